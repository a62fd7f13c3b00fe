"""The anchors' egress on the cluster egress bench's harness (issue 42).

``cluster_egress_bench.py`` calls :func:`run_anchor` for Mosaic Streaming's and LitData's
``StreamingDataset``, each in its side environment (``make bench-envs``: ``.venv-mosaic``
with boto3 added for ``s3://``, ``.venv-litdata``), on the same moto server and behind the
same byte-counting proxy as spark-dl. Each simulated node is one ``unshare -m`` mount
namespace with a private ``/dev/shm`` (Mosaic keeps its per-node state in shared memory, which
would otherwise collide between nodes on one machine) and its own temp dir and cache
directory, shared by its rank processes. The ranks join one gloo process group (torchrun's
variables; LitData learns its rank only from ``torch.distributed``), open the dataset once and
iterate it for 3 epochs in one process, the way a training loop advances either anchor's
epochs; between epochs they wait at a file barrier while the bench reads the proxy's byte
counter and the node caches' sizes.

Mosaic reads the very MDS dataset spark-dl reads (its ``index.json`` and shards are Mosaic's
format), with its defaults plus ``shuffle=True``, a seed and the batch size. LitData reads the
same rows written by ``litdata.optimize`` (chunks of 128 KiB, as spark-dl's shards) and put on
the server, shuffled with a seed, once with ``NNODES`` set (its docs' multi-node setting) and
once without. Served rows are counted per epoch (repeats and misses), reported, not asserted.

This file is also the anchors' process: ``--node`` (runs its node's ranks), ``--rank`` (one
rank, 3 epochs), ``--optimize`` (writes LitData's chunks). It runs under the side
environments' Python, so it imports neither spark-dl nor anything the bench's venv alone has.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 3
SEED = 0
CHUNK_BYTES = 128 * 1024  # LitData's chunks, the size of spark-dl's shards in the bench
STALL_S = 900  # one epoch of one case; an anchor stuck longer is reported as failed

# name -> (side environment, whether NNODES is set)
ANCHORS: dict[str, tuple[str, bool]] = {
    "mosaic": (".venv-mosaic", False),
    "litdata NNODES": (".venv-litdata", True),
    "litdata": (".venv-litdata", False),
}
# what each environment needs before the bench can use it (Makefile's bench-envs)
READY = {".venv-mosaic": ".s3", ".venv-litdata": ".installed"}


def available() -> list[str]:
    """The anchors whose side environment is built, in ``ANCHORS``' order."""
    return [name for name, (venv, _) in ANCHORS.items() if (ROOT / venv / READY[venv]).exists()]


