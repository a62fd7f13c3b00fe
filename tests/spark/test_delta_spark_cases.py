"""``since=`` on tables written by delta-spark with the change data feed, Spark's own
``readChangeFeed`` as the oracle, and the bad inputs of issue 43 around the feed.

One module fixture writes every table in the shared classic session (CI time: tables of a
few rows, one Spark session).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

pytest.importorskip("deltalake")
pytest.importorskip("delta")

from spark_dl_core.tables.delta.since import SinceError
from spark_dl_core.tables.delta.table import open_delta

pytestmark = pytest.mark.spark


def _sql(spark: Any, *statements: str) -> None:
    for statement in statements:
        spark.sql(statement)


def _version(spark: Any, path: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]["version"])


@pytest.fixture(scope="module")
def tables(_spark_sessions: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    spark = _spark_sessions.get("classic")
    root = tmp_path_factory.mktemp("delta_cases")
    feed, late = str(root / "feed"), str(root / "late_feed")
    _sql(
        spark,
        f"""CREATE TABLE delta.`{feed}` (id BIGINT, x DOUBLE, part STRING) USING delta
            PARTITIONED BY (part)
            TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true',
                           'delta.enableDeletionVectors' = 'false')""",
        f"INSERT INTO delta.`{feed}` SELECT id, 0.5, if(id % 2 = 0, 'a', 'b') FROM range(0, 20)",
        f"INSERT INTO delta.`{feed}` SELECT id, 0.5, if(id % 2 = 0, 'a', 'b') FROM range(20, 40)",
        # copy-on-write: each rewritten file holds copied rows and the changed ones
        f"UPDATE delta.`{feed}` SET x = 9.0 WHERE id IN (3, 4, 25)",
        f"""MERGE INTO delta.`{feed}` t USING (SELECT id, 7.0 AS x FROM range(38, 45)) s
            ON t.id = s.id WHEN MATCHED THEN UPDATE SET t.x = s.x
            WHEN NOT MATCHED THEN INSERT (id, x, part) VALUES (s.id, s.x, 'c')""",
        f"OPTIMIZE delta.`{feed}`",  # compacts files partly new since earlier versions
        f"UPDATE delta.`{feed}` SET x = 8.0 WHERE id IN (5, 26)",
        f"DELETE FROM delta.`{feed}` WHERE id IN (22, 41)",
    )
    _sql(
        spark,
        f"""CREATE TABLE delta.`{late}` (id BIGINT, x DOUBLE) USING delta
            TBLPROPERTIES ('delta.enableDeletionVectors' = 'false')""",
        f"INSERT INTO delta.`{late}` SELECT id, 0.5 FROM range(0, 10)",
        f"UPDATE delta.`{late}` SET x = 2.0 WHERE id = 3",  # the feed off: coarse
        f"ALTER TABLE delta.`{late}` SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')",
        f"INSERT INTO delta.`{late}` SELECT id, 0.5 FROM range(10, 15)",
        f"UPDATE delta.`{late}` SET x = 3.0 WHERE id = 11",
    )
    return {"feed": feed, "late": late}


def _oracle(spark: Any, path: str, since: int, version: int) -> Counter[tuple[Any, ...]]:
    """Spark's change data feed after ``since``: the inserted rows and update post-images
    that are still live at ``version`` (rows here are unique by value)."""
    live = Counter(
        tuple(r)
        for r in spark.read.format("delta").option("versionAsOf", version).load(path).collect()
    )
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", since + 1)
        .option("endingVersion", version)
        .load(path)
        .where("_change_type IN ('insert', 'update_postimage')")
        .select(*spark.read.format("delta").load(path).columns)
        .collect()
    )
    return Counter(tuple(r) for r in changes) & live


def _core(table: Any) -> Counter[tuple[Any, ...]]:
    return Counter(zip(*(table.column(n).to_pylist() for n in table.column_names)))


def test_since_reads_the_change_data_feed_as_spark_does(
    classic_spark: Any, tables: dict[str, str]
) -> None:
    """Every since=M to the latest version: the rows Spark's change data feed calls new and
    still live, exactly (copied rows of a copy-on-write UPDATE/MERGE are not new), in place
    and exported alike, across an OPTIMIZE and a DELETE of partly new files."""
    path = tables["feed"]
    latest = _version(classic_spark, path)
    for since in range(latest + 1):
        expected = _oracle(classic_spark, path, since, latest) if since < latest else Counter()
        snap = open_delta(path, version=latest, since=since)
        assert _core(snap.to_arrow()) == expected, since
        assert _core(snap.dataset().to_arrow()) == expected, (since, "in place")
    # the copy-on-write UPDATE at version 3 added 3 new rows, not the files it rewrote
    assert len(open_delta(path, version=3, since=2).to_arrow()) == 3


def test_a_range_crossing_the_feed_off_is_refused(
    classic_spark: Any, tables: dict[str, str]
) -> None:
    """A copy-on-write UPDATE committed while the feed was off, on a table whose feed is on
    now: refused naming the table, versions, commit and the feature; a range after it reads
    as Spark's feed says."""
    path = tables["late"]
    latest = _version(classic_spark, path)
    with pytest.raises(SinceError) as refused:
        open_delta(path, version=latest, since=0)
    text = str(refused.value)
    assert path in text and f"version {latest} since 0" in text
    assert "commit 2" in text and "delta.enableChangeDataFeed" in text
    expected = _oracle(classic_spark, path, 2, latest)
    assert _core(open_delta(path, version=latest, since=2).to_arrow()) == expected
    assert len(expected) == 5
