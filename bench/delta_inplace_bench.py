"""Reading a pinned Delta version in place vs a plain pyarrow scan vs exporting to MDS.

Not a test. Builds a Delta table (``id`` int64 + ``x`` float32[32], 8 files written by
deltalake), then prints time to first batch and cold/warm-epoch rows/s for: the in-place loader
(``open_delta(...).dataset(...).to_torch(shuffle=True)``, in-process and 2 workers, without
and with its disk cache of converted row groups: the cold pass fills it), a pyarrow scan of the
same version's files delivering torch tensors (no shuffle), and the MDS path
(``snap.write_mds`` + loading the export shuffled). Frameworks are imported before any clock.

    python bench/delta_inplace_bench.py --rows 1000000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from deltalake import write_deltalake

from spark_dl_core import open_dataset
from spark_dl_core.sources.delta import open_delta

DIM = 32
FILES = 8


def build(path: str, rows: int) -> None:
    per = rows // FILES
    for k in range(FILES):
        ids = np.arange(k * per, (k + 1) * per, dtype=np.int64)
        values = np.random.default_rng(k).random(per * DIM, dtype=np.float32)
        offsets = np.arange(0, per * DIM + 1, DIM, dtype=np.int32)
        x = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        write_deltalake(path, pa.table({"id": ids, "x": x}), mode="append")


def timed(make: Callable[[], Iterable[Any]]) -> tuple[float, float, int]:
    """(seconds to the first batch, seconds for the whole pass, rows) of one pass."""
    start = time.perf_counter()
    first = None
    rows = 0
    for batch in make():
        if first is None:
            first = time.perf_counter() - start
        rows += len(batch["id"])
    return first or 0.0, time.perf_counter() - start, rows


def scan(files: list[str], batch_size: int) -> Iterable[dict[str, torch.Tensor]]:
    """A plain pyarrow scan (file order, no shuffle) delivering torch tensors."""
    for f in files:
        for b in pq.ParquetFile(f).iter_batches(batch_size=batch_size):
            x = b.column("x").values.to_numpy().reshape(-1, DIM).copy()
            yield {"id": torch.from_numpy(b.column("id").to_numpy()), "x": torch.from_numpy(x)}


def report(name: str, cold: tuple[float, float, int], warm: tuple[float, float, int]) -> float:
    rate = warm[2] / warm[1]
    print(
        f"{name:<34} first batch {cold[0]:7.3f} s (cold)  epoch cold {cold[2] / cold[1]:>11,.0f}"
        f" rows/s  warm {rate:>11,.0f} rows/s"
    )
    return rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    args = parser.parse_args()
    bs = args.batch_size
    with tempfile.TemporaryDirectory() as tmp:
        table = f"{tmp}/table"
        build(table, args.rows)
        print(f"{args.rows:,} rows of id int64 + x float32[{DIM}] in {FILES} files")
        rates: dict[str, float] = {}

        def inplace(workers: int, cache: bool) -> Callable[[], Iterable[Any]]:
            def make() -> Iterable[Any]:
                # open counts toward the first batch; one cold disk cache per setting
                snap = open_delta(table)
                ds = snap.dataset(cache=cache, cache_dir=f"{tmp}/cache-{workers}")
                return ds.to_torch(batch_size=bs, shuffle=True, seed=0, num_workers=workers)

            return make

        for cache in (False, True):
            for workers in (0, 2):
                name = f"in place{'' if cache else ' no cache'}, shuffled, {workers} workers"
                make = inplace(workers, cache)
                rates[name] = report(name, timed(make), timed(make))
        files = open_delta(table).files
        rates["pyarrow scan"] = report(
            "pyarrow scan -> torch (no shuffle)",
            timed(lambda: scan(files, bs)),
            timed(lambda: scan(files, bs)),
        )
        start = time.perf_counter()
        open_delta(table).write_mds(f"{tmp}/mds")
        export_s = time.perf_counter() - start
        print(f"snap.write_mds (export)            {export_s:7.3f} s")

        def mds(workers: int) -> Callable[[], Iterable[Any]]:
            def make() -> Iterable[Any]:
                ds = open_dataset(f"{tmp}/mds")
                return ds.to_torch(batch_size=bs, shuffle=True, seed=0, num_workers=workers)

            return make

        for workers in (0, 2):
            name = f"MDS export, shuffled, {workers} workers"
            cold = timed(mds(workers))
            rates[name] = report(name, cold, timed(mds(workers)))
            if workers == 0:
                print(f"{'':<34} first batch after export {export_s + cold[0]:.3f} s")
        scan_rate = rates["pyarrow scan"]
        for workers in (0, 2):
            ours = rates[f"in place, shuffled, {workers} workers"]
            print(
                f"in place / pyarrow scan ({workers} workers): {ours / scan_rate:.2f}x;  "
                f"in place / MDS: {ours / rates[f'MDS export, shuffled, {workers} workers']:.2f}x"
            )


if __name__ == "__main__":
    main()
