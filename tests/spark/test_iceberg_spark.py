"""Iceberg tables written by Spark's Iceberg runtime, read back by Spark's own Iceberg reader
as the oracle.

The suite's shared classic session (``spark_dl.with_iceberg``: a Hadoop-type catalog named
``iceberg`` over a temporary warehouse, beside Delta). A format-version 2 table gets appends,
merge-on-read DELETE, UPDATE and MERGE (position delete files), a column added and one
renamed, and a partition spec of transforms (``days(ts)``, ``bucket(4, id)``) evolved with
``truncate``; a format-version 3 table gets deletion vectors (Puffin) from DELETE and
UPDATE, a second delete of the same file merging into its vector. For every snapshot, what
``open_iceberg`` (the table's metadata file, the snapshot id) reads must equal
``spark.read.option("versionAsOf", id).table(...)`` (Iceberg 1.12 refuses
its own ``snapshot-id`` option there), row for row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("pyiceberg")

from spark_dl.iceberg_session import IcebergSetupError, iceberg_jars
from spark_dl_core.tables.iceberg.table import open_iceberg

pytestmark = pytest.mark.spark

try:
    if not iceberg_jars():
        pytest.skip("no Iceberg jars: run `make install`", allow_module_level=True)
except IcebergSetupError as exc:  # e.g. no JDK to build the compatibility jar with
    pytest.skip(str(exc), allow_module_level=True)


@pytest.fixture(scope="module")
def iceberg(_spark_sessions: Any) -> Any:
    """The suite's shared classic session: it has Iceberg's extension and a Hadoop catalog
    named ``iceberg`` over a temporary warehouse (tests/conftest.py), beside Delta."""
    spark = _spark_sessions.get("classic")
    assert spark.conf.get("spark.sql.catalog.iceberg.type") == "hadoop"
    return spark


def _sql(spark: Any, *statements: str) -> None:
    for statement in statements:
        spark.sql(statement)


def _snapshots(spark: Any, table: str) -> list[int]:
    rows = spark.sql(f"SELECT snapshot_id FROM {table}.snapshots ORDER BY committed_at").collect()
    return [int(r["snapshot_id"]) for r in rows]


def _metadata_file(spark: Any, table: str) -> str:
    """The table's newest metadata file (it names every snapshot the table keeps)."""
    row = spark.sql(
        f"SELECT file FROM {table}.metadata_log_entries ORDER BY timestamp DESC LIMIT 1"
    ).collect()[0]
    return str(row["file"]).removeprefix("file:")


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=lambda r: r[0])


def _agree(spark: Any, table: str) -> dict[int, int]:
    """Every snapshot of ``table``: the core's rows == Spark's. Returns {snapshot: rows}."""
    metadata = _metadata_file(spark, table)
    counts = {}
    for snapshot in _snapshots(spark, table):
        want = spark.read.option("versionAsOf", snapshot).table(table).toArrow()
        snap = open_iceberg(metadata, snapshot_id=snapshot)
        got = snap.to_arrow()
        assert got.column_names == want.column_names, snapshot
        assert _rows(got) == _rows(want), snapshot
        in_place = snap.dataset({"nulls": "mask"}).to_arrow()
        assert _rows(in_place) == _rows(want), snapshot  # read in place (no export)
        counts[snapshot] = want.num_rows
    return counts


_ROW = (
    "id, timestamp_micros(1700000000000000 + id * 7200000000) AS ts, "
    "element_at(array('a', 'bb', 'ccc', null), cast(id % 4 + 1 as int)) AS cat, "
    "cast(id as double) / 3 AS v, array(concat('t', id), 'x') AS tags"
)


def test_v2_position_deletes_schema_and_partition_evolution(iceberg: Any) -> None:
    t = "iceberg.db.events"
    mor = ", ".join(f"'write.{op}.mode'='merge-on-read'" for op in ("delete", "update", "merge"))
    _sql(
        iceberg,
        f"""CREATE TABLE {t} (id BIGINT NOT NULL, ts TIMESTAMP, cat STRING, v DOUBLE,
              tags ARRAY<STRING>) USING iceberg PARTITIONED BY (days(ts), bucket(4, id))
            TBLPROPERTIES ('format-version'='2', {mor})""",
        f"INSERT INTO {t} SELECT {_ROW} FROM range(0, 60)",
        f"INSERT INTO {t} SELECT {_ROW} FROM range(60, 100)",
        f"DELETE FROM {t} WHERE id % 7 = 0",
        f"UPDATE {t} SET v = -v, cat = 'upd' WHERE id % 5 = 0",
        f"ALTER TABLE {t} ADD COLUMN extra INT",
        f"INSERT INTO {t} SELECT {_ROW}, cast(id * 2 as int) AS extra FROM range(100, 120)",
        f"ALTER TABLE {t} RENAME COLUMN cat TO category",
        f"""MERGE INTO {t} d USING (SELECT id, cast(id as double) AS v FROM range(110, 130)) s
            ON d.id = s.id
            WHEN MATCHED AND s.id % 2 = 0 THEN DELETE
            WHEN MATCHED THEN UPDATE SET d.v = s.v
            WHEN NOT MATCHED THEN INSERT (id, ts, category, v, tags, extra)
              VALUES (s.id, timestamp_micros(1700000000000000), 'new', s.v, array(), 1)""",
        f"ALTER TABLE {t} ADD PARTITION FIELD truncate(1, category)",
        f"INSERT INTO {t} SELECT {_ROW}, 0 AS extra FROM range(200, 210)",
        f"DELETE FROM {t} WHERE category = 'bb' AND id > 200",
    )
    deletes = iceberg.sql(f"SELECT content FROM {t}.all_delete_files").collect()
    assert deletes and {r["content"] for r in deletes} == {1}  # position deletes only
    counts = _agree(iceberg, t)
    assert len(counts) == 8 and list(counts.values())[:4] == [60, 100, 85, 85]
    last = open_iceberg(_metadata_file(iceberg, t))
    assert last.version == _snapshots(iceberg, t)[-1]
    assert last.schema.names == ["id", "ts", "category", "v", "tags", "extra"]
    assert last.deleted_rows()


