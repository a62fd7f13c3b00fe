/*
 * spark-dl JVM scan: an optimizer rule (session.experimental.extraOptimizations, which run
 * after Spark's V2 scan push-down) that swaps the Python `mds` source's scan for MdsScan over
 * only the columns the query uses. PySpark's Python Data Source API gives a reader neither the
 * columns a query needs nor a way to count from metadata, so every read decoded every column
 * in a Python worker. Where the JVM reader cannot promise the Python reader's exact rows and
 * errors (see MdsDataset), or spark.spark_dl.jvmScan.enabled is false, the plan is left alone.
 * Only scans are replaced: write targets (a relation, never a scan) are not touched.
 */
package sparkdl.jvm;

import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.expressions.AttributeReference;
import org.apache.spark.sql.catalyst.expressions.ExprId;
import org.apache.spark.sql.catalyst.plans.logical.Aggregate;
import org.apache.spark.sql.catalyst.plans.logical.Filter;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.catalyst.rules.Rule;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2ScanRelation;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.AbstractFunction1;

public final class MdsScanRule extends Rule<LogicalPlan> {
  public static final String ENABLED = "spark.spark_dl.jvmScan.enabled";
  private static final Set<String> OPTIONS = Set.of("path", "verify_hashes", "shards_per_partition", "allow_unsafe");

  /** Adds the rule to session once (the Python side calls this after adding the jar). */
  public static synchronized boolean install(SparkSession session) {
    Seq<Rule<LogicalPlan>> rules = session.experimental().extraOptimizations();
    for (Rule<LogicalPlan> r : CollectionConverters.asJava(rules)) {
      if (r.getClass().getName().equals(MdsScanRule.class.getName())) {
        return false;
      }
    }
    List<Rule<LogicalPlan>> more = new ArrayList<>(CollectionConverters.asJava(rules));
    more.add(new MdsScanRule());
    session.experimental().extraOptimizations_$eq(CollectionConverters.asScala(more).toList());
    return true;
  }

  @Override
  public LogicalPlan apply(LogicalPlan plan) {
    if (!"true".equalsIgnoreCase(SQLConf.get().getConfString(ENABLED, "true").trim())) {
      return plan;
    }
    try {
      return rewrite(plan);
    } catch (RuntimeException | LinkageError e) { // e.g. a jar built for another Spark
      logWarning(() -> "spark-dl JVM scan not used (reads stay in Python): " + e);
      return plan;
    }
  }

  private LogicalPlan rewrite(LogicalPlan node) {
    if (isPythonMds(node)) {
      return replace((DataSourceV2ScanRelation) node, null);
    }
    if ((node instanceof Project || node instanceof Aggregate) && node.children().size() == 1) {
      // Project/Aggregate over Filters over the scan: the scan needs only their references
      List<LogicalPlan> chain = new ArrayList<>();
      LogicalPlan c = node.children().head();
      while (c instanceof Filter) {
        chain.add(c);
        c = ((Filter) c).child();
      }
      if (isPythonMds(c)) {
        Set<ExprId> needed = new HashSet<>();
        addReferences(node, needed);
        for (LogicalPlan filter : chain) {
          addReferences(filter, needed);
        }
        LogicalPlan below = replace((DataSourceV2ScanRelation) c, needed);
        if (below == c) {
          return node;
        }
        for (int i = chain.size() - 1; i >= 0; i--) {
          below = chain.get(i).withNewChildren(single(below));
        }
        return node.withNewChildren(single(below));
      }
    }
    return node.mapChildren(new AbstractFunction1<LogicalPlan, LogicalPlan>() {
      @Override
      public LogicalPlan apply(LogicalPlan child) {
        return rewrite(child);
      }
    });
  }

  private static Seq<LogicalPlan> single(LogicalPlan p) {
    return CollectionConverters.asScala(List.of(p)).toList();
  }

  private static void addReferences(LogicalPlan node, Set<ExprId> into) {
    for (var a : CollectionConverters.asJava(node.references().toSeq())) {
      into.add(a.exprId());
    }
  }

  private static boolean isPythonMds(LogicalPlan node) {
    if (!(node instanceof DataSourceV2ScanRelation)) {
      return false;
    }
    DataSourceV2ScanRelation s = (DataSourceV2ScanRelation) node;
    return s.relation().table().getClass().getSimpleName().equals("PythonTable")
        && "mds".equals(s.relation().table().name())
        && s.scan().getClass().getSimpleName().equals("PythonScan");
  }

