"""Storage -> Spark read: ``spark.read.format("mds")`` vs ``spark.read.parquet`` on the same rows.

One DataFrame of N rows is written once as MDS (spark-dl's source) and once as Parquet; then
each query runs on both, alternately (mds, parquet, mds, parquet …), and the median time of
each and the ratio mds / parquet are printed. ``mds`` is what a classic session runs: the JVM
scan where it applies (``spark_dl/jvm_scan.py``). ``--python`` adds ``mds_python``: the same
reads on the Python reader (``spark.spark_dl.jvmScan.enabled=false``). ``--floor`` adds
``mds_floor`` (see :func:`_register_floor`): Spark's own cost of a Python data source for
these rows.
Queries: ``count()``, a count and two sums (``count+2sums``: ``sum(x)``, ``sum(y)``; with
an array column ``sum(y)`` and ``sum(features[0])``, the issue's yardstick), and a full scan
of every column (``write.format("noop")``). Each line says which reader ran the query.

``--shape numeric``: ``id`` bigint, ``x`` double, ``y`` float. ``--shape features`` adds
``features`` array<float>[32] stored as ``ndarray:float32:32`` (a fixed width, as ``df.dl``
or ``columns=`` store it); ``--shape features_var`` stores it as a plain
``df.write.format("mds")`` does, variable ``ndarray:float32``.

``--connect`` runs it all on a local Spark Connect server started with the JVM scan's
session extension (``spark_dl.with_jvm_scan``): the reads a Connect client gets.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python bench/spark_read_bench.py [--rows N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

QUERIES = ("count", "count+2sums", "scan")


def _session(connect: bool) -> Any:
    """A classic ``local[2]`` session (the JVM scan added at run time), or a client of a local
    Spark Connect server started with the JVM scan's session extension."""
    from pyspark.sql import SparkSession

    import spark_dl

    if connect:
        os.environ["SPARK_TESTING"] = "1"  # the local server on a free port, not 15002
        builder = spark_dl.with_jvm_scan(SparkSession.builder.remote("local[2]"))
        spark = builder.config("spark.sql.shuffle.partitions", "2").getOrCreate()
    else:
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
    spark_dl.register(spark)
    return spark


def _write(spark: Any, rows: int, shape: str, work: Path) -> dict[str, Path]:
    """The same rows as MDS and as Parquet (two files / shard groups each way)."""
    cols = "id, CAST(id * 0.5 AS double) AS x, CAST(id % 1000 AS float) AS y"
    if shape.startswith("features"):
        cols += ", transform(sequence(0, 31), i -> CAST(id + i AS float)) AS features"
    df = spark.sql(f"SELECT {cols} FROM range({rows})").repartition(2).cache()
    df.count()
    paths = {"mds": work / "mds", "parquet": work / "parquet"}
    writer = df.write.format("mds").mode("overwrite")
    if shape == "features":  # features_var: the variable encoding Spark's schema implies
        writer = writer.option("columns", '{"features": "ndarray:float32:32"}')
    writer.save(str(paths["mds"]))
    df.write.mode("overwrite").parquet(str(paths["parquet"]))
    df.unpersist()
    return paths


def _frames(spark: Any, path: Path, fmt: str) -> dict[str, Callable[[], Any]]:
    """Each query's DataFrame (``scan``: the load itself), timed by :func:`_queries` and
    planned by :func:`_reader`."""
    from pyspark.sql import functions as F

    def load() -> Any:
        if fmt == "parquet":
            return spark.read.parquet(str(path))
        return spark.read.format(fmt).load(str(path))

    def sums() -> Any:
        df = load()
        if "features" in df.columns:
            return df.agg(F.sum("y"), F.sum(F.col("features")[0]))
        return df.agg(F.sum("x"), F.sum("y"))

    return {"count": lambda: load().groupBy().count(), "count+2sums": sums, "scan": load}


def _queries(spark: Any, path: Path, fmt: str) -> dict[str, Callable[[], Any]]:
    if fmt == "mds_python":  # the Python reader: the JVM scan off around each query
        return {k: _python_path(spark, fn) for k, fn in _queries(spark, path, "mds").items()}
    frames = _frames(spark, path, fmt)

    def count() -> Any:
        return frames["scan"]().count()

    def sums() -> Any:
        return frames["scan"]().count(), frames["count+2sums"]().collect()

    def scan() -> Any:
        frames["scan"]().write.format("noop").mode("overwrite").save()

    return {"count": count, "count+2sums": sums, "scan": scan}


def _python_path(spark: Any, fn: Callable[[], Any]) -> Callable[[], Any]:
    from spark_dl.jvm_scan import ENABLED

    def run() -> Any:
        spark.conf.set(ENABLED, "false")
        try:
            return fn()
        finally:
            spark.conf.unset(ENABLED)

    return run


def _check(spark: Any, paths: dict[str, Path]) -> None:
    """Every read gives the same sums (a benchmark of wrong data is worthless)."""
    names = ("mds", "mds_python", "parquet")
    got = [_queries(spark, paths.get(f, paths["mds"]), f)["count+2sums"]() for f in names]
    if got[0] != got[2] or got[1] != got[2]:
        raise SystemExit(f"mds (JVM), mds (Python) and parquet disagree: {got}")


