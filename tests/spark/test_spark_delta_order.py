"""One Delta version, one dataset: the same shards, fingerprint and batches through Spark at
any parallelism, through ``df.dl``, through the JVM-free core and through the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

deltalake = pytest.importorskip("deltalake")
from deltalake import WriterProperties, write_deltalake  # noqa: E402

from spark_dl_core import open_dataset, open_delta  # noqa: E402

pytestmark = pytest.mark.spark

SPEC = {"shard_size": 1500, "hashes": ["xxh64"]}


def _rows(start: int, n: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(start, start + n), pa.int64()),
            "x": pa.array([i / 4 for i in range(start, start + n)], pa.float64()),
            "name": [f"row-{i}" for i in range(start, start + n)],
            "part": ["ab"[i % 2] for i in range(start, start + n)],
        }
    )


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Files of unequal sizes, several row groups each, partitioned; version 2 is pinned
    and version 3 lands afterwards."""
    path = str(tmp_path_factory.mktemp("order") / "events")
    small_groups = WriterProperties(max_row_group_size=40)
    for i, n in enumerate([400, 90, 250]):
        write_deltalake(
            path,
            _rows(1000 * i, n),
            mode="append",
            partition_by=["part"],
            writer_properties=small_groups,
        )
    write_deltalake(path, _rows(9000, 30), mode="append", partition_by=["part"])
    return path


def _stream(path: str) -> str:
    """A digest of one shuffled epoch, batch by batch."""
    digest = hashlib.sha256()
    for batch in open_dataset(path).iter_batches(batch_size=64, shuffle=True, seed=7):
        for name in sorted(batch):
            digest.update(name.encode() + repr(batch[name].tolist()).encode())
    return digest.hexdigest()


def _conf(spark: Any, settings: dict[str, str]) -> dict[str, str | None]:
    before = {}
    for key, value in settings.items():
        before[key] = spark.conf.get(key, None)
        spark.conf.set(key, value)
    return before


def _restore(spark: Any, before: dict[str, str | None]) -> None:
    for key, value in before.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


# Spark splits each file into several partitions / packs all files into few partitions.
SETTINGS = [
    {"spark.sql.files.maxPartitionBytes": "1500", "spark.sql.shuffle.partitions": "1"},
    {
        "spark.sql.files.maxPartitionBytes": "134217728",
        "spark.sql.files.openCostInBytes": "1",
        "spark.sql.shuffle.partitions": "5",
    },
]


def test_one_version_one_dataset_at_any_parallelism(spark: Any, table: str, tmp_path: Path) -> None:
    import spark_dl

    core = open_delta(table, version=2).write_mds(str(tmp_path / "core"), SPEC)
    assert core.shards > 3
    expected = _stream(str(tmp_path / "core"))
    for i, settings in enumerate(SETTINGS):
        before = _conf(spark, settings)
        try:
            df = spark_dl.read_delta(spark, table, version=2)
            assert df.columns == ["id", "x", "name", "part"]  # no lineage column shows
            out = str(tmp_path / f"spark{i}")
            df.write.format("mds").option("shard_size", "1500").option("hashes", "xxh64").save(out)
        finally:
            _restore(spark, before)
        ds = open_dataset(out)
        assert ds.columns == open_dataset(str(tmp_path / "core")).columns
        assert (ds.fingerprint, ds.num_shards) == (core.fingerprint, core.shards), settings
        assert _stream(out) == expected
        assert ds.source["table"] == table and ds.source["version"] == 2
        assert ds.source["writer"] == "spark" and "derived" not in ds.source


def test_derived_frame_keeps_order_and_lineage(spark: Any, table: str, tmp_path: Path) -> None:
    import spark_dl

    core = open_delta(
        table, version=2, columns=["id", "name"], filter=pc.field("id") >= 1050
    ).write_mds(str(tmp_path / "core"), SPEC)
    df = spark_dl.read_delta(spark, table, version=2)
    again = spark_dl.read_delta(spark, table, version=2)
    assert df.semanticHash() == again.semanticHash()  # same snapshot, same converter cache
    derived = df.filter("id >= 1050").select("id", "name")
    assert spark_dl.delta.lineage_for(derived)["derived"] is True  # type: ignore[index]
    out = str(tmp_path / "spark")
    derived.write.format("mds").option("shard_size", "1500").option("hashes", "xxh64").save(out)
    ds = open_dataset(out)
    assert ds.fingerprint == core.fingerprint
    assert ds.source["version"] == 2 and ds.source["derived"] is True
    # a transformation adds a column: lineage still names the snapshot
    out2 = str(tmp_path / "with_column")
    df.withColumn("double", df["x"] * 2).write.format("mds").save(out2)
    assert open_dataset(out2).source["table"] == table