  /** The scan over the needed columns (all where needed is null), or scan itself where the
   * JVM reader cannot read it exactly as the Python one would. */
  private LogicalPlan replace(DataSourceV2ScanRelation scan, Set<ExprId> needed) {
    try {
      LogicalPlan out = tryReplace(scan, needed);
      return out == null ? scan : out;
    } catch (Exception e) { // unreadable metadata and the like: the Python reader says why
      logDebug(() -> "spark-dl JVM scan not used: " + e);
      return scan;
    }
  }

  private LogicalPlan tryReplace(DataSourceV2ScanRelation scan, Set<ExprId> needed) throws Exception {
    Map<String, String> options = scan.relation().options().asCaseSensitiveMap();
    Boolean verify = null;
    Integer perPartition = null;
    String path = null;
    for (Map.Entry<String, String> e : options.entrySet()) {
      String key = e.getKey().toLowerCase(Locale.ROOT);
      String value = e.getValue().trim().toLowerCase(Locale.ROOT);
      if (!OPTIONS.contains(key)) {
        return null; // a mixture, storage.* (remote), a catalog table's keys…: Python
      }
      if (key.equals("verify_hashes") || key.equals("allow_unsafe")) {
        if (!value.equals("true") && !value.equals("false")) {
          return null; // the Python reader refuses it, naming the option
        }
        if (key.equals("verify_hashes")) {
          verify = value.equals("true");
        }
      } else if (key.equals("shards_per_partition")) {
        try {
          perPartition = Integer.parseInt(value);
        } catch (NumberFormatException x) {
          return null;
        }
        if (perPartition < 1 || perPartition > (1 << 20)) {
          return null;
        }
      } else {
        path = e.getValue();
      }
    }
    Path dir = localPath(path);
    if (dir == null) {
      return null;
    }
    MdsDataset ds = MdsDataset.open(dir, verify);
    if (ds == null) {
      return null;
    }
    List<AttributeReference> keep = new ArrayList<>();
    List<StructField> fields = new ArrayList<>();
    List<Integer> stored = new ArrayList<>();
    List<Integer> kinds = new ArrayList<>();
    List<Integer> masks = new ArrayList<>();
    List<NdArrayColumn> arrays = new ArrayList<>();
    for (AttributeReference a : CollectionConverters.asJava(scan.output())) {
      if (needed != null && !needed.contains(a.exprId())) {
        continue;
      }
      int column = ds.column(a.name());
      int kind = column < 0 ? -1 : ds.kind(column, a.dataType());
      NdArrayColumn array = kind < 0 && column >= 0 ? ds.array(column, a.dataType()) : null;
      if (array != null) {
        kind = MdsDataset.NDARRAY;
      }
      if (kind < 0) {
        return null;
      }
      keep.add(a);
      fields.add(new StructField(a.name(), a.dataType(), a.nullable(), a.metadata()));
      stored.add(column);
      kinds.add(kind);
      masks.add(ds.mask(column));
      arrays.add(array);
    }
    StructType schema = new StructType(fields.toArray(new StructField[0]));
    MdsScan jvm = new MdsScan(ds, schema, ints(stored), ints(kinds), ints(masks),
        arrays.toArray(new NdArrayColumn[0]), perPartition);
    return withScan(scan, jvm, CollectionConverters.asScala(keep).toList());
  }

  /**
   * {@code scan} with another Scan and output, every other field kept. Built through the case
   * class's constructor, since its field list grows between Spark versions (4.3 added
   * {@code mergeableScan}), so one jar source compiles against any PySpark 4.x.
   */
  private static LogicalPlan withScan(DataSourceV2ScanRelation scan, Object jvm, Object output)
      throws Exception {
    Object[] fields = new Object[scan.productArity()];
    for (int i = 0; i < fields.length; i++) {
      fields[i] = scan.productElement(i);
    }
    fields[1] = jvm; // (relation, scan, output, ...)
    fields[2] = output;
    for (java.lang.reflect.Constructor<?> c : DataSourceV2ScanRelation.class.getConstructors()) {
      if (c.getParameterCount() == fields.length) {
        return (LogicalPlan) c.newInstance(fields);
      }
    }
    throw new IllegalStateException("no DataSourceV2ScanRelation constructor of " + fields.length);
  }

  private static int[] ints(List<Integer> values) {
    return values.stream().mapToInt(Integer::intValue).toArray();
  }

  /** A local dataset directory, as mds_options._path reads the option; null otherwise. */
  private static Path localPath(String path) {
    if (path == null || path.isEmpty()) {
      return null;
    }
    if (path.startsWith("file:/") && !path.startsWith("file://")) {
      path = path.substring("file:".length());
    }
    if (path.contains(":")) {
      return null; // s3://, gs://, file://…: fsspec's business
    }
    return Path.of(path).toAbsolutePath();
  }
}
