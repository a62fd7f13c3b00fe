"""Delta version-pinned reads: JVM-free (deltalake) and Spark paths give the same rows."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

deltalake = pytest.importorskip("deltalake")
from delta_helpers import add_deletion_vector  # noqa: E402
from deltalake import DeltaTable, write_deltalake  # noqa: E402

from spark_dl_core import DatasetSpec, open_dataset  # noqa: E402
from spark_dl_core.tables.delta.snapshot import DeltaSnapshotError  # noqa: E402
from spark_dl_core.tables.delta.table import open_delta  # noqa: E402

# --------------------------------------------------------------------------- table builders


def commit_parquet_directories(path: str, data: pa.Table) -> None:
    """Make Spark-written ``part=../ts=..`` Parquet directories a Delta table, as delta-spark
    commits them: ``add.path`` the relative path URI-encoded once, partition values from the
    rows (timestamps as UTC instants, which the protocol allows).

    (deltalake's ``convert_to_deltalake`` decodes ``%3A`` in directory names, so its log
    names files that do not exist.)"""
    from urllib.parse import quote

    fields = [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]
    fields += [{"name": "part", "type": "string", "nullable": True, "metadata": {}}]
    fields += [{"name": "ts", "type": "timestamp", "nullable": True, "metadata": {}}]
    meta = {
        "id": str(uuid.uuid4()),
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps({"type": "struct", "fields": fields}),
        "partitionColumns": ["part", "ts"],
        "configuration": {},
    }
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "CONVERT"}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"metaData": meta},
    ]
    by_part = {r["part"]: r["ts"] for r in data.to_pylist()}
    for file in sorted(Path(path).rglob("*.parquet")):
        rel = file.relative_to(path).as_posix()
        part = next(v for v in by_part if rel.startswith(f"part={_spark_escape(v)}/"))
        when = by_part[part].astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        add = {"path": quote(rel, safe="/="), "size": file.stat().st_size, "dataChange": True}
        add |= {"partitionValues": {"part": part, "ts": when}, "modificationTime": 0}
        actions.append({"add": add})
    Path(path, "_delta_log").mkdir()
    Path(path, "_delta_log", f"{0:020}.json").write_text(
        "\n".join(json.dumps(a) for a in actions) + "\n"
    )


def _spark_escape(value: str) -> str:
    """Spark's escaping of partition directory names (the characters our values use)."""
    return "".join(f"%{ord(c):02X}" if c in ':/%"#=?*' else c for c in value)


def rows(table: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(tuple(r.values()) for r in table.to_pylist())


def _data(ids: range) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(list(ids), pa.int64()),
            "x": pa.array([float(i) / 2 for i in ids], pa.float32()),
            "name": [f"row{i}" for i in ids],
        }
    )


# Partition values whose directory names need escaping, and a timestamp partition column.
ESCAPED_PARTS = ["a b", "c:d", "e/f", "g%h", "é", "plain"]
ESCAPED_TIMES = [dt.datetime(2024, 1, 2, 10, 0, tzinfo=dt.timezone.utc)] * 3 + [
    dt.datetime(2024, 1, 3, 18, 30, 15, 250000, tzinfo=dt.timezone.utc)
] * 3


def write_escaped(path: str) -> pa.Table:
    """A table partitioned by text that needs escaping and by a timestamp; its rows."""
    data = pa.table(
        {
            "id": pa.array(range(6), pa.int64()),
            "part": ESCAPED_PARTS,
            "ts": pa.array(ESCAPED_TIMES, pa.timestamp("us", "UTC")),
        }
    )
    write_deltalake(path, data, partition_by=["part", "ts"])
    return data


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """history: v0 write, v1 append, v2 delete, v3 overwrite; part: partitioned; dv: DVs."""
    root = tmp_path_factory.mktemp("delta")
    history = str(root / "history")
    expected: dict[int, list[int]] = {}
    write_deltalake(history, _data(range(10)))
    expected[0] = list(range(10))
    time.sleep(0.01)
    write_deltalake(history, _data(range(10, 15)), mode="append")
    expected[1] = list(range(15))
    time.sleep(0.01)
    DeltaTable(history).delete("id < 3")
    expected[2] = list(range(3, 15))
    time.sleep(0.01)
    write_deltalake(history, _data(range(100, 104)), mode="overwrite")
    expected[3] = list(range(100, 104))

    part = str(root / "part")
    t = _data(range(12)).append_column("part", pa.array(["a", "b", "c"] * 4))
    t = t.append_column("year", pa.array([2020, 2021] * 6, pa.int32()))
    write_deltalake(part, t, partition_by=["part", "year"])

    dv = str(root / "dv")
    write_deltalake(dv, _data(range(10)), configuration={"delta.enableDeletionVectors": "true"})
    add_deletion_vector(dv, [0, 3, 9])
    escaped = str(root / "escaped 100% é")  # the table's own path needs escaping too
    write_escaped(escaped)
    return {
        "root": root,
        "history": history,
        "expected": expected,
        "part": part,
        "dv": dv,
        "escaped": escaped,
    }


