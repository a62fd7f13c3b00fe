/*
 * spark-dl JVM scan: the columns a query uses, read from MDS shards into Spark's columnar
 * batches by the JVM (no Python worker). Partitions are shard groups planned as the Python
 * reader plans them; each task checks its shards are still the ones index.json names, checks
 * size and (once per file and JVM, as the Python reader once per machine) the stored xxh3_64,
 * decompresses zstd, validates the shard header and decodes rows. Errors name the file.
 */
package sparkdl.jvm;

import com.github.luben.zstd.Zstd;
import java.io.IOException;
import java.io.Serializable;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.FileTime;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

public final class MdsScan implements Scan, Batch {
  // as spark_dl/mds_options.py: PARTITION_BYTES, SHARD_OPEN_BYTES
  static final long PARTITION_BYTES = 128L << 20;
  static final long SHARD_OPEN_BYTES = 4L << 20;
  static final int BATCH_ROWS = 16384;
  // as mds_options.READ_BATCH_BYTES and READ_BATCH_ROWS' low end: a batch of long arrays is
  // bounded by its bytes, not by its rows
  static final int BATCH_BYTES = 8 << 20;
  static final int MIN_BATCH_ROWS = 64;

  private final MdsDataset ds;
  private final StructType schema;
  private final int[] stored;
  private final int[] kinds;
  private final int[] masks;
  private final NdArrayColumn[] arrays;
  private final Integer shardsPerPartition;

  MdsScan(MdsDataset ds, StructType schema, int[] stored, int[] kinds, int[] masks,
      NdArrayColumn[] arrays, Integer shardsPerPartition) {
    this.ds = ds;
    this.schema = schema;
    this.stored = stored;
    this.kinds = kinds;
    this.masks = masks;
    this.arrays = arrays;
    this.shardsPerPartition = shardsPerPartition;
  }

  @Override
  public StructType readSchema() {
    return schema;
  }

  @Override
  public String description() {
    return "MdsJvmScan " + ds.dir + " " + schema.simpleString();
  }

  @Override
  public Batch toBatch() {
    return this;
  }

  @Override
  public InputPartition[] planInputPartitions() {
    List<List<Integer>> groups = groups();
    List<InputPartition> out = new ArrayList<>();
    for (List<Integer> g : groups) {
      List<MdsDataset.Shard> shards = new ArrayList<>();
      for (int i : g) {
        shards.add(ds.shards.get(i));
      }
      out.add(new Part(ds.dir.toString(), g.stream().mapToInt(Integer::intValue).toArray(), shards));
    }
    return out.toArray(new InputPartition[0]);
  }

  /** Consecutive shard groups, as mds_reader.plan_groups (or shards_per_partition). */
  private List<List<Integer>> groups() {
    int n = ds.shards.size();
    List<List<Integer>> groups = new ArrayList<>();
    if (shardsPerPartition != null) {
      for (int i = 0; i < n; i += shardsPerPartition) {
        List<Integer> g = new ArrayList<>();
        for (int j = i; j < Math.min(n, i + shardsPerPartition); j++) {
          g.add(j);
        }
        groups.add(g);
      }
      return groups;
    }
    long total = 0;
    for (MdsDataset.Shard s : ds.shards) {
      total += s.rawBytes + SHARD_OPEN_BYTES;
    }
    int cores = Runtime.getRuntime().availableProcessors();
    long target = Math.min(PARTITION_BYTES, Math.max(SHARD_OPEN_BYTES, total / Math.max(1, cores)));
    List<Integer> current = new ArrayList<>();
    long filled = 0;
    for (int i = 0; i < n; i++) {
      long size = ds.shards.get(i).rawBytes;
      if (!current.isEmpty() && filled + size > target) {
        groups.add(current);
        current = new ArrayList<>();
        filled = 0;
      }
      current.add(i);
      filled += size + SHARD_OPEN_BYTES;
    }
    if (!current.isEmpty()) {
      groups.add(current);
    }
    return groups;
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    int[] sizes = ds.sizes.stream().mapToInt(Integer::intValue).toArray();
    DataType[] types = java.util.Arrays.stream(schema.fields()).map(StructField::dataType)
        .toArray(DataType[]::new);
    return new Factory(stored, kinds, masks, arrays, types, sizes);
  }

  /** A shard group: the dataset's path, the shards' positions in the index, their entries. */
  static final class Part implements InputPartition {
    private static final long serialVersionUID = 1L;
    final String dir;
    final int[] positions;
    final List<MdsDataset.Shard> shards;

    Part(String dir, int[] positions, List<MdsDataset.Shard> shards) {
      this.dir = dir;
      this.positions = positions;
      this.shards = new ArrayList<>(shards);
    }
  }

