"""Peak memory of full shuffled epochs does not grow with dataset size or across epochs.

Writes datasets of N and 4N shards (each many times the shuffle window), then reads each
in a fresh subprocess (a clean measurement): three shuffled epochs through
``iter_batches``, recording ``VmHWM`` (peak RSS) and ``VmRSS`` from ``/proc/self/status``
after opening the dataset and after each epoch. No psutil needed.

    python bench/memory_bench.py [--shards 24] [--shard-size 512KiB] [--workdir DIR]
                                 [--streams N]   (0, the default: automatic; 1: no streams)

``--child PATH`` is the measuring side (used by ``tests/loaders/test_memory.py`` too): it prints one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

WINDOW = 2  # shards in the shuffle window
ROW_BYTES = 32 * 4 + 8


def _status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes (Linux ``/proc``)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def child(
    path: str, epochs: int, batch_size: int, prefetch: int | None, streams: int = 0
) -> dict[str, Any]:
    """Read ``epochs`` shuffled epochs of the dataset at ``path``; memory figures.
    ``prefetch`` is the loader's read-ahead budget in bytes (None: its default); ``streams``
    the order's streams (0: the loader's automatic default)."""
    from spark_dl_core import open_dataset

    ds = open_dataset(path)
    start = _status()
    epochs_out = []
    rows = 0
    for epoch in range(epochs):
        for batch in ds.iter_batches(
            batch_size=batch_size,
            shuffle=True,
            seed=0,
            epoch=epoch,
            shuffle_window=WINDOW,
            prefetch_bytes=prefetch,
            streams=streams,
        ):
            rows += len(batch["label"])
        epochs_out.append(_status())
    return {
        "shards": ds.num_shards,
        "rows": len(ds),
        "rows_read": rows,
        "stored_bytes": sum(s.stored.bytes for s in ds.shards),
        "max_shard_bytes": max(s.stored.bytes for s in ds.shards),
        "start": start,
        "epochs": epochs_out,
    }


def write(path: str, shards: int, shard_size: str) -> None:
    import numpy as np
    import pyarrow as pa

    from spark_dl_core import DatasetSpec, parse_size, write_mds

    rows = int(parse_size(shard_size) * shards / ROW_BYTES)
    rng = np.random.default_rng(0)
    x = rng.random((rows, 32), dtype=np.float32)
    table = pa.table(
        {
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 32),
            "label": pa.array(np.arange(rows, dtype=np.int64)),
        }
    )
    write_mds(table, path, DatasetSpec(shard_size=shard_size), mode="overwrite")


def measure(
    path: str,
    epochs: int = 3,
    batch_size: int = 512,
    prefetch: int | None = None,
    streams: int = 0,
) -> dict[str, Any]:
    """``child`` in a fresh interpreter."""
    extra = [] if prefetch is None else ["--prefetch-bytes", str(prefetch)]
    extra += ["--streams", str(streams)]
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            path,
            "--epochs",
            str(epochs),
            "--batch-size",
            str(batch_size),
            *extra,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--shards", type=int, default=24)
    parser.add_argument("--shard-size", default="512KiB")
    parser.add_argument("--workdir")
    parser.add_argument("--prefetch-bytes", type=int, default=None)
    parser.add_argument("--streams", type=int, default=0)
    args = parser.parse_args()
    if args.child:
        got = child(args.child, args.epochs, args.batch_size, args.prefetch_bytes, args.streams)
        print(json.dumps(got))
        return
    work = Path(args.workdir or tempfile.mkdtemp(prefix="memory-bench-"))
    mib = 1 << 20
    from spark_dl_core import parse_size

    bounded = 4 * parse_size(args.shard_size)
    print(f"streams={args.streams} (0: automatic)")
    print(
        f"{'prefetch':>9} {'shards':>7} {'dataset MiB':>12} {'window MiB':>11} "
        f"{'start RSS':>10} {'peak RSS':>9} {'peak-start':>11} {'RSS after epochs':>24}  (MiB)"
    )
    for factor in (1, 4):
        path = str(work / f"ds{factor}")
        write(path, args.shards * factor, args.shard_size)
    for prefetch in (bounded, args.prefetch_bytes):
        for factor in (1, 4):
            r = measure(
                str(work / f"ds{factor}"), args.epochs, args.batch_size, prefetch, args.streams
            )
            peak = r["epochs"][-1]["VmHWM"]
            after = " ".join(f"{e['VmRSS'] / mib:.1f}" for e in r["epochs"])
            label = "default" if prefetch is None else f"{prefetch / mib:.0f}MiB"
            print(
                f"{label:>9} {r['shards']:>7} {r['stored_bytes'] / mib:>12.1f} "
                f"{WINDOW * r['max_shard_bytes'] / mib:>11.1f} "
                f"{r['start']['VmRSS'] / mib:>10.1f} {peak / mib:>9.1f} "
                f"{(peak - r['start']['VmRSS']) / mib:>11.1f} {after:>24}"
            )


if __name__ == "__main__":
    main()
