"""The Delta Acceptance Testing (DAT) reader cases, Spark's own Delta reader as the oracle
(issue 43).

One module fixture writes a small table shaped like each named DAT reader case through SQL on
the shared classic session (tens of rows, a few commits each, one Spark session). For every
case and every version of it, from 0 to the latest, what the core reads
(``open_delta(path, version=v).to_arrow()``) must hold exactly the rows
``spark.read.format("delta").option("versionAsOf", v)`` returns; a version the core refuses
must be refused with a typed spark_dl_core error naming the table, the version and why.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deltalake")
pytest.importorskip("delta")

from delta_helpers import cheap_delta_writes, sorted_rows, write_concurrently

from spark_dl_core.tables.delta.log import DeltaSnapshotError
from spark_dl_core.tables.delta.table import open_delta

pytestmark = pytest.mark.spark

_NO_DV = "'delta.enableDeletionVectors' = 'false'"
_PRIMITIVES = (
    "cast(id AS tinyint) AS int8, cast(id * 300 AS smallint) AS int16,"
    " cast(id * 70000 AS int) AS int32, id * 5000000000 AS int64,"
    " cast(cast(id AS float) / 4 AS float) AS float32, cast(id AS double) / 3 AS float64,"
    " cast(id / 8 AS decimal(10,2)) AS decimal, cast(id / 7 AS decimal(38,18)) AS decimal38,"
    " id % 2 = 0 AS bool, concat('s', id) AS utf8, cast(concat('b', id) AS binary) AS binary,"
    " date_add(DATE'2020-02-27', cast(id AS int)) AS date32,"
    " timestamp_micros(1583000000000000 + id * 3600000001) AS timestamp"
)
_NESTED = (
    "id AS pk, named_struct('a', cast(id AS int), 'b', named_struct('c', concat('c', id)))"
    " AS struct, array(id, id + 1, null) AS array,"
    " map(concat('k', id), cast(id AS double), 'z', null) AS map,"
    " array(named_struct('x', cast(id AS int), 'y', concat('y', id)),"
    " named_struct('x', null, 'y', null)) AS structs"
)

# Each case: the statements writing it, ``{p}`` standing for the table's path. Version 0 is a
# CREATE TABLE ... AS SELECT where it can be (one commit less per case: CI time).
CASES: dict[str, list[str]] = {
    "basic_append": [
        "CREATE TABLE delta.`{p}` USING delta AS SELECT * FROM VALUES"
        " ('a', 1L, 1.1D), ('b', 2L, 2.2D), ('c', 3L, 3.3D) AS t(letter, number, a_float)",
        "INSERT INTO delta.`{p}` VALUES ('d', 4, 4.4), ('e', 5, 5.5)",
    ],
    "basic_partitioned": [
        "CREATE TABLE delta.`{p}` USING delta PARTITIONED BY (letter) AS SELECT * FROM VALUES"
        " ('a', 1L, 1.1D), ('b', 2L, 2.2D), ('c', 3L, 3.3D) AS t(letter, number, a_float)",
        "INSERT INTO delta.`{p}` VALUES ('a', 4, 4.4), ('e', 5, 5.5), ('f', 6, 6.6)",
    ],
    "partitioned_with_null": [
        "CREATE TABLE delta.`{p}` USING delta PARTITIONED BY (letter) AS SELECT * FROM VALUES"
        " ('a', 1L, 1.1D), (null, 2L, 2.2D), ('c', 3L, null) AS t(letter, number, a_float)",
        "INSERT INTO delta.`{p}` VALUES (null, 4, 4.4), ('a', 5, 5.5), (null, null, null)",
    ],
    "multi_partitioned": [
        "CREATE TABLE delta.`{p}` USING delta PARTITIONED BY (letter, date) AS SELECT"
        " element_at(array('a b', 'x/y', 'k=v', '50%', 'é#ü'), cast(id % 5 + 1 AS int))"
        " AS letter, date_add(DATE'1970-01-01', cast(id % 3 AS int)) AS date,"
        " cast(concat('d', id) AS binary) AS data, id AS number FROM range(0, 15)",
        "INSERT INTO delta.`{p}` SELECT element_at(array('a b', 'x/y', 'k=v', '50%', null),"
        " cast(id % 5 + 1 AS int)), if(id % 4 = 0, null, DATE'2024-02-29'),"
        " cast(concat('d', id) AS binary), id FROM range(15, 25)",
    ],
    "multi_partitioned_2": [
        "CREATE TABLE delta.`{p}` USING delta PARTITIONED BY (bool, time, amount) AS SELECT"
        " id % 2 = 0 AS bool, timestamp_micros(1600000000000000 + (id % 3) * 1000001) AS time,"
        " cast((id % 4) / 3 AS decimal(10,2)) AS amount, cast(id AS int) AS int"
        " FROM range(0, 20) UNION ALL SELECT null, null, null, 99"
        " UNION ALL SELECT true, null, 1.50, 100",
    ],
    "with_schema_change": [
        "CREATE TABLE delta.`{p}` USING delta AS SELECT concat('l', id) AS letter, id AS number"
        " FROM range(0, 10)",
        "ALTER TABLE delta.`{p}` ADD COLUMNS (a_float DOUBLE, tags ARRAY<STRING>)",
        "INSERT INTO delta.`{p}` SELECT concat('l', id), id, id / 2, array(concat('t', id))"
        " FROM range(10, 20)",
    ],
    "all_primitive_types": [
        "CREATE TABLE delta.`{p}` USING delta AS SELECT " + _PRIMITIVES + " FROM range(0, 10)"
        " UNION ALL SELECT null, null, null, null, null, null, null, null, null, null, null,"
        " null, null",
    ],
    "nested_types": [
        "CREATE TABLE delta.`{p}` USING delta AS SELECT " + _NESTED + " FROM range(0, 10)"
        " UNION ALL SELECT 10, null, null, null, null",
    ],
    "with_checkpoint": [  # a checkpoint at version 2
        "CREATE TABLE delta.`{p}` USING delta TBLPROPERTIES ('delta.checkpointInterval' = '2')"
        " AS SELECT 'a' AS letter, id AS int, DATE'2021-01-01' AS date FROM range(0, 5)",
        "INSERT INTO delta.`{p}` SELECT 'b', id, DATE'2021-01-02' FROM range(5, 10)",
        "DELETE FROM delta.`{p}` WHERE int = 3",
        "INSERT INTO delta.`{p}` SELECT 'c', id, null FROM range(10, 15)",
    ],
    "no_replay": [  # a checkpoint at version 2; the JSON commits before it deleted below
        "CREATE TABLE delta.`{p}` USING delta TBLPROPERTIES ('delta.checkpointInterval' = '2',"
        " " + _NO_DV + ") AS SELECT id, concat('n', id) AS name FROM range(0, 10)",
        "UPDATE delta.`{p}` SET name = 'updated' WHERE id < 3",
        "INSERT INTO delta.`{p}` SELECT id, concat('n', id) FROM range(10, 15)",
        "DELETE FROM delta.`{p}` WHERE id = 12",
    ],
    "stats_as_struct": [  # a checkpoint at version 2
        "CREATE TABLE delta.`{p}` USING delta PARTITIONED BY (part)"
        " TBLPROPERTIES ('delta.checkpointInterval' = '2',"
        " 'delta.checkpoint.writeStatsAsStruct' = 'true',"
        " 'delta.checkpoint.writeStatsAsJson' = 'false')"
        " AS SELECT id, concat('n', id) AS name, cast(id % 2 AS int) AS part FROM range(0, 10)",
        "INSERT INTO delta.`{p}` SELECT id, null, cast(id % 3 AS int) FROM range(10, 20)",
        "INSERT INTO delta.`{p}` VALUES (20, 'last', null)",
    ],
    "no_stats": [
        "CREATE TABLE delta.`{p}` USING delta"
        " TBLPROPERTIES ('delta.dataSkippingNumIndexedCols' = '0')"
        " AS SELECT id, concat('n', id) AS name FROM range(0, 10)",
        "INSERT INTO delta.`{p}` SELECT id, null FROM range(10, 15)",
    ],
    "deletion_vectors": [
        "CREATE TABLE delta.`{p}` USING delta"
        " TBLPROPERTIES ('delta.enableDeletionVectors' = 'true') AS SELECT"
        " element_at(array('a', 'b', 'c'), cast(id % 3 + 1 AS int)) AS letter, id AS int,"
        " date_add(DATE'2020-01-01', cast(id AS int)) AS date FROM range(0, 30)",
        "DELETE FROM delta.`{p}` WHERE int % 4 = 1",
        "DELETE FROM delta.`{p}` WHERE letter = 'c' AND int > 20",
    ],
    "check_constraints": [
        "CREATE TABLE delta.`{p}` USING delta AS SELECT id, cast(id * 10 AS int) AS value"
        " FROM range(0, 10)",
        "ALTER TABLE delta.`{p}` ADD CONSTRAINT value_positive CHECK (value >= 0)",
        "INSERT INTO delta.`{p}` SELECT id, cast(id AS int) FROM range(10, 15)",
    ],
    "cdf": [
        "CREATE TABLE delta.`{p}` USING delta PARTITIONED BY (part)"
        " TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true', " + _NO_DV + ") AS SELECT"
        " id, concat('n', id) AS name, if(id % 2 = 0, 'even', 'odd') AS part FROM range(0, 20)",
        "UPDATE delta.`{p}` SET name = 'changed' WHERE id IN (1, 2, 15)",
        "DELETE FROM delta.`{p}` WHERE id IN (3, 4) OR (part = 'odd' AND id > 16)",
    ],
    "generated_columns": [  # a column list: not a CREATE ... AS SELECT
        "CREATE TABLE delta.`{p}` (id BIGINT, ts TIMESTAMP,"
        " day DATE GENERATED ALWAYS AS (CAST(ts AS DATE)),"
        " doubled BIGINT GENERATED ALWAYS AS (id * 2)) USING delta PARTITIONED BY (day)",
        "INSERT INTO delta.`{p}` (id, ts) SELECT id, timestamp_micros(1700000000000000"
        " + id * 36000000000) FROM range(0, 12) UNION ALL SELECT 100, null",
    ],
    "column_mapping": [
        "CREATE TABLE delta.`{p}` USING delta PARTITIONED BY (part) TBLPROPERTIES ("
        " 'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5',"
        " 'delta.columnMapping.mode' = 'name') AS SELECT id, concat('n', id) AS name,"
        " cast(id AS int) AS drop_me, if(id % 2 = 0, 'x y', 'z') AS part FROM range(0, 10)",
        "ALTER TABLE delta.`{p}` RENAME COLUMN name TO `new name`",
        "ALTER TABLE delta.`{p}` DROP COLUMN drop_me",
        "INSERT INTO delta.`{p}` SELECT id, concat('m', id), 'z' FROM range(10, 15)",
    ],
    "timestamp_ntz": [
        "CREATE TABLE delta.`{p}` USING delta PARTITIONED BY (tsNtzPartition) AS SELECT id,"
        " cast(timestamp_micros(1600000000000000 + id * 1000001) AS timestamp_ntz) AS tsNtz,"
        " if(id % 3 = 0, null, TIMESTAMP_NTZ'2021-11-18 02:30:00.123456') AS tsNtzPartition"
        " FROM range(0, 12)",
        "INSERT INTO delta.`{p}` VALUES (99, TIMESTAMP_NTZ'1969-12-31 23:59:59.999999',"
        " TIMESTAMP_NTZ'9999-12-31 23:59:59')",
    ],
    "iceberg_compat_v1": [
        "CREATE TABLE delta.`{p}` USING delta PARTITIONED BY (part) TBLPROPERTIES ("
        " 'delta.columnMapping.mode' = 'name', 'delta.enableIcebergCompatV1' = 'true', "
        + _NO_DV
        + ") AS SELECT id, concat('n', id) AS name, if(id < 5, 'a', 'b') AS part"
        " FROM range(0, 10) UNION ALL SELECT 10, null, null",
    ],
}

# Versions the core refuses: case -> a word of the reason its error must carry.
REFUSED: dict[str, str] = {}


def _latest(path: str) -> int:
    """The table's latest version, from its log's file names (no Spark job: CI time)."""
    heads = (f.name.split(".")[0] for f in (Path(path) / "_delta_log").iterdir())
    return max(int(h) for h in heads if h.isdigit())


def _drop_replay(path: str) -> int:
    """Delete every JSON commit (and its .crc) before the latest checkpoint: the versions
    before it cannot be replayed any more. Returns the checkpoint's version."""
    log = Path(path) / "_delta_log"
    checkpoint = max(int(f.name.split(".")[0]) for f in log.glob("*.checkpoint*.parquet"))
    for f in log.iterdir():
        head = f.name.split(".")[0]
        if head.isdigit() and int(head) < checkpoint and not f.name.endswith(".parquet"):
            f.unlink()
    return checkpoint


