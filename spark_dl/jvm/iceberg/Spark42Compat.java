// Rewrites the few classes of Iceberg's Spark 4.1 runtime that do not link against Spark
// 4.2 (Iceberg publishes no runtime for Spark 4.2 yet), writing the rewritten .class files
// under an output folder; spark_dl/iceberg_session.py jars them with SparkView.java's
// stand-in, ahead of the runtime jar on the classpath. Two changes, each found by running
// Spark 4.2 on the 4.1 runtime (three changes):
//  - BaseCatalog implements both TableCatalog and ViewCatalog, which Spark 4.2 refuses at
//    catalog load ("must implement RelationCatalog instead"): ViewCatalog and Iceberg's
//    SupportsReplaceView are dropped from its interfaces (tables only; no Iceberg views).
//  - CatalogV2Util.structTypeToV2Columns(StructType) gained a boolean parameter with a
//    default (NoSuchMethodError when a table is resolved): each call passes the default.
//  - CatalogManager became an interface ("Found interface ... CatalogManager, but class was
//    expected", in Iceberg's SQL extensions; "must be InterfaceMethodref" for its static
//    SESSION_CATALOG_NAME in format("iceberg") loads): its calls become interface calls.
// Usage: java -cp <spark jars> Spark42Compat <runtime jar> <output folder>
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.Enumeration;
import java.util.zip.ZipEntry;
import java.util.zip.ZipFile;
import org.apache.xbean.asm9.ClassReader;
import org.apache.xbean.asm9.ClassVisitor;
import org.apache.xbean.asm9.ClassWriter;
import org.apache.xbean.asm9.MethodVisitor;
import org.apache.xbean.asm9.Opcodes;

public class Spark42Compat {
  static final String BASE = "org/apache/iceberg/spark/BaseCatalog.class";
  static final String UTIL = "org/apache/spark/sql/connector/catalog/CatalogV2Util";
  static final String COLUMNS = "structTypeToV2Columns";
  static final String MANAGER = "org/apache/spark/sql/connector/catalog/CatalogManager";
  static final String OLD =
      "(Lorg/apache/spark/sql/types/StructType;)[Lorg/apache/spark/sql/connector/catalog/Column;";
  static final String NEW =
      "(Lorg/apache/spark/sql/types/StructType;Z)[Lorg/apache/spark/sql/connector/catalog/Column;";

  public static void main(String[] args) throws Exception {
    int patched = 0;
    try (ZipFile zip = new ZipFile(args[0])) {
      for (Enumeration<? extends ZipEntry> e = zip.entries(); e.hasMoreElements(); ) {
        ZipEntry entry = e.nextElement();
        String name = entry.getName();
        if (!name.endsWith(".class")) {
          continue;
        }
        byte[] bytes;
        try (InputStream in = zip.getInputStream(entry)) {
          bytes = in.readAllBytes();
        }
        boolean base = name.equals(BASE);
        String text = new String(bytes, StandardCharsets.ISO_8859_1);
        if (!base && !text.contains(COLUMNS) && !text.contains(MANAGER)) {
          continue;
        }
        Files.createDirectories(Path.of(args[1], name).getParent());
        Files.write(Path.of(args[1], name), rewrite(bytes, base));
        patched++;
      }
    }
    if (patched < 2) {
      throw new IllegalStateException("expected BaseCatalog and its callers, patched " + patched);
    }
    System.out.println("spark-dl: " + patched + " Iceberg classes rewritten for Spark 4.2");
  }

  static byte[] rewrite(byte[] bytes, boolean base) {
    ClassReader reader = new ClassReader(bytes);
    ClassWriter writer = new ClassWriter(reader, ClassWriter.COMPUTE_MAXS);
    reader.accept(
        new ClassVisitor(Opcodes.ASM9, writer) {
          @Override
          public void visit(
              int version, int access, String n, String sig, String sup, String[] ifaces) {
            if (base) {
              ifaces =
                  Arrays.stream(ifaces)
                      .filter(
                          i ->
                              !i.equals("org/apache/spark/sql/connector/catalog/ViewCatalog")
                                  && !i.equals("org/apache/iceberg/spark/SupportsReplaceView"))
                      .toArray(String[]::new);
            }
            super.visit(version, access, n, sig, sup, ifaces);
          }

          @Override
          public MethodVisitor visitMethod(int a, String n, String d, String s, String[] x) {
            return new MethodVisitor(Opcodes.ASM9, super.visitMethod(a, n, d, s, x)) {
              @Override
              public void visitMethodInsn(
                  int op, String owner, String mn, String md, boolean itf) {
                if (owner.equals(UTIL) && mn.equals(COLUMNS) && md.equals(OLD)) {
                  super.visitMethodInsn(
                      Opcodes.INVOKESTATIC, UTIL, COLUMNS + "$default$2", "()Z", false);
                  md = NEW;
                }
                if (owner.equals(MANAGER)) { // its static methods are an interface's too
                  op = op == Opcodes.INVOKEVIRTUAL ? Opcodes.INVOKEINTERFACE : op;
                  itf = true;
                }
                super.visitMethodInsn(op, owner, mn, md, itf);
              }
            };
          }
        },
        0);
    return writer.toByteArray();
  }
}