def test_a_sort_of_a_pinned_read_is_kept_and_said(spark: Any, table: str, tmp_path: Path) -> None:
    """``read_delta(...).orderBy(...)`` was written in the snapshot's file order, the sort
    the user asked for dropped without a word. The sort is kept now, and the write says the
    dataset is therefore not the snapshot's canonical export."""
    from pyspark.sql import functions as F

    import spark_dl

    df = spark_dl.read_delta(spark, table, version=2)
    for name, sorted_frame in [
        ("orderBy", df.orderBy(F.col("x").desc())),
        ("sortWithinPartitions", df.coalesce(1).sortWithinPartitions(F.col("x").desc())),
    ]:
        out = str(tmp_path / name)
        with pytest.warns(UserWarning, match="sorted .* not in the snapshot's file order"):
            sorted_frame.write.format("mds").save(out)
        xs = open_dataset(out).to_arrow().column("x").to_pylist()
        assert len(xs) == 740 and xs == sorted(xs, reverse=True), name


def test_an_aggregate_of_a_pinned_read_writes_without_an_error_log(
    spark: Any, table: str, tmp_path: Path
) -> None:
    """A ``groupBy`` then ``write.format("mds")`` succeeded but PySpark logged an ERROR with
    a long stack trace: the writer tried the scan's ``_metadata`` above the aggregate and
    caught the failure, and PySpark logs every failed analysis. The plan decides it now,
    and the warning names the node in the way."""
    import logging

    from pyspark.sql import functions as F

    import spark_dl

    class Records(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.DEBUG)
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    loggers = [
        logging.getLogger(n) for n in ("DataFrameQueryContextLogger", "SQLQueryContextLogger")
    ]
    seen = Records()
    for logger in loggers:
        logger.addHandler(seen)
    try:
        df = spark_dl.read_delta(spark, table, version=2)
        out = str(tmp_path / "grouped")
        with pytest.warns(UserWarning, match="no longer name their data file after Aggregate"):
            df.groupBy("part").count().write.format("mds").save(out)
        plain = spark.range(10).groupBy((F.col("id") % 2).alias("k")).count()
        plain.write.format("mds").save(str(tmp_path / "plain"))
    finally:
        for logger in loggers:
            logger.removeHandler(seen)
    assert sorted(open_dataset(out).to_arrow().column("count").to_pylist()) == [370, 370]
    assert [r.getMessage()[:200] for r in seen.records if r.levelno >= logging.ERROR] == []


def test_explicit_source_option(spark: Any, tmp_path: Path) -> None:
    out = str(tmp_path / "explicit")
    given = {"kind": "delta", "table": "s3://lake/t", "version": 5}
    spark.range(10).write.format("mds").option("source", json.dumps(given)).save(out)
    source = open_dataset(out).source
    assert {k: source[k] for k in given} == given and source["writer"] == "spark"
    with pytest.raises(Exception, match="source"):
        spark.range(3).write.format("mds").option("source", "[1]").save(str(tmp_path / "bad"))


