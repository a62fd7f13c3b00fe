"""Loader throughput: one shuffled epoch of 1M rows (float32[32] + int64 label), batch 1024.

Compares, in one run, with alternating rounds and medians:

- ``ours_w2``: ``ds.to_torch(shuffle=True, num_workers=2)``
- ``ours_w0``: the same in-process (``num_workers=0``)
- ``pyarrow``: a plain ``pq.ParquetFile.iter_batches`` → ``torch.from_numpy`` loop (no shuffle)
- ``mem_seq``: sequential slices of a preloaded tensor (upper limit)
- ``mem_shuf``: a preloaded tensor gathered by a random permutation, batch by batch
- ``mosaic``: Mosaic ``StreamingDataset`` + DataLoader(2 workers), if ``.venv-mosaic`` exists
- ``one_w0`` / ``one_w2``: ``ours_w0`` / ``ours_w2`` with ``streams=1``, run where the default
  order reads several streams (``--shard-size 2MiB``): what the streams cost or save

``--baseline OTHER/jvm-free`` adds ``base_w0`` / ``base_w2``: the same two loaders run from
another source tree (e.g. ``git archive main``), for before/after ratios under one load.

Each measurement runs in a fresh subprocess, so peak RSS (self + worker children) is its
own. Usage: ``python bench/loader_bench.py [--rows N] [--rounds R]``.

``--memory`` instead shows bounded memory: peak RSS of one shuffled epoch (in-process and
2 workers) over datasets of ``rows / 4`` and ``rows`` rows, same shard size and shuffle
window, next to ``baseline`` (interpreter, torch and the opened dataset, no iteration).
Peak RSS should stay about equal although the larger dataset is 4x the data.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BATCH = 1024


def make_data(directory: Path, rows: int, shard_size: str = "8MiB") -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_dl_core import DatasetSpec, write_mds

    if (directory / "done").exists():
        return
    rng = np.random.default_rng(0)
    x = rng.random((rows, 32), dtype=np.float32)
    table = pa.table(
        {
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 32),
            "label": pa.array(np.arange(rows, dtype=np.int64)),
        }
    )
    write_mds(table, str(directory / "mds"), DatasetSpec(shard_size=shard_size), mode="overwrite")
    pq.write_table(table, directory / "data.parquet", row_group_size=65536)
    np.save(directory / "x.npy", x)
    (directory / "done").write_text("ok")


def _peak_rss_kib() -> int:
    """This process's peak RSS. ``VmHWM`` where Linux has it: ``ru_maxrss`` survives exec, so
    a child started from a big parent (e.g. one that just built a dataset) inherits its peak.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_one(name: str, directory: Path) -> dict[str, float]:
    """One epoch of one loader; returns seconds, time to first batch, samples, peak RSS."""
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    from spark_dl_core import open_dataset

    torch.set_num_threads(1)
    start = time.perf_counter()  # loader time, not interpreter start or module imports
    first = None
    samples = 0
    if name.startswith(("ours", "one")):
        ds = open_dataset(str(directory / "mds"))
        workers = 2 if name.endswith("_w2") else 0
        prefetch = int(os.environ.get("SPARK_DL_BENCH_PREFETCH_MIB", "1024")) << 20
        batches = ds.to_torch(
            batch_size=BATCH,
            shuffle=True,
            seed=0,
            num_workers=workers,
            prefetch_bytes=prefetch,
            streams=1 if name.startswith("one") else 0,  # one stream: the order before v4
        )
        for b in batches:
            first = first or time.perf_counter()
            samples += len(b["label"])
            assert b["x"].shape[1] == 32
    elif name == "baseline":  # what the process holds before reading a sample
        ds = open_dataset(str(directory / "mds"))
        samples = 1
    elif name == "pyarrow":
        for rb in pq.ParquetFile(directory / "data.parquet").iter_batches(batch_size=BATCH):
            x = torch.from_numpy(rb.column(0).values.to_numpy(zero_copy_only=False).reshape(-1, 32))
            y = torch.from_numpy(rb.column(1).to_numpy())
            first = first or time.perf_counter()
            samples += len(y)
            assert x.shape[1] == 32
    elif name.startswith("mem"):
        x_all = torch.from_numpy(np.load(directory / "x.npy"))
        y_all = torch.arange(len(x_all))
        start = time.perf_counter()  # the limit excludes loading the tensor
        n = len(x_all)
        if name == "mem_seq":
            for i in range(0, n, BATCH):
                x, y = x_all[i : i + BATCH], y_all[i : i + BATCH]
                first = first or time.perf_counter()
                samples += len(y)
        else:
            perm = torch.randperm(n)
            for i in range(0, n, BATCH):
                idx = perm[i : i + BATCH]
                x, y = x_all[idx], y_all[idx]
                first = first or time.perf_counter()
                samples += len(y)
    else:
        raise ValueError(name)
    end = time.perf_counter()
    rss = _peak_rss_kib()
    rss_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {
        "seconds": end - start,
        "first_batch_s": (first or end) - start,
        "samples": samples,
        "peak_rss_mib": (rss + rss_children) / 1024,
    }


