"""(c) Same bytes: for the same samples and settings our shards and index equal MDSWriter's."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from mosaic_helpers import (
    SAME_BYTES_COLUMNS,
    SAME_BYTES_COMPRESSIONS,
    SAME_BYTES_HASHES,
    SAME_BYTES_SIZE_LIMIT,
    SAME_BYTES_TABLE,
    shard_files,
)

from spark_dl_core import DatasetSpec, write_mds

pytestmark = pytest.mark.mosaic


def _decompress(compression: str | None, data: bytes) -> bytes:
    if compression is None:
        return data
    family = compression.split(":")[0]
    if family == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    if family == "gz":
        return gzip.decompress(data)
    if family == "bz2":
        import bz2

        return bz2.decompress(data)
    if family == "br":
        import brotli

        return brotli.decompress(data)
    import cramjam

    return bytes(cramjam.snappy.decompress_raw(data))


def _gzip_neutral_header(data: bytes) -> bytes:
    """A gzip member with its MTIME (bytes 4-7) and OS (byte 9) header fields zeroed.

    Both are informational (RFC 1952): Python's ``gzip.compress``, which MDSWriter calls,
    stamps the current time and OS 255 ("unknown"); a fixed MTIME makes output reproducible.
    """
    return data[:4] + b"\0\0\0\0" + data[8:9] + b"\0" + data[10:]


def _index_without(index: dict[str, Any], drop_zip_hashes: bool) -> dict[str, Any]:
    if drop_zip_hashes:
        for shard in index["shards"]:
            if shard.get("zip_data"):
                shard["zip_data"]["hashes"] = {}
    return index


@pytest.mark.parametrize("compression", SAME_BYTES_COMPRESSIONS, ids=lambda c: c or "raw")
def test_same_bytes_as_mdswriter(
    side_written: dict[str, Any], tmp_path: Path, compression: str | None
) -> None:
    theirs = side_written["root"] / f"c-{compression or 'raw'}"
    ours = tmp_path / "ours"
    spec = DatasetSpec(
        columns=SAME_BYTES_COLUMNS,
        compression=compression,
        hashes=SAME_BYTES_HASHES,
        shard_size=SAME_BYTES_SIZE_LIMIT,
    )
    write_mds(SAME_BYTES_TABLE, str(ours), spec)
    assert shard_files(ours) == shard_files(theirs)
    assert len(shard_files(theirs)) > 2

    # The uncompressed shard contents first: a difference there is an encoding difference.
    for name in shard_files(theirs):
        mine = _decompress(compression, (ours / name).read_bytes())
        reference = _decompress(compression, (theirs / name).read_bytes())
        assert mine == reference, f"{name}: decompressed shard differs from MDSWriter's"

    is_gz = compression is not None and compression.startswith("gz")
    our_index = _index_without(json.loads((ours / "index.json").read_text()), is_gz)
    their_index = _index_without(json.loads((theirs / "index.json").read_text()), is_gz)
    assert our_index == their_index
    if is_gz:  # gzip stamps the write time into each file; everything else must match
        for name in shard_files(theirs):
            assert _gzip_neutral_header((ours / name).read_bytes()) == _gzip_neutral_header(
                (theirs / name).read_bytes()
            ), name
    else:
        assert (ours / "index.json").read_bytes() == (theirs / "index.json").read_bytes()
        for name in shard_files(theirs):
            assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
