"""How ``spark.read.format("mds")`` plans and streams a read: shards grouped into input
partitions by bytes (as Spark splits files), Arrow batches bounded by bytes, and the rows
still exactly the core's, whatever the grouping."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from spark_dl.datasource import MDSDataSource
from spark_dl.mds_options import PARTITION_BYTES, READ_BATCH_BYTES, SHARD_OPEN_BYTES
from spark_dl.mds_reader import batch_rows, plan_groups
from spark_dl_core import DatasetSpec, open_dataset, write_mds

MIB = 1 << 20


def _jpeg(seed: int, side: int = 256) -> bytes:
    """A noisy photo-like JPEG (noise keeps it large: ~100 KB)."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=95)
    return out.getvalue()


def _reader(path: str, **options: str) -> Any:
    source = MDSDataSource({"path": path, **options})
    return source.reader(source.schema())


def test_groups_are_consecutive_cover_every_shard_and_feed_every_core() -> None:
    small = plan_groups([2 * MIB] * 40, cores=4)  # 240 MiB with opening costs
    assert [i for g in small for i in g] == list(range(40))
    assert len(small) >= 4
    big = plan_groups([64 * MIB] * 10, cores=2)  # grouped up to 128 MiB, never above
    assert [i for g in big for i in g] == list(range(10))
    for group in big:
        assert len(group) == 1 or sum(64 * MIB + SHARD_OPEN_BYTES for _ in group) <= (
            PARTITION_BYTES
        )
    tiny = plan_groups([100] * 30, cores=8)  # a tiny dataset: a few tasks, not 30
    assert len(tiny) < 30
    assert plan_groups([], cores=2) == []


def test_batch_rows_bound_bytes_not_rows() -> None:
    assert batch_rows(24 * MIB, 1_000_000) == 1 << 17  # narrow rows: capped row count
    images = batch_rows(100_000 * 1000, 1000)  # ~100 KB a row
    assert images * 100_000 <= READ_BATCH_BYTES and images >= 64


def test_small_shards_are_grouped_and_rows_stay_exact(spark: Any, tmp_path: Any) -> None:
    """Many small shards were as many tasks; now a few, with the same rows, nulls, arrays
    and pruned reads as the core gives."""
    n = 4000
    rng = np.random.default_rng(7)
    values = rng.normal(size=n)
    table = pa.table(
        {
            "id": pa.array(np.arange(n, dtype=np.int64)),
            "v": pa.array([None if i % 7 == 0 else float(values[i]) for i in range(n)]),
            "vec": pa.array([rng.random(8, dtype=np.float32) for _ in range(n)]),
            "text": pa.array([f"row {i}" for i in range(n)]),
        }
    )
    path = str(tmp_path / "many")
    spec = DatasetSpec(shard_size="16KiB", nulls="mask", columns={"vec": "ndarray:float32:8"})
    write_mds(table, path, spec)
    ds = open_dataset(path)
    assert ds.num_shards > 10

    planned = _reader(path).partitions()
    assert 2 <= len(planned) < ds.num_shards
    assert [i for p in planned for i in p.shards] == list(range(ds.num_shards))
    assert len(_reader(path, shards_per_partition="1").partitions()) == ds.num_shards

    from pyspark.sql import functions as F

    df = spark.read.format("mds").load(path)
    tasks = df.select(F.spark_partition_id().alias("p")).distinct().count()
    assert tasks == len(planned)  # (each group holds rows, so each shows)
    got = {r.id: (r.v, list(r.vec), r.text) for r in df.collect()}
    core = ds.to_arrow()
    want = {
        i: (v, [float(x) for x in vec], t)
        for i, v, vec, t in zip(
            core.column("id").to_pylist(),
            core.column("v").to_pylist(),
            core.column("vec").to_pylist(),
            core.column("text").to_pylist(),
        )
    }
    assert got == want and len(got) == n
    assert got[7][0] is None and got[8][0] == pytest.approx(values[8])
    pruned = spark.read.format("mds").schema("v double, id long").load(path)
    assert pruned.columns == ["v", "id"]
    assert sorted((r.id, r.v) for r in pruned.collect()) == sorted(
        (i, v[0]) for i, v in want.items()
    )
    assert df.count() == n


def test_image_batches_are_bounded_by_bytes(tmp_path: Any) -> None:
    """8192 rows a batch whatever a row weighs held hundreds of MiB of images per batch;
    batches are now about READ_BATCH_BYTES, and the bytes are the stored JPEGs."""
    images = [_jpeg(i) for i in range(240)]
    path = str(tmp_path / "images")
    table = pa.table({"id": pa.array(range(240), pa.int64()), "image": pa.array(images)})
    write_mds(table, path, DatasetSpec(columns={"image": "jpeg"}, shard_size="64MiB"))
    assert open_dataset(path).num_shards == 1
    reader = _reader(path)
    batches = [b for p in reader.partitions() for b in reader.read(p)]
    assert len(batches) > 1
    widest = max(len(x) for x in images)
    assert all(b.nbytes <= READ_BATCH_BYTES + 2 * widest + 64 * 1024 for b in batches)
    got = pa.Table.from_batches(batches)
    assert got.column("id").to_pylist() == list(range(240))
    assert got.column("image").to_pylist() == images


def test_a_scan_reads_whole_runs_without_aliasing_the_shard(tmp_path: Any) -> None:
    """A contiguous run of rows is read without a gather; its columns are still copies
    (writable, not sharing the shard's bytes) and equal a gathered read."""
    n = 300_000
    table = pa.table({"a": np.arange(n, dtype=np.int64), "b": np.arange(n, dtype=np.float32)})
    path = str(tmp_path / "run")
    write_mds(table, path, DatasetSpec(shard_size="64MiB"))
    ds = open_dataset(path)
    data = ds.load_shard(0)
    run = ds.decode(data, np.arange(1000, 200_000))
    gathered = ds.decode(data, np.arange(199_999, 999, -1))
    assert np.array_equal(run["a"], np.arange(1000, 200_000))
    assert np.array_equal(run["a"], gathered["a"][::-1])
    assert np.array_equal(run["b"], gathered["b"][::-1])
    one = ds.decode(data, np.arange(5, 10), columns=["a"])
    assert one["a"].flags.writeable and one["a"].tolist() == [5, 6, 7, 8, 9]
    one["a"][0] = -1  # a copy: the shard is untouched
    assert ds.decode(data, np.arange(5, 6), columns=["a"])["a"].tolist() == [5]
