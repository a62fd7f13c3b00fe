"""Delta tables written by delta-spark, read back by Spark's own Delta reader as the oracle.

Each history below is written through SQL on the shared classic session (``with_delta``):
deletion vectors from DELETE / UPDATE / MERGE, column mapping with renames and drops,
partition values that need escaping, NOT NULL and generated columns, the change data feed,
row tracking, liquid clustering, type widening, v2 checkpoints, ``timestamp_ntz``, OPTIMIZE
and VACUUM. For every version, what the core reads (the snapshot, in place, exported) must
equal what ``spark.read.format("delta").option("versionAsOf", v)`` returns, or be refused
with an error naming the feature.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("deltalake")
pytest.importorskip("delta")

from delta_helpers import cheap_delta_writes, sorted_rows, write_concurrently

from spark_dl_core import open_dataset
from spark_dl_core.tables.delta.snapshot import (
    DeltaSnapshotError,
    UnsupportedDeltaFeatureError,
)
from spark_dl_core.tables.delta.table import open_delta

pytestmark = pytest.mark.spark

MASKED = {"nulls": "mask"}


def _sql(spark: Any, *statements: str) -> None:
    for statement in statements:
        spark.sql(statement)


def _version(spark: Any, path: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]["version"])


def _insert(spark: Any, path: str, start: int, count: int, columns: str) -> None:
    """``count`` rows from ``start`` through SQL, so generated columns are computed by Delta."""
    spark.sql(
        f"INSERT INTO delta.`{path}` ({columns}) SELECT {_ROW_EXPRESSIONS[columns]} "
        f"FROM range({start}, {start + count})"
    )


_FEATURE_COLUMNS = "id, label, name, emb, amount, ts, tsn, part, info"
_ROW_EXPRESSIONS = {
    _FEATURE_COLUMNS: (
        "id, cast(id % 3 as int), concat('n', id), array(cast(id as float), 0.5f), "
        "cast(id / 4 as decimal(10,2)), timestamp_micros(1700000000000000 + id * 1000001), "
        "cast(timestamp_micros(1600000000000000 + id) as timestamp_ntz), "
        "element_at(array('a b', 'x%y', 'c=d', 'é/ü', null), cast(id % 5 + 1 as int)), "
        "named_struct('a', cast(id as int), 'b', cast(id * 2 as string))"
    ),
    "id, small, v": "id, cast(id % 100 as int), cast(id as float) / 3",
    "id, tiny, v, big": (
        "id, cast(id % 100 as int), cast(id as float) / 3, cast(id * 3000000000 as bigint)"
    ),
}


def _write_features(spark: Any, features: str) -> None:
    _sql(
        spark,
        f"""CREATE TABLE delta.`{features}` (
              id BIGINT NOT NULL, label INT, name STRING, emb ARRAY<FLOAT>,
              amount DECIMAL(10,2), ts TIMESTAMP, tsn TIMESTAMP_NTZ, part STRING,
              info STRUCT<a: INT, b: STRING>,
              twice INT GENERATED ALWAYS AS (label * 2))
            USING delta PARTITIONED BY (part)
            TBLPROPERTIES ('delta.enableDeletionVectors' = 'true',
                           'delta.columnMapping.mode' = 'name',
                           'delta.enableChangeDataFeed' = 'true',
                           'delta.enableRowTracking' = 'true',
                           'delta.checkpointInterval' = '4')""",
    )
    _insert(spark, features, 0, 60, _FEATURE_COLUMNS)
    _sql(
        spark,
        f"DELETE FROM delta.`{features}` WHERE id % 7 = 0",
        f"UPDATE delta.`{features}` SET label = label + 100 WHERE id % 5 = 0",
        f"""MERGE INTO delta.`{features}` t
            USING (SELECT id, cast(id % 3 as int) AS label FROM range(50, 70)) s
            ON t.id = s.id
            WHEN MATCHED THEN UPDATE SET t.label = s.label - 7
            WHEN NOT MATCHED THEN INSERT (id, label, part) VALUES (s.id, s.label, 'merged')""",
        f"ALTER TABLE delta.`{features}` RENAME COLUMN name TO title",
        f"ALTER TABLE delta.`{features}` DROP COLUMN amount",
        f"OPTIMIZE delta.`{features}`",
    )
    spark.sql(
        f"INSERT INTO delta.`{features}` (id, label, title, part) "
        "SELECT id, 1, 'late', 'a b' FROM range(100, 110)"
    )


def _write_clustered(spark: Any, clustered: str) -> None:
    _sql(
        spark,
        f"""CREATE TABLE delta.`{clustered}` (id BIGINT, small INT, v FLOAT)
            USING delta CLUSTER BY (id)
            TBLPROPERTIES ('delta.columnMapping.mode' = 'id',
                           'delta.checkpointPolicy' = 'v2',
                           'delta.checkpointInterval' = '2')""",
    )
    _insert(spark, clustered, 0, 40, "id, small, v")
    _sql(
        spark,
        f"ALTER TABLE delta.`{clustered}` ADD COLUMNS (big BIGINT)",
        f"ALTER TABLE delta.`{clustered}` RENAME COLUMN small TO tiny",
    )
    _insert(spark, clustered, 40, 20, "id, tiny, v, big")
    _sql(
        spark,
        f"OPTIMIZE delta.`{clustered}`",
        f"DELETE FROM delta.`{clustered}` WHERE id % 4 = 1",  # no deletion vectors: rewrites
        f"ALTER TABLE delta.`{clustered}` DROP COLUMN v",
    )


def _write_widened(spark: Any, widened: str) -> None:
    _sql(
        spark,
        f"""CREATE TABLE delta.`{widened}` (id BIGINT, small INT)
            USING delta TBLPROPERTIES ('delta.enableTypeWidening' = 'true')""",
        f"INSERT INTO delta.`{widened}` VALUES (1, 2)",
        f"ALTER TABLE delta.`{widened}` ALTER COLUMN small TYPE BIGINT",
    )


def _write_vacuumed(spark: Any, vacuumed: str) -> int:
    """Three appends, a copy-on-write DELETE and an OPTIMIZE, then a VACUUM of every file
    they no longer need (retention check off: :func:`cheap_delta_writes`); returns the
    version before the vacuum."""
    spark.range(0, 30).selectExpr("id", "id * 2 AS x").write.format("delta").save(vacuumed)
    for start in (30, 60):
        spark.range(start, start + 30).selectExpr("id", "id * 2 AS x").write.format("delta").mode(
            "append"
        ).save(vacuumed)
    _sql(
        spark,
        f"DELETE FROM delta.`{vacuumed}` WHERE id % 3 = 0",  # no deletion vectors: rewrites
        f"OPTIMIZE delta.`{vacuumed}`",
    )
    before_vacuum = _version(spark, vacuumed)
    spark.sql(f"VACUUM delta.`{vacuumed}` RETAIN 0 HOURS")
    return before_vacuum


@pytest.fixture(scope="module")
def histories(_spark_sessions: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Four tables written by delta-spark, one commit per feature exercised; the tables are
    written side by side (CI time)."""
    spark = _spark_sessions.get("classic")
    root = tmp_path_factory.mktemp("delta_spark")
    paths = {n: str(root / n) for n in ("features", "clustered", "widened", "vacuumed")}
    writers = {
        "features": _write_features,
        "clustered": _write_clustered,
        "widened": _write_widened,
        "vacuumed": _write_vacuumed,
    }
    jobs = {n: (lambda n=n: writers[n](spark, paths[n])) for n in writers}
    with cheap_delta_writes(spark):
        written = write_concurrently(jobs)
    return {**paths, "vacuumed_at": written["vacuumed"], "root": root}


