"""Scale benchmark: opening and planning an epoch at 10^4..10^6 shards, 10^8..10^10 samples.

Synthesizes, per size, an MDS index (``index.json`` as Mosaic writes it, plus spark-dl's
compact index) of shards that do not exist (no payload is needed to open a dataset or to
plan an epoch), then, each size in a fresh process (torch imported before the clock):

- ``open``: ``open_dataset(path)``;
- ``ready``: building rank 0 of 64's ``to_torch`` loader (shuffled) and computing the global
  sample ids of its first batch;
- ``resume``: a fresh loader given a state at 90% of the epoch, up to its first batch's ids
  (the order is recomputed, as in a new process);
- ``plan MB``: peak RSS above the process's RSS after imports (the plan's own memory);
- ``peak MB``: the process's peak RSS (``VmHWM``), imports included.

``python bench/scale_bench.py`` runs every size; ``--sizes 1e4x1e4,1e6x1e4`` picks some
(shards x samples per shard); ``--json`` prints machine-readable rows.

``--mixture 100x1e4x1e3`` instead measures a mixture of 100 sources of 10^4 shards of
~10^3 samples each (proportions 1..100): ``open`` opens every source and builds the
mixture; ``ready`` and ``resume`` as above (rank 0 of 64), on the mixture. With
``--schedule`` the mixture is a 3-stage schedule over one epoch (sources named, epoch = every
source's samples): proportions 1..100 from 0, 100..1 from a third of the epoch, all equal from
two thirds; ``resume`` at 90% then lies in the last stage (target: ``--mixture 100x1e4x1e4
--schedule``, 10^10 samples, ready < 2 s and plan < 500 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = ["1e4x1e4", "1e5x1e3", "1e6x1e2", "1e4x1e6", "1e5x1e5", "1e6x1e4"]
BATCH, WORLD = 256, 64


def _rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def synthesize(path: Path, shards: int, per_shard: int) -> None:
    """index.json (Mosaic's fields) and its compact index for ``shards`` absent shards."""
    import numpy as np
    import pyarrow as pa

    from spark_dl_core.format.compact import COMPACT_FILE, compact_from_columns

    path.mkdir(parents=True)
    raw = 8 * per_shard + 4 * (per_shard + 2) + 200  # 8-byte rows + offsets + config
    config = (
        '"column_encodings": ["int64"], "column_names": ["id"], "column_sizes": [8], '
        '"compression": null, "format": "mds", "hashes": [], "size_limit": 67108864, '
        '"version": 2'
    )
    entries = (
        f'{{{config}, "raw_data": {{"basename": "shard.{i:07}.mds", "bytes": {raw}, '
        f'"hashes": {{}}}}, "samples": {per_shard}, "zip_data": null}}'
        for i in range(shards)
    )
    text = ('{"shards": [' + ", ".join(entries) + '], "version": 2}').encode()
    (path / "index.json").write_bytes(text)
    names = pa.array([f"shard.{i:07}.mds" for i in range(shards)], pa.string())
    columns = {
        "samples": pa.array(np.full(shards, per_shard, np.int64)),
        "raw_basename": names,
        "raw_bytes": pa.array(np.full(shards, raw, np.int64)),
        "zip_basename": pa.nulls(shards, pa.string()),
        "zip_bytes": pa.array(np.full(shards, -1, np.int64)),
        "compression": pa.nulls(shards, pa.string()),
        "size_limit": pa.array(np.full(shards, 67108864, np.int64)),
        "hashes": pa.array(["[]"] * shards, pa.string()),
    }
    layout = {"names": ["id"], "encodings": ["int64"], "sizes": [8]}
    fingerprint = f"synthetic-{shards}x{per_shard}"
    (path / COMPACT_FILE).write_bytes(compact_from_columns(columns, layout, text, fingerprint))


def measure(path: str) -> dict[str, float]:
    """One size, in this (fresh) process."""
    import torch  # noqa: F401  (imported before the clock, as training code would)

    from spark_dl_core import open_dataset
    from spark_dl_core.loaders.torch_loader import TorchLoader  # noqa: F401

    base = _rss_mb("VmRSS")
    t0 = time.perf_counter()
    ds = open_dataset(path)
    t1 = time.perf_counter()
    kw = dict(batch_size=BATCH, shuffle=True, seed=0, rank=0, world_size=WORLD)
    loader = ds.to_torch(**kw)
    first = loader.sample_order()[0]
    t2 = time.perf_counter()
    state = loader.state_dict()
    state["consumed"] = int(0.9 * len(ds)) // (BATCH * WORLD) * (BATCH * WORLD)
    from spark_dl_core.order import choice as order

    order._ORDERS.clear()  # as in a fresh process: nothing of the first loader's order kept
    t3 = time.perf_counter()
    resumed = ds.to_torch(**kw)
    resumed.load_state_dict(state)
    again = resumed.sample_order()[0]
    t4 = time.perf_counter()
    assert len(first) == len(again) == BATCH
    return {
        "samples": len(ds),
        "shards": ds.num_shards,
        "open_s": t1 - t0,
        "ready_s": t2 - t1,
        "resume_s": t4 - t3,
        "plan_mb": _rss_mb("VmHWM") - base,
        "peak_mb": _rss_mb("VmHWM"),
        "batches_rank0": len(loader),
    }


def _stages(n: int, size: int) -> list[tuple[int, dict[str, float]]]:
    """The 3-stage schedule of ``--schedule``: rising, falling, then equal proportions."""
    names = [f"s{i:04}" for i in range(n)]
    return [
        (0, {name: float(i + 1) for i, name in enumerate(names)}),
        (size // 3, {name: float(n - i) for i, name in enumerate(names)}),
        (2 * (size // 3), dict.fromkeys(names, 1.0)),
    ]


def measure_mixture(root: str, scheduled: bool = False) -> dict[str, float]:
    """A mixture of every source under ``root`` (``scheduled``: as a 3-stage schedule), in
    this (fresh) process."""
    import torch  # noqa: F401  (imported before the clock, as training code would)

    from spark_dl_core import Source, mix, open_dataset
    from spark_dl_core.loaders.torch_loader import TorchLoader  # noqa: F401
    from spark_dl_core.order import choice as order

    paths = sorted(str(p) for p in Path(root).iterdir())
    base = _rss_mb("VmRSS")
    t0 = time.perf_counter()
    if scheduled:  # every source's samples in one epoch, its weights changing twice
        opened = [open_dataset(p) for p in paths]
        size = sum(len(d) for d in opened)
        named = [Source(d, name=f"s{i:04}") for i, d in enumerate(opened)]
        stages = _stages(len(paths), size)
        m = mix(named, epoch_size=size, schedule=stages, source_column="source")
    else:
        m = mix([Source(p, proportion=i + 1) for i, p in enumerate(paths)], source_column="source")
    t1 = time.perf_counter()
    kw = dict(batch_size=BATCH, shuffle=True, seed=0, rank=0, world_size=WORLD)
    loader = m.to_torch(**kw)
    first = loader.sample_order()[0]
    t2 = time.perf_counter()
    state = loader.state_dict()
    state["consumed"] = int(0.9 * len(m)) // (BATCH * WORLD) * (BATCH * WORLD)
    order._ORDERS.clear()
    t3 = time.perf_counter()
    resumed = m.to_torch(**kw)
    resumed.load_state_dict(state)
    again = resumed.sample_order()[0]
    t4 = time.perf_counter()
    assert len(first) == len(again) == BATCH
    return {
        "sources": len(paths),
        "stages": len(m.stages or [None]),
        "samples": len(m),
        "shards": m.num_shards,
        "open_s": t1 - t0,
        "ready_s": t2 - t1,
        "resume_s": t4 - t3,
        "plan_mb": _rss_mb("VmHWM") - base,
        "peak_mb": _rss_mb("VmHWM"),
    }


def mixture(spec: str, as_json: bool, scheduled: bool = False) -> None:
    sources, shards, per_shard = (int(float(x)) for x in spec.split("x"))
    root = Path(tempfile.mkdtemp(prefix="spark-dl-scale-mix-"))
    try:
        for i in range(sources):  # sizes differ a little: every source its own fingerprint
            synthesize(root / f"s{i:04}", shards, per_shard + i)
        out = subprocess.run(
            [sys.executable, __file__, "--measure-mixture", str(root)]
            + (["--schedule"] if scheduled else []),
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        ).stdout
        row = json.loads(out.strip().splitlines()[-1])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if as_json:
        print(json.dumps(row, indent=1))
        return
    print(
        f"mixture of {row['sources']} sources, {row['stages']} stage(s), {row['shards']:,} shards, "
        f"{row['samples']:,} samples per epoch: open {row['open_s']:.3f}s  "
        f"ready {row['ready_s']:.3f}s  resume@90% {row['resume_s']:.3f}s  "
        f"plan {row['plan_mb']:.1f} MB  peak {row['peak_mb']:.1f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--mixture", help="sources x shards x samples, e.g. 100x1e4x1e3")
    parser.add_argument(
        "--schedule", action="store_true", help="with --mixture: a 3-stage schedule"
    )
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--measure-mixture", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return
    if args.measure_mixture:
        print(json.dumps(measure_mixture(args.measure_mixture, args.schedule)))
        return
    if args.mixture:
        mixture(args.mixture, args.json, args.schedule)
        return
    rows = []
    root = Path(tempfile.mkdtemp(prefix="spark-dl-scale-"))
    try:
        for size in args.sizes.split(","):
            shards, per_shard = (int(float(x)) for x in size.split("x"))
            path = root / size
            synthesize(path, shards, per_shard)
            out = subprocess.run(
                [sys.executable, __file__, "--measure", str(path)],
                check=True,
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            ).stdout
            row = {"size": size, **json.loads(out.strip().splitlines()[-1])}
            rows.append(row)
            if not args.json:
                print(
                    f"{row['shards']:>9,} shards {row['samples']:>16,} samples  "
                    f"open {row['open_s']:6.3f}s  ready {row['ready_s']:6.3f}s  "
                    f"resume@90% {row['resume_s']:6.3f}s  plan {row['plan_mb']:7.1f} MB  "
                    f"peak {row['peak_mb']:7.1f} MB",
                    flush=True,
                )
            shutil.rmtree(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
