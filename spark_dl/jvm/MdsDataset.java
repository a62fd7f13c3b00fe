/*
 * spark-dl JVM scan: a local MDS dataset's metadata (index.json, spark_dl.json) as the JVM
 * reader needs it, and whether the JVM reader can read a column exactly as the Python reader
 * (spark_dl/mds_reader.py) does. Anything it cannot promise to read identically (another
 * compression, hash or encoding, a null mask of another layout, read-time transforms,
 * Mosaic's datasets) makes open()/column() answer null, and the plan keeps the Python scan.
 */
package sparkdl.jvm;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.Serializable;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;

final class MdsDataset {
  static final ObjectMapper JSON = new ObjectMapper();
  /** Column kinds the reader decodes: fixed-width little-endian numbers, UTF-8 text, bytes;
   * and NDARRAY, an `ndarray` column that its NdArrayColumn reads. */
  static final String[] ENCODINGS = {
    "int8", "int16", "int32", "int64", "float32", "float64", "str", "bytes", "uint8"
  };
  static final String[] ARROW = {
    "int8", "int16", "int32", "int64", "float", "double", "string", "binary", "bool"
  };
  static final DataType[] SPARK = {
    DataTypes.ByteType, DataTypes.ShortType, DataTypes.IntegerType, DataTypes.LongType,
    DataTypes.FloatType, DataTypes.DoubleType, DataTypes.StringType, DataTypes.BinaryType,
    DataTypes.BooleanType
  };
  static final int[] WIDTH = {1, 2, 4, 8, 4, 8, -1, -1, 1};
  /** The kind of an `ndarray` column, read by its NdArrayColumn. */
  static final int NDARRAY = 9; // past ENCODINGS

  /** One shard as the index and spark_dl.json describe it. */
  static final class Shard implements Serializable {
    private static final long serialVersionUID = 1L;
    final String basename;
    final long storedBytes;
    final long rawBytes;
    final int samples;
    final boolean zstd;
    /** xxh3_64 of the stored file (null: verify_hashes=false, nothing to check). */
    final String xxh3;
    /** verify_hashes=true: checked on every load, not once. */
    final boolean everyLoad;

    Shard(String basename, long storedBytes, long rawBytes, int samples, boolean zstd, String xxh3,
        boolean everyLoad) {
      this.everyLoad = everyLoad;
      this.basename = basename;
      this.storedBytes = storedBytes;
      this.rawBytes = rawBytes;
      this.samples = samples;
      this.zstd = zstd;
      this.xxh3 = xxh3;
    }
  }

  final Path dir;
  final List<Shard> shards = new ArrayList<>();
  final List<String> names = new ArrayList<>();
  final List<String> encodings = new ArrayList<>();
  /** Each stored column's width in a sample, -1 where variable (index.json column_sizes). */
  final List<Integer> sizes = new ArrayList<>();
  private JsonNode columns;
  /** spark_dl.json's shard entries (each records its ndarray columns' one shape, if any). */
  private JsonNode recordedShards;

  private MdsDataset(Path dir) {
    this.dir = dir;
  }

  /** The dataset at dir, or null where the JVM reader must not read it. */
  static MdsDataset open(Path dir, Boolean verify) throws IOException {
    Path metaFile = dir.resolve("spark_dl.json");
    Path indexFile = dir.resolve("index.json");
    if (!Files.isRegularFile(metaFile) || !Files.isRegularFile(indexFile)) {
      return null; // Mosaic's datasets (no spark_dl.json): the Python reader warns, checks more
    }
    JsonNode meta = JSON.readTree(metaFile.toFile());
    JsonNode index = JSON.readTree(indexFile.toFile());
    JsonNode spec = meta.path("spec");
    if (hasReadTransforms(spec) || meta.has("virtual") || !meta.path("shards").isArray()) {
      return null;
    }
    MdsDataset ds = new MdsDataset(dir);
    ds.columns = meta.path("columns");
    ds.recordedShards = meta.path("shards");
    JsonNode entries = index.path("shards");
    if (!entries.isArray() || entries.size() != meta.path("shards").size()) {
      return null;
    }
    for (int i = 0; i < entries.size(); i++) {
      Shard shard = ds.shard(entries.get(i), meta.path("shards").get(i), verify);
      if (shard == null) {
        return null;
      }
      ds.shards.add(shard);
    }
    return ds;
  }

  /** Whether the spec records read-time transforms, which the Python reader applies (as
   * ops.arrow.read_transforms: write-time ones, a tokenize op say, already shaped the shards). */
  private static boolean hasReadTransforms(JsonNode spec) {
    for (JsonNode transform : spec.path("transforms")) {
      if (!transform.isObject() || "read".equals(transform.path("at").asText())) {
        return true;
      }
    }
    return !spec.path("transforms").isMissingNode() && !spec.path("transforms").isArray();
  }