  static final class Factory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;
    final int[] stored;
    final int[] kinds;
    final int[] masks;
    /** Per asked column: its NdArrayColumn where it is one, else null. */
    final NdArrayColumn[] arrays;
    /** Per asked column: its Spark type. */
    final DataType[] types;
    final int[] sizes;
    final int columns;
    final int[] variable;

    Factory(int[] stored, int[] kinds, int[] masks, NdArrayColumn[] arrays, DataType[] types,
        int[] sizes) {
      this.stored = stored;
      this.kinds = kinds;
      this.masks = masks;
      this.arrays = arrays;
      this.types = types;
      this.sizes = sizes;
      this.columns = sizes.length;
      this.variable = java.util.stream.IntStream.range(0, sizes.length).filter(i -> sizes[i] < 0).toArray();
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) {
      return true;
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      throw new UnsupportedOperationException("the MDS JVM scan reads columnar batches");
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
      return new Reader((Part) partition, this);
    }
  }

  /** A read failure, worded as the Python reader's error of the same kind. A JDK class:
   * the driver deserializes a task's failure without the jar's classes. */
  static IllegalStateException failure(String message) {
    return new IllegalStateException(message);
  }

  /** Files (path, size, times, expected hash) whose hash this JVM has checked. */
  static final Set<String> VERIFIED = ConcurrentHashMap.newKeySet();

  static final class Reader implements PartitionReader<ColumnarBatch> {
    private final Part part;
    private final Factory f;
    private final OnHeapColumnVector[] vectors;
    private final NdArrayColumn.Writer[] arrays;
    private final ColumnarBatch batch;
    private int shard = -1;
    private Shard current;
    private int row;

    Reader(Part part, Factory f) {
      this.part = part;
      this.f = f;
      this.vectors = new OnHeapColumnVector[f.stored.length];
      this.arrays = new NdArrayColumn.Writer[f.stored.length];
      for (int i = 0; i < vectors.length; i++) {
        vectors[i] = new OnHeapColumnVector(BATCH_ROWS, f.types[i]);
        if (f.arrays[i] != null) {
          arrays[i] = f.arrays[i].new Writer(vectors[i], message -> current.error(message));
        }
      }
      this.batch = new ColumnarBatch(vectors);
    }

    @Override
    public boolean next() throws IOException {
      if (shard == -1) {
        checkUnchanged();
      }
      while (current == null || row >= current.count) {
        if (++shard >= part.shards.size()) {
          return false;
        }
        current = new Shard(Path.of(part.dir), part.shards.get(shard), f);
        row = 0;
      }
      int n = f.stored.length == 0 ? current.count - row : Math.min(current.batchRows, current.count - row);
      for (OnHeapColumnVector v : vectors) {
        v.reset();
      }
      for (NdArrayColumn.Writer a : arrays) {
        if (a != null) {
          a.reset();
        }
      }
      current.decode(row, n, vectors, arrays);
      batch.setNumRows(n);
      row += n;
      return true;
    }

    /** As MDSReader.read: the shards planned must be the ones index.json names now. */
    private void checkUnchanged() throws IOException {
      Path dir = Path.of(part.dir);
      List<String> now;
      try {
        now = MdsDataset.basenames(dir);
      } catch (IOException e) {
        throw failure("DatasetError: " + dir + " changed while it was being read; read it again (" + e + ")");
      }
      for (int i = 0; i < part.positions.length; i++) {
        int at = part.positions[i];
        if (at >= now.size() || !now.get(at).equals(part.shards.get(i).basename)) {
          throw failure("DatasetError: " + dir + " changed while it was being read; read it again");
        }
      }
    }

    @Override
    public ColumnarBatch get() {
      return batch;
    }

    @Override
    public void close() {
      batch.close();
    }
  }

  /** One shard's rows: read, checked, decompressed, its offsets validated. */
  static final class Shard {
    final String file;
    final int count;
    /** Rows per batch: about BATCH_BYTES of this shard's samples, at most BATCH_ROWS. */
    final int batchRows;
    private final byte[] raw;
    private final ByteBuffer buf;
    private final int[] offsets;
    private final Factory f;

    Shard(Path dir, MdsDataset.Shard info, Factory f) throws IOException {
      this.f = f;
      Path path = dir.resolve(info.basename);
      this.file = path.toString();
      if (f.stored.length == 0) { // a count: the index's row count, the file checked present
        long size = size(path);
        if (size != info.storedBytes) {
          throw error("has " + size + " bytes, the index says " + info.storedBytes);
        }
        this.raw = null;
        this.buf = null;
        this.offsets = null;
        this.count = info.samples;
        this.batchRows = BATCH_ROWS;
        return;
      }
      byte[] data = read(path, info);
      verify(path, info, data);
      this.raw = info.zstd ? decompress(info, data) : data;
      this.buf = ByteBuffer.wrap(raw).order(ByteOrder.LITTLE_ENDIAN);
      this.count = header(info.samples);
      long perRow = Math.max(1, info.rawBytes / Math.max(1, count));
      this.batchRows = (int) Math.max(MIN_BATCH_ROWS, Math.min(BATCH_ROWS, BATCH_BYTES / perRow));
      this.offsets = new int[count + 1];
      validate();
    }

    IllegalStateException error(String message) {
      return failure("ShardError: shard '" + file + "': " + message);
    }

    private long size(Path path) throws IOException {
      try {
        return Files.size(path);
      } catch (NoSuchFileException e) {
        throw failure("DatasetChangedError: shard " + file + " is gone: the dataset "
            + "changed since it was opened (overwritten, or its old shards vacuumed); read it again");
      }
    }

    private byte[] read(Path path, MdsDataset.Shard info) throws IOException {
      long size = size(path);
      if (size != info.storedBytes) {
        throw error("has " + size + " bytes, the index says " + info.storedBytes);
      }
      byte[] data = new byte[(int) size];
      try (FileChannel ch = FileChannel.open(path, StandardOpenOption.READ)) {
        ByteBuffer into = ByteBuffer.wrap(data);
        while (into.hasRemaining() && ch.read(into) >= 0) {
          // read until full or end of file
        }
        if (into.hasRemaining()) {
          throw error("has " + into.position() + " bytes, the index says " + info.storedBytes);
        }
      }
      return data;
    }

    /** xxh3_64 of the stored file, checked once per file identity in this JVM. */
    private void verify(Path path, MdsDataset.Shard info, byte[] data) throws IOException {
      if (info.xxh3 == null) {
        return;
      }
      FileTime changed = info.everyLoad ? null : changeTime(path);
      String key = path.toRealPath() + "|" + data.length + "|" + Files.getLastModifiedTime(path)
          + "|" + changed + "|" + info.xxh3;
      if (changed != null && VERIFIED.contains(key)) {
        return;
      }
      String actual = Xxh3.hexdigest(data, 0, data.length);
      if (!actual.equals(info.xxh3)) {
        throw failure("HashMismatchError: shard '" + file + "': xxh3_64 is " + actual
            + ", spark_dl.json (or the index) says " + info.xxh3);
      }
      // a file changed in the last seconds may change again within the clock's tick: as
      // the Python reader, it is not remembered as checked
      if (changed != null && System.currentTimeMillis() - changed.toMillis() >= 2000) {
        VERIFIED.add(key);
      }
    }

    /** The inode's change time (any rewrite moves it); null where the OS has none. */
    private static FileTime changeTime(Path path) {
      try {
        return (FileTime) Files.getAttribute(path, "unix:ctime");
      } catch (IOException | UnsupportedOperationException | IllegalArgumentException e) {
        return null; // no identity to trust: every load is checked
      }
    }

    private byte[] decompress(MdsDataset.Shard info, byte[] data) {
      if (!info.basename.endsWith(".zstd")) {
        throw error("does not end in .zstd as its compression needs");
      }
      byte[] out = new byte[(int) info.rawBytes + 1];
      long n;
      try {
        n = Zstd.decompressByteArray(out, 0, out.length, data, 0, data.length);
      } catch (RuntimeException e) {
        throw error("zstd data does not decompress: " + e.getMessage());
      }
      if (Zstd.isError(n)) {
        throw error("zstd data does not decompress: " + Zstd.getErrorName(n));
      }
      if (n != info.rawBytes) {
        throw error("zstd data decompresses to " + (n > info.rawBytes ? "more than " : "") + n
            + " bytes, index promises " + info.rawBytes);
      }
      return java.util.Arrays.copyOf(out, (int) n);
    }

    private int header(int samples) {
      if (raw.length < 8) {
        throw error("is " + raw.length + " bytes, too short to be an MDS shard");
      }
      long stored = buf.getInt(0) & 0xFFFFFFFFL;
      if (stored != samples) {
        throw error("holds " + stored + " samples, its index entry says " + samples);
      }
      if (4 + 4 * (stored + 1) > raw.length) {
        throw error("is truncated inside its offset table");
      }
      return samples;
    }

    /** As ShardData: offsets start past the table, never decrease, end at the file's end. */
    private void validate() {
      long prev = -1;
      for (int i = 0; i <= count; i++) {
        long at = buf.getInt(4 + 4 * i) & 0xFFFFFFFFL;
        if ((i == 0 && at < 4 + 4L * (count + 1)) || at < prev) {
          throw error("has a corrupted offset table");
        }
        offsets[i] = (int) at;
        prev = at;
      }
      if (prev != raw.length) {
        throw error("offsets end at byte " + prev + " but the file has " + raw.length + " bytes");
      }
    }

    /** Rows [start, start+n) of the asked columns into vectors. */
    void decode(int start, int n, OnHeapColumnVector[] vectors, NdArrayColumn.Writer[] arrays) {
      if (vectors.length == 0) {
        return;
      }
      if (f.variable.length == 0) {
        decodeFixed(start, n, vectors, arrays);
        return;
      }
      int columns = f.columns;
      int head = 4 * f.variable.length;
      int[] at = new int[columns];
      int[] width = new int[columns];
      for (int r = 0; r < n; r++) {
        int s = offsets[start + r];
        int end = offsets[start + r + 1];
        if (end - s < head) {
          throw error("a sample is shorter than its size header");
        }
        int v = 0;
        int pos = s + head;
        for (int c = 0; c < columns; c++) {
          int w;
          if (v < f.variable.length && f.variable[v] == c) {
            long size = buf.getInt(s + 4 * v) & 0xFFFFFFFFL;
            v++;
            if (size > end - pos) {
              throw error("a sample's column sizes do not add up to its length");
            }
            w = (int) size;
          } else {
            w = f.sizes[c];
          }
          at[c] = pos;
          width[c] = w;
          pos += w;
        }
        if (pos != end) {
          throw error(f.variable.length == 0
              ? "samples are not all " + (pos - s) + " bytes as its columns imply"
              : "a sample's column sizes do not add up to its length");
        }
        for (int k = 0; k < vectors.length; k++) {
          int mask = f.masks[k];
          if (mask >= 0 && raw[at[mask]] != 0) { // as batch_to_arrow: a nonzero mask byte
            if (arrays[k] != null) {
              arrays[k].putNull(r);
            } else {
              vectors[k].putNull(r);
            }
          } else if (arrays[k] != null) {
            arrays[k].put(r, raw, buf, at[f.stored[k]], width[f.stored[k]]);
          } else {
            put(vectors[k], f.kinds[k], r, at[f.stored[k]], width[f.stored[k]]);
          }
        }
      }
    }

    /** Every column fixed-width: each sample is one row of the same size; a column at a
     * time, the type switched on once per column rather than once per value. */
    private void decodeFixed(int start, int n, OnHeapColumnVector[] vectors,
        NdArrayColumn.Writer[] arrays) {
      int row = 0;
      int[] at = new int[f.columns];
      for (int c = 0; c < f.columns; c++) {
        at[c] = row;
        row += f.sizes[c];
      }
      for (int r = start; r < start + n; r++) {
        if (offsets[r + 1] - offsets[r] != row) {
          throw error("samples are not all " + row + " bytes as its columns imply");
        }
      }
      int base = offsets[start];
      for (int k = 0; k < vectors.length; k++) {
        OnHeapColumnVector v = vectors[k];
        int col = base + at[f.stored[k]];
        int mask = f.masks[k];
        switch (f.kinds[k]) {
          case 0: for (int r = 0; r < n; r++) v.putByte(r, buf.get(col + r * row)); break;
          case 1: for (int r = 0; r < n; r++) v.putShort(r, buf.getShort(col + r * row)); break;
          case 2: for (int r = 0; r < n; r++) v.putInt(r, buf.getInt(col + r * row)); break;
          case 3: for (int r = 0; r < n; r++) v.putLong(r, buf.getLong(col + r * row)); break;
          case 4: for (int r = 0; r < n; r++) v.putFloat(r, buf.getFloat(col + r * row)); break;
          case 5: for (int r = 0; r < n; r++) v.putDouble(r, buf.getDouble(col + r * row)); break;
          case MdsDataset.NDARRAY: for (int r = 0; r < n; r++) arrays[k].put(r, raw, buf, col + r * row, row); break;
          default: for (int r = 0; r < n; r++) v.putBoolean(r, buf.get(col + r * row) != 0);
        }
        if (mask >= 0) { // as batch_to_arrow: a nonzero mask byte is a null
          int m = base + at[mask];
          for (int r = 0; r < n; r++) {
            if (raw[m + r * row] != 0) {
              v.putNull(r);
            }
          }
        }
      }
    }

    private void put(OnHeapColumnVector v, int kind, int r, int at, int w) {
      switch (kind) {
        case 0: v.putByte(r, buf.get(at)); break;
        case 1: v.putShort(r, buf.getShort(at)); break;
        case 2: v.putInt(r, buf.getInt(at)); break;
        case 3: v.putLong(r, buf.getLong(at)); break;
        case 4: v.putFloat(r, buf.getFloat(at)); break;
        case 5: v.putDouble(r, buf.getDouble(at)); break;
        case 8: v.putBoolean(r, buf.get(at) != 0); break;
        default: v.putByteArray(r, raw, at, w);
      }
    }
  }
}
