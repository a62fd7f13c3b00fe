"""The pristine MDS datasets the fuzz corrupts (two tables covering every encoding family,
raw and zstd shards, with and without the compact index) and the cases planned over
their files: metadata files, few and parsed first, get most of them."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from bench.fuzzing.mutations import KINDS

METADATA = ("index.json", "spark_dl.json", "spark_dl.index.arrow")
META_FILE = METADATA[1]


def _png(i: int) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (4 + i % 3, 3), (i * 7 % 256, 0, 0)).save(out, format="PNG")
    return out.getvalue()


def _jpeg(i: int) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (16, 8 + i % 4), (0, i * 5 % 256, 9)).save(out, format="JPEG")
    return out.getvalue()


def _tables() -> dict[str, tuple[Any, dict[str, str]]]:
    """Two tables covering the encoding families, with the spec's column encodings."""
    import decimal

    import numpy as np
    import pyarrow as pa

    n = 40
    mixed = pa.table(
        {
            "i8": pa.array(np.arange(n) % 100, pa.int8()),
            "u16": pa.array(np.arange(n) * 3, pa.uint16()),
            "i64": pa.array(np.arange(n) * 1_000_003, pa.int64()),
            "u64": pa.array(np.arange(n), pa.uint64()),
            "f16": pa.array(np.arange(n) / 4, pa.float16()),
            "f64": pa.array(np.arange(n) / 3, pa.float64()),
            "flag": pa.array([i % 2 == 0 for i in range(n)]),
            "text": [f"row {i} " * (i % 4) for i in range(n)],
            "maybe": pa.array([None if i % 5 == 0 else f"m{i}" for i in range(n)]),
            "blob": pa.array([bytes([i]) * (i % 6) for i in range(n)], pa.binary()),
            "vec": pa.array([[float(i), 1.0, 2.0] for i in range(n)], pa.list_(pa.float32(), 3)),
            "tokens": pa.array([list(range(i % 9)) for i in range(n)], pa.list_(pa.int16())),
            "dense": pa.array([[i, i + 1] for i in range(n)], pa.list_(pa.int32())),
            "any": pa.array([[float(i)] * (i % 3 + 1) for i in range(n)], pa.list_(pa.float64())),
            "ts": pa.array(np.arange(n) * 10**9, pa.timestamp("ns")),
            "price": pa.array([decimal.Decimal(f"{i}.25") for i in range(n)], pa.decimal128(8, 2)),
            "si": pa.array(np.arange(n) - 7, pa.int64()),
            "sf": pa.array(np.arange(n) * 0.5, pa.float64()),
            "meta": [{"k": i, "v": [i] * (i % 3)} for i in range(n)],
        }
    )
    mixed_columns = {"any": "ndarray", "si": "str_int", "sf": "str_float", "u64": "uint64"}
    media = pa.table(
        {
            "id": pa.array(np.arange(n), pa.int32()),
            "png": pa.array([_png(i) for i in range(n)], pa.binary()),
            "jpeg": pa.array([_jpeg(i) for i in range(n)], pa.binary()),
            "caption": [f"image {i}" for i in range(n)],
        }
    )
    return {
        "mixed": (mixed, mixed_columns),
        "media": (media, {"png": "png", "jpeg": "jpeg"}),
    }


def build_datasets(root: Path) -> dict[str, Path]:
    """Pristine datasets: each table, raw and zstd shards, with and without the compact
    index (raw ones record content hashes only, zstd ones xxh64 file hashes as well)."""
    from spark_dl_core import DatasetSpec, write_mds
    from spark_dl_core.format.compact import COMPACT_FILE

    out: dict[str, Path] = {}
    for table_name, (table, columns) in _tables().items():
        for compression in (None, "zstd"):
            for compact in (True, False):
                name = f"{table_name}-{compression or 'raw'}-{'compact' if compact else 'json'}"
                spec = DatasetSpec(
                    shard_size="3KiB" if table_name == "mixed" else "8KiB",
                    compression=compression,
                    hashes=["xxh64"] if compression else [],
                    nulls="mask",
                    columns=columns,
                )
                path = root / name
                write_mds(table, str(path), spec)
                if not compact:
                    (path / COMPACT_FILE).unlink()
                out[name] = path
    return out


def plan_cases(
    datasets: dict[str, Path], count: int, seed: int, targets: list[str]
) -> list[dict[str, Any]]:
    """``count`` cases, reproducible from ``seed``: metadata files get most of them (they
    are few and parsed first), shards the rest."""
    rng = random.Random(seed)
    files = {
        name: sorted(p.name for p in path.iterdir() if p.is_file())
        for name, path in datasets.items()
    }
    cases = []
    for i in range(count):
        name = rng.choice(sorted(datasets))
        meta = [f for f in files[name] if f in METADATA]
        shards = [f for f in files[name] if f not in METADATA]
        file = rng.choice(meta if rng.random() < 0.7 else shards)
        cases.append(
            {
                "id": i,
                "dataset": name,
                "file": file,
                "kind": rng.choice(KINDS),
                "seed": rng.getrandbits(32),
                "target": targets[i % len(targets)],
            }
        )
    return cases
