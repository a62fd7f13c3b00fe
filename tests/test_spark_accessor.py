"""``df.dl`` on classic and Connect DataFrames: spec-object writes and the converter cache."""

from __future__ import annotations

import os
from typing import Any

import pytest

from spark_dl_core import DatasetSpec, open_dataset

pytestmark = pytest.mark.spark


def _frame(spark: Any) -> Any:
    return spark.sql(
        "SELECT id AS label, array_repeat(CAST(id AS float), 4) AS features FROM range(300)"
    )


def test_accessor_on_both_dataframe_classes(spark: Any) -> None:
    import spark_dl

    assert isinstance(spark.range(1).dl, spark_dl.DLAccessor)
    spark_dl._register_active()  # what `import spark_dl` does with a session already active
    assert spark.read.format("mds") is not None


def test_write_mds_with_a_spec_object(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "spec")
    spec = DatasetSpec(compression="zstd", shard_size="2KiB", hashes=["xxh64"])
    _frame(spark).dl.write_mds(path, spec)
    ds = open_dataset(path)
    assert ds.columns == {"label": "int64", "features": "ndarray:float32:4"}
    assert len(ds) == 300 and ds.num_shards > 1
    assert ds.spec is not None and ds.spec["hashes"] == ["xxh64"]
    with pytest.raises(Exception, match="already exists"):
        _frame(spark).dl.write_mds(path, spec)
    _frame(spark).limit(10).dl.write_mds(path, spec, mode="overwrite")
    assert len(open_dataset(path)) == 10


def test_converter_cache(spark: Any, tmp_path: Any) -> None:
    from spark_dl import converter as conv

    spark.conf.set("spark_dl.cache.dir", str(tmp_path / "cache"))
    try:
        df = _frame(spark)
        first = df.dl.converter()
        assert first.created and first.path.startswith(str(tmp_path / "cache"))
        assert len(first.dataset) == 300
        again = _frame(spark).dl.converter()  # same plan, new DataFrame object
        assert again.path == first.path and not again.created
        changed = df.filter("label < 100").dl.converter()
        assert changed.path != first.path and len(changed) == 100
        with df.limit(5).dl.converter() as scoped:
            assert os.path.exists(scoped.path)
        assert not os.path.exists(scoped.path)
        first.delete()
        assert not os.path.exists(first.path)
        assert df.dl.converter().created  # written anew after delete
        conv._cleanup()  # what runs at exit: caches this process made are gone
        assert not os.path.exists(changed.path)
    finally:
        spark.conf.unset("spark_dl.cache.dir")


def test_to_torch(spark: Any, tmp_path: Any) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("spark_dl_core.torch_loader")
    spark.conf.set("spark_dl.cache.dir", str(tmp_path / "cache"))
    try:
        loader = _frame(spark).dl.to_torch(batch_size=64, shuffle=True, seed=7)
        labels = []
        for batch in loader:
            assert tuple(batch["features"].shape[1:]) == (4,)
            labels += batch["label"].tolist()
        assert sorted(labels) == list(range(300))
    finally:
        spark.conf.unset("spark_dl.cache.dir")


def test_to_tf(spark: Any, tmp_path: Any) -> None:
    pytest.importorskip("tensorflow")
    pytest.importorskip("spark_dl_core.tf_loader")
    spark.conf.set("spark_dl.cache.dir", str(tmp_path / "cache"))
    try:
        tfds = _frame(spark).dl.to_tf(batch_size=100)
        labels = []
        for batch in tfds:
            labels += batch["label"].numpy().tolist()
        assert sorted(labels) == list(range(300))
    finally:
        spark.conf.unset("spark_dl.cache.dir")


def test_write_transforms_run_in_the_tasks(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "transformed")
    spec = DatasetSpec(
        transforms=[
            {"op": "rename", "mapping": {"label": "y"}},
            {"op": "drop", "columns": ["features"]},
        ]
    )
    _frame(spark).dl.write_mds(path, spec)
    ds = open_dataset(path)
    assert ds.columns == {"y": "int64"}
    assert sorted(r.y for r in spark.read.format("mds").load(path).collect()) == list(range(300))
