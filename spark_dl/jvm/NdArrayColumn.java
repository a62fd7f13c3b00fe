/*
 * spark-dl JVM scan: an `ndarray` column (format/ndarray.py) read into Spark arrays, nested
 * one level per axis, as the Python reader (mds_reader.py through ops/arrow.py) gives them.
 * Fixed columns (`ndarray:DTYPE:SHAPE`) are the values alone; variable ones (`ndarray:DTYPE`)
 * are [ndim << 2 | shape width code] [ndim little-endian unsigned dims] [values] per sample.
 * Values are little-endian; unsigned ones widen to the next signed Spark type and float16 to
 * float, as Spark's Arrow schema (spark_dl/types.py) widens them.
 */
package sparkdl.jvm;

import java.io.Serializable;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;
import java.util.function.Function;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;

final class NdArrayColumn implements Serializable {
  private static final long serialVersionUID = 1L;
  private static final boolean NATIVE_LITTLE_ENDIAN = ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN;

  /** The stored element types the JVM scan converts, their widths, Arrow and Spark types. */
  enum Dtype {
    INT8(1, "int8", DataTypes.ByteType),
    UINT8(1, "uint8", DataTypes.ShortType),
    INT16(2, "int16", DataTypes.ShortType),
    UINT16(2, "uint16", DataTypes.IntegerType),
    FLOAT16(2, "halffloat", DataTypes.FloatType),
    INT32(4, "int32", DataTypes.IntegerType),
    UINT32(4, "uint32", DataTypes.LongType),
    FLOAT32(4, "float", DataTypes.FloatType),
    INT64(8, "int64", DataTypes.LongType),
    FLOAT64(8, "double", DataTypes.DoubleType),
    /** uint8 values recorded as Arrow booleans (how spark-dl stores array<boolean>). */
    BOOL(1, "bool", DataTypes.BooleanType);

    final int width;
    final String arrow;
    final DataType spark;

    Dtype(int width, String arrow, DataType spark) {
      this.width = width;
      this.arrow = arrow;
      this.spark = spark;
    }

    /** The element type of an `ndarray:NAME` encoding (uint64 has no exact Spark type). */
    static Dtype named(String name) {
      switch (name) {
        case "int8": return INT8;
        case "uint8": return UINT8;
        case "int16": return INT16;
        case "uint16": return UINT16;
        case "float16": return FLOAT16;
        case "int32": return INT32;
        case "uint32": return UINT32;
        case "float32": return FLOAT32;
        case "int64": return INT64;
        case "float64": return FLOAT64;
        default: return null;
      }
    }
  }

  final String name;
  final Dtype dtype;
  /** Axes per sample: the Spark type's array depth. */
  final int depth;
  /** `ndarray:DTYPE:SHAPE`: every sample's shape, no header; null for a variable column. */
  final int[] fixedShape;
  /** A variable column spark_dl.json records with one shape in every shard (the Python
   * reader's "dense" form, which refuses another shape); null otherwise. */
  final int[] recordedShape;

  private NdArrayColumn(String name, Dtype dtype, int depth, int[] fixedShape, int[] recordedShape) {
    this.name = name;
    this.dtype = dtype;
    this.depth = depth;
    this.fixedShape = fixedShape;
    this.recordedShape = recordedShape;
  }

  /**
   * The column as the JVM scan reads it, or null where the Python reader must: another
   * encoding, an element type other than the encoding's own (which Python would cast), a
   * Spark type other than the one Python gives, a shape whose rank is not the type's depth.
   */
  static NdArrayColumn of(String name, String encoding, String arrowType, DataType asked,
      int storedWidth, int[] recordedShape) {
    String[] parts = encoding.split(":", -1);
    if (parts.length < 2 || parts.length > 3 || !parts[0].equals("ndarray")) {
      return null; // plain `ndarray` carries a dtype per sample: the Python reader
    }
    Dtype dtype = Dtype.named(parts[1]);
    int depth = 0;
    String leaf = arrowType;
    for (String inner = listValue(leaf); inner != null; inner = listValue(leaf)) {
      depth++;
      leaf = inner;
    }
    leaf = withoutNotNull(leaf);
    if (dtype == Dtype.UINT8 && leaf.equals("bool")) {
      dtype = Dtype.BOOL;
    }
    if (dtype == null || depth == 0 || !leaf.equals(dtype.arrow) || !isArrays(asked, depth, dtype.spark)) {
      return null;
    }
    int[] fixed = null;
    if (parts.length == 3) {
      fixed = dims(parts[2]);
      if (fixed == null || fixed.length != depth || (long) storedWidth != product(fixed) * dtype.width) {
        return null;
      }
    } else if (storedWidth != -1 || (recordedShape != null && recordedShape.length != depth)) {
      return null;
    }
    return new NdArrayColumn(name, dtype, depth, fixed, parts.length == 3 ? null : recordedShape);
  }

