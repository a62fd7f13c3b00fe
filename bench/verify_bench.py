"""What verifying a shard on first read costs: xxh3 of the stored file vs reading and
decompressing it, on one 64 MiB shard (Mosaic's default size limit).

Both sides are timed in this one process on the same files (medians of ``--repeats``), so
the ratio holds on a loaded machine. Reads come from the page cache (the cheapest case for
the read, so the ratio is the worst case for the hash). Usage:
``python bench/verify_bench.py [--repeats 7] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from spark_dl_core import DatasetSpec, open_dataset, write_mds
from spark_dl_core.format.hashing import STORED_HASH, digest


def _table(rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table(
        {
            "x": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.normal(size=rows * 32).astype(np.float32)), 32
            ),
            "label": pa.array(rng.integers(0, 1000, rows)),
            "text": pa.array([f"sample {i} " * (i % 4) for i in range(rows)]),
        }
    )


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm: page cache, allocator
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        table = _table(440_000)  # ~64 MiB of shard bytes: one full shard per dataset
        for compression in (None, "zstd"):
            path = str(Path(tmp) / (compression or "raw"))
            spec = DatasetSpec(compression=compression, shard_size="64MiB")
            write_mds(table, path, spec, mode="overwrite")
            ds = open_dataset(path)
            info = ds.shards[0]
            file = Path(path) / info.stored.basename

            def read_decompress(ds: object = ds) -> object:
                raw = ds.load_shard(0, verify_hashes=False).raw  # type: ignore[attr-defined]
                return int(raw[::4096].sum())  # touch every page: the read really happens

            def hash_stored(file: Path = file) -> str:
                return digest(STORED_HASH, np.fromfile(file, dtype=np.uint8))

            in_memory = np.fromfile(file, dtype=np.uint8)

            def hash_only(data: np.ndarray = in_memory) -> str:
                return digest(STORED_HASH, data)

            load = _median_s(read_decompress, args.repeats)
            hashed = _median_s(hash_stored, args.repeats)
            pure = _median_s(hash_only, args.repeats)
            out[compression or "none"] = {
                "stored_mib": info.stored.bytes / 2**20,
                "raw_mib": info.raw_data.bytes / 2**20,
                "read_and_decompress_ms": load * 1e3,
                "read_and_xxh3_ms": hashed * 1e3,
                "xxh3_in_memory_ms": pure * 1e3,
                "xxh3_over_load": pure / load,
            }
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for name, row in out.items():
        print(
            f"compression={name}: stored {row['stored_mib']:.1f} MiB (raw {row['raw_mib']:.1f}); "
            f"read+decompress {row['read_and_decompress_ms']:.1f} ms, "
            f"xxh3 of the stored bytes {row['xxh3_in_memory_ms']:.1f} ms "
            f"({100 * row['xxh3_over_load']:.0f}% of the load); "
            f"read+xxh3 {row['read_and_xxh3_ms']:.1f} ms"
        )


if __name__ == "__main__":
    main()
