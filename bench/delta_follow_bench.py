"""Following a Delta table (issue 31 item 1): an update against a full export.

A table of ``--rows`` rows (float32[32] + int64) in 8 data files; then
- the update after a 1% append, against a full export of the same version;
- the storage of a followed dataset after 10 versions of 1% appends, against one export;
- the update after a 0.1% delete by deletion vectors (no shard may be written).
Each figure is printed with the load average when it was taken (the machine is shared).

    PYTHONPATH=jvm-free:. python bench/delta_follow_bench.py [--rows 4000000] [--dir /tmp/x]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from spark_dl_core import open_dataset
from spark_dl_core.tables.delta.table import open_delta
from tests.delta_helpers import delete_by_dv


def rows(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    vec = np.random.default_rng(start).random((n, 32), dtype=np.float32)
    return pa.table(
        {"id": ids, "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1)), 32)}
    )


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def size(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="follow-bench-"))
    table, out = str(root / "table"), str(root / "followed")
    per = args.rows // 8
    write_deltalake(table, rows(0, per), configuration={"delta.enableDeletionVectors": "true"})
    for k in range(1, 8):
        write_deltalake(table, rows(k * per, per), mode="append")
    next_id = 8 * per
    t, _ = timed(lambda: open_delta(table).write_mds(out, mode="update"))
    print(f"first update (a full export, {args.rows} rows, 8 files): {t:.2f}s ({load()})")

    step = args.rows // 100
    write_deltalake(table, rows(next_id, step), mode="append")
    next_id += step
    t_up, _ = timed(lambda: open_delta(table).write_mds(out, mode="update"))
    fresh = str(root / "fresh")
    t_full, _ = timed(lambda: open_delta(table).write_mds(fresh))
    assert open_dataset(out).fingerprint == open_dataset(fresh).fingerprint
    print(
        f"1% append: update {t_up:.2f}s vs full export {t_full:.2f}s = {t_up / t_full:.1%} "
        f"(target <= 5% + 0.5 s = {0.05 * t_full + 0.5:.2f}s) ({load()})"
    )

    for _ in range(9):  # 10 versions of 1% appends in all
        write_deltalake(table, rows(next_id, step), mode="append")
        next_id += step
        open_delta(table).write_mds(out, mode="update")
    shutil.rmtree(fresh)
    open_delta(table).write_mds(fresh)
    ratio = size(out) / size(fresh)
    print(
        f"storage after 10 versions of 1% appends: {size(out) / 2**20:.0f} MiB vs one export "
        f"{size(fresh) / 2**20:.0f} MiB = {ratio:.3f}x (target <= 1.15x) ({load()})"
    )

    before = {n for n in os.listdir(out) if ".mds" in n}
    gone = np.random.default_rng(1).choice(next_id, size=next_id // 1000, replace=False)
    delete_by_dv(table, sorted(int(i) for i in gone))
    t_dv, result = timed(lambda: open_delta(table).write_mds(out, mode="update"))
    after = {n for n in os.listdir(out) if ".mds" in n}
    assert after == before, "a deletion-vector update wrote shards"
    shutil.rmtree(fresh)
    open_delta(table).write_mds(fresh)
    assert result.fingerprint == open_dataset(fresh).fingerprint
    print(
        f"0.1% delete by deletion vectors ({len(gone)} rows, every file): update "
        f"{t_dv:.2f}s, no shard written (target <= 0.5 s) ({load()})"
    )
    if not args.dir:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
