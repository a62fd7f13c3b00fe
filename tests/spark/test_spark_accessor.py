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


def test_accessor_on_both_dataframe_classes(spark: Any, tmp_path: Any) -> None:
    import spark_dl

    assert isinstance(spark.range(1).dl, spark_dl.DLAccessor)
    spark_dl._register_active()  # what `import spark_dl` does with a session already active
    path = str(tmp_path / "registered")
    spark.range(7).write.format("mds").save(path)
    assert sorted(r.id for r in spark.read.format("mds").load(path).collect()) == list(range(7))


def test_new_session_knows_mds_without_register(classic_spark: Any, tmp_path: Any) -> None:
    """Spark discovers the installed source (pyspark_spark_dl) for every session; the
    explained error where it cannot is tested in test_spark_plugin."""
    fresh = classic_spark.newSession()  # its own session state: nothing registered on it
    path = str(tmp_path / "w")
    fresh.range(3).write.format("mds").save(path)
    assert sorted(r.id for r in fresh.read.format("mds").load(path).collect()) == [0, 1, 2]


def test_dl_loaders_have_real_signatures() -> None:
    import inspect

    from spark_dl import DLAccessor

    for name in ("to_torch", "to_tf"):
        params = inspect.signature(getattr(DLAccessor, name)).parameters
        assert not any(p.kind is p.VAR_KEYWORD for p in params.values()), name
        for wanted in ("batch_size", "shuffle", "seed", "spec", "transforms", "device"):
            assert wanted in params, (name, wanted)


def test_write_mds_with_a_spec_object(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "spec")
    spec = DatasetSpec(compression="zstd", shard_size="2KiB", hashes=["xxh64"])
    _frame(spark).dl.write_mds(path, spec)
    ds = open_dataset(path)
    assert ds.columns == {"label": "int64", "features": "ndarray:float32"}
    assert len(ds) == 300 and ds.num_shards > 1
    assert ds.spec is not None and ds.spec["hashes"] == ["xxh64"]
    with pytest.raises(Exception, match="already exists"):
        _frame(spark).dl.write_mds(path, spec)
    _frame(spark).limit(10).dl.write_mds(path, spec, mode="overwrite")
    assert len(open_dataset(path)) == 10


def test_converter_cache(spark: Any, tmp_path: Any) -> None:
    from spark_dl import converter as conv

    spark.conf.set("spark.spark_dl.cache.dir", str(tmp_path / "cache"))
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
        spark.conf.unset("spark.spark_dl.cache.dir")


def test_a_rewritten_parquet_source_read_again_is_converted_anew(spark: Any, tmp_path: Any) -> None:
    """The plan of ``spark.read.parquet(path)`` is the same after the files under ``path``
    are rewritten: the cache used to serve the old rows. Input files with their sizes and
    modification times are part of the key now (new names, or the same name rewritten)."""
    pytest.importorskip("torch")
    import warnings

    import pyarrow as pa
    import pyarrow.parquet as pq

    source, cache = tmp_path / "events", str(tmp_path / "cache")
    source.mkdir()

    def rows(loader: Any) -> list[int]:
        return sorted(x for b in loader for x in b["label"].tolist())

    def write(labels: list[int], name: str) -> None:
        for old in source.iterdir():
            old.unlink()
        pq.write_table(pa.table({"label": pa.array(labels, pa.int64())}), source / name)

    write(list(range(10)), "part-0.parquet")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # local files are listed: no warning
        first = spark.read.parquet(str(source)).dl.to_torch(batch_size=4, cache_dir=cache)
    assert rows(first) == list(range(10))
    write(list(range(100, 120)), "part-1.parquet")  # other files
    assert rows(spark.read.parquet(str(source)).dl.to_torch(4, cache_dir=cache)) == list(
        range(100, 120)
    )
    write(list(range(200, 220)), "part-1.parquet")  # same name, same size, new content
    assert rows(spark.read.parquet(str(source)).dl.to_torch(4, cache_dir=cache)) == list(
        range(200, 220)
    )
    again = spark.read.parquet(str(source)).dl.converter(cache_dir=cache)
    assert not again.created  # unchanged files: the cache is reused


def test_an_overwritten_source_under_escaped_partition_directories_is_converted_anew(
    spark: Any, tmp_path: Any
) -> None:
    """Spark names files under escaped partition directories (``part=a b`` is the directory
    ``part=a%20b``) by URI, escaped again (``part=a%2520b``): taken as paths they were not
    found, the key fell back to the plan alone (with a warning) and an overwrite of the
    source served the old rows. Each value here needs escaping: space, %, =, /, non-ASCII."""
    import warnings

    source, cache = str(tmp_path / "events"), str(tmp_path / "cache")
    values = ["a b", "100%", "k=v", "x/y", "\u00e9t\u00e9"]

    def write(first: int) -> None:
        rows = [(first + i, v) for i, v in enumerate(values)]
        frame = spark.createDataFrame(rows, "label long, part string")
        frame.write.partitionBy("part").mode("overwrite").parquet(source)

    def converted() -> tuple[list[int], list[str]]:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # every file is stat'ed: no plan-only warning
            table = spark.read.parquet(source).dl.converter(cache_dir=cache).dataset.to_arrow()
        return sorted(table.column("label").to_pylist()), sorted(table.column("part").to_pylist())

    write(0)
    assert converted() == ([0, 1, 2, 3, 4], sorted(values))
    write(100)
    assert converted() == ([100, 101, 102, 103, 104], sorted(values))