# --------------------------------------------------------------------------- JVM-free reads


def test_each_version_of_history(tables: dict[str, Any]) -> None:
    for version, ids in tables["expected"].items():
        snap = open_delta(tables["history"], version=version)
        assert snap.version == version
        table = snap.to_arrow()
        assert sorted(table["id"].to_pylist()) == ids
        assert table.schema.names == ["id", "x", "name"]
        assert table.num_rows == sum(b.num_rows for b in snap.batches())
    assert open_delta(tables["history"]).version == 3  # latest, pinned


def test_version_as_digits_or_refused(tables: dict[str, Any]) -> None:
    """version="1" raised an internal TypeError ('<' between str and int)."""
    from spark_dl_core import SpecError

    path = tables["history"]
    assert open_delta(path, version="1").version == 1
    assert open_delta(path, version=" 2 ").to_arrow() == open_delta(path, version=2).to_arrow()
    for bad in ("one", "1.0", 1.5, True, "-1"):
        with pytest.raises(SpecError, match=r"version=.*a whole number >= 0"):
            open_delta(path, version=bad)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="version or timestamp, not both"):
        open_delta(path, version=1, timestamp=0)


def test_partition_columns_present_and_typed(tables: dict[str, Any]) -> None:
    table = open_delta(tables["part"]).to_arrow()
    assert table.schema.field("year").type == pa.int32()
    assert table.schema.field("part").type == pa.string()
    by_id = {r["id"]: (r["part"], r["year"]) for r in table.to_pylist()}
    assert by_id == {i: ("abc"[i % 3], 2020 + i % 2) for i in range(12)}


def test_partition_values_that_need_escaping(tables: dict[str, Any], tmp_path: Path) -> None:
    """Log paths are URI-encoded Hive directories: decoded once, the files are found."""
    snap = open_delta(tables["escaped"])
    table = snap.to_arrow()
    by_id = {r["id"]: (r["part"], r["ts"]) for r in table.to_pylist()}
    assert by_id == {i: (ESCAPED_PARTS[i], ESCAPED_TIMES[i]) for i in range(6)}
    assert all(os.path.isfile(f) for f in snap.files)
    engine = pa.RecordBatchReader.from_stream(DeltaTable(tables["escaped"]).scan()).read_all()
    assert rows(engine.select(table.schema.names)) == rows(table)
    ds = snap.to_dataset(str(tmp_path / "out"))
    assert len(ds) == 6


def test_deletion_vector_on_escaped_path(tmp_path: Path) -> None:
    table = str(tmp_path / "dv 50%")
    data = _data(range(10)).append_column("part", pa.array(["x y:z"] * 10))
    write_deltalake(
        table, data, partition_by=["part"], configuration={"delta.enableDeletionVectors": "true"}
    )
    add_deletion_vector(table, [0, 3])
    assert open_delta(table).to_arrow()["id"].to_pylist() == [1, 2, 4, 5, 6, 7, 8, 9]