def test_v3_deletion_vectors(iceberg: Any) -> None:
    t = "iceberg.db.dv"
    mor = ", ".join(f"'write.{op}.mode'='merge-on-read'" for op in ("delete", "update"))
    _sql(
        iceberg,
        f"""CREATE TABLE {t} (id BIGINT, ts TIMESTAMP, cat STRING, v DOUBLE,
              tags ARRAY<STRING>) USING iceberg PARTITIONED BY (bucket(2, id))
            TBLPROPERTIES ('format-version'='3', {mor})""",
        f"INSERT INTO {t} SELECT {_ROW} FROM range(0, 40)",
        f"INSERT INTO {t} SELECT {_ROW} FROM range(40, 80)",  # two data files a partition
        f"DELETE FROM {t} WHERE id % 3 = 0",
        f"UPDATE {t} SET v = 0.0 WHERE id % 4 = 1",
        f"DELETE FROM {t} WHERE id % 5 = 2",  # the same files again: their vectors merge
    )
    deletes = iceberg.sql(f"SELECT * FROM {t}.delete_files").collect()
    assert {r["file_format"] for r in deletes} == {"PUFFIN"}
    # one Puffin file holds the vectors of several data files (one path, many blobs)
    puffins = [r["file_path"] for r in deletes]
    assert len(set(puffins)) < len(puffins), puffins
    counts = _agree(iceberg, t)
    assert list(counts.values())[:3] == [40, 80, 53]


def test_a_damaged_deletion_vector_is_refused_naming_its_file(iceberg: Any) -> None:
    """One bit flipped in a vector Spark wrote: the open fails with the table's error
    naming the Puffin file and the CRC, instead of deleting other rows."""
    from spark_dl_core.tables.iceberg.errors import IcebergSnapshotError

    t = "iceberg.db.dv_damaged"
    _sql(
        iceberg,
        f"""CREATE TABLE {t} (id BIGINT, v DOUBLE) USING iceberg
            TBLPROPERTIES ('format-version'='3', 'write.delete.mode'='merge-on-read')""",
        f"INSERT INTO {t} SELECT id, cast(id as double) FROM range(0, 500)",
        f"DELETE FROM {t} WHERE id % 7 = 3",
    )
    metadata = _metadata_file(iceberg, t)
    assert open_iceberg(metadata, plan_cache=False).to_arrow().num_rows == 500 - 71
    row = iceberg.sql(f"SELECT file_path, content_offset FROM {t}.delete_files").collect()[0]
    puffin = Path(str(row["file_path"]).removeprefix("file:"))
    data = bytearray(puffin.read_bytes())
    data[int(row["content_offset"]) + 20] ^= 0x01  # inside the bitmap: its CRC no longer fits
    puffin.write_bytes(bytes(data))
    with pytest.raises(IcebergSnapshotError, match="CRC-32") as caught:
        open_iceberg(metadata, plan_cache=False)
    assert puffin.name in str(caught.value)


def _ids(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in batch["id"]]