def test_old_cache_conf_key_still_read(spark: Any, tmp_path: Any) -> None:
    from spark_dl.converter import default_cache_dir

    spark.conf.set("spark_dl.cache.dir", str(tmp_path / "old"))
    try:
        with pytest.warns(DeprecationWarning, match=r"spark\.spark_dl\.cache\.dir"):
            assert default_cache_dir(spark) == str(tmp_path / "old")
    finally:
        spark.conf.unset("spark_dl.cache.dir")


def test_leaving_a_converter_spares_a_loader_still_reading(spark: Any, tmp_path: Any) -> None:
    pytest.importorskip("torch")
    import gc

    cache = str(tmp_path / "cache")
    loader = _frame(spark).dl.to_torch(batch_size=50, cache_dir=cache)
    with _frame(spark).dl.converter(cache_dir=cache) as scoped:
        path = scoped.path
        assert scoped.in_use  # the loader holds the same cached dataset
    assert os.path.exists(path)  # deletion waits for the loader
    assert sum(len(b["label"]) for b in loader) == 300
    del loader
    gc.collect()
    assert not os.path.exists(path)  # the last holder went: now it is removed


@pytest.mark.parametrize("peek", [False, True], ids=["untouched", "peeked"])
def test_a_loader_made_inside_the_block_keeps_working_after_it(
    spark: Any, tmp_path: Any, peek: bool
) -> None:
    """Leaving ``with`` used to delete the cache under a loader made from the converter
    itself (it shares the converter's dataset): the next pass failed on a missing shard."""
    pytest.importorskip("torch")
    import gc

    with _frame(spark).dl.converter(cache_dir=str(tmp_path / "cache")) as scoped:
        loader = scoped.to_torch(batch_size=50)
        path = scoped.path
        assert scoped.in_use
        if peek:
            next(iter(loader))
    assert os.path.exists(path)
    for _ in range(2):  # two whole epochs after the block
        assert sorted(x for b in loader for x in b["label"].tolist()) == list(range(300))
    del loader
    gc.collect()
    assert not os.path.exists(path)  # the last holder went: now it is removed


def test_to_torch(spark: Any, tmp_path: Any) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("spark_dl_core.loaders.torch_loader")
    cache = str(tmp_path / "cache")
    df = _frame(spark)
    loader = df.dl.to_torch(batch_size=64, shuffle=True, seed=7, cache_dir=cache)
    order = []
    for batch in loader:
        assert tuple(batch["features"].shape[1:]) == (4,)
        order.append(batch["label"].tolist())
    assert sorted(x for b in order for x in b) == list(range(300))
    # exactly the core loader's batches for that seed, on the cached dataset itself
    core = df.dl.converter(cache_dir=cache).dataset
    want = [b["label"].tolist() for b in core.to_torch(batch_size=64, shuffle=True, seed=7)]
    assert order == want
    other = [b["label"].tolist() for b in df.dl.to_torch(64, shuffle=True, seed=8, cache_dir=cache)]
    assert other != order and sorted(x for b in other for x in b) == list(range(300))
    assert order != sorted(order)  # shuffled, not the stored order
    # 7 ranks over 300 rows: equal steps (43 rows each, 1 repeat marked) unless asked not to
    kw: dict[str, Any] = dict(world_size=7, pad_mask=True, cache_dir=cache)
    ranks = [list(df.dl.to_torch(64, shuffle=True, seed=7, rank=r, **kw)) for r in range(7)]
    assert [[len(b["label"]) for b in batches] for batches in ranks] == [[43]] * 7
    once = [x for bs in ranks for b in bs for x in b["label"][~b["pad_mask"]].tolist()]
    assert (
        sorted(once) == list(range(300)) and sum(int(bs[0]["pad_mask"].sum()) for bs in ranks) == 1
    )
    plain = [len(list(df.dl.to_torch(64, rank=r, even_batches=False, **kw))) for r in range(7)]
    assert plain == [1, 1, 1, 1, 1, 0, 0]


def test_to_tf(spark: Any, tmp_path: Any) -> None:
    pytest.importorskip("tensorflow")
    pytest.importorskip("spark_dl_core.loaders.tf_loader.loader")
    spark.conf.set("spark.spark_dl.cache.dir", str(tmp_path / "cache"))
    try:
        tfds = _frame(spark).dl.to_tf(batch_size=100)
        labels = []
        for batch in tfds:
            labels += batch["label"].numpy().tolist()
        assert sorted(labels) == list(range(300))
    finally:
        spark.conf.unset("spark.spark_dl.cache.dir")


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


def test_ragged_nested_arrays_infer_json(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "ragged")
    df = spark.sql(
        "SELECT id, IF(id % 2 = 0, array(array(1, 2), array(3)), array(array(4, 5))) AS nested,"
        " array(array(CAST(id AS double), 1.0D), array(2.0D, 3.0D)) AS regular FROM range(10)"
    )
    df.dl.write_mds(path)
    ds = open_dataset(path)
    assert ds.columns["nested"] == "json" and ds.columns["regular"].startswith("ndarray")
    back = {r.id: r.nested for r in spark.read.format("mds").load(path).collect()}
    assert back[0] == [[1, 2], [3]] and back[1] == [[4, 5]]