def test_deletion_vectors_without_the_reader_feature_still_delete(tmp_path: Path) -> None:
    """A log whose adds carry deletion vectors but whose protocol does not list the feature:
    delta-rs's SQL path deletes those rows, so the export and the in-place read do too."""
    from deltalake import QueryBuilder

    table = str(tmp_path / "dv")
    write_deltalake(table, _data(range(10)))  # no delta.enableDeletionVectors
    add_deletion_vector(table, [0, 3, 9])
    sql = QueryBuilder().register("t", DeltaTable(table)).execute("select id from t")
    want = sorted(pa.table(sql.read_all())["id"].to_pylist())
    assert want == [1, 2, 4, 5, 6, 7, 8]
    snap = open_delta(table)
    assert sorted(snap.to_arrow()["id"].to_pylist()) == want
    assert sorted(int(i) for b in snap.iter_batches(4, shuffle=True) for i in b["id"]) == want


def test_deletion_vectors_are_honoured(tables: dict[str, Any]) -> None:
    before = open_delta(tables["dv"], version=0)
    after = open_delta(tables["dv"], version=1)
    assert not before.has_deletion_vectors and after.has_deletion_vectors
    assert sorted(before.to_arrow()["id"].to_pylist()) == list(range(10))
    assert after.to_arrow()["id"].to_pylist() == [1, 2, 4, 5, 6, 7, 8]
    # deltalake's own engine agrees (it applies DVs too, in no fixed order)
    engine = pa.RecordBatchReader.from_stream(DeltaTable(tables["dv"]).scan()).read_all()
    assert rows(engine) == rows(after.to_arrow())


def test_columns_and_filter(tables: dict[str, Any]) -> None:
    snap = open_delta(tables["history"], version=1, columns=["id"], filter=pc.field("id") >= 12)
    assert snap.to_arrow().to_pydict() == {"id": [12, 13, 14]}
    assert snap.lineage()["columns"] == ["id"] and "12" in snap.lineage()["filter"]


