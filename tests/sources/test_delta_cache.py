"""One conversion of a row group per machine: a process that needs a row group another
process is converting reads what that one caches (tables/parquet/cache.RowGroupCache.claim)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

deltalake = pytest.importorskip("deltalake")
from deltalake import WriterProperties, write_deltalake  # noqa: E402

from spark_dl_core.tables.delta import in_place as delta_inplace  # noqa: E402
from spark_dl_core.tables.delta.table import open_delta  # noqa: E402
from spark_dl_core.tables.parquet.cache import RowGroupCache  # noqa: E402


def _table(tmp_path: Path) -> str:
    path = str(tmp_path / "t")
    x = np.arange(600 * 4, dtype=np.float32).reshape(600, 4)
    data = pa.table({"id": np.arange(600), "x": pa.array(list(x), pa.list_(pa.float32()))})
    write_deltalake(path, data, writer_properties=WriterProperties(max_row_group_size=200))
    return path


def test_a_row_group_being_converted_elsewhere_is_read_not_converted(tmp_path: Path) -> None:
    path, cache = _table(tmp_path), str(tmp_path / "cache")
    mine = open_delta(path).dataset(cache_dir=cache)
    other = open_delta(path).dataset(cache_dir=cache)  # as a DataLoader worker's copy
    got: dict[str, Any] = {}
    before = delta_inplace.conversions
    with RowGroupCache(cache).claim(mine._cache_key(1)) as held:
        assert held
        waiter = threading.Thread(target=lambda: got.update(data=other.load_shard(1)))
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive() and delta_inplace.conversions == before  # waits, converts none
        data = mine._convert(1, RowGroupCache(cache), mine._cache_key(1))
    waiter.join(30)
    assert delta_inplace.conversions == before + 1
    assert got["data"].raw.tobytes() == data.raw.tobytes()
    assert not list(Path(cache).glob("*.lock"))


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    path, cache = _table(tmp_path), str(tmp_path / "cache")
    ds = open_delta(path).dataset(cache_dir=cache)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    lock = Path(RowGroupCache(cache).path(ds._cache_key(0)) + ".lock")
    lock.parent.mkdir(parents=True)
    lock.write_text(dead)
    started = time.monotonic()
    expected = open_delta(path).dataset(cache=False).load_shard(0).raw.tobytes()
    assert ds.load_shard(0).raw.tobytes() == expected
    assert time.monotonic() - started < 20 and not lock.exists()


def test_a_cached_row_group_is_hashed_once_per_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every pass's fresh process (a DataLoader worker, the next epoch's loader) hashed
    every cached row group again; a file that passed once is trusted until it changes."""
    from spark_dl_core.sources import shard_loading
    from spark_dl_core.tables.parquet import cache as delta_cache

    hashed: list[int] = []
    digest = delta_cache.digest

    def counted(name: str, data: Any) -> str:
        hashed.append(len(data))
        return digest(name, data)

    monkeypatch.setattr(delta_cache, "digest", counted)
    monkeypatch.setattr(shard_loading, "_SETTLED_S", 0.0)  # written just now: trust it anyway
    path, cache = _table(tmp_path), str(tmp_path / "cache")
    expected = open_delta(path).dataset(cache=False).to_arrow()
    open_delta(path).dataset(cache_dir=cache).to_arrow()  # converts and caches
    open_delta(path).dataset(cache_dir=cache).to_arrow()  # reads, hashes, notes
    hashed.clear()
    again = open_delta(path).dataset(cache_dir=cache)  # as a fresh process
    before = delta_inplace.conversions
    assert again.to_arrow().equals(expected)
    assert hashed == [] and delta_inplace.conversions == before
    open_delta(path).dataset(cache_dir=cache).load_shard(1, verify_hashes=True)
    assert hashed
    time.sleep(0.05)  # past the file system's timestamp tick
    victim = Path(RowGroupCache(cache).path(again._cache_key(1)))
    data = bytearray(victim.read_bytes())
    data[len(data) // 3] ^= 0x10  # in place, same size: a value inside a row
    with open(victim, "r+b") as f:
        f.write(data)
    fresh = open_delta(path).dataset(cache_dir=cache)
    assert fresh.to_arrow().equals(expected)
    assert delta_inplace.conversions == before + 1  # caught, converted again


def test_alike_rows_are_converted_straight_into_the_cache_file(tmp_path: Path) -> None:
    """The memory-mapped conversion (RowGroupCache.reserve) publishes exactly the bytes an
    in-memory conversion gives, sealed and read-only, and leaves no temporary file."""
    path, cache = _table(tmp_path), str(tmp_path / "cache")
    cached = open_delta(path).dataset(cache_dir=cache)
    in_memory = open_delta(path).dataset(cache=False)
    for shard in range(len(cached._groups)):
        data = cached.load_shard(shard)
        assert data.raw.tobytes() == in_memory.load_shard(shard).raw.tobytes()
        assert not data.raw.flags.writeable
        again = RowGroupCache(cache).read(cached._cache_key(shard), verify=True)
        assert again is not None and again.tobytes() == data.raw.tobytes()
    assert sorted(p.suffix for p in Path(cache).iterdir()) == [".mds"] * 3


def test_a_reservation_publishes_on_commit_and_nothing_on_abort(tmp_path: Path) -> None:
    """A conversion that fails after it began filling its cache file (the reader's
    ``abort``) leaves no file; a committed one reads back whole and checked."""
    cache = RowGroupCache(str(tmp_path / "cache"))
    payload = np.arange(1000, dtype=np.uint8)
    failed = cache.reserve("a", len(payload))
    assert failed is not None
    failed.payload[:] = payload
    failed.abort()
    assert cache.read("a", verify=True) is None and not list(Path(cache.directory).iterdir())
    done = cache.reserve("b", len(payload))
    assert done is not None
    done.payload[:] = payload
    assert cache.read("b", verify=True) is None  # not published before its commit
    done.commit()
    again = cache.read("b", verify=True)
    assert again is not None and again.tobytes() == payload.tobytes()
    assert [p.name for p in Path(cache.directory).iterdir()] == ["b.mds"]


def test_a_disk_that_refuses_the_file_costs_only_the_cache(tmp_path: Path) -> None:
    """A cache directory that cannot take the file (here: the process's file size limit,
    as a full disk refuses blocks) is an error where the blocks are reserved, not a crash
    in the copy: the row group is converted in memory, read right, and nothing is cached."""
    path, cache = _table(tmp_path), str(tmp_path / "cache")
    script = f"""
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
from spark_dl_core.tables.delta.table import open_delta
ds = open_delta({path!r}).dataset(cache_dir={cache!r})
data = ds.load_shard(1)
print(data.raw.nbytes, ds.to_arrow().column("id").to_pylist() == list(range(600)))
"""
    done = subprocess.run([sys.executable, "-c", script], text=True, capture_output=True)
    assert done.returncode == 0, done.stderr
    nbytes, right = done.stdout.split()
    assert int(nbytes) > 4096 and right == "True"
    assert not list(Path(cache).glob("*.mds")) and not list(Path(cache).glob(".tmp-*"))


def test_without_posix_fallocate_row_groups_are_converted_in_memory_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where Python has no ``os.posix_fallocate`` (macOS), nothing is mapped: the row group
    is converted in memory and written to the cache as before, with the same bytes."""
    import os

    path, cache = _table(tmp_path), str(tmp_path / "cache")
    mapped = open_delta(path).dataset(cache_dir=str(tmp_path / "mapped")).load_shard(2)
    monkeypatch.delattr(os, "posix_fallocate")
    ds = open_delta(path).dataset(cache_dir=cache)
    data = ds.load_shard(2)
    assert data.raw.tobytes() == mapped.raw.tobytes()
    again = RowGroupCache(cache).read(ds._cache_key(2), verify=True)
    assert again is not None and again.tobytes() == mapped.raw.tobytes()
