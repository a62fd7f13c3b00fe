"""Bytes a simulated cluster pulls from object storage per epoch (issue 42).

Each simulated node is a set of rank processes sharing one temp dir (its machine cache) with
torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK). They read
a real S3-compatible server (moto, its own process, on loopback) through a byte-counting
proxy (tests/s3_helpers.ShapedLink, no delay), an MDS dataset and a Delta table read in
place, and a mixture of three MDS sources (each sample once an epoch, ``batching=
"stratified"``, kind ``mixture``), 4 nodes x 1 rank and 2 nodes x 2 ranks, 3 reshuffled
epochs. Printed: bytes pulled /
dataset bytes per epoch and in all, bytes landed per node; checked: every row served once
per epoch, and each step's rows are the 1-rank order's batches kW..kW+W-1. Kinds ``packed``,
``packed-bin`` and ``packed-mixture`` (not in the default kinds): token documents read by a
packed ``concat`` or ``bin`` loader (rows of 128 tokens, 64 a batch), the last over a
mixture of three sources of them, checked the same way by tokens: every token once per
epoch, a step's batches the 1-rank loader's.

    .venv/bin/python bench/cluster_egress_bench.py [--rows 16384] [--streams 0]
        [--kinds mds,delta,mixture,packed,packed-bin,packed-mixture]
        [--anchors auto|none|mosaic,litdata NNODES,litdata]

``--streams 0`` (the default) is the loaders' default: as many streams as the dataset's
shards allow (``order.auto_streams``), printed per case; 1 is the order without streams.

A rank process is this script with ``--rank-worker``: it reads its share of one epoch
(``iter_batches``, rank and world size from the environment) and writes its batches' ids.

The anchors (``bench/egress_anchors.py``), printed in the same table when their side
environments are built (``make bench-envs``; ``--anchors auto``, the default): Mosaic
Streaming's ``StreamingDataset`` (its defaults, shuffled with a seed) on the same MDS dataset,
and LitData's on the same rows written by ``litdata.optimize``, with ``NNODES`` set and
without, 4 x 1 and 2 x 2, on the same server and proxy; their rank processes join one gloo
group and iterate 3 epochs each, every node in its own mount namespace with a private
``/dev/shm`` (Mosaic's per-machine shared memory). Their rows are counted, not asserted:
``rows`` says how many were served twice and missed in each epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

BATCH = 64
SEED = 0
# the packed kind: rows of 128 tokens, 64 a batch, cut from streams (pack version 2)
PACK = {"column": "tokens", "seq_len": 128, "pad_id": 0}
PACK_BATCH = 64
# kind -> its packing: ``packed`` back to back, ``packed-bin`` by best fit (whole documents),
# ``packed-mixture`` back to back over the mixture of three sources of those documents
PACKS = {"packed": PACK, "packed-bin": PACK | {"mode": "bin"}, "packed-mixture": PACK}


def rank_worker(args: argparse.Namespace) -> None:
    """One rank of one node, one epoch: its batches' ids and what it downloaded, as JSON."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ds = _open(args.kind, args.url, json.loads(args.options), args.cache)
    order = {
        "shuffle": True,
        "seed": SEED,
        "epoch": args.epoch,
        "rank": rank,
        "world_size": world,
        "even_batches": False,
        "streams": args.streams,
    }
    if args.kind in PACKS:
        pack = PACKS[args.kind]
        batches = [_real_tokens(b) for b in ds.iter_batches(PACK_BATCH, pack=pack, **order)]
    else:
        batches = [b["id"].tolist() for b in ds.iter_batches(BATCH, columns=["id", "x"], **order)]
    out = {"batches": batches, "net": ds.download_stats()}
    Path(args.out).write_text(json.dumps(out))


def _real_tokens(batch: dict[str, Any]) -> list[int]:
    """A packed batch's tokens in row order, padding left out (tokens are 1 and up, pad 0)."""
    ids = np.asarray(batch["input_ids"]).reshape(-1)
    return ids[ids > 0].tolist()


def _documents(rows: int) -> list[np.ndarray]:
    """``rows`` token documents of 1 to 511 tokens, every token unique over the dataset
    (the tokens 1 .. total in document order): where each token went is checkable."""
    lengths = np.random.default_rng(0).integers(1, 512, size=rows)
    ends = np.cumsum(lengths)
    return [np.arange(e - k, e, dtype=np.int32) + 1 for e, k in zip(ends, lengths)]