def test_df_dl_on_iceberg_scans(iceberg: Any, tmp_path: Path) -> None:
    """``spark.table``, a ``versionAsOf`` read and SQL ``VERSION AS OF`` reach ``df.dl`` as
    the snapshot Spark resolved: the lineage names the table and snapshot, ``in_place=True``
    reads its files through ``open_iceberg`` (no copy), ``write_mds`` records it; a filter
    is refused in place."""
    from spark_dl.delta_inplace import NotInPlaceError
    from spark_dl_core import open_dataset

    t = "iceberg.db.loader"
    _sql(
        iceberg,
        f"""CREATE TABLE {t} (id BIGINT, x DOUBLE, cat STRING) USING iceberg
            TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read')""",
        f"INSERT INTO {t} SELECT id, id / 2, concat('c', id % 3) FROM range(0, 50)",
        f"DELETE FROM {t} WHERE id % 4 = 0",
        f"INSERT INTO {t} SELECT id, id / 2, concat('c', id % 3) FROM range(50, 60)",
    )
    first, deleted, last = _snapshots(iceberg, t)
    latest = iceberg.table(t)
    lineage = latest.dl.lineage()
    assert lineage is not None
    assert (lineage["kind"], lineage["table"], lineage["snapshot_id"]) == ("iceberg", t, last)
    copies = tmp_path / "copies"
    loader = latest.dl.to_torch(8, shuffle=True, seed=1, in_place=True, cache_dir=str(copies))
    want = sorted(r["id"] for r in latest.select("id").collect())
    assert sorted(_ids(loader)) == want and not copies.exists()  # nothing materialized

    old = iceberg.read.option("versionAsOf", deleted).table(t).select("id", "x")
    assert old.dl.lineage()["snapshot_id"] == deleted  # type: ignore[index]
    batch = next(iter(old.dl.to_torch(100, in_place=True)))
    assert sorted(batch) == ["id", "x"]
    assert sorted(int(i) for i in batch["id"]) == [i for i in range(50) if i % 4]

    # Iceberg 1.12 refuses its own "snapshot-id" option here: Spark's versionAsOf it is
    by_option = iceberg.read.format("iceberg").option("versionAsOf", deleted).load(t)
    assert by_option.dl.lineage()["snapshot_id"] == deleted  # type: ignore[index]
    sql = iceberg.sql(f"SELECT * FROM {t} VERSION AS OF {first}")
    assert sql.dl.lineage()["snapshot_id"] == first  # type: ignore[index]
    sql.dl.write_mds(str(tmp_path / "mds"))
    iceberg.sql(f"DELETE FROM {t} WHERE id < 10")  # a commit after the scan: not written
    written = open_dataset(str(tmp_path / "mds"))
    assert sorted(written.to_arrow()["id"].to_pylist()) == list(range(50))
    source = written.source
    assert (source["table"], source["snapshot_id"]) == (t, first)

    with pytest.raises(NotInPlaceError):
        old.filter("id > 3").dl.to_torch(8, in_place=True)
    assert old.filter("id > 3").dl.lineage() is None


def test_df_dl_on_iceberg_scans_on_connect(connect_spark: Any, tmp_path: Path) -> None:
    """On Spark Connect the same scans are taken from the server's plan text: the lineage
    names the table and the snapshot Spark resolved, ``in_place=True`` reads it through
    ``open_iceberg``, ``write_mds`` writes that snapshot; a filter or a computed column is
    not taken (no lineage, refused in place)."""
    from spark_dl.delta_inplace import NotInPlaceError
    from spark_dl.iceberg_session import CATALOG_CLASS
    from spark_dl_core import open_dataset

    spark = connect_spark
    catalog = "iceconnect"  # a catalog is set at run time: the session's jars have Iceberg
    spark.conf.set(f"spark.sql.catalog.{catalog}", CATALOG_CLASS)
    spark.conf.set(f"spark.sql.catalog.{catalog}.type", "hadoop")
    spark.conf.set(f"spark.sql.catalog.{catalog}.warehouse", str(tmp_path / "wh"))
    t = f"{catalog}.db.loader"
    _sql(
        spark,
        f"CREATE TABLE {t} (id BIGINT, x DOUBLE) USING iceberg",
        f"INSERT INTO {t} SELECT id, id / 2 FROM range(0, 40)",
        f"INSERT INTO {t} SELECT id, id / 2 FROM range(40, 60)",
    )
    first, last = _snapshots(spark, t)
    latest = spark.table(t)
    lineage = latest.dl.lineage()
    assert lineage is not None
    assert (lineage["kind"], lineage["table"], lineage["snapshot_id"]) == ("iceberg", t, last)
    assert lineage["metadata"] == _metadata_file(spark, t)
    loader = latest.dl.to_torch(8, shuffle=True, seed=1, in_place=True)
    assert sorted(_ids(loader)) == list(range(60))

    old = spark.read.option("versionAsOf", first).table(t).select("id")
    assert old.dl.lineage()["snapshot_id"] == first  # type: ignore[index]
    assert sorted(_ids(old.dl.to_torch(100, in_place=True))) == list(range(40))
    sql = spark.sql(f"SELECT * FROM {t} VERSION AS OF {first}")
    assert sql.dl.lineage()["snapshot_id"] == first  # type: ignore[index]
    sql.dl.write_mds(str(tmp_path / "mds"))
    written = open_dataset(str(tmp_path / "mds"))
    assert sorted(written.to_arrow()["id"].to_pylist()) == list(range(40))
    assert (written.source["table"], written.source["snapshot_id"]) == (t, first)

    for other in (latest.filter("id > 3"), latest.selectExpr("id", "x * 2 AS x")):
        assert other.dl.lineage() is None
        with pytest.raises(NotInPlaceError):
            other.dl.to_torch(8, in_place=True)
