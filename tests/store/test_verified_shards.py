"""A local shard passes its hash check once per machine: later processes (DataLoader workers
forked for every pass) skip the hash of that very file, and any rewrite is checked again."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import spark_dl_core.sources.shard_loading as shard_loading
from spark_dl_core import HashMismatchError, open_dataset, write_mds


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The hashes computed while loading shards (the real functions, counted)."""
    seen: list[str] = []
    digest, content = shard_loading.digest, shard_loading.content_hash

    def counted_digest(name: str, data: object) -> str:
        seen.append(name)
        return digest(name, data)  # type: ignore[arg-type]

    def counted_content(data: object) -> str:
        seen.append("content")
        return content(data)  # type: ignore[arg-type]

    monkeypatch.setattr(shard_loading, "digest", counted_digest)
    monkeypatch.setattr(shard_loading, "content_hash", counted_content)
    return seen


def _shard(path: Path) -> Path:
    return next(p for p in sorted(path.iterdir()) if p.name.startswith("shard."))


def test_a_verified_file_is_not_hashed_again_until_it_changes(
    tmp_path: Path, hashes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ds"
    write_mds(pa.table({"x": np.arange(1000), "b": [b"%d" % i for i in range(1000)]}), str(path))
    monkeypatch.setattr(shard_loading, "_SETTLED_S", 0.0)  # written just now: trust it anyway
    open_dataset(str(path)).load_shard(0)
    assert hashes  # the first process checks
    hashes.clear()
    again = open_dataset(str(path))  # another process would start from nothing too
    assert again.load_shard(0).count == 1000
    assert hashes == []
    again.load_shard(0, verify_hashes=True)  # asked for: checked on every load
    assert hashes
    hashes.clear()
    time.sleep(0.05)  # past the file system's timestamp tick
    shard = _shard(path)
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF  # in place, same size
    with open(shard, "r+b") as f:
        f.write(data)
    with pytest.raises(HashMismatchError):
        open_dataset(str(path)).load_shard(0)


def test_a_file_written_moments_ago_gets_no_note(tmp_path: Path, hashes: list[str]) -> None:
    path = tmp_path / "ds"
    write_mds(pa.table({"x": np.arange(100)}), str(path))
    first = open_dataset(str(path))
    first.load_shard(0)
    status = os.stat(_shard(path))
    assert first._verified_record(0, status) is None  # changed within the last seconds
    hashes.clear()
    open_dataset(str(path)).load_shard(0)
    assert hashes  # so the next process checks it again
