"""Two nodes launched by real ``torchrun`` processes (``--nnodes 2 --nproc-per-node 2``, one
c10d rendezvous on loopback), each node with its own temp dir and machine cache, train a tiny
model with DDP over gloo from a real S3-compatible server reached through a byte-counting
link, from an MDS dataset and from a Delta table read in place (issue 42): every row is served
once per epoch, each step's rows are the one-rank order's batches, the cluster pulls about one
copy of the data, not one per node, and the position saved mid-epoch resumes exactly on one node
of two ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from ports import free_port

from spark_dl_core import DatasetSpec, open_dataset, open_delta, write_mds

pytest.importorskip("torch")
pytest.importorskip("moto")
pytest.importorskip("deltalake")

ROWS, BATCH, STREAMS, SEED, STOP = 4096, 32, 16, 3, 10

WORKER = f"""
import faulthandler, json, os, sys
faulthandler.enable(all_threads=True)  # a crash prints every thread's stack in the log
import torch
import torch.distributed as dist
from spark_dl_core import open_dataset, open_delta

kind, url, cache, options, out_dir, state_in, stop = sys.argv[1:8]
dist.init_process_group("gloo")
if kind == "mds":
    ds = open_dataset(url, cache_dir=cache, storage_options=json.loads(options))
else:
    ds = open_delta(url, storage_options=json.loads(options)).dataset(cache=False, span_dir=cache)