def _register_floor(spark: Any) -> None:
    """``format("mds_floor")``: the ``mds`` reader's plan and schema, but each task decodes
    one batch and yields it again until its rows are out. Its time is what Spark's Python
    Data Source path costs for these rows with no decoding at all: the floor any Python
    source (``mds`` included) can reach."""
    import spark_dl.datasource as sds
    from spark_dl.mds_reader import MDSReader

    class FloorReader(MDSReader):
        def read(self, partition: Any) -> Any:
            rows = sum(self._open().shards[i].samples for i in partition.shards)
            first = next(super().read(partition), None)
            while first is not None and rows > 0:
                yield first.slice(0, min(rows, first.num_rows))
                rows -= first.num_rows

    class FloorSource(sds.MDSDataSource):
        @classmethod
        def name(cls) -> str:
            return "mds_floor"

        def reader(self, schema: Any) -> Any:
            return FloorReader(dict(self.options), schema)

    spark.dataSource.register(FloorSource)


def _reader(spark: Any, path: Path, query: str) -> str:
    """Which reader ``format("mds")`` runs ``query`` on (its executed plan says: the JVM scan
    takes a query only where it reads every column the query uses)."""
    df = _frames(spark, path, "mds")[query]()
    jdf = getattr(df, "_jdf", None)  # classic: the JVM's plan; Connect: the server's explain
    plan = jdf.queryExecution().executedPlan().toString() if jdf else df._explain_string()
    return "JVM scan" if "MdsJvmScan" in str(plan) else "Python reader"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument(
        "--shape", choices=("numeric", "features", "features_var"), default="numeric"
    )
    parser.add_argument("--runs", type=int, default=5, help="paired runs per query")
    parser.add_argument("--queries", default=",".join(QUERIES))
    parser.add_argument("--floor", action="store_true", help="also time the API's floor")
    parser.add_argument("--python", action="store_true", help="also time the Python reader")
    parser.add_argument("--data", type=Path, help="keep the written rows here (reused if there)")
    parser.add_argument(
        "--connect", action="store_true", help="on a local Spark Connect server (with_jvm_scan)"
    )
    parser.add_argument(
        "--only", choices=("mds", "parquet"), help="with --data: run this format's queries only"
    )
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = _session(args.connect)
    if args.only:  # one format, nothing written or compared: for timing whole processes
        if args.data is None:
            raise SystemExit("--only needs --data (written by an earlier run)")
        for _ in range(args.runs):
            for name in args.queries.split(","):
                _queries(spark, args.data / args.only, args.only)[name]()
        spark.stop()
        return
    work = args.data or Path(tempfile.mkdtemp(prefix="spark_read_bench-"))
    try:
        paths = {"mds": work / "mds", "parquet": work / "parquet"}
        if not (paths["mds"] / "index.json").exists():
            paths = _write(spark, args.rows, args.shape, work)
        _check(spark, paths)
        formats = ["mds", "parquet"]
        if args.python:
            paths["mds_python"] = paths["mds"]
            formats.append("mds_python")
        if args.floor:
            _register_floor(spark)
            paths["mds_floor"] = paths["mds"]
            formats.append("mds_floor")
        kind = "Spark Connect on local[2]" if args.connect else "local[2]"
        print(f"\nstorage -> Spark read, {args.rows:,} rows, shape {args.shape}, {kind}")
        print(f"  load average before: {os.getloadavg()[0]:.2f}")
        for name in args.queries.split(","):
            fns = {f: _queries(spark, paths[f], f)[name] for f in formats}
            for fn in fns.values():  # one warm-up each: JIT, page cache, worker start
                fn()
            times: dict[str, list[float]] = {f: [] for f in formats}
            ratios, floors, pythons = [], [], []
            for _ in range(args.runs):
                pair = {}
                for fmt, fn in fns.items():
                    start = time.perf_counter()
                    fn()
                    pair[fmt] = time.perf_counter() - start
                    times[fmt].append(pair[fmt])
                ratios.append(pair["mds"] / pair["parquet"])
                if args.floor:
                    floors.append(pair["mds"] / pair["mds_floor"])
                if args.python:
                    pythons.append(pair["mds_python"] / pair["parquet"])
            med = {f: statistics.median(t) for f, t in times.items()}
            line = (
                f"  {name:12s} mds ({_reader(spark, paths['mds'], name)}) "
                f"{med['mds']:6.3f} s  parquet {med['parquet']:6.3f} s  "
                f"mds/parquet median {statistics.median(ratios):4.2f}x "
                f"(min {min(ratios):4.2f}, max {max(ratios):4.2f})"
            )
            if pythons:
                line += (
                    f"  python {med['mds_python']:6.3f} s, python/parquet "
                    f"{statistics.median(pythons):4.2f}x"
                )
            if floors:
                line += (
                    f"  floor {med['mds_floor']:6.3f} s, mds/floor "
                    f"{statistics.median(floors):4.2f}x"
                )
            print(line)
        print(f"  load average after: {os.getloadavg()[0]:.2f}")
    finally:
        if args.data is None:
            shutil.rmtree(work, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