# the mixture's sources: shares of the rows, each its own MDS dataset under the kind's url
MIX_SOURCES = (("web", 0.5), ("code", 0.375), ("math", 0.125))


def _mixture_parts(rows: int) -> list[tuple[str, int, int]]:
    """(name, first row, rows) of each of the mixture's sources."""
    out, at = [], 0
    for name, share in MIX_SOURCES:
        n = int(rows * share) if name != MIX_SOURCES[-1][0] else rows - at
        out.append((name, at, n))
        at += n
    return out


def _open(kind: str, url: str, options: dict[str, Any], cache: str | None) -> Any:
    """The case's dataset (an MDS dataset, a Delta table read in place, the mixture), its
    node cache under ``cache`` (None: the default)."""
    from spark_dl_core import open_dataset, open_delta

    if kind in ("mixture", "packed-mixture"):
        return _open_mixture(url, options, cache)
    if kind == "mds" or kind in PACKS:
        return open_dataset(url, cache_dir=cache, storage_options=options)
    return open_delta(url, storage_options=options).dataset(cache=False, span_dir=cache)


def _open_mixture(url: str, options: dict[str, Any], cache: str | None) -> Any:
    """The mixture over the sources at ``url``: each at its size (every row once an epoch),
    stratified batches."""
    from spark_dl_core import Source, mix, open_dataset

    sources = []
    for name, _, _ in _mixture_parts(_rows_at(url)):
        # one cache directory per source: an explicit cache_dir is one dataset's
        where = None if cache is None else f"{cache}/{name}"
        ds = open_dataset(f"{url}/{name}", cache_dir=where, storage_options=options)
        sources.append(Source(ds, proportion=len(ds), name=name))
    return mix(sources, batching="stratified")


def _rows_at(url: str) -> int:
    return int(url.rsplit("-rows", 1)[1].split("-")[0])


def _write_data(
    kind: str, url: str, rows: int, options: dict[str, Any], delta: dict[str, str]
) -> None:
    import pyarrow as pa

    from spark_dl_core import DatasetSpec, write_mds

    if kind in PACKS:  # token documents, each shard's tokens (and lengths) recorded
        docs = pa.array([d.tolist() for d in _documents(rows)], pa.list_(pa.int32()))
        table, spec = pa.table({"tokens": docs}), DatasetSpec(shard_size="128KiB")
        if kind != "packed-mixture":
            write_mds(table, url, spec, storage_options=options)
            return
        for name, first, n in _mixture_parts(rows):  # documents back to back over the sources
            write_mds(table.slice(first, n), f"{url}/{name}", spec, storage_options=options)
        return
    x = np.random.default_rng(0).random((rows, 256), dtype=np.float32)
    table = pa.table({"id": np.arange(rows, dtype=np.int64), "x": list(x)})
    if kind == "mds":
        write_mds(table, url, DatasetSpec(shard_size="128KiB"), storage_options=options)
        return
    if kind == "mixture":  # rows back to back over the sources: ids stay the rows' numbers
        for name, first, n in _mixture_parts(rows):
            part = table.slice(first, n)
            spec = DatasetSpec(shard_size="128KiB")
            write_mds(part, f"{url}/{name}", spec, storage_options=options)
        return
    from deltalake import WriterProperties, write_deltalake

    per_file = rows // 16
    props = WriterProperties(max_row_group_size=256)  # row groups are the shards read in place
    for f in range(16):
        part = table.slice(f * per_file, per_file)
        write_deltalake(url, part, mode="append", storage_options=delta, writer_properties=props)


def _token_count(rows: int) -> int:
    return int(sum(len(d) for d in _documents(rows)))


