"""``df.dl.to_torch(in_place=True)`` on a pinned ``read_delta``: the table's files read where
they are (no Spark job, no copy) on classic and Connect sessions; anything more refused."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("deltalake")
pytest.importorskip("torch")
from deltalake import write_deltalake

from spark_dl_core.tables.delta.table import open_delta

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("inplace") / "events")
    for k in range(3):
        ids = list(range(k * 40, (k + 1) * 40))
        data = pa.table({"id": ids, "x": [[float(i)] * 4 for i in ids], "y": [i % 3 for i in ids]})
        write_deltalake(path, data, mode="append")
    return path


def _ids(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in batch["id"]]


def test_pinned_read_in_place(spark: Any, table: str, tmp_path: Path) -> None:
    import spark_dl

    df = spark_dl.read_delta(spark, table, version=1)
    copy_dir = str(tmp_path / "copies")
    loader = df.dl.to_torch(16, shuffle=True, seed=3, in_place=True, cache_dir=copy_dir)
    core = open_delta(table, version=1).to_torch(16, shuffle=True, seed=3)
    assert _ids(loader) == _ids(core) and sorted(_ids(loader)) == list(range(80))
    assert not os.path.exists(copy_dir)  # nothing materialized
    picked = df.select("id", "y").dl.to_torch(32, in_place=True, cache_dir=copy_dir)
    batch = next(iter(picked))
    assert sorted(batch) == ["id", "y"] and not os.path.exists(copy_dir)
    tf_like = df.select("y", "id").dl.to_torch(200, in_place=True)
    assert list(next(iter(tf_like))) == ["y", "id"]


@pytest.mark.parametrize(
    ("derive", "words"),
    [
        (lambda df: df.filter("id > 3"), ["Filter"]),
        (lambda df: df.withColumn("id", df["id"] + 1), ["read of", "at version 1"]),
        (lambda df: df.select(df["id"].alias("key")), ["computed or renamed column"]),
        (lambda df: df.join(df.select("id"), "id"), ["Join"]),
    ],
)
def test_anything_more_than_the_read_is_refused(
    spark: Any, table: str, derive: Any, words: list[str]
) -> None:
    import spark_dl
    from spark_dl.delta_inplace import NotInPlaceError

    df = derive(spark_dl.read_delta(spark, table, version=1))
    with pytest.raises(NotInPlaceError) as err:
        df.dl.to_torch(16, in_place=True)
    for w in words:
        assert w in str(err.value)
    assert "leave in_place out" in str(err.value)


def test_not_a_pinned_read_and_auto(spark: Any, table: str, tmp_path: Path) -> None:
    import spark_dl
    from spark_dl.delta_inplace import NotInPlaceError

    with pytest.raises(NotInPlaceError, match=r"no spark_dl\.read_delta read"):
        spark.range(5).dl.to_torch(4, in_place=True)
    df = spark_dl.read_delta(spark, table, version=0).filter("id < 10")
    with pytest.warns(UserWarning, match="in_place='auto': copying"):
        loader = df.dl.to_torch(4, in_place="auto", cache_dir=str(tmp_path / "c"))
    assert sorted(_ids(loader)) == list(range(10))
