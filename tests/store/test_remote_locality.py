"""Each rank downloads only its streams' shards from a real S3 server (moto, on loopback),
and loader.stats() says what came from the store, what from the node cache, which shards
were touched and how local the rank's reads are."""

from __future__ import annotations

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
