"""Parallel, ranged downloads into the shard cache, against moto behind a shaped loopback link.

The link (``s3_helpers.ShapedLink``) delays every byte by half a round trip each way, so
requests that overlap in time show up as connections open at once; it also counts the
requests that ask for a byte range. Nothing here is timed: the bench (bench/remote_bench.py)
measures speed; these tests hold the behaviour.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from s3_helpers import ShapedLink, aws_test_env, endpoint_options, moto_server

from spark_dl_core import DatasetError, DatasetSpec, SpecError, open_dataset, write_mds
from spark_dl_core.store.cache import ShardCache
from spark_dl_core.store.cached_store import shard_cache

N = 4000
URL = "s3://bucket/par"
TIMEOUT_S = 60


def _values(ids: np.ndarray) -> np.ndarray:
    x = ids.astype(np.float32)
    return np.stack([x, x + 0.5, -x, x * 2] * 4, axis=1)


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[dict[str, Any], ShapedLink]]:
    """Storage options through a 40 ms link to moto; the dataset written directly."""
    with moto_server() as (host, port), aws_test_env():
        import s3fs

        direct = endpoint_options(host, port)
        s3fs.S3FileSystem(**direct).call_s3("create_bucket", Bucket="bucket")
        ids = np.arange(N, dtype=np.int64)
        table = pa.table({"id": pa.array(ids), "v": pa.array(list(_values(ids)))})
        spec = DatasetSpec(shard_size="32KiB", hashes=["xxh64"])
        write_mds(table, URL, spec, mode="overwrite", storage_options=direct)
        with ShapedLink((host, port), rtt_s=0.04) as link:
            yield endpoint_options("127.0.0.1", link.port), link


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_DL_PART_BYTES", "8192")  # ~32 KiB shards: 4 ranges each


def _check(batches: list[dict[str, Any]]) -> list[int]:
    ids = np.concatenate([b["id"] for b in batches])
    v = np.concatenate(
        [np.stack(list(b["v"])) if b["v"].dtype == object else b["v"] for b in batches]
    )
    assert np.array_equal(v, _values(ids))
    return sorted(ids.tolist())


def test_shards_arrive_in_concurrent_byte_ranges(
    s3: tuple[dict[str, Any], ShapedLink], tmp_path: Path, small_parts: None
) -> None:
    options, link = s3
    ds = open_dataset(URL, cache_dir=str(tmp_path), storage_options=options)
    assert ds.num_shards >= 6 and min(s.stored.bytes for s in ds.shards[:-1]) > 2 * 8192
    ranged, link.max_open = link.ranged, link.open
    batches = list(ds.iter_batches(batch_size=300, shuffle=True, seed=2, download_threads=6))
    assert _check(batches) == list(range(N))
    cache = shard_cache(ds)
    assert cache.downloads == ds.num_shards  # each shard once
    assert cache.bytes_downloaded == int(ds.shards.stored_bytes.sum())
    assert link.ranged - ranged >= 3 * ds.num_shards  # byte ranges, not whole objects
    assert link.max_open >= 4  # several GETs in flight at once
    assert cache.threads >= 6
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_shard_a_reader_waits_for_comes_over_every_thread(
    s3: tuple[dict[str, Any], ShapedLink], tmp_path: Path, small_parts: None
) -> None:
    """A shard a reader waits for before its download began (an epoch's first) is split
    over every download thread, no finer than an eighth of the part size, so it arrives at
    the link's speed; a shard queued ahead comes in part-size ranges. Its bytes are the
    object's and checked against the index's hash either way."""
    import s3fs

    options, link = s3
    ds = open_dataset(URL, cache_dir=str(tmp_path), storage_options=options)
    cache = shard_cache(ds)
    cache.set_threads(8)
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    first, second = (s.stored for s in ds.shards[:2])
    assert first.bytes > 16 * 1024 and first.hashes  # 8 ranges of 4 KiB, not 4 of 8 KiB
    ranged = link.ranged
    data = cache.fetch(first.basename, first.bytes)
    assert link.ranged - ranged == 8
    assert data.tobytes() == fs.cat_file(f"{URL}/{first.basename}")
    ranged = link.ranged
    cache.prefetch([(second.basename, second.bytes, second.hashes)])
    deadline = time.monotonic() + TIMEOUT_S
    while not (tmp_path / second.basename).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert link.ranged - ranged == -(-second.bytes // 8192)
    assert cache.fetch(second.basename, second.bytes).tobytes() == fs.cat_file(
        f"{URL}/{second.basename}"
    )
    assert cache.downloads == 2 and cache.redownloads == 0


def test_loader_stats_show_downloads(s3: tuple[dict[str, Any], ShapedLink], tmp_path: Path) -> None:
    options, _link = s3
    ds = open_dataset(URL, cache_dir=str(tmp_path), storage_options=options)
    loader = ds.to_torch(batch_size=500, shuffle=True, seed=1, download_threads=3)
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(N))
    stats = loader.stats()
    assert stats["download_bytes"] == int(ds.shards.stored_bytes.sum())
    assert stats["download_bytes_per_s"] > 0 and stats["network_wait_s"] >= 0
    assert stats["workers"]["main"]["download_bytes"] == stats["download_bytes"]
    loader.set_epoch(1)  # warm: nothing downloaded
    assert sum(len(b["id"]) for b in loader) == N
    assert loader.stats()["download_bytes"] == 0
    with pytest.raises(SpecError, match="download_threads"):
        ds.to_torch(batch_size=8, download_threads=0)


def test_a_shard_locked_by_another_downloader_stalls_nothing_else(
    s3: tuple[dict[str, Any], ShapedLink], tmp_path: Path
) -> None:
    """While another process holds shard 0's download lock, this one downloads the rest;
    only fetching shard 0 waits, and downloads it once the lock is free."""
    options, _link = s3
    ds = open_dataset(URL, storage_options=options)
    cache = ShardCache(ds.store, str(tmp_path), threads=4)
    first = ds.shards[0].stored
    held = cache._lock(first.basename, "dl")
    fcntl.flock(held, fcntl.LOCK_EX)  # as a slow downloader elsewhere would
    try:
        cache.prefetch([(s.stored.basename, s.stored.bytes, None) for s in ds.shards])
        others = {s.stored.basename for s in ds.shards[1:]}
        deadline = time.monotonic() + TIMEOUT_S
        while not others <= {p.name for p in tmp_path.iterdir()}:
            assert time.monotonic() < deadline, "the other shards were not downloaded"
            time.sleep(0.05)
        assert not (tmp_path / first.basename).exists()
        got: list[Any] = []
        waiter = threading.Thread(
            target=lambda: got.append(cache.fetch(first.basename, first.bytes))
        )
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive() and not got  # waits for the lock holder
    finally:
        os.close(held)
    waiter.join(TIMEOUT_S)
    assert len(got[0]) == first.bytes and cache.downloads == ds.num_shards
    cache.release([s.stored.basename for s in ds.shards])


_READER = textwrap.dedent(
    """
    import json, sys
    from spark_dl_core import open_dataset
    from spark_dl_core.store.cached_store import shard_cache
    cache_dir, options, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    ds = open_dataset("s3://bucket/par", cache_dir=cache_dir, storage_options=options)
    ids = [i for b in ds.iter_batches(batch_size=256, shuffle=True, seed=4) for i in b["id"]]
    json.dump({"ids": sorted(int(i) for i in ids), "downloads": shard_cache(ds).downloads},
              open(out, "w"))
    """
)


def test_processes_on_one_machine_download_each_shard_once(
    s3: tuple[dict[str, Any], ShapedLink], tmp_path: Path
) -> None:
    options, _link = s3
    cache_dir = tmp_path / "cache"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _READER,
                str(cache_dir),
                json.dumps(options),
                str(tmp_path / f"{r}.json"),
            ]
        )
        for r in range(2)
    ]
    try:
        assert [p.wait(timeout=TIMEOUT_S) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert all(r["ids"] == list(range(N)) for r in results)
    ds = open_dataset(URL, storage_options=options)
    assert sum(r["downloads"] for r in results) == ds.num_shards


def test_unreachable_store_or_missing_credentials_is_a_clear_error(
    s3: tuple[dict[str, Any], ShapedLink], monkeypatch: pytest.MonkeyPatch
) -> None:
    options, _link = s3
    import s3fs

    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    secret = "sEcReT-unreachable-42"
    closed = {"key": "AKID", "secret": secret, **endpoint_options("127.0.0.1", 1)}
    started = time.monotonic()
    with pytest.raises(DatasetError, match=r"s3://bucket/par/index\.json: cannot be read") as info:
        open_dataset(URL, storage_options=closed)
    assert secret not in str(info.value) and time.monotonic() - started < TIMEOUT_S
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    with pytest.raises(DatasetError, match=r"s3://bucket/par/index\.json.*Credentials"):
        open_dataset(URL, storage_options={**options, "skip_instance_cache": True})


def test_download_threads_can_be_lowered(
    s3: tuple[dict[str, Any], ShapedLink], tmp_path: Path
) -> None:
    options, _link = s3
    ds = open_dataset(URL, storage_options=options)
    cache = ShardCache(ds.store, str(tmp_path), threads=4)
    assert cache._running == 0  # threads start with the first download
    cache.prefetch([(s.stored.basename, s.stored.bytes, None) for s in ds.shards[:2]])
    assert cache._running == 4
    cache.set_threads(1)
    deadline = time.monotonic() + TIMEOUT_S
    while cache._running > 1:  # the extra ones end once idle
        assert time.monotonic() < deadline
        time.sleep(0.05)
    info = ds.shards[2].stored
    assert len(cache.fetch(info.basename, info.bytes)) == info.bytes and cache._running == 1
    cache.release([s.stored.basename for s in ds.shards[:2]])


def test_dataloader_workers_download_each_shard_once(
    s3: tuple[dict[str, Any], ShapedLink], tmp_path: Path
) -> None:
    options, _link = s3
    ds = open_dataset(URL, cache_dir=str(tmp_path), storage_options=options)
    loader = ds.to_torch(batch_size=200, shuffle=True, seed=3, num_workers=2)
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(N))
    stats = loader.stats()
    assert set(stats["workers"]) == {"worker 0", "worker 1"}
    # Both workers read every window; each shard came over the network once.
    assert stats["download_bytes"] == int(ds.shards.stored_bytes.sum())