loader = ds.to_torch({BATCH}, shuffle=True, seed={SEED}, streams={STREAMS}, columns=["id", "x"])
if state_in != "-":
    loader.load_state_dict(json.load(open(state_in)))
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(128, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ids, state = [], None
for step, batch in enumerate(loader):
    loss = model(batch["x"]).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    ids.append(batch["id"].tolist())
    if step + 1 == int(stop):  # the position then, for a run resumed elsewhere
        state = loader.state_dict()
env = {{k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK")}}
report = {{"ids": ids, "env": env, "state": state}}
with open(os.path.join(out_dir, f"out-{{os.environ['RANK']}}.json"), "w") as f:
    json.dump(report, f)
dist.barrier()  # no rank tears gloo down while a peer still talks to it
dist.destroy_process_group()
sys.stdout.flush()
# The report is written and the group is gone: skip interpreter teardown, where gloo's C++
# threads met Python's finalizer once in CI ("terminate called without an active exception")
os._exit(0)
"""


def _launch(
    work: Path, name: str, nodes: int, per_node: int, args: list[str]
) -> list[dict[str, Any]]:
    """``nodes`` torchrun launches of ``per_node`` ranks, one temp dir and cache per node:
    every rank's report, in rank order."""
    script = work / "worker.py"
    script.write_text(WORKER)
    port, procs = free_port(), []
    for node in range(nodes):
        home = work / f"{name}-node{node}"
        home.mkdir()
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(nodes), "--nproc-per-node", str(per_node),
            "--node-rank", str(node), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", name, "--max-restarts", "0",
            str(script), args[0], args[1], str(home / "cache"), args[2],
            str(home), *args[3:],
        ]  # fmt: skip
        env = dict(os.environ, TMPDIR=str(home), OMP_NUM_THREADS="1")
        logs = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(subprocess.Popen(cmd, env=env, **logs))  # type: ignore[call-overload]
    for node, proc in enumerate(procs):
        log, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"node {node}:\n{log.decode(errors='replace')[-3000:]}"
    reports = [json.loads(p.read_text()) for p in sorted(work.glob(f"{name}-node*/out-*.json"))]
    return sorted(reports, key=lambda r: int(r["env"]["RANK"]))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """An S3 server with the same rows as an MDS dataset and as a Delta table."""
    from s3_helpers import ShapedLink, aws_test_env, delta_options, endpoint_options, moto_process

    with moto_process() as (host, port), aws_test_env(), ShapedLink((host, port)) as link:
        import s3fs
        from deltalake import WriterProperties, write_deltalake

        direct = endpoint_options(host, port)
        fs = s3fs.S3FileSystem(**direct)
        fs.call_s3("create_bucket", Bucket="nodes")
        x = np.random.default_rng(0).random((ROWS, 128), dtype=np.float32)
        table = pa.table({"id": np.arange(ROWS, dtype=np.int64), "x": list(x)})
        write_mds(table, "s3://nodes/mds", DatasetSpec(shard_size="32KiB"), storage_options=direct)
        # Row groups are the shards read in place. Two files of 1 MB: every node also reads
        # each file's footer tail (64 KiB), which small files would make a large share.
        props = WriterProperties(max_row_group_size=128)
        for f in range(2):
            part = table.slice(f * ROWS // 2, ROWS // 2)
            write_deltalake(
                "s3://nodes/delta", part, mode="append",
                storage_options=delta_options(host, port), writer_properties=props,
            )  # fmt: skip
        sizes = {k: sum(int(i["size"]) for i in fs.find(f"nodes/{k}", detail=True).values())
                 for k in ("mds", "delta")}  # fmt: skip
        yield {
            "mds": ("s3://nodes/mds", direct, endpoint_options("127.0.0.1", link.port)),
            "delta": (
                "s3://nodes/delta",
                delta_options(host, port),
                delta_options("127.0.0.1", link.port),
            ),
            "link": link,
            "sizes": sizes,
        }


def _reference(kind: str, url: str, options: dict[str, Any]) -> tuple[Any, np.ndarray]:
    """The one-rank order and each position's id (a Delta table's rows in log order)."""
    if kind == "mds":
        ds: Any = open_dataset(url, storage_options=options)
    else:
        ds = open_delta(url, storage_options=options).dataset(cache=False)
    order = ds.sample_order(BATCH, shuffle=True, seed=SEED, streams=STREAMS)
    return order, np.asarray(ds.read(np.arange(len(ds)), columns=["id"])["id"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mds", "delta"])
def test_two_torchrun_nodes_train_on_their_share_and_resume_on_one(
    store: Any, tmp_path: Path, kind: str
) -> None:
    url, direct, counted, link = (*store[kind], store["link"])
    before = link.down_bytes
    args = [kind, url, json.dumps(counted), "-", str(STOP)]
    reports = _launch(tmp_path, "whole", 2, 2, args)
    pulled = (link.down_bytes - before) / store["sizes"][kind]
    print(f"{kind}: 2 nodes x 2 ranks pulled {pulled:.2f}x the data in one epoch")
    assert [r["env"]["RANK"] for r in reports] == ["0", "1", "2", "3"]
    assert sorted({r["env"]["GROUP_RANK"] for r in reports}) == ["0", "1"]
    world = len(reports)
    every = np.sort(np.concatenate([np.concatenate(r["ids"]) for r in reports]))
    assert np.array_equal(every, np.arange(ROWS)), "rows not served exactly once"
    order, ids = _reference(kind, url, direct)
    for k in range(len(reports[0]["ids"])):  # step k: global batches kW..kW+W-1
        for rank, report in enumerate(reports):
            want = ids[np.asarray(order[k * world + rank])]
            assert np.array_equal(report["ids"][k], want), f"step {k} rank {rank}"
    assert pulled < 1.3, f"{pulled:.2f}x of the data for 2 nodes: each read the whole"

    # the position after STOP steps on 2 nodes x 2 ranks, resumed on 1 node x 2 ranks
    states = {json.dumps(r["state"], sort_keys=True) for r in reports}
    assert len(states) == 1, "ranks saved different positions"
    state_file = tmp_path / "state.json"
    state_file.write_text(states.pop())
    rest = _launch(tmp_path, "rest", 1, 2, [kind, url, json.dumps(counted), str(state_file), "0"])
    first = [np.concatenate(r["ids"][:STOP]) for r in reports]
    served = first + [np.concatenate(r["ids"]) for r in rest]
    assert np.array_equal(np.sort(np.concatenate(served)), np.arange(ROWS))
    for k in range(len(rest[0]["ids"])):  # the rest, in the order at world size 2
        for rank, report in enumerate(rest):
            want = ids[np.asarray(order[STOP * world + k * 2 + rank])]
            assert np.array_equal(report["ids"][k], want), f"resumed step {k} rank {rank}"
