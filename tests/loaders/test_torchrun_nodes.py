"""Two nodes launched by real ``torchrun`` processes (``--nnodes 2``, a c10d rendezvous on
loopback, gloo), each with its own machine cache, read one shuffled epoch of an MDS dataset
from a real S3-compatible server through a byte-counting link: every sample is served once,
each step's batches are the one-rank order's, and with the order drawn from streams the
cluster pulls about one copy of the dataset, not one per node (issue 42)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, open_dataset, write_mds

pytest.importorskip("torch")
pytest.importorskip("moto")

ROWS, BATCH, STREAMS, SEED = 4096, 32, 16, 3

WORKER = f"""
import json, os, sys
import torch.distributed as dist
from spark_dl_core import open_dataset

url, cache, options, out, streams = sys.argv[1:6]
dist.init_process_group("gloo")
ds = open_dataset(url, cache_dir=cache, storage_options=json.loads(options))
loader = ds.to_torch({BATCH}, shuffle=True, seed={SEED}, streams=int(streams),
                     even_batches=False, columns=["id", "x"])
ids = [b["id"].tolist() for b in loader]
dist.barrier()
env = {{k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK")}}
json.dump({{"ids": ids, "net": ds.download_stats(), "env": env}}, open(out, "w"))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_nodes(url: str, options: dict[str, Any], streams: int, work: Path) -> list[dict[str, Any]]:
    """Both nodes' torchrun launches, one rank each; each rank's JSON report."""
    script = work / "worker.py"
    script.write_text(WORKER)
    port, procs, outs = _free_port(), [], []
    for node in range(2):
        home = work / f"node{node}-{streams}"
        home.mkdir()
        out = home / "out.json"
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", f"nodes-{streams}", "--max-restarts", "0",
            str(script), url, str(home / "cache"), json.dumps(options), str(out), str(streams),
        ]  # fmt: skip
        env = dict(os.environ, TMPDIR=str(home), OMP_NUM_THREADS="1")
        logs = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(subprocess.Popen(cmd, env=env, **logs))  # type: ignore[call-overload]
        outs.append(out)
    for node, proc in enumerate(procs):
        log, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"node {node}:\n{log.decode(errors='replace')[-3000:]}"
    return [json.loads(out.read_text()) for out in outs]


@pytest.fixture(scope="module")
def s3_dataset(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from s3_helpers import ShapedLink, aws_test_env, endpoint_options, moto_process

    with moto_process() as (host, port), aws_test_env(), ShapedLink((host, port)) as link:
        import s3fs

        direct = endpoint_options(host, port)
        fs = s3fs.S3FileSystem(**direct)
        fs.call_s3("create_bucket", Bucket="nodes")
        x = np.random.default_rng(0).random((ROWS, 128), dtype=np.float32)
        table = pa.table({"id": np.arange(ROWS, dtype=np.int64), "x": list(x)})
        url = "s3://nodes/train"
        write_mds(table, url, DatasetSpec(shard_size="32KiB"), storage_options=direct)
        stored = sum(int(i["size"]) for i in fs.find("nodes/train", detail=True).values())
        counted = endpoint_options("127.0.0.1", link.port)
        yield url, direct, counted, link, stored


@pytest.mark.slow
@pytest.mark.parametrize("streams", [1, STREAMS])
def test_two_torchrun_nodes_serve_the_order_once_and_pull_their_share(
    s3_dataset: Any, tmp_path: Path, streams: int
) -> None:
    url, direct, counted, link, stored = s3_dataset
    before = link.down_bytes
    reports = _run_nodes(url, counted, streams, tmp_path)
    pulled = (link.down_bytes - before) / stored
    ranks = {int(r["env"]["RANK"]): r for r in reports}
    assert sorted(ranks) == [0, 1] and {r["env"]["WORLD_SIZE"] for r in reports} == {"2"}
    assert {r["env"]["GROUP_RANK"] for r in reports} == {"0", "1"}  # two nodes, not one
    every = np.sort(np.concatenate([np.concatenate(r["ids"]) for r in reports]))
    assert np.array_equal(every, np.arange(ROWS)), "rows not served exactly once"
    ds = open_dataset(url, storage_options=direct)
    order = ds.sample_order(BATCH, shuffle=True, seed=SEED, streams=streams)
    for k in range(max(len(r["ids"]) for r in reports)):  # step k: global batches 2k, 2k+1
        for rank in (0, 1):
            if k < len(ranks[rank]["ids"]):
                want = np.asarray(order[2 * k + rank])
                assert np.array_equal(ranks[rank]["ids"][k], want), f"step {k} rank {rank}"
    print(f"streams={streams}: 2 nodes pulled {pulled:.2f}x the dataset")
    if streams == 1:  # every rank needs every shard of the window: each node pulls it all
        assert pulled > 1.6, f"{pulled:.2f}x"
    else:  # each node reads its streams' shards: one copy across the cluster
        assert pulled < 1.3, f"{pulled:.2f}x of the dataset for 2 nodes"
