"""Remote datasets through a real S3-compatible server (moto, on loopback) and the shard cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from s3_helpers import s3_bucket

from spark_dl_core import DatasetSpec, open_dataset, write_mds
from spark_dl_core.store.cache import ShardCache
from spark_dl_core.store.cached_store import shard_cache

N = 3000


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A moto S3 server on 127.0.0.1, credentials in the usual environment variables."""
    with s3_bucket() as made:
        yield made


def _table() -> pa.Table:
    return pa.table(
        {
            "id": pa.array(np.arange(N, dtype=np.int64)),
            "v": pa.array(list(np.random.default_rng(0).random((N, 8), dtype=np.float32))),
        }
    )


def test_write_and_read_through_cache(s3: Any, tmp_path: Path) -> None:
    fs, options = s3
    write_mds(
        _table(),
        "s3://bucket/ds",
        DatasetSpec(shard_size="16KiB", compression="zstd"),
        mode="overwrite",  # moto keeps its buckets in-process: other tests use this path too
        storage_options=options,
    )
    cache_dir = tmp_path / "cache"
    ds = open_dataset("s3://bucket/ds", cache_dir=str(cache_dir), storage_options=options)
    assert ds.num_shards > 4
    loader = ds.to_torch(batch_size=256, shuffle=True, seed=1)
    first = [i for b in loader for i in b["id"].tolist()]
    assert sorted(first) == list(range(N))
    cache = shard_cache(ds)
    assert cache.downloads == ds.num_shards
    assert sorted(p.name for p in cache_dir.iterdir() if not p.name.startswith(".")) == sorted(
        s.stored.basename for s in ds.shards
    )
    # Epoch 2 is served from the cache: no new downloads, even with the objects gone.
    for s in ds.shards:
        fs.rm(f"bucket/ds/{s.stored.basename}")
    loader.set_epoch(1)
    second = [i for b in loader for i in b["id"].tolist()]
    assert sorted(second) == list(range(N)) and second != first
    assert cache.downloads == ds.num_shards and cache.hits >= ds.num_shards
    # A worker process shares the same cache directory.
    loader2 = ds.to_torch(batch_size=256, num_workers=1, columns=["id"])
    assert sorted(i for b in loader2 for i in b["id"].tolist()) == list(range(N))


def test_lru_eviction_skips_shards_in_use(s3: Any, tmp_path: Path) -> None:
    _fs, options = s3
    write_mds(_table(), "s3://bucket/ev", DatasetSpec(shard_size="16KiB"), storage_options=options)
    ds = open_dataset("s3://bucket/ev", storage_options=options)
    sizes = [s.stored.bytes for s in ds.shards]
    cache = ShardCache(ds.store, str(tmp_path / "c"), limit_bytes=max(sizes) * 2 + 1)
    held = cache.fetch(ds.shards[0].stored.basename, sizes[0])  # stays in use
    for s in ds.shards[1:]:
        cache.fetch(s.stored.basename, s.stored.bytes)
    names = {p.name for p in (tmp_path / "c").iterdir() if not p.name.startswith(".")}
    assert ds.shards[0].stored.basename in names  # in use: never evicted
    assert ds.shards[-1].stored.basename in names
    assert len(names) <= 3
    assert held[:4].view("<u4")[0] == ds.shards[0].samples


def test_size_mismatch_is_an_error(s3: Any, tmp_path: Path) -> None:
    fs, options = s3
    write_mds(_table(), "s3://bucket/bad", DatasetSpec(shard_size="16KiB"), storage_options=options)
    ds = open_dataset("s3://bucket/bad", cache_dir=str(tmp_path / "c"), storage_options=options)
    name = ds.shards[0].stored.basename
    fs.pipe(f"bucket/bad/{name}", b"short")
    from spark_dl_core import ShardError

    with pytest.raises(ShardError, match=name):
        ds.load_shard(0)
    assert not (tmp_path / "c" / name).exists()
