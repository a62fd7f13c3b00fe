"""The Spark spelling of an update of a dataset that follows a Delta table:
``spark_dl.read_delta(spark, uri, version=N).write.format("mds").mode("update").save(path)``
on a classic session: each version it reaches is a fresh export, with no Spark job;
anything but the pinned read is refused."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deltalake")
from delta_helpers import delete_by_dv
from deltalake import write_deltalake

from spark_dl_core import SpecError, open_dataset
from spark_dl_core.errors import FollowError
from spark_dl_core.tables.delta.table import open_delta
from spark_dl_core.versions import held_versions
from tests.sources.test_delta_follow import (
    DV_TABLE,
    SPEC,
    _fresh,
    _rows,
    _same,
)

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> str:
    """v0 0..300, v1 +300..500, v2 deletion vectors on both files, v3 +500..600."""
    path = str(tmp_path_factory.mktemp("spark-follow") / "t")
    write_deltalake(path, _rows(0, 300), configuration=DV_TABLE)
    write_deltalake(path, _rows(300, 200), mode="append")
    delete_by_dv(path, [*range(5, 20), 100, 303, 450])
    write_deltalake(path, _rows(500, 100), mode="append")
    return path


def _update(spark: Any, table: str, version: int, out: str, **options: Any) -> None:
    import spark_dl

    writer = spark_dl.read_delta(spark, table, version=version).write.format("mds")
    writer.mode("update").options(**options).save(out)


def _shard_files(out: str) -> set[str]:
    return {n for n in os.listdir(out) if n.endswith(".mds") or ".mds." in n}


def test_spark_updates_equal_fresh_exports(classic_spark: Any, table: str, tmp_path: Path) -> None:
    """Each version reached by Spark updates is a fresh export of it; an update converts
    only the files added since (a deletion vector writes no shard) and runs no Spark job."""
    import spark_dl

    out = str(tmp_path / "followed")
    sc = classic_spark.sparkContext
    for version in range(4):
        before = _shard_files(out) if version else set()
        # delta-spark replays the log with Spark jobs when the DataFrame is made: not ours
        writer = spark_dl.read_delta(classic_spark, table, version=version).write
        sc.setJobGroup("spark-dl-follow", "update", False)
        try:
            writer.format("mds").mode("update").options(**SPEC).save(out)
            jobs = sc.statusTracker().getJobIdsForGroup("spark-dl-follow")
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
        assert list(jobs) == []  # the update ran in the client: no Spark job
        followed = open_dataset(out)
        assert followed.version == version and followed.source["version"] == version
        _same(followed, _fresh(table, version, tmp_path))
        added = _shard_files(out) - before
        assert before <= _shard_files(out)  # kept shards stay
        if version == 2:
            assert not added  # deletion vectors: masks, no shard written
        if version in (1, 3):  # one new data file: one new prefix
            assert len({n.rsplit(".", 1)[0].rsplit("-", 1)[0] for n in added}) == 1
    assert held_versions(open_dataset(out).store) == [0, 1, 2, 3]
    _same(open_dataset(out, version=1), open_dataset(str(tmp_path / "fresh-1")))


def test_spark_and_core_updates_follow_one_dataset(
    classic_spark: Any, table: str, tmp_path: Path
) -> None:
    """Core and Spark updates take turns on one dataset; a select of columns is the core's
    ``columns=``; the spec need not be repeated, and one that differs is refused."""
    import spark_dl

    out = str(tmp_path / "mixed")
    open_delta(table, version=1).write_mds(out, SPEC, mode="update")
    _update(classic_spark, table, 2, out)  # spec taken from the dataset
    open_delta(table, version=3).write_mds(out, mode="update")
    assert held_versions(open_dataset(out).store) == [1, 2, 3]
    _same(open_dataset(out, version=2), _fresh(table, 2, tmp_path))
    with pytest.raises(FollowError, match="shard_size"):
        _update(classic_spark, table, 3, out, shard_size=8192)

    picked = str(tmp_path / "picked")
    df = spark_dl.read_delta(classic_spark, table, version=2).select("id")
    df.write.format("mds").mode("update").save(picked)
    core = str(tmp_path / "picked-core")
    open_delta(table, version=2, columns=["id"]).write_mds(core, mode="update")
    assert open_dataset(picked).fingerprint == open_dataset(core).fingerprint
    assert open_dataset(picked).source["columns"] == ["id"]


@pytest.mark.parametrize(
    ("derive", "words"),
    [
        (lambda df: df.filter("id > 3"), ["Filter", "version 3"]),
        (lambda df: df.withColumn("id", df["id"] + 1), ["more than the read of", "version 3"]),
        (lambda df: df.limit(10), ["Limit"]),
    ],
)
def test_anything_but_the_pinned_read_is_refused(
    classic_spark: Any, table: str, tmp_path: Path, derive: Any, words: list[str]
) -> None:
    import spark_dl

    out = str(tmp_path / "followed")
    open_delta(table, version=1).write_mds(out, SPEC, mode="update")
    before = sorted(os.listdir(out))
    df = derive(spark_dl.read_delta(classic_spark, table, version=3))
    with pytest.raises(FollowError) as err:
        df.write.format("mds").mode("update").save(out)
    text = str(err.value)
    assert out in text and all(w in text for w in words), text
    assert sorted(os.listdir(out)) == before and held_versions(open_dataset(out).store) == [1]


def test_update_spelling_errors(classic_spark: Any, table: str, tmp_path: Path) -> None:
    import spark_dl

    out = str(tmp_path / "followed")
    plain = classic_spark.createDataFrame([(1,), (2,)], "id long")
    with pytest.raises(FollowError, match=r"no spark_dl\.read_delta read"):
        plain.write.format("mds").mode("update").save(out)
    df = spark_dl.read_delta(classic_spark, table, version=1)
    with pytest.raises(SpecError, match="format\\('mds'\\)"):
        df.write.format("parquet").mode("update").save(str(tmp_path / "pq"))
    with pytest.raises(SpecError, match="'source' has no meaning"):
        df.write.format("mds").mode("update").option("source", "{}").save(out)
    assert not os.path.exists(out) and not os.path.exists(str(tmp_path / "pq"))
    df.write.mode("update").format("mds").save(out)  # either order of mode and format
    df.dl.write_mds(out, mode="update")  # the accessor: the same update, already held
    assert held_versions(open_dataset(out).store) == [1]


def test_spark_and_sql_read_a_version_the_dataset_holds(
    spark: Any, table: str, tmp_path: Path
) -> None:
    """``open_dataset(path, version=N)`` reads an older version a followed dataset holds;
    Spark could only read the latest, and ``register_dataset`` said an MDS path "has no
    versions". ``format("mds").option("version", N)``, ``register_dataset(path=,
    version=)`` and SQL's ``OPTIONS (version 'N')`` read what the core reads."""
    import spark_dl

    out = str(tmp_path / "followed")
    for version in (0, 1):
        open_delta(table, version=version).write_mds(out, SPEC, mode="update")

    def ids(df: Any) -> list[int]:
        return sorted(r.id for r in df.select("id").collect())

    held = {
        v: sorted(open_dataset(out, version=v).to_arrow().column("id").to_pylist()) for v in (0, 1)
    }
    assert len(held[0]) == 300 and len(held[1]) == 500
    assert ids(spark.read.format("mds").load(out)) == held[1]
    assert ids(spark.read.format("mds").option("version", 0).load(out)) == held[0]
    assert ids(spark_dl.register_dataset(spark, "followed_v0", path=out, version=0)) == held[0]
    assert ids(spark.table("followed_v0")) == held[0]
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW followed_sql USING mds "
        f"OPTIONS (path '{out}', version '0')"
    )
    assert ids(spark.table("followed_sql")) == held[0]
    with pytest.raises(Exception, match=r"option 'version' must be an integer, got 'v0'"):
        spark.read.format("mds").option("version", "v0").load(out).count()
    with pytest.raises(Exception, match=r"holds table versions \[0, 1\], not 7"):
        spark.read.format("mds").option("version", 7).load(out).count()
