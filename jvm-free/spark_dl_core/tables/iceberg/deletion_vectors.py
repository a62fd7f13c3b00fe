"""Iceberg v3 deletion vectors (Puffin ``deletion-vector-v1`` blobs), read and checked.

Why not PyIceberg's reader alone: it takes a blob's bitmap without checking the blob's
framing (its length prefix, its magic bytes) or its CRC-32, so a damaged blob can
deserialize into other positions, and deleted rows come back or live rows go, silently.
Here each blob is checked as the table spec frames it (length, magic ``D1 D3 39 64``, the
portable 64-bit Roaring bitmap, CRC-32 of magic and vector), and each manifest entry's
vector against its blob (where it starts, its size, the data file it names, and its
cardinality, which is the entry's record count), before any position is used.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

BLOB_TYPE = "deletion-vector-v1"
MAGIC = bytes([0xD1, 0xD3, 0x39, 0x64])
REFERENCED = "referenced-data-file"


@dataclass(frozen=True)
class Vector:
    """One blob's deleted positions (ascending) and where it lies in its Puffin file."""

    data_file: str
    offset: int
    length: int
    positions: np.ndarray


def read_vectors(data: bytes) -> dict[int, Vector]:
    """The deletion vectors of Puffin file ``data``, by their blobs' offsets; ValueError,
    saying which blob and why, for a file or blob not framed as the spec says."""
    from pyiceberg.table.deletion_vector import DeletionVector
    from pyiceberg.table.puffin import PuffinFile

    puffin = PuffinFile(data)  # the file's magic bytes and its footer
    vectors: dict[int, Vector] = {}
    for blob in puffin.footer.blobs:
        if blob.type != BLOB_TYPE:
            continue
        where = f"blob at byte {blob.offset}"
        if blob.compression_codec is not None:
            raise ValueError(f"{where} is compressed ({blob.compression_codec}): vectors are not")
        if blob.offset < len(MAGIC) or blob.offset + blob.length > len(data) or blob.length < 12:
            raise ValueError(f"{where} ({blob.length} bytes) lies outside the file's blobs")
        raw = data[blob.offset : blob.offset + blob.length]
        size = int.from_bytes(raw[:4], "big")
        if size != len(raw) - 8:
            raise ValueError(
                f"{where}: its length prefix says {size} bytes of magic and vector, the blob "
                f"holds {len(raw) - 8}"
            )
        if raw[4:8] != MAGIC:
            raise ValueError(f"{where}: magic bytes {raw[4:8].hex()}, not {MAGIC.hex()}")
        if zlib.crc32(raw[4:-4]) != int.from_bytes(raw[-4:], "big"):
            raise ValueError(f"{where}: its CRC-32 does not match its bytes (damaged)")
        referenced = blob.properties.get(REFERENCED)
        if not referenced:
            raise ValueError(f"{where} names no {REFERENCED}")
        bitmaps = DeletionVector._deserialize_bitmap(raw[8:-4])
        chunks = [
            np.frombuffer(b.to_array(), dtype=np.uint32).astype(np.int64) + (k << 32)
            for k, b in enumerate(bitmaps)
        ]
        positions = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64)
        vectors[int(blob.offset)] = Vector(referenced, int(blob.offset), len(raw), positions)
    return vectors


def entry_vector(vectors: dict[int, Vector], entry: Any, uri: str) -> Vector | None:
    """The vector manifest entry ``entry`` (a PyIceberg DataFile of a deletion vector, read
    with its v3 fields: ``deletes.manifest_entries``) points at, checked against it, when it
    is data file ``uri``'s (else None); ValueError saying what disagrees.

    An entry without its offset or data file is refused: the spec requires both, and
    matching a vector by the data file its Puffin footer names instead would trust a footer
    that no checksum covers (a damaged name moves deletes to another file, or drops them)."""
    offset = _v3_field(entry, "content_offset")
    named = _v3_field(entry, "referenced_data_file")
    if offset is None or named is None:
        raise ValueError(
            "its manifest entry gives no content_offset or referenced_data_file, which a "
            "deletion vector's entry must (Iceberg v3)"
        )
    found = vectors.get(int(offset))
    if found is None:
        raise ValueError(f"its manifest entry points at byte {offset}, where no vector starts")
    size = _v3_field(entry, "content_size_in_bytes")
    if size is not None and int(size) != found.length:
        raise ValueError(
            f"the vector at byte {found.offset} is {found.length} bytes, its manifest entry "
            f"says {size}"
        )
    if named != found.data_file:
        raise ValueError(
            f"the vector at byte {found.offset} is for {found.data_file}, its manifest entry "
            f"for {named}"
        )
    if len(found.positions) != int(entry.record_count):
        raise ValueError(
            f"the vector at byte {found.offset} deletes {len(found.positions)} rows, its "
            f"manifest entry's record count is {entry.record_count}"
        )
    return found if found.data_file == uri else None


def vector_target(entry: Any) -> str:
    """The data file whose rows a deletion vector's manifest entry deletes; ValueError where
    the entry does not say (the spec requires it; PyIceberg's own manifest reader drops it)."""
    named = _v3_field(entry, "referenced_data_file")
    if named is None:
        raise ValueError(
            f"the deletion vector entry of {entry.file_path} names no referenced_data_file, "
            "which a deletion vector's entry must (Iceberg v3)"
        )
    return str(named)


def _v3_field(entry: Any, name: str) -> Any:
    """A format-version-3 field of a manifest entry's data file (PyIceberg keeps them by
    position only); None where the entry was read without it."""
    from pyiceberg.manifest import DATA_FILE_TYPE

    at = [f.name for f in DATA_FILE_TYPE[3].fields].index(name)
    return entry[at] if len(entry) > at else None