def test_timestamp_pins_last_commit_at_or_before(tables: dict[str, Any]) -> None:
    history = sorted(DeltaTable(tables["history"]).history(), key=lambda h: h["version"])
    ts1 = history[1]["timestamp"]
    assert open_delta(tables["history"], timestamp=ts1).version == 1
    assert open_delta(tables["history"], timestamp=history[2]["timestamp"] - 1).version == 1


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"version": 9}, ["version 9", "no such version", "0..3"]),
        ({"version": -1}, ["version -1", "0..3"]),
        (
            {"timestamp": "2001-01-01T00:00:00"},
            ["timestamp 2001-01-01", "before the first", "0..3"],
        ),
    ],
)
def test_bad_versions_name_table_and_range(
    tables: dict[str, Any], kwargs: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(DeltaSnapshotError) as err:
        open_delta(tables["history"], **kwargs)
    text = str(err.value)
    assert tables["history"] in text
    for w in words:
        assert w in text


def test_vacuumed_snapshot_and_missing_table(tables: dict[str, Any], tmp_path: Path) -> None:
    table = str(tmp_path / "vac")
    write_deltalake(table, _data(range(3)))
    write_deltalake(table, _data(range(5, 7)), mode="overwrite")
    DeltaTable(table).vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
    assert sorted(open_delta(table, version=1).to_arrow()["id"].to_pylist()) == [5, 6]
    with pytest.raises(DeltaSnapshotError, match=r"version 0.*missing.*versions available: 0\.\."):
        open_delta(table, version=0)
    with pytest.raises(DeltaSnapshotError, match="cannot be opened"):
        open_delta(str(tmp_path / "nope"))


def test_unknown_column_mapping_mode_refused_clearly(tmp_path: Path) -> None:
    """Column mapping ``name``/``id`` is read (tests/sources/test_delta_column_mapping.py);
    a mode the protocol does not define is refused, not guessed."""
    table = str(tmp_path / "cm")
    write_deltalake(table, _data(range(2)), configuration={"delta.columnMapping.mode": "name"})
    log = Path(table, "_delta_log", f"{0:020}.json")
    log.write_text(log.read_text().replace('Mapping.mode":"name"', 'Mapping.mode":"bogus"'))
    from spark_dl_core.tables.delta.snapshot import UnsupportedDeltaFeatureError

    # a typed error (what read_delta's delta-spark path lets through), not a message match
    with pytest.raises(UnsupportedDeltaFeatureError, match="column mapping mode 'bogus'"):
        open_delta(table)


# --------------------------------------------------------------------------- lineage, pinning


def test_export_records_lineage_and_pins(tables: dict[str, Any], tmp_path: Path) -> None:
    table = str(tmp_path / "pin")
    write_deltalake(table, _data(range(20)))
    write_deltalake(table, _data(range(20, 30)), mode="append")
    spec = DatasetSpec(hashes=["xxh64"], shard_size=256)
    first = open_delta(table, version=1).write_mds(str(tmp_path / "a"), spec)
    ds = open_dataset(str(tmp_path / "a"))
    assert ds.source["table"] == table and ds.source["version"] == 1
    assert ds.source["timestamp"] and ds.source["kind"] == "delta"
    assert ds.num_shards > 1
    write_deltalake(table, _data(range(30, 40)), mode="append")  # a new commit lands
    again = open_delta(table, version=1).write_mds(str(tmp_path / "b"), spec)
    assert again.fingerprint == first.fingerprint
    other = open_delta(table, version=2).write_mds(str(tmp_path / "c"), spec)
    assert other.fingerprint != first.fingerprint
    # to_dataset reuses a matching export and rewrites only when the snapshot differs
    reused = open_delta(table, version=1).to_dataset(str(tmp_path / "a"), spec)
    assert reused.fingerprint == first.fingerprint
    assert open_delta(table, version=2).to_dataset(str(tmp_path / "a"), spec).source["version"] == 2


_HASH_SCRIPT = """
import hashlib, sys
from spark_dl_core import open_delta, open_dataset
table, version, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
open_delta(table, version=version).write_mds(out, {"shard_size": 300, "hashes": ["xxh64"]})
ds = open_dataset(out)
h = hashlib.sha256()
for batch in ds.iter_batches(batch_size=4, shuffle=True, seed=7):
    for name in sorted(batch):
        h.update(name.encode()); h.update(repr(batch[name].tolist()).encode())
print(ds.fingerprint, h.hexdigest())
"""


def test_two_processes_same_batches(tables: dict[str, Any], tmp_path: Path) -> None:
    outs = []
    for i in range(2):
        proc = subprocess.run(
            [sys.executable, "-c", _HASH_SCRIPT, tables["part"], "0", str(tmp_path / f"o{i}")],
            capture_output=True,
            text=True,
            check=True,
        )
        outs.append(proc.stdout.split())
    assert outs[0] == outs[1]
    assert len(outs[0]) == 2


# --------------------------------------------------------------------------- Spark path


@pytest.fixture(scope="module")
def spark(_spark_sessions: Any) -> Any:
    """The shared classic session (one SparkContext per process: stopping a session of
    our own would stop the one every later test shares), in UTC with one shuffle partition
    for this module, its settings put back afterwards."""
    pytest.importorskip("pyspark")
    session = _spark_sessions.get("classic")
    wanted = {"spark.sql.session.timeZone": "UTC", "spark.sql.shuffle.partitions": "1"}
    before = {key: session.conf.get(key) for key in wanted}
    for key, value in wanted.items():
        session.conf.set(key, value)
    yield session
    for key, value in before.items():
        session.conf.set(key, value)


@pytest.mark.spark
def test_read_delta_matches_open_delta(spark: Any, tables: dict[str, Any]) -> None:
    from spark_dl.delta import lineage_for, read_delta, session_reads_delta

    assert session_reads_delta(spark)  # the shared session has delta-spark (with_delta)
    cases = [(tables["history"], v) for v in tables["expected"]]
    cases += [(tables["part"], 0), (tables["dv"], 0), (tables["dv"], 1)]
    # "auto" is Delta's own reader here; "deltalake" the fallback for sessions without it
    readers = {"auto": "delta-spark", "deltalake": "spark-parquet"}
    for (path, version), engine in itertools.product(cases, readers):
        df = read_delta(spark, path, version=version, engine=engine)  # type: ignore[arg-type]
        snap = open_delta(path, version=version)
        assert df.columns == snap.schema.names, path
        got = sorted(tuple(r) for r in df.collect())
        assert got == rows(snap.to_arrow()), (path, version, engine)
        lineage = lineage_for(df)
        assert lineage is not None and lineage["version"] == version
        # deletion vectors are a filter on the file scan: no trip through driver memory
        assert lineage["reader"] == readers[engine]
        assert "derived" not in lineage
    latest = read_delta(spark, tables["history"])
    assert lineage_for(latest)["version"] == 3  # type: ignore[index]
    derived = lineage_for(latest.select("id").filter("id > 100"))
    assert derived is not None and derived["version"] == 3 and derived["derived"] is True
    assert lineage_for(spark.range(3)) is None


def _instants(table: pa.Table) -> list[tuple[Any, ...]]:
    """Rows with timestamps as UTC microseconds: the same instant compares equal."""
    cols = [c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in table.columns]
    return rows(pa.table(cols, names=table.column_names))


def _spark_instants(df: Any) -> list[tuple[Any, ...]]:
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    cols = [
        F.unix_micros(F.col(f.name)) if isinstance(f.dataType, TimestampType) else F.col(f.name)
        for f in df.schema.fields
    ]
    return sorted(tuple(r) for r in df.select(*cols).collect())


@pytest.mark.spark
def test_read_delta_partitions_like_the_core(
    spark: Any, tables: dict[str, Any], tmp_path: Path
) -> None:
    """Escaped partition directories and timestamp partitions: Spark gives the core's values
    (the log's, timestamps as UTC instants) whatever the session time zone, for a table
    written by deltalake and for Parquet partition directories Spark wrote itself."""
    from spark_dl.delta import lineage_for, read_delta

    written = str(tmp_path / f"spark {spark.conf.get('spark.sql.session.timeZone')}")
    data = write_escaped(str(tmp_path / "scratch"))
    spark.createDataFrame(data.to_pandas()).write.partitionBy("part", "ts").parquet(written)
    commit_parquet_directories(written, data)
    readers = {"auto": "delta-spark", "deltalake": "spark-parquet"}
    for path, engine in itertools.product((tables["escaped"], written), readers):
        snap = open_delta(path)
        df = read_delta(spark, path, engine=engine)  # type: ignore[arg-type]
        assert df.columns == snap.schema.names
        assert _spark_instants(df) == _instants(snap.to_arrow()), (path, engine)
        assert lineage_for(df)["reader"] == readers[engine]  # type: ignore[index]
    core = open_delta(tables["escaped"]).to_arrow()
    assert sorted(core["part"].to_pylist()) == sorted(ESCAPED_PARTS)


@pytest.mark.spark
def test_read_delta_errors(spark: Any, tables: dict[str, Any]) -> None:
    from spark_dl.delta import read_delta

    with pytest.raises(DeltaSnapshotError, match=r"version 7.*0\.\.3"):
        read_delta(spark, tables["history"], version=7)


def _nested_decimals(path: str) -> pa.Table:
    """A Delta table with decimals inside a list, a struct and a map."""
    from decimal import Decimal as D

    dec = pa.decimal128(12, 3)
    data = pa.table(
        {
            "id": pa.array([0, 1], pa.int64()),
            "l": pa.array([[D("1.250"), D("-3.500")], [D("0.001")]], pa.list_(dec)),
            "s": pa.array([{"d": D("2.500")}, {"d": None}], pa.struct([("d", dec)])),
            "m": pa.array([[("a", D("9.999"))], []], pa.map_(pa.string(), dec)),
        }
    )
    write_deltalake(path, data)
    return data


def test_nested_decimals_round_trip(tmp_path: Path) -> None:
    data = _nested_decimals(str(tmp_path / "nested"))
    open_delta(str(tmp_path / "nested")).write_mds(str(tmp_path / "out"))
    back = open_dataset(str(tmp_path / "out")).to_arrow()
    assert back.schema.field("l").type == data.schema.field("l").type
    assert back.to_pylist() == data.to_pylist()


@pytest.mark.spark
def test_nested_decimals_spark_reader(classic_spark: Any, tmp_path: Path) -> None:
    data = _nested_decimals(str(tmp_path / "nested"))
    open_delta(str(tmp_path / "nested")).write_mds(str(tmp_path / "out"))
    got = classic_spark.read.format("mds").load(str(tmp_path / "out")).orderBy("id").collect()
    assert [r["l"] for r in got] == data.column("l").to_pylist()
    assert [r["s"]["d"] for r in got] == [s["d"] for s in data.column("s").to_pylist()]


# --------------------------------------------------------------------------- INT96 timestamps

EXTREMES = [
    dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone.utc),
    dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc),
    dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=dt.timezone.utc),
    None,
]


