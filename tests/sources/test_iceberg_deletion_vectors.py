"""Deletion vectors (Iceberg v3 Puffin blobs) are checked before a position is used.

The Puffin files here are laid out by hand as the table spec frames them (file magic,
``deletion-vector-v1`` blobs: length, magic, a portable Roaring bitmap per 32-bit key, CRC-32,
then the JSON footer), so each damage is exactly the one named. A Spark-written v3 table
with a damaged vector is tested in tests/spark/test_iceberg_spark.py.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import numpy as np
import pytest

pytest.importorskip("pyiceberg")
pyroaring = pytest.importorskip("pyroaring")

from spark_dl_core.tables.iceberg.deletion_vectors import (  # noqa: E402
    MAGIC,
    entry_vector,
    read_vectors,
)

DATA = "file:/warehouse/t/data/part-0.parquet"
OTHER = "file:/warehouse/t/data/part-1.parquet"


def vector_blob(positions: list[int]) -> bytes:
    """One ``deletion-vector-v1`` blob deleting ``positions`` (any 64-bit positions)."""
    keys: dict[int, list[int]] = {}
    for p in sorted(positions):
        keys.setdefault(p >> 32, []).append(p & 0xFFFFFFFF)
    body = len(keys).to_bytes(8, "little")
    for key, low in sorted(keys.items()):
        body += key.to_bytes(4, "little") + pyroaring.BitMap(low).serialize()
    framed = MAGIC + body
    return len(framed).to_bytes(4, "big") + framed + zlib.crc32(framed).to_bytes(4, "big")


def puffin(blobs: list[tuple[bytes, str]]) -> tuple[bytes, list[dict[str, Any]]]:
    """A Puffin file of ``blobs`` (bytes, referenced data file) and its footer's entries."""
    out, meta = b"PFA1", []
    for blob, referenced in blobs:
        meta.append(
            {
                "type": "deletion-vector-v1",
                "fields": [2147483645],
                "snapshot-id": -1,
                "sequence-number": -1,
                "offset": len(out),
                "length": len(blob),
                "properties": {"referenced-data-file": referenced},
            }
        )
        out += blob
    footer = json.dumps({"blobs": meta, "properties": {}}).encode()
    tail = len(footer).to_bytes(4, "little") + bytes(4) + b"PFA1"
    return out + b"PFA1" + footer + tail, meta


def entry(meta: dict[str, Any], record_count: int, **v3: Any) -> Any:
    """The manifest entry of a deletion vector, as PyIceberg reads one from a v3 manifest."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    fields = {
        "referenced_data_file": meta["properties"]["referenced-data-file"],
        "content_offset": meta["offset"],
        "content_size_in_bytes": meta["length"],
        **v3,
    }
    return DataFile.from_args(
        3,
        content=DataFileContent.POSITION_DELETES,
        file_path="file:/warehouse/t/data/deletes.puffin",
        file_format=FileFormat.PUFFIN,
        record_count=record_count,
        file_size_in_bytes=100,
        **fields,
    )


def test_vectors_read_as_their_positions_and_match_their_entries() -> None:
    wide = [0, 7, 8, 1 << 32, (1 << 32) + 5, (3 << 32) + 1]
    data, meta = puffin([(vector_blob([1, 5, 9]), DATA), (vector_blob(wide), OTHER)])
    vectors = read_vectors(data)
    assert sorted(vectors) == [meta[0]["offset"], meta[1]["offset"]]
    first = entry_vector(vectors, entry(meta[0], 3), DATA)
    assert first is not None and first.positions.tolist() == [1, 5, 9]
    second = entry_vector(vectors, entry(meta[1], len(wide)), OTHER)
    assert second is not None and second.positions.tolist() == wide
    assert second.positions.dtype == np.int64
    # an entry asked for another data file's rows gives none, once checked
    assert entry_vector(vectors, entry(meta[0], 3), OTHER) is None


def test_an_entry_without_its_v3_fields_is_matched_by_the_data_file() -> None:
    """As PyIceberg reads a v3 manifest (no offset, size or data file), pairing the entry
    with every data file of its partition: each data file gets the blob naming it."""
    data, meta = puffin([(vector_blob([2, 3]), DATA), (vector_blob([4]), OTHER)])
    vectors = read_vectors(data)
    blank = {"content_offset": None, "content_size_in_bytes": None, "referenced_data_file": None}
    bare = entry(meta[1], 1, **blank)
    found = entry_vector(vectors, bare, DATA)
    assert found is not None and found.positions.tolist() == [2, 3]
    found = entry_vector(vectors, bare, OTHER)
    assert found is not None and found.positions.tolist() == [4]
    assert entry_vector(vectors, bare, "file:/warehouse/t/data/part-2.parquet") is None
    with pytest.raises(ValueError, match="no vector in it deletes 5 rows"):
        entry_vector(vectors, entry(meta[1], 5, **blank), DATA)


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda b: b[:46] + bytes([b[46] ^ 0x01]) + b[47:], "CRC-32 does not match"),
        (lambda b: b[:4] + b"\xd1\xd3\x39\x65" + b[8:], "magic bytes d1d33965"),
        (lambda b: (int.from_bytes(b[:4], "big") + 1).to_bytes(4, "big") + b[4:], "length prefix"),
    ],
    ids=["bit flipped in the bitmap", "magic", "length"],
)
def test_a_damaged_blob_is_refused_saying_why(damage: Any, why: str) -> None:
    """Refused: a bit flipped inside the bitmap, a wrong magic, a wrong length prefix."""
    blob = damage(vector_blob([1, 5, 9, 4000, 70000]))
    data, _ = puffin([(blob, DATA)])
    with pytest.raises(ValueError, match=why):
        read_vectors(data)


def test_the_flipped_bit_reads_as_another_row_without_the_crc() -> None:
    """Why the CRC is checked: the bitmap of the blob above with that bit flipped is a
    valid bitmap, deleting row 4 instead of row 5."""
    from pyiceberg.table.deletion_vector import DeletionVector

    blob = vector_blob([1, 5, 9, 4000, 70000])
    flipped = blob[:46] + bytes([blob[46] ^ 0x01]) + blob[47:]
    bitmaps = DeletionVector._deserialize_bitmap(flipped[8:-4])
    assert sorted(p for bitmap in bitmaps for p in bitmap) == [1, 4, 9, 4000, 70000]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"record_count": 4}, "deletes 3 rows, its manifest entry's record count is 4"),
        ({"content_offset": 5}, "points at byte 5, where no vector starts"),
        ({"content_size_in_bytes": 7}, "its manifest entry says 7"),
        ({"referenced_data_file": OTHER}, "its manifest entry for"),
    ],
)
def test_an_entry_that_disagrees_with_its_vector_is_refused(
    change: dict[str, Any], why: str
) -> None:
    data, meta = puffin([(vector_blob([1, 5, 9]), DATA)])
    count = change.pop("record_count", 3)
    with pytest.raises(ValueError, match=why):
        entry_vector(read_vectors(data), entry(meta[0], count, **change), DATA)