  /** The value type of an Arrow list type's text (`list<item: float>`, `large_list<…>`,
   * `fixed_size_list<item: float>[4]`), or null for a type that is no list. */
  private static String listValue(String type) {
    String body;
    if (type.startsWith("list<") || type.startsWith("large_list<")) {
      body = withoutNotNull(type);
    } else if (type.startsWith("fixed_size_list<") && type.endsWith("]")) {
      body = type.substring(0, type.lastIndexOf('['));
    } else {
      return null;
    }
    int open = body.indexOf('<');
    int colon = body.indexOf(": ", open);
    if (!body.endsWith(">") || colon < 0) {
      return null;
    }
    return body.substring(colon + 2, body.length() - 1);
  }

  private static String withoutNotNull(String type) {
    return type.endsWith(" not null") ? type.substring(0, type.length() - " not null".length()) : type;
  }

  private static boolean isArrays(DataType type, int depth, DataType leaf) {
    for (int i = 0; i < depth; i++) {
      if (!(type instanceof ArrayType)) {
        return false;
      }
      type = ((ArrayType) type).elementType();
    }
    return type.equals(leaf);
  }

  private static int[] dims(String text) {
    try {
      int[] out = Arrays.stream(text.split(",")).mapToInt(Integer::parseInt).toArray();
      return out.length == 0 || Arrays.stream(out).anyMatch(d -> d < 1) ? null : out;
    } catch (NumberFormatException e) {
      return null;
    }
  }

  private static long product(int[] shape) {
    long n = 1;
    for (int d : shape) {
      n *= d;
    }
    return n;
  }

  /** Python's tuple text of a shape, for messages worded as the Python reader's. */
  static String shapeText(int[] shape) {
    StringBuilder s = new StringBuilder("(");
    for (int i = 0; i < shape.length; i++) {
      s.append(i == 0 ? "" : ", ").append(shape[i]);
    }
    return s.append(shape.length == 1 ? ",)" : ")").toString();
  }

  /** A batch's vectors of this column: the top-level array vector, one more per axis below,
   * the leaf last, and how many entries each holds so far. One per reader. */
  final class Writer {
    private final WritableColumnVector[] levels = new WritableColumnVector[depth + 1];
    private final int[] filled = new int[depth + 1];
    private final Function<String, RuntimeException> error;

    /** error: a shard's error naming its file, given the message after the column. */
    Writer(WritableColumnVector top, Function<String, RuntimeException> error) {
      this.error = error;
      levels[0] = top;
      for (int i = 1; i <= depth; i++) {
        levels[i] = levels[i - 1].arrayData();
      }
    }

    /** Starts a new batch (the vectors were reset). */
    void reset() {
      Arrays.fill(filled, 0);
    }

    void putNull(int row) {
      levels[0].putNull(row);
      levels[0].putArray(row, filled[1], 0);
    }

    /** The sample value of `width` bytes at `at` into `row` (buf: raw, little-endian). */
    void put(int row, byte[] raw, ByteBuffer buf, int at, int width) {
      if (fixedShape != null) {
        put(row, raw, buf, at, fixedShape);
        return;
      }
      if (width < 1) {
        throw fail("an ndarray value is shorter than its header");
      }
      int header = raw[at] & 0xFF;
      int ndim = header >> 2;
      int dimWidth = 1 << (header & 3);
      int body = 1 + ndim * dimWidth;
      if (width < body) {
        throw fail("an ndarray shape header is truncated");
      }
      long count = 1; // capped at 2^31: more can never match the bytes there are
      boolean fits = true;
      int[] shape = new int[ndim];
      for (int i = 0; i < ndim; i++) {
        long d = dim(buf, at + 1 + i * dimWidth, dimWidth);
        fits &= d <= Integer.MAX_VALUE;
        shape[i] = (int) Math.min(d, Integer.MAX_VALUE);
        count = Math.min(1L << 31, count * Math.min(d, 1L << 31));
      }
      if (!fits || count * dtype.width != width - body) {
        throw fail("ndarray values do not match their shape " + shapeText(shape));
      }
      if (recordedShape != null && !Arrays.equals(shape, recordedShape)) {
        throw failForm("is recorded with one shape " + shapeText(recordedShape)
            + " in every shard (dense), but this batch holds arrays of another shape");
      }
      if (ndim != depth) {
        throw depth == 1
            ? failForm("is recorded as 1-D arrays but holds arrays of other rank")
            : fail("an ndarray of " + ndim + " axes in a column of " + depth + "-deep arrays");
      }
      put(row, raw, buf, at + body, shape);
    }