MOSAIC_SAMPLES = 100_000
MOSAIC = """
import json, sys, time, resource
sys.path.insert(0, sys.argv[2])
import mosaic_shim  # stubs the SDKs Mosaic imports but never uses for local MDS
mosaic_shim.install()
from streaming import StreamingDataset
from torch.utils.data import DataLoader
start = time.perf_counter(); first = None; n = 0
ds = StreamingDataset(local=sys.argv[1], shuffle=True, shuffle_seed=0, batch_size=1024)
for b in DataLoader(ds, batch_size=1024, num_workers=2):
    first = first or time.perf_counter(); n += len(b["label"])
    if n >= int(sys.argv[3]):  # Mosaic is ~100x slower: time a sample of the epoch
        break
end = time.perf_counter()
r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + resource.getrusage(
    resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"seconds": end - start, "first_batch_s": first - start, "samples": n,
                  "peak_rss_mib": r / 1024}))
"""


def measure(name: str, directory: Path) -> dict[str, float]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if name == "mosaic":
        python = ROOT / ".venv-mosaic" / "bin" / "python"
        interop = str(ROOT / "tests" / "interop")
        cmd = [str(python), "-c", MOSAIC, str(directory / "mds"), interop, str(MOSAIC_SAMPLES)]
    elif name.startswith("base_"):  # the same loader from another source tree (before/after)
        env["PYTHONPATH"] = os.environ["SPARK_DL_BENCH_BASELINE"]
        one = "ours_" + name[len("base_") :]
        cmd = [sys.executable, __file__, "--one", one, "--dir", str(directory)]
    else:
        cmd = [sys.executable, __file__, "--one", name, "--dir", str(directory)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if out.returncode:
        raise RuntimeError(f"{name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory(rows: int, rounds: int) -> None:
    """Peak RSS of one epoch for ``rows // 4`` and ``rows`` rows: bounded by window, not size."""
    sizes = [rows // 4, rows]
    dirs = {}
    for n in sizes:
        dirs[n] = Path(tempfile.gettempdir()) / f"spark-dl-bench-{n}"
        dirs[n].mkdir(parents=True, exist_ok=True)
        make_data(dirs[n], n)
    names = ["baseline", "ours_w0", "ours_w2"]
    peak: dict[tuple[str, int], list[float]] = {}
    for r in range(rounds):
        for n in sizes if r % 2 == 0 else reversed(sizes):
            for name in names:
                peak.setdefault((name, n), []).append(measure(name, dirs[n])["peak_rss_mib"])
    prefetch = os.environ.get("SPARK_DL_BENCH_PREFETCH_MIB", "1024")
    print(f"\npeak RSS MiB (median of {rounds}); shards 8 MiB, window 4, prefetch {prefetch} MiB")
    print(f"{'loader':10} " + " ".join(f"{n:>12,} rows" for n in sizes) + "  ratio")
    for name in names:
        values = [statistics.median(peak[(name, n)]) for n in sizes]
        print(
            f"{name:10} "
            + " ".join(f"{v:17.0f}" for v in values)
            + f"  {values[1] / values[0]:.2f}"
        )
    data = {n: sum(f.stat().st_size for f in (dirs[n] / "mds").iterdir()) >> 20 for n in sizes}
    print("dataset MiB: " + ", ".join(f"{n:,} rows = {m}" for n, m in data.items()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one")
    parser.add_argument("--dir")
    parser.add_argument("--skip", default="", help="comma-separated loaders to leave out")
    parser.add_argument("--memory", action="store_true", help="peak RSS at 1/4 and full size")
    parser.add_argument("--prefetch-mib", type=int, default=None, help="loader prefetch budget")
    parser.add_argument(
        "--shard-size",
        default="8MiB",
        help="the MDS shards' size: 2MiB makes ~68 shards of 1M rows, so the default order "
        "reads 4 streams; one_w0/one_w2 (streams=1) run beside ours_w0/ours_w2",
    )
    parser.add_argument(
        "--baseline",
        help="a source tree's jvm-free/ dir: also run ours_w0/ours_w2 from it (base_w0/base_w2)",
    )
    args = parser.parse_args()
    if args.baseline:
        os.environ["SPARK_DL_BENCH_BASELINE"] = str(Path(args.baseline).resolve())
    if args.prefetch_mib is not None:
        os.environ["SPARK_DL_BENCH_PREFETCH_MIB"] = str(args.prefetch_mib)
    if args.one:
        print(json.dumps(run_one(args.one, Path(args.dir))))
        return
    if args.memory:
        memory(args.rows, args.rounds)
        return
    sized = "" if args.shard_size == "8MiB" else f"-{args.shard_size}"
    default_dir = Path(tempfile.gettempdir()) / f"spark-dl-bench-{args.rows}{sized}"
    directory = Path(args.dir or default_dir)
    directory.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    make_data(directory, args.rows, args.shard_size)
    print(f"data ready in {time.perf_counter() - t:.1f}s at {directory}")
    from spark_dl_core import open_dataset
    from spark_dl_core.order import resolve_streams

    opened = open_dataset(str(directory / "mds"))
    streams = resolve_streams(opened, True, 0)
    print(f"{opened.num_shards} shards: the default order reads {streams} stream(s)")
    names = ["ours_w2", "ours_w0", "pyarrow", "mem_seq", "mem_shuf"]
    if streams > 1:  # the same loaders in the one-stream order, for the streams' cost
        names += ["one_w2", "one_w0"]
    if (ROOT / ".venv-mosaic" / "bin" / "python").exists():
        names.append("mosaic")
    else:
        print("mosaic: skipped (.venv-mosaic not found)")
    print("petastorm: skipped (no side environment)")
    if args.baseline:
        names += ["base_w2", "base_w0"]
    names = [n for n in names if n not in args.skip.split(",")]
    results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else reversed(names):  # alternate the order
            try:
                results[name].append(measure(name, directory))
            except RuntimeError as exc:
                print(exc)
    med = {
        n: {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        for n, runs in results.items()
        if runs
    }
    rate = {n: m["samples"] / m["seconds"] for n, m in med.items()}
    print(f"\n{args.rows:,} rows, batch {BATCH}, {args.rounds} rounds (medians)")
    print(
        f"{'loader':10} {'samples/s':>12} {'epoch s':>8} {'1st batch s':>11} {'peak RSS MiB':>12}"
    )
    for n, m in med.items():
        print(
            f"{n:10} {rate[n]:12,.0f} {m['seconds']:8.2f} {m['first_batch_s']:11.3f} "
            f"{m['peak_rss_mib']:12.0f}"
        )
    print("\nratios")
    for a, b in [
        ("ours_w2", "pyarrow"),
        ("ours_w2", "mosaic"),
        ("ours_w0", "mem_shuf"),
        ("ours_w2", "mem_shuf"),
        ("mem_shuf", "mem_seq"),
        ("ours_w0", "base_w0"),
        ("ours_w2", "base_w2"),
        ("ours_w0", "one_w0"),
        ("ours_w2", "one_w2"),
    ]:
        if a in rate and b in rate:
            print(f"  {a} / {b}: {rate[a] / rate[b]:.2f}x")


if __name__ == "__main__":
    main()
