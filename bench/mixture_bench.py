"""Mixture throughput: two datasets read as one mixture against the same rows as one dataset.

Workload (ANCHORS.md): two fixed-width datasets of 2M and 1M rows (``id`` int64 +
``x`` float32[8]), proportions 2/3 and 1/3 (epoch = 3M rows), batch 1024, shuffled; and a
token-document mixture (two datasets of variable-length int32 documents, ``torch.nested``
out, batch 16). Each case runs in a fresh process with torch imported before the clock and
reports its first pass (cold: shards read and hashed) and a second pass (warm) separately,
in wall time and in the process's CPU time. Round ``r`` shuffles with seed ``r`` in every case
(the medians span seeds: a seed's shuffle windows decide part of a pass's cost). On a shared
machine the wall figures follow the load; the CPU ratios of the in-process cases (``_w0``,
``tok_*``) do not, and are the ones to compare there:

- ``one_w0`` / ``one_w2``: the same rows written as one dataset, ``to_torch`` in-process /
  2 workers
- ``mix_w0`` / ``mix_w2``: ``mix([Source(a, proportion=2/3), Source(b, proportion=1/3)])``
- ``strat_w0``: the mixture with ``batching="stratified"``
- ``fix3_w0`` / ``sched_w0``: three fixed-width sources (``a``, ``b`` and ``one``, 6M rows)
  mixed 5:3:2 with epoch 3M, fixed / as a 3-stage schedule whose stages all fall in the
  second (warm) pass: epoch 1 is stage 0 for 1M rows, then 3:3:4, then 2:2:6 (target:
  ``sched_w0`` warm >= 0.9x ``fix3_w0`` warm)
- ``tok_one`` / ``tok_mix``: the token documents as one dataset / as a mixture of two
- ``mosaic``: Mosaic ``StreamingDataset(streams=[Stream(proportion=2/3), Stream(proportion=1/3)])``
  in-process (timed over a sample of the epoch, it is far slower), if ``.venv-mosaic`` exists

Usage: ``python bench/mixture_bench.py [--scale 1.0] [--rounds 3] [--only one_w0,strat_w0]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BATCH = 1024
TOKEN_BATCH = 16
MOSAIC_SAMPLES = 100_000


def make_data(directory: Path, scale: float) -> None:
    import numpy as np
    import pyarrow as pa

    from spark_dl_core import DatasetSpec, write_mds

    if (directory / "done").exists():
        return
    rng = np.random.default_rng(0)
    sizes = {"a": int(2_000_000 * scale), "b": int(1_000_000 * scale)}
    tables = {}
    start = 0
    for name, n in sizes.items():
        x = rng.random((n, 8), dtype=np.float32)
        tables[name] = pa.table(
            {
                "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
                "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 8),
            }
        )
        start += n
    spec = DatasetSpec(shard_size="8MiB")
    for name, table in tables.items():
        write_mds(table, str(directory / name), spec, mode="overwrite")
    write_mds(pa.concat_tables(tables.values()), str(directory / "one"), spec, mode="overwrite")
    docs = {"ta": int(30_000 * scale), "tb": int(20_000 * scale)}
    token_tables = {}
    for name, n in docs.items():
        lengths = rng.integers(64, 1024, n)
        values = rng.integers(0, 50_000, int(lengths.sum()), dtype=np.int32)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        token_tables[name] = pa.table(
            {"tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))}
        )
        write_mds(token_tables[name], str(directory / name), spec, mode="overwrite")
    write_mds(
        pa.concat_tables(token_tables.values()), str(directory / "tone"), spec, mode="overwrite"
    )
    (directory / "done").write_text("ok")


def run_one(name: str, directory: Path, seed: int = 0) -> dict[str, float]:
    """Two passes of one loader: seconds (wall and this process's CPU) and rows of each."""
    import torch  # noqa: F401  (imported before the clock)

    from spark_dl_core import Source, mix, open_dataset

    d = str(directory)
    workers = 2 if name.endswith("_w2") else 0
    if name.startswith("one"):
        source = open_dataset(f"{d}/one")
    elif name.startswith("tok_one"):
        source = open_dataset(f"{d}/tone")
    elif name.startswith(("fix3", "sched")):
        three = [Source(f"{d}/{n}", name=n) for n in ("a", "b", "one")]
        size = int(open_dataset(f"{d}/one").shard_offsets[-1])
        first = {"a": 5.0, "b": 3.0, "one": 2.0}
        if name.startswith("fix3"):
            weighted = [Source(s.dataset, name=s.name, proportion=first[s.name]) for s in three]
            source = mix(weighted, epoch_size=size)
        else:  # the stages all in epoch 1 (the warm pass): three parts of a third each
            stages = [
                (0, first),
                (size + size // 3, {"a": 3.0, "b": 3.0, "one": 4.0}),
                (size + 2 * (size // 3), {"a": 2.0, "b": 2.0, "one": 6.0}),
            ]
            source = mix(three, epoch_size=size, schedule=stages)
    elif name.startswith("tok_mix"):
        source = mix([Source(f"{d}/ta", proportion=0.6), Source(f"{d}/tb", proportion=0.4)])
    else:
        batching = "stratified" if name.startswith("strat") else "random"
        source = mix(
            [Source(f"{d}/a", proportion=2 / 3), Source(f"{d}/b", proportion=1 / 3)],
            batching=batching,
        )
    batch = TOKEN_BATCH if name.startswith("tok") else BATCH
    loader = source.to_torch(batch_size=batch, shuffle=True, seed=seed, num_workers=workers)
    out: dict[str, float] = {}
    for label in ("cold", "warm"):
        start, cpu = time.perf_counter(), time.process_time()
        rows = 0
        for b in loader:
            value = b["tokens"] if "tokens" in b else b["id"]
            rows += value.size(0)
        out[f"{label}_s"] = time.perf_counter() - start
        out[f"{label}_cpu"] = time.process_time() - cpu
        out[f"{label}_rows"] = rows
    return out


MOSAIC = """
import json, sys, time
sys.path.insert(0, sys.argv[2])
import mosaic_shim  # stubs the SDKs Mosaic imports but never uses for local MDS
mosaic_shim.install()
import torch
from streaming import Stream, StreamingDataset
streams = [Stream(local=sys.argv[1] + "/a", proportion=2 / 3),
           Stream(local=sys.argv[1] + "/b", proportion=1 / 3)]
ds = StreamingDataset(streams=streams, shuffle=True, shuffle_seed=0, batch_size=1024)
loader = torch.utils.data.DataLoader(ds, batch_size=1024, num_workers=0)
start = time.perf_counter(); n = 0
for b in loader:
    n += len(b["id"])
    if n >= int(sys.argv[3]):  # far slower: time a sample of the epoch
        break
print(json.dumps({"warm_s": time.perf_counter() - start, "warm_rows": n}))
"""


def measure(name: str, directory: Path, seed: int = 0) -> dict[str, float]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if name == "mosaic":
        python = ROOT / ".venv-mosaic" / "bin" / "python"
        interop = str(ROOT / "tests" / "interop")
        cmd = [str(python), "-c", MOSAIC, str(directory), interop, str(MOSAIC_SAMPLES)]
    else:
        cmd = [sys.executable, __file__, "--one", name, "--dir", str(directory)]
        cmd += ["--seed", str(seed)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if out.returncode:
        raise RuntimeError(f"{name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="data size (1.0: 2M + 1M rows)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--only", help="comma-separated cases to run (e.g. one_w0,strat_w0); default: all"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, Path(args.dir), args.seed)))
        return
    directory = Path(tempfile.gettempdir()) / f"spark-dl-mixture-bench-{args.scale}"
    directory.mkdir(parents=True, exist_ok=True)
    make_data(directory, args.scale)
    names = ["one_w0", "mix_w0", "strat_w0", "one_w2", "mix_w2", "fix3_w0", "sched_w0"]
    names += ["tok_one", "tok_mix"]
    if (ROOT / ".venv-mosaic" / "bin" / "python").exists():
        names.append("mosaic")
    else:
        print("mosaic: skipped (.venv-mosaic not found)")
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            parser.error(f"unknown case(s) {unknown}: choose from {names}")
        names = [n for n in names if n in wanted]
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else list(reversed(names)):
            if name == "mosaic" and r:  # one sample is enough: it is ~1000x slower
                continue
            runs[name].append(measure(name, directory, seed=r) | {"load": os.getloadavg()[0]})
    rate: dict[str, dict[str, float]] = {}
    print(f"\nrows/s (docs/s for tok_*), medians of {args.rounds} rounds, fresh process each")
    print(f"{'case':10} {'cold':>12} {'warm':>12} {'warm / CPU s':>13}")
    for name, got in runs.items():
        rate[name] = {}
        for label in ("cold", "warm"):
            values = [g[f"{label}_rows"] / g[f"{label}_s"] for g in got if f"{label}_s" in g]
            if values:
                rate[name][label] = statistics.median(values)
        cpu = [g["warm_rows"] / g["warm_cpu"] for g in got if g.get("warm_cpu")]
        if cpu and not name.endswith("_w2"):  # workers' CPU is not this process's
            rate[name]["cpu"] = statistics.median(cpu)
        cells = [
            f"{rate[name][k]:>12,.0f}" if k in rate[name] else f"{'-':>12}"
            for k in ("cold", "warm", "cpu")
        ]
        loads = [g["load"] for g in got]
        load = f"load {min(loads):.1f}-{max(loads):.1f}"
        print(f"{name:10} {cells[0]} {cells[1]} {cells[2]:>13}  {load}")
    print("\nratios (warm)")
    for a, b in [
        ("mix_w0", "one_w0"),
        ("strat_w0", "one_w0"),
        ("mix_w2", "one_w2"),
        ("sched_w0", "fix3_w0"),
        ("tok_mix", "tok_one"),
        ("mix_w0", "mosaic"),
    ]:
        if a in rate and b in rate and "warm" in rate[a] and "warm" in rate[b]:
            line = f"{a} / {b}: {rate[a]['warm'] / rate[b]['warm']:.2f}x"
            if "cpu" in rate[a] and "cpu" in rate[b]:
                line += f" (CPU time: {rate[a]['cpu'] / rate[b]['cpu']:.2f}x)"
            print(line)


if __name__ == "__main__":
    main()