    /** As the Python reader words a value's error: the column, then the encoding's words. */
    private RuntimeException fail(String message) {
      return error.apply("column '" + name + "': " + message);
    }

    /** As the Python reader words a value that breaks the column's recorded form. */
    private RuntimeException failForm(String message) {
      return error.apply("column '" + name + "' " + message);
    }

    /** One sample of shape `dims` into the vectors: an array per entry of each axis above
     * the leaf, laid end to end, then the values themselves. */
    private void put(int row, byte[] raw, ByteBuffer buf, int at, int[] dims) {
      levels[0].putArray(row, filled[1], dims[0]);
      long entries = dims[0];
      for (int level = 1; level < depth; level++) {
        WritableColumnVector v = levels[level];
        int d = dims[level];
        int start = filled[level];
        long needed = start + entries;
        if (needed > Integer.MAX_VALUE - 16 || filled[level + 1] + entries * d > Integer.MAX_VALUE - 16) {
          throw fail("ndarray values do not match their shape " + shapeText(dims));
        }
        v.reserve((int) needed);
        for (int e = 0; e < entries; e++) {
          v.putArray(start + e, filled[level + 1] + e * d, d);
        }
        filled[level] = (int) needed;
        entries *= d;
      }
      WritableColumnVector leaf = levels[depth];
      int start = filled[depth];
      int n = (int) entries;
      leaf.reserve(start + n);
      copy(leaf, start, n, raw, buf, at);
      filled[depth] = start + n;
    }

    private void copy(WritableColumnVector leaf, int start, int n, byte[] raw, ByteBuffer le, int at) {
      switch (dtype) {
        case INT8: leaf.putBytes(start, n, raw, at); break;
        case UINT8: for (int i = 0; i < n; i++) leaf.putShort(start + i, (short) (raw[at + i] & 0xFF)); break;
        case BOOL: for (int i = 0; i < n; i++) leaf.putBoolean(start + i, raw[at + i] != 0); break;
        case INT16:
          if (NATIVE_LITTLE_ENDIAN) {
            leaf.putShorts(start, n, raw, at);
          } else {
            for (int i = 0; i < n; i++) leaf.putShort(start + i, le.getShort(at + 2 * i));
          }
          break;
        case UINT16: for (int i = 0; i < n; i++) leaf.putInt(start + i, le.getShort(at + 2 * i) & 0xFFFF); break;
        case FLOAT16: for (int i = 0; i < n; i++) leaf.putFloat(start + i, halfToFloat(le.getShort(at + 2 * i))); break;
        case INT32: leaf.putIntsLittleEndian(start, n, raw, at); break;
        case UINT32: for (int i = 0; i < n; i++) leaf.putLong(start + i, le.getInt(at + 4 * i) & 0xFFFFFFFFL); break;
        case FLOAT32: leaf.putFloatsLittleEndian(start, n, raw, at); break;
        case INT64: leaf.putLongsLittleEndian(start, n, raw, at); break;
        default: leaf.putDoublesLittleEndian(start, n, raw, at);
      }
    }
  }

  private static long dim(ByteBuffer buf, int at, int width) {
    switch (width) {
      case 1: return buf.get(at) & 0xFFL;
      case 2: return buf.getShort(at) & 0xFFFFL;
      case 4: return buf.getInt(at) & 0xFFFFFFFFL;
      default: {
        long d = buf.getLong(at);
        return d < 0 ? Long.MAX_VALUE : d;
      }
    }
  }

  /** IEEE half to float, exactly (as numpy's float16 -> float32), NaN payloads kept. */
  static float halfToFloat(short half) {
    int h = half & 0xFFFF;
    int sign = (h & 0x8000) << 16;
    int exponent = (h >> 10) & 0x1F;
    int mantissa = h & 0x3FF;
    if (exponent == 0x1F) { // inf, NaN
      return Float.intBitsToFloat(sign | 0x7F800000 | (mantissa << 13));
    }
    if (exponent != 0) { // normal
      return Float.intBitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
    }
    if (mantissa == 0) {
      return Float.intBitsToFloat(sign);
    }
    float subnormal = mantissa * 0x1p-24f; // mantissa * 2^-24, exact in float
    return sign == 0 ? subnormal : -subnormal;
  }
}
