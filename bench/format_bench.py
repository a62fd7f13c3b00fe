"""Write and read 1,000,000 rows of float32[32] + int64 label: spark-dl vs Mosaic Streaming.

One run, same data, each case in its own process where it matters, printed as rows/s and
ratios. Mosaic runs in its side environment (``make mosaic-env``); without it, its rows
say "skipped". Usage: ``python bench/format_bench.py [--rows N] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
MOSAIC_PYTHON = Path(
    os.environ.get("SPARK_DL_MOSAIC_PYTHON", REPO / ".venv-mosaic" / "bin" / "python")
)

MOSAIC_SCRIPT = textwrap.dedent(
    """
    import sys, time, json
    sys.path.insert(0, sys.argv[1])
    import mosaic_shim
    mosaic_shim.install()
    import numpy as np
    from streaming import MDSWriter, StreamingDataset
    from torch.utils.data import DataLoader
    mode, data_dir, out = sys.argv[2], sys.argv[3], sys.argv[4]
    if mode == "write":
        features = np.load(data_dir + "/features.npy")
        labels = np.load(data_dir + "/labels.npy")
        start = time.perf_counter()
        columns = {"features": "ndarray:float32:32", "label": "int64"}
        with MDSWriter(out=out, columns=columns) as writer:
            for i in range(len(labels)):
                writer.write({"features": features[i], "label": labels[i]})
        print(json.dumps({"seconds": time.perf_counter() - start}))
    else:
        limit = int(sys.argv[5])
        ds = StreamingDataset(local=out, shuffle=True, batch_size=1024, shuffle_seed=0)
        loader = DataLoader(ds, batch_size=1024, num_workers=2)
        start = time.perf_counter()
        seen = 0
        for batch in loader:
            seen += len(batch["label"])
            if seen >= limit:
                break
        print(json.dumps({"seconds": time.perf_counter() - start, "rows": seen}))
    """
)


def make_table(rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    features = rng.random((rows, 32), dtype=np.float32)
    labels = rng.integers(0, 1000, rows, dtype=np.int64)
    flat = pa.array(features.reshape(-1))
    return pa.table(
        {"features": pa.FixedSizeListArray.from_arrays(flat, 32), "label": pa.array(labels)}
    )


def ours_write(table: pa.Table, out: str) -> float:
    from spark_dl_core import write_mds

    start = time.perf_counter()
    write_mds(table, out)
    return time.perf_counter() - start


def ours_read(path: str, shuffle: bool) -> tuple[float, int]:
    import torch

    from spark_dl_core import open_dataset

    start = time.perf_counter()
    seen = 0
    for batch in open_dataset(path).iter_batches(batch_size=1024, shuffle=shuffle, seed=0):
        torch.from_numpy(batch["features"])
        seen += len(batch["label"])
    return time.perf_counter() - start, seen


def mosaic(mode: str, data_dir: str, out: str, limit: int = 0) -> dict[str, float] | None:
    if not MOSAIC_PYTHON.exists():
        return None
    result = subprocess.run(
        [
            str(MOSAIC_PYTHON),
            "-c",
            MOSAIC_SCRIPT,
            str(REPO / "tests" / "interop"),
            mode,
            data_dir,
            out,
            str(limit),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--mosaic-read-rows", type=int, default=100_000, help="Mosaic reads are slow; sample"
    )
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    args = parser.parse_args()

    rows = args.rows
    table = make_table(rows)
    results: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory(prefix="spark-dl-bench-") as tmp:
        np.save(
            f"{tmp}/features.npy",
            table["features"].combine_chunks().flatten().to_numpy().reshape(rows, 32),
        )
        np.save(f"{tmp}/labels.npy", table["label"].to_numpy())
        ours_dir, mosaic_dir = f"{tmp}/ours", f"{tmp}/mosaic"
        results["write ours rows/s"] = rows / ours_write(table, ours_dir)
        m = mosaic("write", tmp, mosaic_dir)
        results["write mosaic MDSWriter rows/s"] = rows / m["seconds"] if m else None
        seconds, seen = ours_read(ours_dir, shuffle=False)
        results["read ours sequential rows/s"] = seen / seconds
        seconds, seen = ours_read(ours_dir, shuffle=True)
        results["read ours shuffled rows/s"] = seen / seconds
        m = mosaic("read", tmp, mosaic_dir, args.mosaic_read_rows) if m else None
        results["read mosaic StreamingDataset (2 workers, shuffled) rows/s"] = (
            m["rows"] / m["seconds"] if m else None
        )
    write_ratio = _ratio(results["write ours rows/s"], results["write mosaic MDSWriter rows/s"])
    read_ratio = _ratio(
        results["read ours shuffled rows/s"],
        results["read mosaic StreamingDataset (2 workers, shuffled) rows/s"],
    )
    results["ratio write ours/mosaic"] = write_ratio
    results["ratio read ours shuffled in-process/mosaic"] = read_ratio
    if args.json:
        print(json.dumps({"rows": rows, **results}, indent=1))
    else:
        print(f"{rows:,} rows of float32[32] + int64 label")
        for name, value in results.items():
            shown = "skipped (no .venv-mosaic)" if value is None else f"{value:,.1f}"
            print(f"  {name:<58} {shown}")
    return 0


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


if __name__ == "__main__":
    sys.exit(main())