def _commit_files(path: str, fields: dict[str, str]) -> None:
    """A Delta log over the Parquet files Spark wrote at ``path``, with schema ``fields``."""
    schema = [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields.items()]
    meta = {
        "id": str(uuid.uuid4()),
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps({"type": "struct", "fields": schema}),
        "partitionColumns": [],
        "configuration": {},
    }
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "CONVERT"}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"metaData": meta},
    ]
    for file in sorted(Path(path).glob("*.parquet")):
        add = {"path": file.name, "size": file.stat().st_size, "dataChange": True}
        actions.append({"add": add | {"partitionValues": {}, "modificationTime": 0}})
    Path(path, "_delta_log").mkdir()
    Path(path, "_delta_log", f"{0:020}.json").write_text(
        "\n".join(json.dumps(a) for a in actions) + "\n"
    )


def _int96_files(spark: Any, path: str) -> None:
    """Parquet with INT96 timestamps (Spark's legacy type) out to 9999-12-31, written by Spark."""
    before = spark.conf.get("spark.sql.parquet.outputTimestampType")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "INT96")
    try:
        rows = [(3_000_000_000 + i, t) for i, t in enumerate(EXTREMES)]
        df = spark.createDataFrame(rows, "id long, ts timestamp")
        df.coalesce(1).write.parquet(path)
    finally:
        spark.conf.set("spark.sql.parquet.outputTimestampType", before)