def _write(spark: Any, name: str, path: str) -> str:
    """Write one case; a case this Delta refuses to write gives its error's first line."""
    try:
        for statement in CASES[name]:
            spark.sql(statement.format(p=path))
    except Exception as refused:
        if name != "iceberg_compat_v1":
            raise
        return str(refused).splitlines()[0]
    return path


@pytest.fixture(scope="module")
def dat(_spark_sessions: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every case written once, in the shared classic session (side by side: CI time)."""
    spark = _spark_sessions.get("classic")
    root = tmp_path_factory.mktemp("dat")
    jobs = {n: (lambda n=n: _write(spark, n, str(root / n))) for n in CASES}
    with cheap_delta_writes(spark):
        out: dict[str, Any] = write_concurrently(jobs)
    out["no_replay@checkpoint"] = _drop_replay(out["no_replay"])
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_dat_case_reads_as_spark_reads_it(
    classic_spark: Any, dat: dict[str, Any], case: str
) -> None:
    """Every version 0..latest: the core's rows are Spark's rows (as sorted row tuples, the
    same column names), or the core refuses with a typed error naming table, version, why."""
    path = dat[case]
    if not os.path.isdir(path):
        pytest.skip(f"delta-spark refuses to write {case}: {path}")
    latest = _latest(path)
    assert latest == len(CASES[case]) - 1  # one commit per statement
    first = dat["no_replay@checkpoint"] if case == "no_replay" else 0
    compared, refused = 0, []
    for version in range(latest + 1):
        if version < first:  # its commit deleted: Spark and the core both refuse it
            with pytest.raises(Exception, match=r"(?i)version|log|checkpoint"):
                classic_spark.read.format("delta").option("versionAsOf", version).load(
                    path
                ).collect()
            with pytest.raises(DeltaSnapshotError) as gone:
                open_delta(path, version=version).to_arrow()
            assert path in str(gone.value) and f"version {version}" in str(gone.value)
            continue
        oracle = (
            classic_spark.read.format("delta").option("versionAsOf", version).load(path).toArrow()
        )
        try:
            core = open_delta(path, version=version).to_arrow()
        except DeltaSnapshotError as error:
            text = str(error)
            assert case in REFUSED, (case, version, text)
            assert path in text and f"version {version}" in text, text
            assert REFUSED[case] in text, text
            refused.append(version)
            continue
        assert core.column_names == oracle.column_names, (case, version)
        assert sorted_rows(core, oracle.column_names) == sorted_rows(oracle, oracle.column_names), (
            case,
            version,
        )
        compared += 1
    assert compared + len(refused) == latest + 1 - first
    assert compared >= 1 or case in REFUSED