  private Shard shard(JsonNode entry, JsonNode recorded, Boolean verify) {
    List<String> shardNames = texts(entry.path("column_names"));
    List<String> shardEncodings = texts(entry.path("column_encodings"));
    List<Integer> shardSizes = new ArrayList<>();
    for (JsonNode size : entry.path("column_sizes")) {
      shardSizes.add(size.isNull() ? -1 : size.asInt(-2));
    }
    if (shardSizes.contains(-2) || shardSizes.size() != shardNames.size()
        || shardEncodings.size() != shardNames.size()) {
      return null;
    }
    if (shards.isEmpty()) {
      names.addAll(shardNames);
      encodings.addAll(shardEncodings);
      sizes.addAll(shardSizes);
    } else if (!names.equals(shardNames) || !encodings.equals(shardEncodings)
        || !sizes.equals(shardSizes)) {
      return null;
    }
    JsonNode raw = entry.path("raw_data");
    JsonNode zip = entry.path("zip_data");
    JsonNode stored = zip.isObject() ? zip : raw;
    String compression = entry.path("compression").isTextual() ? entry.path("compression").asText() : null;
    boolean zstd = zip.isObject();
    if (zstd != (compression != null)) {
      return null;
    }
    if (zstd && !(compression.equals("zstd") || compression.startsWith("zstd:"))) {
      return null; // gz, bz2, br, snappy: the Python reader
    }
    String basename = stored.path("basename").asText("");
    if (!safeName(basename) || !recorded.path("basename").asText().equals(basename)) {
      return null;
    }
    long rawBytes = raw.path("bytes").asLong(-1);
    long storedBytes = stored.path("bytes").asLong(-1);
    int samples = entry.path("samples").asInt(-1);
    if (rawBytes < 0 || storedBytes < 0 || samples < 0 || rawBytes > Integer.MAX_VALUE - 64
        || storedBytes > Integer.MAX_VALUE - 64) {
      return null;
    }
    String xxh3 = null;
    if (!Boolean.FALSE.equals(verify)) {
      // as ShardLoading._verify_stored: the index's hashes of the stored file, else ours
      JsonNode hashes = stored.path("hashes");
      if (hashes.size() == 0) {
        hashes = recorded.path("stored_hashes");
      }
      xxh3 = hashes.path("xxh3_64").isTextual() ? hashes.path("xxh3_64").asText() : null;
      if (xxh3 == null || (Boolean.TRUE.equals(verify) && (hashes.size() != 1
          || (zstd && raw.path("hashes").size() > 0)))) {
        return null; // another hash (or every recorded one, each time): the Python reader
      }
    }
    return new Shard(basename, storedBytes, rawBytes, samples, zstd, xxh3, Boolean.TRUE.equals(verify));
  }

  /** The index into ENCODINGS of stored column i if the JVM reader decodes it exactly as
   * the Python reader does into type asked, else -1. */
  int kind(int i, DataType asked) {
    JsonNode col = columns.path(names.get(i));
    if (!col.isObject() || mask(i) == -2) {
      return -1;
    }
    for (int k = 0; k < ENCODINGS.length; k++) {
      if (ENCODINGS[k].equals(encodings.get(i)) && ARROW[k].equals(col.path("arrow_type").asText())
          && col.path("encoding").asText().equals(ENCODINGS[k]) && SPARK[k].equals(asked)
          && sizes.get(i) == WIDTH[k]) {
        return k;
      }
    }
    return -1;
  }

  /** Stored column i as the JVM scan reads an `ndarray` column into type asked, or null
   * where the Python reader must read it (see NdArrayColumn.of). */
  NdArrayColumn array(int i, DataType asked) {
    JsonNode col = columns.path(names.get(i));
    if (!col.isObject() || mask(i) == -2 || !col.path("encoding").asText().equals(encodings.get(i))) {
      return null;
    }
    return NdArrayColumn.of(names.get(i), encodings.get(i), col.path("arrow_type").asText(), asked,
        sizes.get(i), recordedShape(names.get(i)));
  }

  /** The one shape every shard's entry records for a column (as Dataset.forms' "dense"),
   * else null. */
  private int[] recordedShape(String name) {
    int[] first = null;
    for (JsonNode shard : recordedShards) {
      JsonNode shape = shard.path("shapes").path(name);
      if (!shape.isArray()) {
        return null;
      }
      int[] dims = new int[shape.size()];
      for (int d = 0; d < dims.length; d++) {
        if (!shape.get(d).canConvertToInt()) {
          return null;
        }
        dims[d] = shape.get(d).asInt();
      }
      if (first != null && !java.util.Arrays.equals(first, dims)) {
        return null;
      }
      first = dims;
    }
    return first;
  }

  /** Stored column i's null mask column (one uint8 byte, nonzero: null), -1 for none, -2
   * for a mask the JVM reader cannot read. */
  int mask(int i) {
    JsonNode mask = columns.path(names.get(i)).path("null_mask");
    if (mask.isNull() || mask.isMissingNode()) {
      return -1;
    }
    int at = names.indexOf(mask.asText());
    return at >= 0 && encodings.get(at).equals("uint8") && sizes.get(at) == 1 ? at : -2;
  }

  /** The stored column a read schema's name means (as mds_reader._asked_columns), or -1. */
  int column(String name) {
    int at = names.indexOf(name);
    if (at >= 0) {
      return at;
    }
    for (int i = names.size() - 1; i >= 0; i--) { // a dict by lower name keeps the last
      if (names.get(i).equalsIgnoreCase(name)) {
        return i;
      }
    }
    return -1;
  }

  private static boolean safeName(String name) {
    return !name.isEmpty() && !name.contains("/") && !name.contains("\\") && !name.contains(":")
        && !name.equals(".") && !name.equals("..");
  }

  static List<String> texts(JsonNode array) {
    List<String> out = new ArrayList<>();
    for (Iterator<JsonNode> it = array.elements(); it.hasNext(); ) {
      out.add(it.next().asText());
    }
    return out;
  }

  /** The basenames index.json lists now (a task checks its shards are still those). */
  static List<String> basenames(Path dir) throws IOException {
    JsonNode index = JSON.readTree(dir.resolve("index.json").toFile());
    List<String> out = new ArrayList<>();
    for (JsonNode entry : index.path("shards")) {
      JsonNode zip = entry.path("zip_data");
      out.add((zip.isObject() ? zip : entry.path("raw_data")).path("basename").asText());
    }
    return out;
  }
}
