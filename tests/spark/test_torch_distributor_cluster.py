"""``TorchDistributor`` on a ``local-cluster`` master: two executors, each a node.

Not local mode: the distributor runs a barrier stage of two tasks, one per executor, and
each task starts ``torchrun`` for its own rank (``--nnodes 2``, one rendezvous on the
driver). Each rank reads the dataset through its own node cache (a directory per
``GROUP_RANK``), so together the ranks must serve every row exactly once, each rank in the
one world-size-free order's share, and each node must copy only about half of the shards
(its streams'), as on a real cluster reading object storage or a network mount.

A ``local-cluster`` session needs its own driver process (the suite's shared session holds
this one's SparkContext), so the job runs as this file's ``__main__`` in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

N = 6000
BATCH = 50


def _write(path: str) -> int:
    """An MDS dataset of ``N`` rows in enough shards for several streams; its shard bytes."""
    import pyarrow as pa

    from spark_dl_core import DatasetSpec, write_mds

    table = pa.table(
        {"id": np.arange(N, dtype=np.int64), "v": np.ones((N, 8), np.float32).tolist()}
    )
    write_mds(table, path, DatasetSpec(shard_size="4KiB"))
    return sum(f.stat().st_size for f in Path(path).glob("*.mds"))


def train(path: str, out_dir: str) -> int:
    """One rank, in a torchrun child on an executor: an epoch through its node's cache."""
    import json
    import os

    from spark_dl_core import open_dataset

    node = int(os.environ["GROUP_RANK"])
    ds = open_dataset(path, node_cache=True, cache_dir=os.path.join(out_dir, f"node{node}"))
    loader = ds.to_torch(batch_size=50, shuffle=True, seed=4, even_batches=False, columns=["id"])
    ids = [int(i) for batch in loader for i in batch["id"].tolist()]
    stats = loader.stats()
    record = {
        "ids": ids,
        "rank": loader.rank,
        "world": loader.world_size,
        "node": node,
        "local_world": int(os.environ["LOCAL_WORLD_SIZE"]),
        "download_bytes": stats["download_bytes"],
        "streams_read": stats["locality"]["streams_read"],
        "streams": stats["locality"]["streams"],
    }
    with open(os.path.join(out_dir, f"rank{loader.rank}.json"), "w") as f:
        json.dump(record, f)
    return len(ids)


def _job(path: str, out_dir: str) -> None:
    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import SparkSession

    python = os.environ["PYSPARK_PYTHON"]
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .config("spark.executorEnv.PYSPARK_PYTHON", python)
        .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(sys.path))
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    try:
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(train, path, out_dir)
    finally:
        spark.stop()


@pytest.mark.spark
def test_torch_distributor_on_a_local_cluster_reads_each_nodes_share(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("pyspark")
    path = str(tmp_path / "ds")
    stored = _write(path)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
    done = subprocess.run(
        [sys.executable, __file__, path, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert sorted(r["rank"] for r in seen) == [0, 1]
    assert all(r["world"] == 2 and r["local_world"] == 1 for r in seen)
    assert sorted(r["node"] for r in seen) == [0, 1]  # one rank per executor: two nodes
    every = [i for r in seen for i in r["ids"]]
    assert sorted(every) == list(range(N))  # every row once in the epoch
    # Each rank's batches are the one-rank order's global batches g = rank (mod 2).
    from spark_dl_core import open_dataset

    whole = open_dataset(path).to_torch(batch_size=BATCH, shuffle=True, seed=4, world_size=1)
    batches = [b["id"].tolist() for b in whole]
    for r in seen:
        assert r["ids"] == [i for b in batches[r["rank"] :: 2] for i in b]
    # Each node copied about its half of the shards, never the whole dataset.
    assert all(r["streams"] >= 2 and r["streams_read"] == r["streams"] // 2 for r in seen)
    pulled = [r["download_bytes"] for r in seen]
    assert all(0 < p <= 0.6 * stored for p in pulled), (pulled, stored)
    assert sum(pulled) <= 1.1 * stored, (pulled, stored)


if __name__ == "__main__":
    _job(sys.argv[1], sys.argv[2])
    sys.exit(0)
