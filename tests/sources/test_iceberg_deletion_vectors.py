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


def test_an_entry_without_its_v3_fields_is_refused() -> None:
    """An entry giving no offset or data file (as PyIceberg's own manifest reader leaves
    every entry) is refused, not matched by the data file the Puffin footer names: the
    footer has no checksum, and a damaged name there moved one file's deletes to another or
    dropped them (the fuzzing below found it)."""
    data, meta = puffin([(vector_blob([2, 3]), DATA), (vector_blob([4]), OTHER)])
    vectors = read_vectors(data)
    for blank in ("content_offset", "referenced_data_file"):
        bare = entry(meta[0], 2, **{blank: None})
        with pytest.raises(ValueError, match="gives no content_offset or referenced_data_file"):
            entry_vector(vectors, bare, DATA)


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


def _mutate(data: bytes, rng: np.random.Generator) -> bytes:
    """``data`` damaged once: a byte or a bit changed, a cut, bytes inserted or removed, or a
    number in the footer's JSON (an offset, a length, a snapshot id...) changed."""
    kind = int(rng.integers(6))
    at = int(rng.integers(len(data)))
    if kind == 0:
        return data[:at] + bytes([int(rng.integers(256))]) + data[at + 1 :]
    if kind == 1:
        return data[:at] + bytes([data[at] ^ (1 << int(rng.integers(8)))]) + data[at + 1 :]
    if kind == 2:
        return data[:at]
    if kind == 3:
        return data[:at] + rng.bytes(int(rng.integers(1, 9))) + data[at:]
    if kind == 4:
        return data[:at] + data[at + int(rng.integers(1, 9)) :]
    digits = [i for i, c in enumerate(data) if chr(c).isdigit() and i > data.rfind(b"PFA1", 0, -1)]
    i = digits[int(rng.integers(len(digits)))]
    return data[:i] + str(int(rng.integers(10))).encode() + data[i + 1 :]


def test_random_damage_is_refused_or_reads_the_same_positions() -> None:
    """2,000 seeded single damages of a Puffin file of three vectors (one across 32-bit
    keys): each read either fails (the snapshot's reader turns any failure into an
    IcebergSnapshotError naming the file) or gives every data file the very positions it
    had; never other rows deleted. Blob damage meets the framing and the CRC-32, footer
    damage the entries' offsets, sizes, data files and record counts."""
    third = "file:/warehouse/t/data/part-2.parquet"
    wanted = {DATA: [1, 5, 9, 4000], OTHER: [0, 7, 1 << 32, (1 << 32) + 70000], third: [3]}
    data, meta = puffin([(vector_blob(p), uri) for uri, p in wanted.items()])
    entries = [entry(m, len(p)) for m, p in zip(meta, wanted.values(), strict=True)]

    def read(raw: bytes) -> dict[str, list[int]]:
        vectors = read_vectors(raw)
        got: dict[str, list[int]] = {}
        for e, uri in zip(entries, wanted, strict=True):
            found = entry_vector(vectors, e, uri)
            got[uri] = [] if found is None else found.positions.tolist()
        return got

    assert read(data) == wanted
    rng = np.random.default_rng(20261129)
    outcomes = {"same": 0, "refused": 0}
    for case in range(2000):
        damaged = _mutate(data, rng)
        try:
            got = read(damaged)
        except Exception:  # any failure: the snapshot's reader refuses the table
            outcomes["refused"] += 1
            continue
        assert got == wanted, f"case {case}: damage read as other positions: {got}"
        outcomes["same"] += 1
    assert outcomes["refused"] > 1000  # most damage is seen, not shrugged off
