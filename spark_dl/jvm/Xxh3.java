/*
 * spark-dl JVM scan: XXH3-64 (seed 0, default secret), the hash spark-dl records for every
 * stored shard file (spark_dl.json "stored_hashes": xxh3_64), so the JVM reader checks a
 * shard exactly as the Python reader does. Written from the XXH3 specification; checked
 * against Python's xxhash by tests/spark/test_jvm_scan.py.
 */
package sparkdl.jvm;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;

final class Xxh3 {
  private static final VarHandle LONGS =
      MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
  private static final VarHandle INTS =
      MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.LITTLE_ENDIAN);
  private static final byte[] SECRET = hex("b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671fcb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e");
  private static final long P32_1 = 0x9E3779B1L;
  private static final long P32_2 = 0x85EBCA77L;
  private static final long P32_3 = 0xC2B2AE3DL;
  private static final long P64_1 = 0x9E3779B185EBCA87L;
  private static final long P64_2 = 0xC2B2AE3D27D4EB4FL;
  private static final long P64_3 = 0x165667B19E3779F9L;
  private static final long P64_4 = 0x85EBCA77C2B2AE63L;
  private static final long P64_5 = 0x27D4EB2F165667C5L;
  private static final int STRIPE = 64;
  private static final int STRIPES_PER_BLOCK = (192 - 64) / 8;
  private static final int BLOCK = STRIPE * STRIPES_PER_BLOCK;

  private Xxh3() {}

  private static byte[] hex(String s) {
    byte[] out = new byte[s.length() / 2];
    for (int i = 0; i < out.length; i++) {
      out[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
    }
    return out;
  }

  private static long r64(byte[] b, int at) {
    return (long) LONGS.get(b, at);
  }

  private static long r32(byte[] b, int at) {
    return ((int) INTS.get(b, at)) & 0xFFFFFFFFL;
  }

  /** The hex digest Python's xxhash.xxh3_64_hexdigest gives for b[off, off+len). */
  static String hexdigest(byte[] b, int off, int len) {
    return String.format("%016x", hash(b, off, len));
  }

  static long hash(byte[] b, int off, int len) {
    if (len <= 16) {
      return small(b, off, len);
    }
    if (len <= 128) {
      return upTo128(b, off, len);
    }
    if (len <= 240) {
      return upTo240(b, off, len);
    }
    return longHash(b, off, len);
  }

  private static long small(byte[] b, int off, int len) {
    if (len > 8) {
      long lo = r64(b, off) ^ (r64(SECRET, 24) ^ r64(SECRET, 32));
      long hi = r64(b, off + len - 8) ^ (r64(SECRET, 40) ^ r64(SECRET, 48));
      long acc = len + Long.reverseBytes(lo) + hi + fold(lo, hi);
      return avalanche(acc);
    }
    if (len >= 4) {
      long in1 = r32(b, off);
      long in2 = r32(b, off + len - 4);
      long bitflip = r64(SECRET, 8) ^ r64(SECRET, 16);
      long keyed = (in2 + (in1 << 32)) ^ bitflip;
      return rrmxmx(keyed, len);
    }
    if (len > 0) {
      long c1 = b[off] & 0xFF;
      long c2 = b[off + (len >> 1)] & 0xFF;
      long c3 = b[off + len - 1] & 0xFF;
      long combined = (c1 << 16) | (c2 << 24) | c3 | ((long) len << 8);
      long bitflip = r32(SECRET, 0) ^ r32(SECRET, 4);
      return xxh64Avalanche(combined ^ bitflip);
    }
    return xxh64Avalanche(r64(SECRET, 56) ^ r64(SECRET, 64));
  }

  private static long upTo128(byte[] b, int off, int len) {
    long acc = len * P64_1;
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          acc += mix16(b, off + 48, 96);
          acc += mix16(b, off + len - 64, 112);
        }
        acc += mix16(b, off + 32, 64);
        acc += mix16(b, off + len - 48, 80);
      }
      acc += mix16(b, off + 16, 32);
      acc += mix16(b, off + len - 32, 48);
    }
    acc += mix16(b, off, 0);
    acc += mix16(b, off + len - 16, 16);
    return avalanche(acc);
  }

  private static long upTo240(byte[] b, int off, int len) {
    long acc = len * P64_1;
    int rounds = len / 16;
    for (int i = 0; i < 8; i++) {
      acc += mix16(b, off + 16 * i, 16 * i);
    }
    acc = avalanche(acc);
    for (int i = 8; i < rounds; i++) {
      acc += mix16(b, off + 16 * i, 16 * (i - 8) + 3);
    }
    acc += mix16(b, off + len - 16, 136 - 17);
    return avalanche(acc);
  }

  private static long longHash(byte[] b, int off, int len) {
    long[] acc = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};
    int blocks = (len - 1) / BLOCK;
    for (int n = 0; n < blocks; n++) {
      int base = off + n * BLOCK;
      for (int s = 0; s < STRIPES_PER_BLOCK; s++) {
        accumulate(acc, b, base + s * STRIPE, s * 8);
      }
      scramble(acc);
    }
    int stripes = ((len - 1) - BLOCK * blocks) / STRIPE;
    int base = off + blocks * BLOCK;
    for (int s = 0; s < stripes; s++) {
      accumulate(acc, b, base + s * STRIPE, s * 8);
    }
    accumulate(acc, b, off + len - STRIPE, 192 - STRIPE - 7);
    long result = len * P64_1;
    for (int i = 0; i < 4; i++) {
      result += fold(acc[2 * i] ^ r64(SECRET, 11 + 16 * i), acc[2 * i + 1] ^ r64(SECRET, 19 + 16 * i));
    }
    return avalanche(result);
  }

  private static void accumulate(long[] acc, byte[] b, int at, int secret) {
    for (int i = 0; i < 8; i++) {
      long value = r64(b, at + 8 * i);
      long key = value ^ r64(SECRET, secret + 8 * i);
      acc[i ^ 1] += value;
      acc[i] += (key & 0xFFFFFFFFL) * (key >>> 32);
    }
  }

  private static void scramble(long[] acc) {
    for (int i = 0; i < 8; i++) {
      long a = acc[i];
      a ^= a >>> 47;
      a ^= r64(SECRET, 192 - STRIPE + 8 * i);
      acc[i] = a * P32_1;
    }
  }

  private static long mix16(byte[] b, int at, int secret) {
    return fold(r64(b, at) ^ r64(SECRET, secret), r64(b, at + 8) ^ r64(SECRET, secret + 8));
  }

  private static long fold(long a, long c) {
    return (a * c) ^ (Math.multiplyHigh(a, c) + unsignedCorrection(a, c));
  }

  /** multiplyHigh is signed; the unsigned high word differs by these terms. */
  private static long unsignedCorrection(long a, long c) {
    return ((a >> 63) & c) + ((c >> 63) & a);
  }

  private static long avalanche(long h) {
    h ^= h >>> 37;
    h *= 0x165667919E3779F9L;
    return h ^ (h >>> 32);
  }

  private static long xxh64Avalanche(long h) {
    h ^= h >>> 33;
    h *= P64_2;
    h ^= h >>> 29;
    h *= P64_3;
    return h ^ (h >>> 32);
  }

  private static long rrmxmx(long h, int len) {
    h ^= Long.rotateLeft(h, 49) ^ Long.rotateLeft(h, 24);
    h *= 0x9FB21C651E98DF25L;
    h ^= (h >>> 35) + len;
    h *= 0x9FB21C651E98DF25L;
    return h ^ (h >>> 28);
  }

  /** Hex xxh3_64 of each file named on the command line (the test compares with Python). */
  public static void main(String[] args) throws java.io.IOException {
    for (String a : args) {
      byte[] data = java.nio.file.Files.readAllBytes(java.nio.file.Path.of(a));
      System.out.println(hexdigest(data, 0, data.length));
    }
  }
}
