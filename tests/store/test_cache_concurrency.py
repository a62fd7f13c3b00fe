"""Several processes sharing one shard cache directory under a small limit, against moto.

Each reader is a separate Python process (a rank of 4), reading two shuffled epochs of a
remote dataset through one cache dir smaller than the dataset: every batch is compared
with the values it must hold, every sample is seen exactly once per epoch, nothing hangs
(each process runs under a timeout). Separate tests show that eviction skips a shard
another process holds, and that a process SIGKILLed mid-download blocks nobody.
"""

from __future__ import annotations

import json
import os
import signal
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

from s3_helpers import aws_test_env, endpoint_options, moto_server

from spark_dl_core import DatasetSpec, open_dataset, write_mds
from spark_dl_core.store.cache import ShardCache

N = 4000
WORLD = 4
TIMEOUT_S = 60


def _values(ids: np.ndarray) -> np.ndarray:
    x = ids.astype(np.float32)
    return np.stack([x, x + 0.5, -x, x * 2], axis=1)


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, Any]]:
    with moto_server() as (host, port), aws_test_env():
        import s3fs

        options = endpoint_options(host, port)
        s3fs.S3FileSystem(**options).call_s3("create_bucket", Bucket="bucket")
        ids = np.arange(N, dtype=np.int64)
        table = pa.table({"id": pa.array(ids), "v": pa.array(list(_values(ids)))})
        write_mds(
            table,
            "s3://bucket/ds",
            DatasetSpec(shard_size="8KiB"),
            mode="overwrite",  # moto keeps its buckets in-process, across servers
            storage_options=options,
        )
        yield options


_READER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from spark_dl_core import open_dataset
    from spark_dl_core.store.cached_store import shard_cache
    rank, world, cache_dir, options, out = (
        int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]
    )
    ds = open_dataset("s3://bucket/ds", cache_dir=cache_dir, storage_options=options)
    seen, bad = [], 0
    for epoch in range(2):
        ids = []
        for b in ds.iter_batches(batch_size=64, shuffle=True, seed=7, epoch=epoch, rank=rank,
                                 world_size=world, shuffle_window=2, prefetch_bytes=1):
            v = np.asarray(b["v"].tolist() if b["v"].dtype == object else b["v"], np.float32)
            x = b["id"].astype(np.float32)
            if not np.array_equal(v, np.stack([x, x + 0.5, -x, x * 2], axis=1)):
                bad += 1
            ids.extend(b["id"].tolist())
        seen.append(ids)
    c = shard_cache(ds)
    json.dump({"seen": seen, "bad": bad, "downloads": c.downloads, "hits": c.hits}, open(out, "w"))
    """
)


def _env(limit: int) -> dict[str, str]:
    return {**os.environ, "SPARK_DL_CACHE_BYTES": str(limit), "SPARK_DL_RETRIES": "2"}


def test_processes_share_a_small_cache(s3: dict[str, Any], tmp_path: Path) -> None:
    ds = open_dataset("s3://bucket/ds", storage_options=s3)
    sizes = [s.stored.bytes for s in ds.shards]
    assert ds.num_shards >= 10
    limit = max(sizes) * 6  # < the dataset, > a window (2 shards) + prefetch per process
    cache_dir = tmp_path / "cache"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _READER,
                str(r),
                str(WORLD),
                str(cache_dir),
                json.dumps(s3),
                str(tmp_path / f"r{r}.json"),
            ],
            env=_env(limit),
        )
        for r in range(WORLD)
    ]
    try:
        codes = [p.wait(timeout=TIMEOUT_S) for p in procs]  # no deadlock
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0] * WORLD
    results = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(WORLD)]
    assert sum(r["bad"] for r in results) == 0  # no corrupted batch anywhere
    for epoch in range(2):
        ids = sorted(i for r in results for i in r["seen"][epoch])
        assert ids == list(range(N))  # exactly once per epoch across ranks
    downloads = sum(r["downloads"] for r in results)
    assert downloads > ds.num_shards  # the limit forced evictions and re-downloads
    # The limit is soft while shards are in use; with every reader gone, nothing is held
    # (no stale lock) and one eviction pass brings the cache under it.
    cache = ShardCache(ds.store, str(cache_dir), limit_bytes=limit)
    cache._make_room(0, keep="")
    assert 0 < cache.usage() <= limit
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".tmp-")]


_HOLDER = textwrap.dedent(
    """
    import json, sys, time
    from spark_dl_core import open_dataset
    from spark_dl_core.store.cache import ShardCache
    ds = open_dataset("s3://bucket/ds", storage_options=json.loads(sys.argv[2]))
    cache = ShardCache(ds.store, sys.argv[1], limit_bytes=1 << 30)
    held = cache.fetch(ds.shards[0].stored.basename, ds.shards[0].stored.bytes)
    print("held", flush=True)
    sys.stdin.readline()  # hold the shard until told to stop
    """
)


def test_eviction_skips_a_shard_held_by_another_process(s3: dict[str, Any], tmp_path: Path) -> None:
    ds = open_dataset("s3://bucket/ds", storage_options=s3)
    first = ds.shards[0].stored
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path), json.dumps(s3)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        cache = ShardCache(ds.store, str(tmp_path), limit_bytes=max(first.bytes, 1) * 2)
        for s in ds.shards[1:]:
            cache.fetch(s.stored.basename, s.stored.bytes)
        assert (tmp_path / first.basename).exists()  # in use by the other process
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(timeout=TIMEOUT_S)
    cache.fetch(ds.shards[1].stored.basename, ds.shards[1].stored.bytes)
    assert not (tmp_path / first.basename).exists()  # released: evictable again


_STUCK = textwrap.dedent(
    """
    import sys, time
    from spark_dl_core.store.cache import ShardCache

    class StuckFS:
        def cat_file(self, remote, start=None, end=None, **kw):
            print("writing", flush=True)
            time.sleep(120)  # killed here, mid-download, holding the download lock

    class Store:
        fs = StuckFS()
        def path(self, name):
            return "s3://bucket/ds/" + name
        def display(self, name):
            return self.path(name)
        def redact(self, text):
            return text

    ShardCache(Store(), sys.argv[1]).fetch(sys.argv[2], int(sys.argv[3]))
    """
)


def test_a_process_killed_mid_download_blocks_nothing(s3: dict[str, Any], tmp_path: Path) -> None:
    ds = open_dataset("s3://bucket/ds", storage_options=s3)
    info = ds.shards[0].stored
    stuck = subprocess.Popen(
        [sys.executable, "-c", _STUCK, str(tmp_path), info.basename, str(info.bytes)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stuck.stdout is not None and stuck.stdout.readline().strip() == "writing"
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    finally:
        os.kill(stuck.pid, signal.SIGKILL)
        stuck.wait(timeout=TIMEOUT_S)
    result: list[Any] = []
    cache = ShardCache(ds.store, str(tmp_path))
    t = threading.Thread(target=lambda: result.append(cache.fetch(info.basename, info.bytes)))
    start = time.monotonic()
    t.start()
    t.join(timeout=TIMEOUT_S)
    assert not t.is_alive() and time.monotonic() - start < TIMEOUT_S  # the lock died with it
    assert len(result[0]) == info.bytes and cache.downloads == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]  # cleaned