def _spark_rows(spark: Any, path: str, version: int) -> pa.Table:
    return spark.read.format("delta").option("versionAsOf", version).load(path).toArrow()


def _versions(spark: Any, path: str) -> range:
    return range(_version(spark, path) + 1)


@pytest.mark.parametrize("name", ["features", "clustered"])
def test_every_version_reads_as_spark_reads_it(
    classic_spark: Any, histories: dict[str, Any], name: str, tmp_path: Path
) -> None:
    """Every version: the snapshot, the in-place dataset and the export hold Spark's rows."""
    path = histories[name]
    checked = 0
    for version in _versions(classic_spark, path):
        oracle = _spark_rows(classic_spark, path, version)
        snap = open_delta(path, version=version)
        assert snap.schema.names == oracle.column_names, (name, version)
        expected = sorted_rows(oracle, oracle.column_names)
        assert sorted_rows(snap.to_arrow(), oracle.column_names) == expected, (name, version)
        # real tables hold nulls (a null partition value among them): kept as null masks
        in_place = snap.dataset(MASKED).to_arrow()
        assert sorted_rows(in_place, oracle.column_names) == expected, (name, version, "in place")
        if version == _version(classic_spark, path):  # one export per table: the latest
            snap.write_mds(str(tmp_path / name), MASKED)
            exported = open_dataset(str(tmp_path / name)).to_arrow()
            assert sorted_rows(exported, oracle.column_names) == expected, (name, version, "export")
        checked += 1
    assert checked >= 7


def test_spark_path_gives_the_core_export(
    classic_spark: Any, histories: dict[str, Any], tmp_path: Path
) -> None:
    """read_delta on delta-spark and the core's export of one version: one dataset (same
    rows, same fingerprint, same shuffled batches), the version recorded in the lineage."""
    import spark_dl

    path = histories["features"]
    version = _version(classic_spark, path) - 1
    df = spark_dl.read_delta(classic_spark, path, version=version)
    lineage = spark_dl.delta.lineage_for(df)
    assert lineage is not None and lineage["reader"] == "delta-spark"
    assert lineage["version"] == version
    df.write.format("mds").option("nulls", "mask").save(str(tmp_path / "spark"))
    open_delta(path, version=version).write_mds(str(tmp_path / "core"), MASKED)
    from_spark, from_core = (
        open_dataset(str(tmp_path / "spark")),
        open_dataset(str(tmp_path / "core")),
    )
    assert from_spark.source["version"] == version
    assert from_spark.fingerprint == from_core.fingerprint
    first = [b["id"].tolist() for b in from_spark.iter_batches(batch_size=8, shuffle=True)]
    assert first == [b["id"].tolist() for b in from_core.iter_batches(batch_size=8, shuffle=True)]


