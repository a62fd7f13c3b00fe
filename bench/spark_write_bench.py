"""Spark -> storage write: the ``mds`` data source vs ``df.write.parquet`` (vs Mosaic).

One DataFrame of N rows (``features`` array<float>[32] + ``label`` bigint), cached in
memory first so every writer pays only for encoding and writing. Mosaic Streaming's
``dataframe_to_mds`` runs only when the ``.venv-mosaic`` side environment exists; that
environment has no Spark, so Mosaic's ``streaming`` package (and its small codec modules)
is laid over this environment's Spark through a temporary ``PYTHONPATH`` directory, with
``tests/interop/mosaic_shim.py`` stubbing the heavy imports Mosaic never calls here.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python bench/spark_write_bench.py [--rows N]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MOSAIC_SITE = (
    ROOT
    / ".venv-mosaic"
    / "lib"
    / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    / "site-packages"
)
_MOSAIC_MODULES = {"streaming", "catalogue", "snappy", "zstd", "xxhash", "brotli", "_brotli"}

_MOSAIC_SCRIPT = """
import sys, time
from pyspark.sql import SparkSession
from streaming.base.converters import dataframe_to_mds
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
rows, out = int(sys.argv[1]), sys.argv[2]
df = spark.sql(
    "SELECT id AS label, CAST(transform(sequence(0, 31), i -> CAST(id + i AS float)) "
    f"AS array<float>) AS features FROM range({rows})"  # Mosaic wants nullable elements
).repartition(2).cache()
df.count()
t = time.perf_counter()
dataframe_to_mds(df, merge_index=True, mds_kwargs={
    "out": out, "columns": {"label": "int64", "features": "ndarray:float32:32"}})
print("MOSAIC_SECONDS", time.perf_counter() - t)
"""


def _mosaic_overlay(work: Path) -> Path | None:
    """A PYTHONPATH dir exposing Mosaic's packages (those this env lacks), or None."""
    if not (MOSAIC_SITE / "streaming").is_dir():
        return None
    overlay = work / "mosaic-overlay"
    overlay.mkdir()
    for entry in MOSAIC_SITE.iterdir():
        name = entry.name.split(".", 1)[0]
        if name in _MOSAIC_MODULES and importlib.util.find_spec(name) is None:
            (overlay / entry.name).symlink_to(entry)
    shim_dir = ROOT / "tests" / "interop"
    (overlay / "sitecustomize.py").write_text(
        f"import sys\nsys.path.append({str(shim_dir)!r})\nimport mosaic_shim\n"
        "mosaic_shim.STUBBED = tuple(m for m in mosaic_shim.STUBBED "
        "if m not in ('pandas', 'pyspark'))\nmosaic_shim.install()\n"
    )
    return overlay


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2, help="best of this many runs")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    import spark_dl

    spark_dl.register(spark)
    df = (
        spark.sql(
            "SELECT id AS label, "
            "transform(sequence(0, 31), i -> CAST(id + i AS float)) AS features "
            f"FROM range({args.rows})"
        )
        .repartition(2)
        .cache()
    )
    df.count()
    work = Path(tempfile.mkdtemp(prefix="spark_write_bench-"))
    columns = '{"features": "ndarray:float32:32"}'
    try:
        results: dict[str, float] = {}

        def mds() -> None:
            df.write.format("mds").mode("overwrite").option("columns", columns).save(
                str(work / "mds")
            )

        def parquet() -> None:
            df.write.mode("overwrite").parquet(str(work / "parquet"))

        for name, fn in (("spark-dl mds", mds), ("spark parquet", parquet)):
            results[name] = min(_timed(fn) for _ in range(args.repeat))
        overlay = _mosaic_overlay(work)
        if overlay is not None:
            out = work / "mosaic"
            proc = subprocess.run(
                [sys.executable, "-c", _MOSAIC_SCRIPT, str(args.rows), str(out)],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": str(overlay)},
            )
            line = [x for x in proc.stdout.splitlines() if x.startswith("MOSAIC_SECONDS")]
            if line:
                results["mosaic dataframe_to_mds"] = float(line[0].split()[1])
            else:
                print("mosaic dataframe_to_mds: failed:", proc.stderr.strip()[-800:])
        else:
            print(f"mosaic dataframe_to_mds: skipped ({MOSAIC_SITE} missing; make mosaic-env)")
        ours = results["spark-dl mds"]
        print(f"\nSpark -> storage write, {args.rows:,} rows (features float32[32] + label int64)")
        for name, seconds in results.items():
            rate = args.rows / seconds
            print(
                f"  {name:26s} {seconds:7.2f} s  {rate:12,.0f} rows/s  "
                f"time vs spark-dl {seconds / ours:5.2f}x"
            )
        sizes = {
            name: sum(p.stat().st_size for p in (work / name).rglob("*") if p.is_file())
            for name in ("mds", "parquet")
        }
        print(f"  bytes on disk: mds {sizes['mds']:,}  parquet {sizes['parquet']:,}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
