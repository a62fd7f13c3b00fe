"""The compact binary index: written at commit, read on open, built for Mosaic-written
datasets, refused when it disagrees with index.json, skipped with a warning when absent."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetError, DatasetSpec, open_dataset, write_compact_index, write_mds
from spark_dl_core.errors import MetadataError
from spark_dl_core.format.compact import COMPACT_FILE
from spark_dl_core.format.index import INDEX_FILE, META_FILE


def _write(path: Path, n: int = 3000) -> Path:
    table = pa.table(
        {"id": pa.array(np.arange(n, dtype=np.int64)), "s": [str(i) for i in range(n)]}
    )
    write_mds(
        table, str(path), DatasetSpec(shard_size="4KiB", compression="zstd", hashes=["xxh64"])
    )
    return path


def test_commit_writes_it_and_open_reads_it(tmp_path: Path) -> None:
    path = _write(tmp_path / "ds")
    assert (path / COMPACT_FILE).exists()
    index_before = (path / INDEX_FILE).read_bytes()
    ds = open_dataset(str(path))
    assert ds._compact is not None and ds._index_text is None  # index.json was not parsed
    assert ds.num_shards > 10
    (path / COMPACT_FILE).rename(tmp_path / "aside")
    with pytest.warns(UserWarning, match="no compact index"):
        slow = open_dataset(str(path))
    assert slow._compact is None
    assert list(ds.shards) == list(slow.shards)  # the same ShardInfo, field for field
    assert ds.fingerprint == slow.fingerprint and len(ds) == len(slow) == 3000
    assert np.array_equal(ds.shard_offsets, slow.shard_offsets)
    got = np.concatenate([b["id"] for b in ds.iter_batches(500, shuffle=True, seed=1)])
    assert sorted(got.tolist()) == list(range(3000))
    assert (path / INDEX_FILE).read_bytes() == index_before  # index.json untouched


def test_built_for_a_dataset_without_one(tmp_path: Path) -> None:
    """Mosaic writes index.json only: spark-dl index / write_compact_index add ours."""
    path = _write(tmp_path / "ds")
    (path / COMPACT_FILE).unlink()
    (path / META_FILE).unlink()  # like a Mosaic-written dataset: no spark-dl metadata
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = open_dataset(str(path))
        open_dataset(str(path))
    assert sum("no compact index" in str(w.message) for w in caught) == 1  # warned once
    written = write_compact_index(str(path))
    assert written.endswith(COMPACT_FILE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        after = open_dataset(str(path))
    assert after._compact is not None
    assert after.fingerprint == before.fingerprint  # the index fingerprint, unchanged
    assert list(after.shards) == list(before.shards)


@pytest.mark.parametrize("field", ["samples", "basename", "bytes"])
def test_disagreeing_compact_index_is_refused_naming_the_shard(tmp_path: Path, field: str) -> None:
    path = _write(tmp_path / "ds")
    index = json.loads((path / INDEX_FILE).read_text())
    shard = index["shards"][3]
    if field == "samples":
        shard["samples"] -= 1
    elif field == "basename":
        shard["zip_data"]["basename"] = "other.mds.zstd"
    else:
        shard["zip_data"]["bytes"] += 1
    (path / INDEX_FILE).write_text(json.dumps(index, sort_keys=True))
    with pytest.raises(DatasetError, match=r"disagrees with index.json: shard 3 .*spark-dl index"):
        open_dataset(str(path))


def test_corrupt_compact_index_falls_back_only_to_a_verified_index_json(tmp_path: Path) -> None:
    """Damaged: index.json is read (with a warning) only when it matches the digest
    spark_dl.json records; without that record the damage is an error naming the file."""
    path = _write(tmp_path / "ds")
    good = list(open_dataset(str(path)).shards)
    data = bytearray((path / COMPACT_FILE).read_bytes())
    data[len(data) // 2] ^= 0x40  # one flipped bit in the Arrow bytes, caught by the digest
    (path / COMPACT_FILE).write_bytes(bytes(data))
    with pytest.warns(UserWarning, match=r"spark_dl\.index\.arrow: digest .* reading index.json"):
        ds = open_dataset(str(path))
    assert ds._compact is None and list(ds.shards) == good
    (path / COMPACT_FILE).write_bytes(b"not arrow at all")
    meta = json.loads((path / META_FILE).read_text())
    del meta["index_digest"], meta["digest"]  # as written before the record existed
    (path / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(MetadataError, match=r"spark_dl\.index\.arrow: truncated") as info:
        open_dataset(str(path))
    assert info.value.file.endswith(COMPACT_FILE)


def test_compact_index_of_version_1_is_passed_over(tmp_path: Path) -> None:
    """Built by an older spark-dl (a bare Arrow file, no digest): never parsed."""
    path = _write(tmp_path / "ds")
    (path / COMPACT_FILE).write_bytes(b"ARROW1\0\0" + b"\xff" * 64)
    with pytest.warns(UserWarning, match="older spark-dl"):
        ds = open_dataset(str(path))
    assert ds._compact is None and len(ds) == 3000


def test_cli_index(tmp_path: Path) -> None:
    from spark_dl.cli import main

    path = _write(tmp_path / "ds")
    (path / COMPACT_FILE).unlink()
    assert main(["index", str(path)]) == 0
    assert open_dataset(str(path))._compact is not None
    assert main(["index", str(tmp_path / "missing")]) == 1