def test_dl_to_torch_matches_core(spark: Any, table: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import spark_dl

    core = open_delta(table, version=2).write_mds(str(tmp_path / "core"), SPEC)
    df = spark_dl.read_delta(spark, table, version=2)
    with df.dl.converter(SPEC, cache_dir=str(tmp_path / "cache")) as conv:
        assert conv.dataset.fingerprint == core.fingerprint
        assert conv.dataset.source["version"] == 2
        got = [b["id"].tolist() for b in conv.to_torch(batch_size=50, shuffle=True, seed=7)]
    want = [
        b["id"].tolist()
        for b in open_dataset(str(tmp_path / "core")).to_torch(batch_size=50, shuffle=True, seed=7)
    ]
    assert got == want


_LOCAL1 = """
import sys
from pyspark.sql import SparkSession
import spark_dl
from spark_dl_core import open_dataset
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.sql.session.timeZone", "America/New_York").getOrCreate())
spark_dl.register(spark)
df = spark_dl.read_delta(spark, sys.argv[1], version=2)
df.write.format("mds").option("shard_size", "1500").option("hashes", "xxh64").save(sys.argv[2])
print(open_dataset(sys.argv[2]).fingerprint)
spark.stop()
"""


@pytest.mark.slow
def test_local1_session_and_cli_match_core(table: str, tmp_path: Path) -> None:
    core = open_delta(table, version=2).write_mds(str(tmp_path / "core"), SPEC)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    for key in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE"):
        env.pop(key, None)  # a Connect session of this test process must not leak into it
    proc = subprocess.run(
        [sys.executable, "-c", _LOCAL1, table, str(tmp_path / "local1")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == core.fingerprint
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    cli = subprocess.run(
        [
            *(sys.executable, "-m", "spark_dl.cli", "export", table, "--version", "2"),
            *("--out", str(tmp_path / "cli"), "--spec", str(spec), "--json", "--no-progress"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["fingerprint"] == core.fingerprint


# --------------------------------------------------------------------------- NOT NULL columns

_STRICT = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string()),  # nullable, with nulls
        pa.field("score", pa.float64(), nullable=False),
        pa.field("tags", pa.list_(pa.field("element", pa.int32()))),  # some lists null
        pa.field("pt", pa.struct([pa.field("a", pa.int32(), nullable=False)])),
        pa.field("part", pa.string(), nullable=False),
    ]
)


def _strict_rows(start: int, n: int) -> pa.Table:
    ids = range(start, start + n)
    columns = {
        "id": list(ids),
        "name": [None if i % 3 == 0 else f"n{i}" for i in ids],
        "score": [i / 2 for i in ids],
        "tags": [None if i % 4 == 0 else [i, i + 1] for i in ids],
        "pt": [None if i % 5 == 0 else {"a": i} for i in ids],
        "part": ["ab"[i % 2] for i in ids],
    }
    return pa.table(columns, schema=_STRICT)


@pytest.fixture(scope="module")
def strict_table(tmp_path_factory: pytest.TempPathFactory) -> str:
    """NOT NULL columns (top-level, a struct's field, the partition column) beside nullable
    ones holding nulls, over two commits."""
    path = str(tmp_path_factory.mktemp("strict") / "t")
    for start, n in [(0, 120), (500, 70)]:
        write_deltalake(path, _strict_rows(start, n), mode="append", partition_by=["part"])
    return path


def _same_dataset(got: str, want: str) -> None:
    a, b = open_dataset(got), open_dataset(want)
    assert a.columns == b.columns
    assert a.meta["arrow_schema"] == b.meta["arrow_schema"]  # nullability from the Delta log
    assert a.fingerprint == b.fingerprint
    assert a.to_arrow().equals(b.to_arrow())


def test_not_null_columns_one_fingerprint(spark: Any, strict_table: str, tmp_path: Path) -> None:
    """Spark reads Parquet as all-nullable: its write must still record the Delta log's
    schema, so masks, schema and fingerprint equal the core's export of the version."""
    import spark_dl

    masked = {**SPEC, "nulls": "mask"}
    core = str(tmp_path / "core")
    open_delta(strict_table, version=1).write_mds(core, masked)
    assert "id__isnull" not in open_dataset(core).columns  # NOT NULL: no mask
    df = spark_dl.read_delta(spark, strict_table, version=1)
    out = str(tmp_path / "spark")
    df.write.format("mds").options(shard_size="1500", hashes="xxh64", nulls="mask").save(out)
    _same_dataset(out, core)
    df.dl.write_mds(str(tmp_path / "dl"), masked)
    _same_dataset(str(tmp_path / "dl"), core)
    # no masks: the columns without nulls, projected on both sides (a derived frame)
    columns = ["id", "score", "pt", "part"]
    open_delta(strict_table, version=1, columns=columns).write_mds(str(tmp_path / "c2"), SPEC)
    plain = str(tmp_path / "s2")
    df.select(*columns).write.format("mds").options(shard_size="1500", hashes="xxh64").save(plain)
    _same_dataset(plain, str(tmp_path / "c2"))


def test_recomputed_column_is_not_taken_as_not_null(
    spark: Any, strict_table: str, tmp_path: Path
) -> None:
    """A column recomputed under a NOT NULL column's name may hold nulls: it gets a mask."""
    from pyspark.sql import functions as F

    import spark_dl

    df = spark_dl.read_delta(spark, strict_table, version=1)
    derived = df.withColumn("id", F.when(F.col("score") > 10, F.col("id")))
    out = str(tmp_path / "derived")
    derived.write.format("mds").option("nulls", "mask").save(out)
    ds = open_dataset(out)
    assert "id__isnull" in ds.columns and "score__isnull" not in ds.columns
    got = ds.to_arrow().sort_by("score")
    assert got.column("id").to_pylist() == [
        r["id"] if r["score"] > 10 else None
        for r in sorted(
            open_delta(strict_table, version=1).to_arrow().to_pylist(), key=lambda r: r["score"]
        )
    ]


def _every_type(start: int, n: int) -> pa.Table:
    """A row of every column type a Delta table holds, arrays of one length per row among
    them (an embedding: Spark's schema says ``array<float>`` whatever the lengths)."""
    import datetime as dt
    from decimal import Decimal

    ids = range(start, start + n)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "flag": pa.array([i % 2 == 0 for i in ids]),
            "tiny": pa.array([i % 100 for i in ids], pa.int8()),
            "small": pa.array([i for i in ids], pa.int16()),
            "int": pa.array([-i for i in ids], pa.int32()),
            "f32": pa.array([i / 8 for i in ids], pa.float32()),
            "f64": pa.array([i / 3 for i in ids], pa.float64()),
            "dec": pa.array([Decimal(i) / 100 for i in ids], pa.decimal128(12, 2)),
            "text": [f"row {i}" for i in ids],
            "raw": [bytes([i % 256]) * 3 for i in ids],
            "day": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in ids]),
            "at": pa.array(
                [
                    dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i)
                    for i in ids
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "emb": pa.array([[i / 2] * 8 for i in ids], pa.list_(pa.float32())),
            "counts": pa.array([[i] * 4 for i in ids], pa.list_(pa.int64())),
            "tokens": pa.array([list(range(i % 5 + 1)) for i in ids], pa.list_(pa.int32())),
            "grid": pa.array(
                [[[i, 1.0], [2.0, 3.0]] for i in ids], pa.list_(pa.list_(pa.float64()))
            ),
            "tags": pa.array([[f"t{i}", "x"] for i in ids], pa.list_(pa.string())),
            "pair": pa.array([{"a": i, "b": f"s{i}"} for i in ids]),
            "attrs": pa.array([[("k", i)] for i in ids], pa.map_(pa.string(), pa.int64())),
        }
    )


def test_every_column_type_one_encoding_through_spark_and_the_core(
    spark: Any, tmp_path: Path
) -> None:
    """``df.dl`` on a pinned read stored an equal-length ``list<float>`` (an embedding) as
    ``ndarray:float32:8`` from a data aggregate, where the core's export stores
    ``ndarray:float32`` from the type: another fingerprint and other batches for one seed.
    Encodings are now inferred from the type alone, on every path."""
    import spark_dl

    table = str(tmp_path / "every")
    write_deltalake(table, _every_type(0, 60))
    write_deltalake(table, _every_type(60, 40), mode="append")
    core = str(tmp_path / "core")
    open_delta(table, version=1).write_mds(core, SPEC)
    assert open_dataset(core).columns["emb"] == "ndarray:float32"
    df = spark_dl.read_delta(spark, table, version=1)
    written = {"format": str(tmp_path / "format"), "dl": str(tmp_path / "dl")}
    df.write.format("mds").options(shard_size="1500", hashes="xxh64").save(written["format"])
    df.dl.write_mds(written["dl"], SPEC)
    cached = df.dl.converter(SPEC, cache_dir=str(tmp_path / "cache")).path
    for path in [*written.values(), cached]:
        _same_dataset(path, core)