def test_spark_dataframes_of_every_kind_reach_df_dl(
    classic_spark: Any, histories: dict[str, Any]
) -> None:
    """versionAsOf, a catalog table, and SQL's VERSION AS OF: each reaches df.dl with the
    same rows as the core's snapshot of that version."""
    spark = classic_spark
    path = histories["vacuumed"]
    version = histories["vacuumed_at"]
    spark.sql(f"CREATE TABLE IF NOT EXISTS vacuumed_events USING delta LOCATION '{path}'")
    frames = {
        "versionAsOf": spark.read.format("delta").option("versionAsOf", version).load(path),
        "spark.table": spark.table("vacuumed_events"),
        "VERSION AS OF": spark.sql(f"SELECT * FROM vacuumed_events VERSION AS OF {version}"),
    }
    expected = sorted(open_delta(path, version=version).to_arrow().column("id").to_pylist())
    for how, df in frames.items():
        seen = sorted(i for b in df.dl.to_torch(batch_size=16) for i in b["id"].tolist())
        assert seen == expected, how


def test_vacuumed_version_is_refused_naming_it(
    classic_spark: Any, histories: dict[str, Any]
) -> None:
    """A version whose files VACUUM deleted: Spark fails, and the core refuses it naming the
    table and version (never a partial read); the version after the vacuum still reads."""
    path = histories["vacuumed"]
    with pytest.raises(DeltaSnapshotError) as refused:
        open_delta(path, version=1)
    assert path in str(refused.value) and "version 1" in str(refused.value)
    with pytest.raises(Exception):  # noqa: B017 - Spark's own error, any class
        _spark_rows(classic_spark, path, 1).num_rows  # noqa: B018
    latest = _version(classic_spark, path)
    oracle = _spark_rows(classic_spark, path, latest)
    assert sorted_rows(open_delta(path, version=latest).to_arrow(), ["id", "x"]) == sorted_rows(
        oracle, ["id", "x"]
    )


def test_carry_follows_spark_row_ids_across_optimize_and_rewrites(
    classic_spark: Any, tmp_path: Path
) -> None:
    """A run carried on (strict=False) from version M across a delta-spark OPTIMIZE, a
    copy-on-write DELETE and UPDATE of a row-tracked table: every still-live row of M's epoch
    not yet served comes once, no deleted row, no warning; updated rows carry new values."""
    import warnings

    from carry_helpers import KW, saved

    from spark_dl_core.errors import RowsDroppedWarning

    spark, path = classic_spark, str(tmp_path / "tracked")
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT, x DOUBLE) USING delta "
        "TBLPROPERTIES ('delta.enableRowTracking' = 'true', "
        "'delta.enableDeletionVectors' = 'false')"
    )
    # four files of 200 rows in one commit: range's four partitions, one file each
    spark.sql(f"INSERT INTO delta.`{path}` SELECT id, 0.5 FROM range(0, 800, 1, 4)")
    m = _version(spark, path)
    _sql(
        spark,
        f"OPTIMIZE delta.`{path}`",
        f"DELETE FROM delta.`{path}` WHERE id IN (3, 4, 401, 799)",
        f"UPDATE delta.`{path}` SET x = 9.0 WHERE id IN (10, 11, 600)",
    )
    n = _version(spark, path)
    state, seen = saved(lambda: open_delta(path, version=m), 3, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = open_delta(path, version=n).to_torch(**KW)
        loader.load_state_dict(state, strict=False)
        batches = list(loader)
    assert not [w for w in caught if w.category is RowsDroppedWarning]
    served = [int(i) for b in batches for i in b["id"]]
    expected = set(range(800)) - set(seen) - {3, 4, 401, 799}
    assert len(served) == len(set(served)) and set(served) == expected  # 0 repeats, 0 lost
    xs = {int(i): float(x) for b in batches for i, x in zip(b["id"], b["x"])}
    assert all(xs[i] == 9.0 for i in (10, 11, 600) if i in xs)
    report = loader.stats()["carry"]
    assert report["row_ids"] and report["dropped"] == 0


def test_type_widening_is_refused_naming_it(classic_spark: Any, histories: dict[str, Any]) -> None:
    """delta-rs cannot read a type-widened table (files of the narrower type): the core
    refuses every version by the feature's name, never reads it wrong; Spark reads it."""
    path = histories["widened"]
    for version in _versions(classic_spark, path):
        with pytest.raises(UnsupportedDeltaFeatureError, match="typeWidening") as refused:
            open_delta(path, version=version)
        assert path in str(refused.value) and f"version {version}" in str(refused.value)
    assert _spark_rows(classic_spark, path, _version(classic_spark, path)).num_rows == 1
