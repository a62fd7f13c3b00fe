"""Each rank downloads only its streams' shards from a real S3 server (moto, on loopback),
and loader.stats() says what came from the store, what from the node cache, which shards
were touched and how local the rank's reads are."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
pytest.importorskip("torch")

from s3_helpers import s3_bucket

from spark_dl_core import DatasetSpec, open_dataset, write_mds

N = 8000


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with s3_bucket() as made:
        yield made


def test_ranks_download_their_share_and_stats_say_so(s3: Any, tmp_path: Path) -> None:
    fs, options = s3
    table = pa.table(
        {"id": np.arange(N, dtype=np.int64), "v": np.ones((N, 16), np.float32).tolist()}
    )
    write_mds(table, "s3://bucket/loc", DatasetSpec(shard_size="8KiB"), storage_options=options)
    stored = sum(fs.size(p) for p in fs.ls("bucket/loc") if ".mds" in p)
    world, seen = 4, []
    for rank in range(world):  # each rank a node with its own cache
        ds = open_dataset(
            "s3://bucket/loc", cache_dir=str(tmp_path / f"node{rank}"), storage_options=options
        )
        assert ds.num_shards >= 32
        loader = ds.to_torch(
            batch_size=50,
            shuffle=True,
            seed=3,
            rank=rank,
            world_size=world,
            even_batches=False,
            streams=64,
        )
        for epoch in range(2):
            loader.sampler.set_epoch(epoch)
            ids = [i for b in loader for i in b["id"].tolist()]
            stats = loader.stats()
            if epoch == 0:
                seen += ids
                # about a quarter of the shards, plus at most the boundary shards
                assert stats["download_bytes"] <= stored / world + 2 * stored / ds.num_shards
                assert stats["shards_touched"] <= ds.num_shards / world + 2
                assert stats["cache_hit_bytes"] == 0
            else:  # the same streams: the node's cache serves the whole epoch
                assert stats["download_bytes"] == 0
                assert stats["cache_hit_bytes"] > 0
            assert stats["locality"]["streams_read"] == 64 // world
    assert sorted(seen) == list(range(N))  # every row once in the epoch


def test_a_node_cache_smaller_than_its_share_warns_once(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache that cannot keep this node's share of an epoch (each epoch would download it
    again) warns once per source, naming the sizes and SPARK_DL_CACHE_BYTES; stats() gives
    the node's share (this rank's times LOCAL_WORLD_SIZE) beside the limit. A cache that
    keeps it, or a node of fewer ranks under the same limit, does not warn."""
    from spark_dl_core.errors import CacheTooSmallWarning

    _, options = s3
    table = pa.table(
        {"id": np.arange(4000, dtype=np.int64), "v": np.ones((4000, 16), np.float32).tolist()}
    )
    write_mds(table, "s3://bucket/small", DatasetSpec(shard_size="8KiB"), storage_options=options)

    def epoch(limit: int, node: str, local_ranks: int) -> tuple[dict[str, Any], list[Any]]:
        monkeypatch.setenv("SPARK_DL_CACHE_BYTES", str(limit))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_ranks))
        ds = open_dataset(
            "s3://bucket/small", cache_dir=str(tmp_path / node), storage_options=options
        )
        stored = int(np.sum(ds.shards.stored_bytes))
        kw = {"shuffle": True, "seed": 1, "rank": 0, "world_size": 4, "streams": 4}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):  # two loaders of one source: one warning
                loader = ds.to_torch(batch_size=50, even_batches=False, **kw)
                assert sum(len(b["id"]) for b in loader) > 0
        locality = loader.stats()["locality"]
        assert locality["cache_limit_bytes"] == limit
        assert abs(locality["node_share_bytes"] - stored * local_ranks * locality["data_share"]) < 1
        return locality, [w for w in caught if w.category is CacheTooSmallWarning]

    probe = open_dataset(
        "s3://bucket/small", cache_dir=str(tmp_path / "probe"), storage_options=options
    )
    quarter = int(np.sum(probe.shards.stored_bytes)) // 4
    _, small = epoch(quarter, "a", 4)  # 4 ranks here: the whole source, a quarter's cache
    assert len(small) == 1
    message = str(small[0].message)
    assert "SPARK_DL_CACHE_BYTES" in message and "each epoch downloads it again" in message
    assert small[0].message.limit_bytes == quarter
    _, one_rank = epoch(quarter * 2, "b", 1)  # 1 rank here: about a quarter, twice the room
    assert one_rank == []
    _, roomy = epoch(1 << 40, "c", 4)
    assert roomy == []


def test_a_mixture_of_remote_sources_warns_of_a_small_node_cache(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A streamed mixture's node share is each remote source's share of the epoch, summed by
    the cache it reads through: a cache too small for it warns once, naming the mixture."""
    from spark_dl_core import Source, mix
    from spark_dl_core.errors import CacheTooSmallWarning

    _, options = s3
    for name in ("ma", "mb"):
        table = pa.table(
            {"id": np.arange(2000, dtype=np.int64), "v": np.ones((2000, 16), np.float32).tolist()}
        )
        spec = DatasetSpec(shard_size="8KiB")
        write_mds(table, f"s3://bucket/{name}", spec, storage_options=options)

    def epoch(limit: int, node: str) -> tuple[dict[str, Any], float, list[Any]]:
        monkeypatch.setenv("SPARK_DL_CACHE_BYTES", str(limit))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
        sources = [
            open_dataset(
                f"s3://bucket/{name}",
                cache_dir=str(tmp_path / node / name),
                storage_options=options,
            )
            for name in ("ma", "mb")
        ]
        stored = float(sum(np.sum(s.shards.stored_bytes) for s in sources))
        mixture = mix([Source(s, proportion=1.0, name=s.shown) for s in sources])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = mixture.to_torch(
                batch_size=50, shuffle=True, seed=1, rank=0, world_size=4, streams=4
            )
            assert sum(len(b["id"]) for b in loader) > 0
        locality = loader.stats()["locality"]
        return locality, stored, [w for w in caught if w.category is CacheTooSmallWarning]

    probe = open_dataset("s3://bucket/ma", cache_dir=str(tmp_path / "p"), storage_options=options)
    quarter = int(np.sum(probe.shards.stored_bytes)) // 4
    locality, stored, small = epoch(quarter, "small")
    assert len(small) == 1 and "each epoch downloads it again" in str(small[0].message)
    # 4 ranks here, each about a quarter of each source: about both sources whole
    shares = [s["data_share"] for s in locality["sources"]]
    assert all(0.2 < share < 0.3 for share in shares)
    assert 0.8 * stored < locality["node_share_bytes"] <= stored
    assert locality["cache_limit_bytes"] == 2 * quarter  # two sources, a cache each
    _, _, roomy = epoch(1 << 40, "roomy")
    assert roomy == []