def _stored_bytes(fs: Any, prefix: str) -> int:
    return sum(int(info["size"]) for info in fs.find(prefix, detail=True).values())


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _reference(
    kind: str, url: str, options: dict[str, Any], epoch: int, streams: int
) -> list[np.ndarray]:
    ds = _open(kind, url, options, None)
    if kind in PACKS:  # the 1-rank loader's batches
        settings = {"shuffle": True, "seed": SEED, "epoch": epoch, "streams": streams}
        packed = ds.iter_batches(PACK_BATCH, pack=PACKS[kind], **settings)
        return [np.asarray(_real_tokens(b)) for b in packed]
    order = ds.sample_order(batch_size=BATCH, shuffle=True, seed=SEED, epoch=epoch, streams=streams)
    # positions index the dataset's rows (a Delta table's in the log's file order): its ids
    ids = np.asarray(ds.read(np.arange(len(ds)), columns=["id"])["id"])
    return [ids[np.asarray(b)] for b in order]


def run_case(
    kind: str,
    nodes: int,
    per_node: int,
    url: str,
    direct: dict[str, Any],
    counted: dict[str, Any],
    link: Any,
    stored: int,
    rows: int,
    streams: int,
    work: Path,
) -> dict[str, Any]:
    world = nodes * per_node
    node_dirs = [work / f"{kind}-{nodes}x{per_node}-node{n}" for n in range(nodes)]
    per_epoch, landed = [], []
    for epoch in range(3):
        before = link.down_bytes
        procs = []
        for n in range(nodes):
            for local in range(per_node):
                rank = n * per_node + local
                env = dict(
                    os.environ,
                    RANK=str(rank),
                    WORLD_SIZE=str(world),
                    LOCAL_RANK=str(local),
                    LOCAL_WORLD_SIZE=str(per_node),
                    GROUP_RANK=str(n),
                    TMPDIR=str(node_dirs[n]),
                )
                node_dirs[n].mkdir(parents=True, exist_ok=True)
                out = work / f"out-{kind}-{nodes}x{per_node}-{epoch}-{rank}.json"
                cmd = [
                    sys.executable,
                    __file__,
                    "--rank-worker",
                    "--kind",
                    kind,
                    "--url",
                    url,
                    "--cache",
                    str(node_dirs[n] / "cache"),
                    "--epoch",
                    str(epoch),
                    "--out",
                    str(out),
                    "--options",
                    json.dumps(counted),
                    "--streams",
                    str(streams),
                ]
                procs.append((rank, out, subprocess.Popen(cmd, env=env)))
        got: dict[int, list[np.ndarray]] = {}
        for rank, out, proc in procs:
            if proc.wait() != 0:
                raise SystemExit(f"rank {rank} failed")
            got[rank] = [np.asarray(b) for b in json.loads(out.read_text())["batches"]]
        per_epoch.append((link.down_bytes - before) / stored)
        # every row (packed: every token) once in the epoch
        every = np.sort(np.concatenate([np.concatenate(v) for v in got.values() if v]))
        want = np.arange(1, _token_count(rows) + 1) if kind in PACKS else np.arange(rows)
        assert np.array_equal(every, want), f"{kind} epoch {epoch}: rows not served once"
        # step k's rows are the 1-rank order's batches kW..kW+W-1
        ref = _reference(kind, url, direct, epoch, streams)
        for k in range(len(got[0])):
            step = [got[r][k] for r in range(world) if k < len(got[r])]
            want = ref[k * world : k * world + len(step)]
            assert all(np.array_equal(a, b) for a, b in zip(step, want)), f"{kind} step {k}"
        landed.append([_du(d / "cache") / stored for d in node_dirs])
    return {"per_epoch": per_epoch, "total": sum(per_epoch), "landed": landed[0]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank-worker", action="store_true")
    parser.add_argument("--kind", default="mds")
    parser.add_argument("--url")
    parser.add_argument("--cache")
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument("--out")
    parser.add_argument("--options", default="{}")
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--streams", type=int, default=0)
    parser.add_argument(
        "--kinds",
        default="mds,delta,mixture",
        help="comma-separated: mds, delta, mixture, packed, packed-bin, packed-mixture",
    )
    parser.add_argument("--anchors", default="auto", help="auto (those built), none, or names")
    args = parser.parse_args()
    if args.rank_worker:
        return rank_worker(args)

    from s3_helpers import ShapedLink, aws_test_env, delta_options, endpoint_options, moto_process

    with moto_process() as (host, port), aws_test_env(), ShapedLink((host, port)) as link:
        import s3fs

        direct = endpoint_options(host, port)
        counted = endpoint_options("127.0.0.1", link.port)
        counted_delta = delta_options("127.0.0.1", link.port)
        fs = s3fs.S3FileSystem(**direct)
        fs.call_s3("create_bucket", Bucket="bench")
        print(f"rows={args.rows} batch={BATCH} streams={args.streams}")
        print(
            f"{'case':28} {'epoch 0':>8} {'epoch 1':>8} {'epoch 2':>8} {'3 epochs':>9}"
            "  landed per node"
        )
        for kind in args.kinds.split(","):
            url = f"s3://bench/{kind}-{args.streams}-rows{args.rows}"
            _write_data(kind, url, args.rows, direct, delta_options(host, port))
            stored = _stored_bytes(fs, url[len("s3://") :])
            if args.streams == 0:
                from spark_dl_core.order import resolve_streams

                plain = direct if kind != "delta" else delta_options(host, port)
                opened = _open(kind, url, plain, None)
                blocks = len(opened.shard_offsets) - 1
                auto = resolve_streams(opened, True, 0)
                if kind in PACKS:
                    from spark_dl_core.loaders.packed_streams import packed_streams
                    from spark_dl_core.loaders.settings import LoaderSettings

                    asked = LoaderSettings(batch_size=PACK_BATCH, shuffle=True, pack=PACKS[kind])
                    auto = packed_streams(opened, asked)
                print(f"{kind}: {blocks} shards, automatic streams {auto}")
            options = counted if kind != "delta" else counted_delta
            for nodes, per_node in ((4, 1), (2, 2)):
                with tempfile.TemporaryDirectory() as work:
                    got = run_case(
                        kind,
                        nodes,
                        per_node,
                        url,
                        direct if kind != "delta" else delta_options(host, port),
                        options,
                        link,
                        stored,
                        args.rows,
                        args.streams,
                        Path(work),
                    )
                e = got["per_epoch"]
                landed = " ".join(f"{x:.2f}" for x in got["landed"])
                print(
                    f"{kind + f' {nodes} nodes x {per_node}':28} {e[0]:7.2f}x {e[1]:7.2f}x "
                    f"{e[2]:7.2f}x {got['total']:8.2f}x  {landed} (of the dataset)"
                )
        mds_url = f"s3://bench/mds-{args.streams}-rows{args.rows}"
        if "mds" not in args.kinds.split(","):
            _write_data("mds", mds_url, args.rows, direct, {})
        _print_anchors(args.anchors, mds_url, fs, link, args.rows)


def _print_anchors(which: str, mds_url: str, fs: Any, link: Any, rows: int) -> None:
    """The anchors' rows of the table (``egress_anchors``), on the same server and proxy."""
    import egress_anchors as anchors

    built = anchors.available()
    names = built if which == "auto" else [] if which == "none" else which.split(",")
    for name in anchors.ANCHORS:
        if name not in names or name not in built:
            why = "not asked for" if name not in names else "side environment not built"
            print(f"{name}: {why}, not measured")
    endpoint = f"http://127.0.0.1:{link.port}"
    stored = {"mosaic": _stored_bytes(fs, mds_url[len("s3://") :])}
    for name in [n for n in anchors.ANCHORS if n in names and n in built]:
        kind = name.split()[0]
        url = mds_url if kind == "mosaic" else f"s3://bench/litdata-rows{rows}"
        for nodes, per_node in ((4, 1), (2, 2)):
            with tempfile.TemporaryDirectory() as work:
                if kind not in stored:
                    stored[kind] = anchors.write_litdata(rows, fs, url[5:], Path(work))
                try:
                    got = anchors.run_anchor(
                        name, nodes, per_node, url, endpoint, link, stored[kind], rows, BATCH,
                        Path(work),
                    )  # fmt: skip
                except RuntimeError as e:
                    print(f"{name} {nodes} nodes x {per_node}: failed ({e})")
                    continue
            e = got["per_epoch"]
            landed = " ".join(f"{x:.2f}" for x in got["landed"])
            served = " ".join(f"{r}/{m}" for r, m in zip(got["repeats"], got["misses"]))
            print(
                f"{name + f' {nodes} nodes x {per_node}':28} {e[0]:7.2f}x {e[1]:7.2f}x "
                f"{e[2]:7.2f}x {got['total']:8.2f}x  {landed} (of the dataset); rows twice/"
                f"missed per epoch {served}"
            )


if __name__ == "__main__":
    main()