@pytest.mark.spark
def test_int96_extreme_timestamps(spark: Any, tmp_path: Path) -> None:
    """pyarrow reads INT96 as nanoseconds by default, which cannot hold 9999-12-31 (it
    wrapped around, or raised a bare ArrowInvalid); Delta timestamps are microseconds."""
    import pyarrow.parquet as pq

    path = str(tmp_path / "int96")
    _int96_files(spark, path)
    assert "int96" in str(pq.ParquetFile(next(Path(path).glob("*.parquet"))).schema).lower()
    _commit_files(path, {"id": "long", "ts": "timestamp"})
    got = open_delta(path, version=0).to_arrow()
    assert got.column("ts").to_pylist() == EXTREMES
    from spark_dl.delta import read_delta

    assert _spark_instants(read_delta(spark, path, version=0)) == _instants(got)
    out = str(tmp_path / "mds")
    open_delta(path).write_mds(out, {"nulls": "mask"})
    ds = open_dataset(out)
    assert ds.to_arrow().column("ts").cast(pa.int64()).equals(got.column("ts").cast(pa.int64()))


@pytest.mark.spark
def test_unreadable_value_names_table_version_file_column(spark: Any, tmp_path: Path) -> None:
    """A value the table's type cannot hold (a log saying ``integer`` over a file of longs
    beyond 2^31) is a DeltaSnapshotError naming all four; the CLI prints that one line."""
    path = str(tmp_path / "narrow")
    _int96_files(spark, path)
    _commit_files(path, {"id": "integer", "ts": "timestamp"})
    file, out = next(Path(path).glob("*.parquet")).name, str(tmp_path / "out")
    with pytest.raises(DeltaSnapshotError) as info:
        open_delta(path, version=0).to_arrow()
    text = str(info.value)
    assert all(s in text for s in (path, "version 0", file, "'id'")), text
    proc = subprocess.run(
        [*(sys.executable, "-m", "spark_dl.cli", "export", path), "--no-progress", "--out", out],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and file in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"spark-dl export: error: {text}"]
    assert not Path(out).exists() or not any(Path(out).iterdir())  # nothing half-written


def test_opening_a_snapshot_in_place_imports_no_pandas(tmp_path: Path) -> None:
    """``pa.table`` of delta-rs's add actions and ``RecordBatch.from_pylist`` import pandas
    (0.2-0.4 s before a first batch): opening and planning an in-place read use neither."""
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": [1, 2, 3], "x": [[1.0, 2.0]] * 3}))
    code = (
        "import sys; from spark_dl_core.tables.delta.table import open_delta; "
        "ds = open_delta(sys.argv[1]).dataset(cache=False); assert len(ds) == 3; "
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, path], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