def _python(name: str) -> str:
    return str(ROOT / ANCHORS[name][0] / "bin" / "python")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def write_litdata(rows: int, fs: Any, prefix: str, work: Path) -> int:
    """LitData's chunks of the bench's rows, optimized locally and put under ``prefix`` on the
    server; returns their stored bytes."""
    local = work / "litdata-optimized"
    cmd = [_python("litdata"), __file__, "--optimize", "--rows", str(rows), "--out", str(local)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    fs.put(str(local), prefix, recursive=True)
    return sum(int(i["size"]) for i in fs.find(prefix, detail=True).values())


def run_anchor(
    name: str, nodes: int, per_node: int, url: str, endpoint: str, link: Any, stored: int,
    rows: int, batch: int, work: Path,
) -> dict[str, Any]:  # fmt: skip
    """One anchor, one cluster shape, 3 epochs: bytes pulled / ``stored`` per epoch and in all,
    bytes landed per node after epoch 0, and each epoch's repeated and missed rows."""
    world = nodes * per_node
    node_dirs = [work / f"node{n}" for n in range(nodes)]
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "S3_ENDPOINT_URL":
              endpoint, "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(per_node)}  # fmt: skip
    if ANCHORS[name][1]:
        common["NNODES"] = str(nodes)
    before = link.down_bytes
    procs = []
    for n, node in enumerate(node_dirs):
        node.mkdir(parents=True)
        env = dict(os.environ, **common, GROUP_RANK=str(n), TMPDIR=str(node))
        args = ["--node", "--anchor", name, "--url", url, "--endpoint", endpoint, "--work",
                str(work), "--cache", str(node / "cache"), "--batch", str(batch)]  # fmt: skip
        # a private /dev/shm per node: Mosaic's shared memory is per machine
        shell = 'mount -t tmpfs none /dev/shm && exec "$0" "$@"'
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", shell, _python(name)]
        procs.append(subprocess.Popen([*cmd, __file__, *args], env=env))
    per_epoch, landed, repeats, misses = [], [], [], []
    try:
        for epoch in range(EPOCHS):
            dones = [work / f"done-{epoch}-{r}.json" for r in range(world)]
            _wait_for(dones, procs, f"{name} {nodes}x{per_node} epoch {epoch}")
            per_epoch.append((link.down_bytes - before) / stored)
            before = link.down_bytes
            landed.append([_du(d / "cache") / stored for d in node_dirs])
            ids = np.concatenate([np.asarray(json.loads(d.read_text()), np.int64) for d in dones])
            counts = np.bincount(ids, minlength=rows)
            repeats.append(int((counts[counts > 1] - 1).sum()))
            misses.append(int((counts == 0).sum()))
            (work / f"go-{epoch + 1}").touch()
        for p in procs:
            if p.wait(timeout=STALL_S) != 0:
                raise RuntimeError(f"{name} {nodes}x{per_node}: a node exited {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"per_epoch": per_epoch, "total": sum(per_epoch), "landed": landed[0],
            "repeats": repeats, "misses": misses}  # fmt: skip


def _wait_for(files: list[Path], procs: list[subprocess.Popen[bytes]], what: str) -> None:
    deadline = time.monotonic() + STALL_S
    while not all(f.exists() for f in files):
        failed = [p.returncode for p in procs if p.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {'a node exited ' + str(failed) if failed else 'stalled'}")
        time.sleep(0.2)


# ---- the side environments' processes -------------------------------------------------------


def _node(args: argparse.Namespace) -> int:
    """This node's ranks (global ranks GROUP_RANK * LOCAL_WORLD_SIZE + local), until all exit."""
    per_node, node = int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["GROUP_RANK"])
    procs = []
    for local in range(per_node):
        env = dict(os.environ, RANK=str(node * per_node + local), LOCAL_RANK=str(local))
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank", *sys.argv[2:]], env=env))
    return max(p.wait() for p in procs)


def _open(args: argparse.Namespace) -> Any:
    if args.anchor == "mosaic":
        sys.path.insert(0, str(ROOT / "tests" / "interop"))
        import importlib.util

        import mosaic_shim  # stubs the SDKs streaming imports and never calls here

        # boto3 is real here (Mosaic's s3:// downloads): the shim would also answer its
        # optional submodules (botocore.customizations...) with stubs, so it stubs only absent
        # packages
        present = [m for m in mosaic_shim.STUBBED if importlib.util.find_spec(m) is not None]
        mosaic_shim.STUBBED = tuple(m for m in mosaic_shim.STUBBED if m not in present)
        mosaic_shim.install()
        from streaming import StreamingDataset

        return StreamingDataset(
            remote=args.url, local=args.cache, shuffle=True, shuffle_seed=SEED,
            batch_size=args.batch,
        )  # fmt: skip
    from litdata import StreamingDataset as LitDataset
    from litdata.streaming import downloader

    # its chunk GETs go through obstore, whose client refuses plain http (the local server's)
    # unless told; its client options are this module constant
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"  # type: ignore[index]
    return LitDataset(
        args.url, cache_dir=args.cache, shuffle=True, seed=SEED,
        storage_options={"endpoint_url": args.endpoint},
    )  # fmt: skip


def _rank(args: argparse.Namespace) -> None:
    """One rank: 3 epochs of the anchor's dataset, each epoch's served ids to a done file, then
    the bench's go-ahead before the next."""
    import torch.distributed as dist

    dist.init_process_group("gloo")  # env://: MASTER_ADDR/PORT, RANK, WORLD_SIZE
    rank, work = dist.get_rank(), Path(args.work)
    ds = _open(args)
    for epoch in range(EPOCHS):
        ids = [int(sample["id"]) for sample in ds]
        done = work / f"done-{epoch}-{rank}.json"
        done.with_suffix(".tmp").write_text(json.dumps(ids))
        done.with_suffix(".tmp").rename(done)
        while not (work / f"go-{epoch + 1}").exists():
            time.sleep(0.1)
    dist.destroy_process_group()


def _rows_block(block: tuple[int, int, int]) -> Any:
    """LitData's optimize function: the bench's rows ``start..stop`` of ``rows`` (the same
    values spark-dl's bench writes)."""
    start, stop, rows = block
    x = np.random.default_rng(0).random((rows, 256), dtype=np.float32)
    for i in range(start, stop):
        yield {"id": i, "x": x[i]}


def _optimize(args: argparse.Namespace) -> None:
    from litdata import optimize

    step = 1024
    blocks = [(a, min(a + step, args.rows), args.rows) for a in range(0, args.rows, step)]
    optimize(fn=_rows_block, inputs=blocks, output_dir=args.out, chunk_bytes=CHUNK_BYTES,
             num_workers=1)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--node", "--rank", "--optimize"):
        parser.add_argument(flag, action="store_true")
    for opt in ("--anchor", "--url", "--endpoint", "--work", "--cache", "--out"):
        parser.add_argument(opt)
    parser.add_argument("--rows", type=int)
    parser.add_argument("--batch", type=int)
    args = parser.parse_args()
    if args.node:
        raise SystemExit(_node(args))
    if args.rank:
        return _rank(args)
    if args.optimize:
        return _optimize(args)


if __name__ == "__main__":
    main()
