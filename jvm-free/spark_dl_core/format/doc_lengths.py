"""Each shard's document lengths, in a small file beside it (``shard.00000.mds.lengths``).

Why: a packed loader that deals batches over streams must know every stream's row count
before it reads a shard. ``concat`` rows follow from a stream's total tokens (recorded per
shard in ``spark_dl.json``), but ``bin`` rows (best fit) and a mixture's share of a source
depend on each document's length. The writer therefore stores, per shard, the number of
values in each row of every list-of-integers column (a token document's length), read
instead of the shard. Every rank reads every shard's lengths (it counts every stream's
rows), so they are kept small: 1.2-1.7 bytes a document measured on uniform and long-tailed
lengths, under 0.1% of a shard of 1,000-token documents.

The file is zstd-compressed; decompressed, it holds for each recorded column in sorted name
order one little-endian uint32 per sample of the shard, all of them byte-shuffled (every
value's first byte, then every second byte, ...: the high bytes, mostly zero, compress to
little). ``spark_dl.json`` names it in the shard's entry (``lengths``: basename, stored
bytes, hashes of the stored bytes) beside ``values`` (the columns and their totals);
``index.json`` does not, so Mosaic's readers never see it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import DatasetError, DecompressionError
from .compression import Codec
from .hashing import STORED_HASH, digest
from .index import FileInfo

SUFFIX = ".lengths"
_MAX = (1 << 32) - 1
_CODEC = Codec("zstd", 3)


def lengths_file(shard_basename: str) -> str:
    """The lengths file of the shard whose raw (uncompressed) file is ``shard_basename``."""
    return shard_basename + SUFFIX


def encode_lengths(name: str, columns: Mapping[str, np.ndarray]) -> tuple[bytes, FileInfo]:
    """The file ``name`` holding ``columns`` (each: one length per sample), and its entry."""
    parts = []
    for column in sorted(columns):
        got = np.asarray(columns[column], dtype=np.int64)
        if len(got) and (int(got.min()) < 0 or int(got.max()) > _MAX):
            raise DatasetError(f"column {column!r}: a row holds more than {_MAX} values")
        parts.append(got.astype("<u4"))
    values = np.concatenate(parts) if parts else np.zeros(0, "<u4")
    planes = values.view(np.uint8).reshape(-1, 4).T  # byte-shuffled: plane by plane
    data = _CODEC.compress(np.ascontiguousarray(planes).tobytes())
    return data, FileInfo(name, len(data), {STORED_HASH: digest(STORED_HASH, data)})


def decode_lengths(
    data: bytes, info: FileInfo, columns: list[str], samples: int, shown: str
) -> dict[str, np.ndarray]:
    """Each of ``columns``' lengths from a lengths file's bytes, checked against its entry
    (its size and hash) and against the shard (``samples`` per column); a mismatch names
    the file."""
    if len(data) != info.bytes:
        raise DatasetError(
            f"{shown}: {len(data)} bytes, the dataset's metadata records {info.bytes}"
        )
    expected = info.hashes.get(STORED_HASH)
    if expected is not None and digest(STORED_HASH, data) != expected:
        raise DatasetError(f"{shown}: {STORED_HASH} does not match the metadata (corrupted)")
    want = 4 * samples * len(columns)
    try:
        raw = _CODEC.decompress(data, want)
    except DecompressionError as exc:
        raise DatasetError(f"{shown}: not a lengths file ({exc})") from None
    if len(raw) != want:
        raise DatasetError(
            f"{shown}: holds {len(raw) // 4} lengths, the shard has {samples} samples x "
            f"{len(columns)} column(s): not this shard's lengths"
        )
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(4, -1)
    flat = np.ascontiguousarray(planes.T).view("<u4").reshape(-1).astype(np.int64)
    return {c: flat[i * samples : (i + 1) * samples] for i, c in enumerate(sorted(columns))}
