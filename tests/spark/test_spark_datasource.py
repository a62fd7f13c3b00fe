"""The ``mds`` data source on classic and Spark Connect sessions: types, modes, faults."""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, open_dataset, write_mds

pytestmark = pytest.mark.spark

N = 5000


def _all_types(spark: Any) -> Any:
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        BooleanType,
        ByteType,
        DateType,
        DecimalType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        MapType,
        ShortType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    schema = StructType(
        [
            StructField("id", LongType(), False),
            StructField("flag", BooleanType(), False),
            StructField("tiny", ByteType(), False),
            StructField("small", ShortType(), False),
            StructField("int", IntegerType(), False),
            StructField("float", FloatType(), False),
            StructField("double", DoubleType(), False),
            StructField("dec", DecimalType(12, 3), False),
            StructField("text", StringType(), False),
            StructField("blob", BinaryType(), False),
            StructField("day", DateType(), False),
            StructField("ts", TimestampType(), False),
            StructField("fixed", ArrayType(FloatType(), False), False),
            StructField("ragged", ArrayType(IntegerType(), False), False),
            StructField("nested", ArrayType(ArrayType(DoubleType(), False), False), False),
            StructField("dense", VectorUDT(), False),
            StructField("sparse", VectorUDT(), False),
            StructField(
                "rec", StructType([StructField("a", IntegerType()), StructField("b", StringType())])
            ),
            StructField("tags", MapType(StringType(), IntegerType())),
        ]
    )
    rows = []
    base = dt.datetime(2024, 1, 1, 12, 0, 0)
    for i in range(N):
        rows.append(
            (
                i,
                i % 3 == 0,
                (i % 256) - 128,
                -i,
                i * 7 - 9000,
                float(np.float32(i / 3)),
                i / 7,
                Decimal(i * 1001).scaleb(-3),
                f"row {i} é",
                bytes([i % 256]) * (i % 5),
                dt.date(2020, 1, 1) + dt.timedelta(days=i),
                base + dt.timedelta(seconds=i, microseconds=i),
                [float(np.float32(i + k / 2)) for k in range(8)],
                list(range(i % 4)),
                [[i + 0.5, 1.0, 2.0], [3.0, 4.0, -float(i)]],
                Vectors.dense([i, 1.0, 2.0, 3.0]),
                Vectors.sparse(4, [i % 4], [float(i)]),
                (i, f"s{i}"),
                {"k": i, "j": -i},
            )
        )
    return spark.createDataFrame(rows, schema).repartition(3)


def _plain(value: Any) -> Any:
    """Spark row values comparable after a round trip (vectors are stored as arrays)."""
    if hasattr(value, "toArray"):
        return value.toArray().tolist()
    if isinstance(value, bytearray):
        return bytes(value)
    if hasattr(value, "asDict"):
        return value.asDict()
    return value


def test_every_type_round_trips(spark: Any, tmp_path: Any) -> None:
    df = _all_types(spark)
    path = str(tmp_path / "all")
    df.dl.write_mds(path, DatasetSpec(compression="zstd", shard_size="256KiB"))
    ds = open_dataset(path)
    assert len(ds) == N and ds.num_shards > 3
    assert ds.columns["fixed"] == "ndarray:float32"  # from the type, as every writer infers
    assert ds.columns["dense"] == "ndarray:float64"
    assert ds.columns["ragged"] == "ndarray:int32"
    assert ds.columns["flag"] == "uint8"

    expected = [[_plain(v) for v in r] for r in df.orderBy("id").collect()]
    back = spark.read.format("mds").load(path)
    assert back.schema["flag"].dataType.simpleString() == "boolean"
    assert back.schema["tiny"].dataType.simpleString() == "tinyint"
    assert back.schema["dec"].dataType.simpleString() == "decimal(12,3)"
    assert back.schema["dense"].dataType.simpleString() == "array<double>"
    got = [[_plain(v) for v in r] for r in back.orderBy("id").collect()]
    assert back.columns == df.columns
    for e, g in zip(expected, got):
        assert e == g, (e, g)
    assert len(got) == N

    # the core reads the same values with no Spark in the loop
    table = ds.to_arrow().sort_by("id")
    assert table.column("id").to_pylist() == list(range(N))
    assert table.column("dec").to_pylist() == [e[7] for e in expected]
    assert table.column("text").to_pylist() == [e[8] for e in expected]
    assert table.column("fixed").to_pylist() == [e[12] for e in expected]
    assert table.column("ragged").to_pylist() == [e[13] for e in expected]
    assert table.column("sparse").to_pylist() == [e[16] for e in expected]
    assert table.column("rec").to_pylist() == [e[17] for e in expected]
    assert [dict(m) for m in table.column("tags").to_pylist()] == [e[18] for e in expected]
    assert table.column("day").to_pylist() == [e[10] for e in expected]


@pytest.mark.parametrize("zone", ["Etc/UTC", "America/New_York", "UTC"])
def test_timestamps_in_any_session_zone(spark: Any, tmp_path: Any, zone: str) -> None:
    """Stored as UTC instants whatever the session zone; read back under another zone."""
    before = spark.conf.get("spark.sql.session.timeZone")
    path = str(tmp_path / "ts")
    df = spark.sql(
        "SELECT id, timestamp_micros(id * 3600000000 + 1700000000000000) AS ts FROM range(50)"
    )
    try:
        spark.conf.set("spark.sql.session.timeZone", zone)
        df.write.format("mds").save(path)
        expected = {r.id: r.ts for r in df.collect()}
        spark.conf.set("spark.sql.session.timeZone", "Asia/Tokyo" if zone == "UTC" else zone)
        got = {r.id: r.ts for r in spark.read.format("mds").load(path).collect()}
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    assert got == expected
    assert str(open_dataset(path).plans[0 + 1].arrow_type) == "timestamp[us, tz=UTC]"
    micros = open_dataset(path).to_arrow().column("ts").cast(pa.int64()).to_pylist()
    assert micros == [i * 3600000000 + 1700000000000000 for i in range(50)]


def test_read_schema_prunes_or_refuses(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "pruned")
    df = spark.sql(
        "SELECT id, CAST(id AS double) AS x, IF(id % 2 = 0, NULL, id) AS maybe FROM range(20)"
    )
    df.write.format("mds").option("nulls", "mask").save(path)
    only = spark.read.format("mds").schema("id long").load(path)
    assert only.columns == ["id"] and sorted(r.id for r in only.collect()) == list(range(20))
    two = spark.read.format("mds").schema("MAYBE bigint, x double").load(path)
    got = sorted((r.x, r.MAYBE) for r in two.collect())
    assert got == [(float(i), None if i % 2 == 0 else i) for i in range(20)]
    with pytest.raises(Exception, match="'nope'"):
        spark.read.format("mds").schema("nope long").load(path).collect()
    with pytest.raises(Exception, match=r"'id'.*int.*bigint"):
        spark.read.format("mds").schema("id int").load(path).collect()


@pytest.mark.parametrize(
    ("kind", "key", "value", "words"),
    [
        ("write", "compresion", "zstd", "did you mean 'compression'"),
        ("write", "shard_sise", "1MiB", "did you mean 'shard_size'"),
        ("write", "verify_hashes", "true", "read option"),
        ("read", "verify_hashes", "yes", "'verify_hashes' must be true or false"),
        ("read", "allow_unsafe", "1", "'allow_unsafe' must be true or false"),
        ("read", "shards_per_partition", "0", "'shards_per_partition' must be between 1"),
        ("read", "shards_per_partition", "abc", "'shards_per_partition' must be an integer"),
        ("read", "shard_per_partition", "2", "did you mean 'shards_per_partition'"),
        ("write", "vacuum_retention", "soon", "'vacuum_retention'"),
        ("write", "vector_dtype", "int8", "'vector_dtype'"),
    ],
)
def test_every_option_is_validated(
    spark: Any, tmp_path: Any, kind: str, key: str, value: str, words: str
) -> None:
    path = str(tmp_path / "opts")
    if kind == "write":
        with pytest.raises(Exception, match=words):
            spark.range(3).write.format("mds").option(key, value).save(path)
        assert not os.path.exists(os.path.join(path, "index.json"))
    else:
        spark.range(3).write.format("mds").save(path)
        with pytest.raises(Exception, match=words):
            spark.read.format("mds").option(key, value).load(path).collect()


def test_tiny_shard_size_warns() -> None:
    with pytest.warns(UserWarning, match="shard_size=1 "):
        from spark_dl.datasource import spec_from_options

        spec_from_options({"shard_size": "1"})


def _files(path: str) -> list[str]:
    return sorted(os.listdir(path))


def _listed_exactly(path: str) -> None:
    """Every shard file on disk is in the index, and every indexed file exists."""
    with open(os.path.join(path, "index.json")) as f:
        listed = {
            s["zip_data"]["basename"] if s["zip_data"] else s["raw_data"]["basename"]
            for s in json.load(f)["shards"]
        }
    shards = {n for n in _files(path) if n.startswith("shard")}
    assert shards == listed


def test_save_modes(spark: Any, tmp_path: Any) -> None:
    from spark_dl_core.errors import DatasetError

    path = str(tmp_path / "modes")
    df = spark.range(100).withColumnRenamed("id", "x")
    df.write.format("mds").save(path)  # Spark's default: error if exists — nothing there yet
    assert spark.read.format("mds").load(path).count() == 100
    with pytest.raises(DatasetError, match="already exists"):
        df.write.format("mds").save(path)
    with pytest.raises(DatasetError, match="already exists"):
        df.write.mode("error").format("mds").save(path)
    df.limit(5).write.format("mds").mode("ignore").save(path)
    assert spark.read.format("mds").load(path).count() == 100
    df.limit(10).write.format("mds").mode("append").save(path)
    assert spark.read.format("mds").load(path).count() == 110
    _listed_exactly(path)
    df.limit(7).write.format("mds").mode("overwrite").save(path)
    assert sorted(r.x for r in spark.read.format("mds").load(path).collect()) == list(range(7))
    _listed_exactly(path)
    assert "spark_dl.json" in _files(path)


def test_append_refuses_drift(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "drift")
    spark.sql("SELECT id, CAST(id AS float) AS score FROM range(10)").write.format("mds").save(path)
    with pytest.raises(Exception, match="score"):
        spark.sql("SELECT id, CAST(id AS double) AS score FROM range(10)").write.format("mds").mode(
            "append"
        ).save(path)
    with pytest.raises(Exception, match="extra"):
        spark.sql("SELECT id, CAST(id AS float) AS score, 1 AS extra FROM range(3)").write.format(
            "mds"
        ).mode("append").save(path)
    with pytest.raises(Exception, match="score"):
        spark.sql("SELECT id, CAST(id AS float) AS score FROM range(3)").write.format("mds").mode(
            "append"
        ).option("columns", '{"score": "float64"}').save(path)
    assert spark.read.format("mds").load(path).count() == 10
    _listed_exactly(path)


def test_core_and_spark_append_refuse_the_same_drift(spark: Any, tmp_path: Any) -> None:
    """One policy: the same append is refused with the same message, naming the column or
    spec field, whether it goes through Spark or through the core's write_mds."""
    import re

    import pyarrow as pa

    from spark_dl_core import write_mds

    path = str(tmp_path / "same")
    spark.sql("SELECT id, CAST(id AS float) AS score FROM range(10)").write.format("mds").option(
        "compression", "zstd"
    ).save(path)
    cases = [
        (
            spark.sql("SELECT id, CAST(id AS double) AS score FROM range(3)"),
            {},
            pa.table({"id": pa.array([1], pa.int64()), "score": pa.array([1.0], pa.float64())}),
            {},
        ),
        (
            spark.sql("SELECT id, CAST(id AS float) AS score FROM range(3)"),
            {"compression": "gz"},
            pa.table({"id": pa.array([1], pa.int64()), "score": pa.array([1.0], pa.float32())}),
            {"compression": "gz"},
        ),
        (
            spark.sql("SELECT id, CAST(id AS float) AS score FROM range(3)"),
            {"columns": '{"score": "float64"}'},
            pa.table({"id": pa.array([1], pa.int64()), "score": pa.array([1.0], pa.float32())}),
            {"columns": {"score": "float64"}},
        ),
    ]
    for frame, options, table, spec in cases:
        with pytest.raises(Exception) as core:
            write_mds(table, path, spec, mode="append")
        message = str(core.value)
        assert message.startswith(f"append to {path}:") and ("score" in message or "gz" in message)
        with pytest.raises(Exception, match=re.escape(message)):
            frame.write.format("mds").mode("append").options(**options).save(path)
    assert spark.read.format("mds").load(path).count() == 10
    _listed_exactly(path)


def test_corruption_is_caught_on_first_read_by_default(spark: Any, tmp_path: Any) -> None:
    """Spark-written shards record the xxh3 of their stored file: readers check it once."""
    from spark_dl_core import HashMismatchError, open_dataset

    path = str(tmp_path / "flip")
    spark.range(200).selectExpr("id", "CAST(id AS string) AS s").coalesce(1).write.format(
        "mds"
    ).save(path)
    ds = open_dataset(path)
    assert all(m["stored_hashes"] for m in ds.meta["shards"])
    shard = Path(path) / ds.shards[0].stored.basename
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(HashMismatchError, match=r"xxh3_64 .*spark_dl\.json"):
        list(open_dataset(path).iter_batches())
    with pytest.raises(Exception, match="xxh3_64"):
        spark.read.format("mds").load(path).collect()
    rows = spark.read.format("mds").option("verify_hashes", "false").load(path).count()
    assert rows == 200


def test_options_mirror_the_spec(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "opts")
    df = spark.sql("SELECT id AS Label, CAST(id AS int) AS small FROM range(2000)").coalesce(1)
    (
        df.write.format("mds")
        .option("compression", "zstd")
        .option("shard_size", "4KiB")
        .option("hashes", "sha1,xxh64")
        .option("columns", '{"Label": "int32"}')
        .option("encoding.small", "int64")
        .save(path)
    )
    ds = open_dataset(path)
    assert ds.columns == {"Label": "int32", "small": "int64"}
    assert ds.num_shards > 2
    assert ds.spec is not None and ds.spec["compression"] == "zstd"
    assert ds.shards[0].hashes == ["sha1", "xxh64"]
    assert all(s.stored.basename.endswith(".mds.zstd") for s in ds.shards)
    back = spark.read.format("mds").load(path)
    assert back.schema["Label"].dataType.simpleString() == "bigint"  # the Arrow type is kept
    assert sorted(r.Label for r in back.collect()) == list(range(2000))


def test_encoding_option_matching_two_columns_by_case_is_refused(spark: Any, tmp_path: Any) -> None:
    """Spark lowercases option keys: ``encoding.a`` over columns ``a`` and ``A`` used to land
    on ``A``; it is refused naming both, and the ``spec`` option (JSON keeps case) works."""
    df = spark.createDataFrame([(1, 2)], "a int, A int")
    with pytest.raises(Exception, match=r"encoding\.a.*\['a', 'A'\].*'spec'"):
        df.write.format("mds").option("encoding.a", "int64").save(str(tmp_path / "refused"))
    assert not os.path.exists(tmp_path / "refused" / "index.json")
    path = str(tmp_path / "by_spec")
    spec = '{"columns": {"a": "int64"}}'
    df.write.format("mds").option("spec", spec).save(path)
    assert open_dataset(path).columns == {"a": "int64", "A": "int32"}


def test_nulls(spark: Any, tmp_path: Any) -> None:
    df = spark.sql("SELECT id, IF(id % 3 = 0, NULL, CAST(id AS double)) AS v FROM range(30)")
    with pytest.raises(Exception, match="'v'"):
        df.write.format("mds").save(str(tmp_path / "refused"))
    assert not os.path.exists(tmp_path / "refused" / "index.json")
    path = str(tmp_path / "masked")
    df.write.format("mds").option("nulls", "mask").save(path)
    got = {r.id: r.v for r in spark.read.format("mds").load(path).collect()}
    assert got == {r.id: r.v for r in df.collect()}
    assert got[3] is None


def test_masked_nulls_in_spark_arrays_of_a_fixed_shape(classic_spark: Any, tmp_path: Any) -> None:
    """Spark's arrays (plain Arrow lists: ``array<float>``, ``array<array<double>>``,
    ``array<boolean>``) with nulls, written with nulls='mask' and a fixed ``columns=`` shape:
    the writer refused the nulls (filled with [], not the shape). Now they read back null
    through Spark and masked zeros through the core; a row of another length names the
    column, partition and row, and nothing is committed."""
    df = classic_spark.sql(
        "SELECT id,"
        " IF(id % 3 = 1, NULL, transform(sequence(0, 3), i -> CAST(id + i AS float))) AS vec,"
        " IF(id % 4 = 2, NULL, array(array(id / 2, 1.5D), array(-0.5D, id))) AS grid,"
        " IF(id % 5 = 3, NULL, array(id % 2 = 0, true)) AS flags FROM range(12)"
    ).repartition(2)
    columns = (
        '{"vec": "ndarray:float32:4", "grid": "ndarray:float64:2,2", "flags": "ndarray:uint8:2"}'
    )
    path = str(tmp_path / "masked")
    df.write.format("mds").options(nulls="mask", columns=columns).save(path)
    want = {r.id: r for r in df.collect()}
    got = {r.id: r for r in classic_spark.read.format("mds").load(path).collect()}
    assert got == want and got[1].vec is None and got[2].grid is None and got[3].flags is None
    ds = open_dataset(path)
    (batch,) = ds.iter_batches(batch_size=12)
    for i, row in enumerate(batch["id"].tolist()):
        for name, shape in (("vec", (4,)), ("grid", (2, 2)), ("flags", (2,))):
            value = getattr(want[row], name)
            assert batch[f"{name}__isnull"][i] == (value is None)
            expected = np.zeros(shape) if value is None else np.asarray(value, dtype=float)
            np.testing.assert_array_equal(batch[name][i], expected)
    short = classic_spark.sql(
        "SELECT id, IF(id = 7, array(CAST(1 AS float)), IF(id % 3 = 1, NULL,"
        " transform(sequence(0, 3), i -> CAST(i AS float)))) AS vec FROM range(12)"
    ).coalesce(1)
    bad = str(tmp_path / "short")
    with pytest.raises(Exception, match=r"'vec'.*shape \(1,\).*needs \(4,\).*row 7 of partition 0"):
        short.write.format("mds").options(
            nulls="mask", columns='{"vec": "ndarray:float32:4"}'
        ).save(bad)
    assert not os.path.exists(os.path.join(bad, "index.json"))


def test_failed_overwrite_keeps_the_old_dataset(spark: Any, tmp_path: Any) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    path = str(tmp_path / "fault")
    spark.range(50).write.format("mds").save(path)
    before = open_dataset(path).fingerprint
    files = _files(path)

    @F.udf(LongType())
    def explode_on_one_partition(x):  # no hints: Connect would read them as a pandas UDF
        if x == 1500:
            raise RuntimeError("boom in one task")
        return x

    bad = spark.range(0, 2000, numPartitions=2).select(explode_on_one_partition("id").alias("id"))
    with pytest.raises(Exception, match="boom"):
        bad.write.format("mds").mode("overwrite").option("shard_size", "1KiB").save(path)
    assert _files(path) == files  # no stray shard from the failed job, old ones all there
    assert open_dataset(path).fingerprint == before
    assert sorted(r.id for r in spark.read.format("mds").load(path).collect()) == list(range(50))


def test_reads_datasets_without_spark_dl_metadata(spark: Any, tmp_path: Any) -> None:
    """Mosaic-written datasets have no spark_dl.json and may use unsigned types."""
    path = str(tmp_path / "foreign")
    table = pa.table(
        {
            "u8": pa.array(np.arange(20, dtype=np.uint8)),
            "u32": pa.array(np.arange(20, dtype=np.uint32) * 1000),
            "f16": pa.array(np.arange(20, dtype=np.float16)),
            "s": pa.array([f"x{i}" for i in range(20)]),
            "img": pa.array(
                [[[float(i)] * 3] * 2 for i in range(20)],
                type=pa.list_(pa.list_(pa.float32(), 3), 2),
            ),
        }
    )
    write_mds(table, path, DatasetSpec(columns={"img": "ndarray:float32:2,3"}))
    os.remove(os.path.join(path, "spark_dl.json"))
    os.remove(os.path.join(path, "spark_dl.index.arrow"))  # Mosaic writes neither
    back = spark.read.format("mds").load(path)
    types = {f.name: f.dataType.simpleString() for f in back.schema.fields}
    assert types["u8"] == "smallint" and types["u32"] == "bigint" and types["f16"] == "float"
    rows = sorted(back.collect(), key=lambda r: r.u8)
    assert [r.u32 for r in rows] == [i * 1000 for i in range(20)]
    assert rows[3].s == "x3"
    assert rows[2].img == [[2.0] * 3] * 2


def test_missing_path_and_bad_options_are_clear(spark: Any, tmp_path: Any) -> None:
    with pytest.raises(Exception, match="does not exist"):
        spark.read.format("mds").load(str(tmp_path / "nothing")).count()
    with pytest.raises(Exception, match="compression"):
        spark.range(3).write.format("mds").option("compression", "nope").save(str(tmp_path / "bad"))


def test_s3_write_and_read(spark: Any, tmp_path: Any) -> None:
    """fsspec URLs: shards go through s3fs from the tasks; no Hadoop S3 jars involved."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {
            "storage.endpoint_url": f"http://{host}:{port}",
            "storage.region_name": "us-east-1",
            "storage.key": "testing",
            "storage.secret": "testing",
        }
        import s3fs

        fs = s3fs.S3FileSystem(
            key="testing",
            secret="testing",
            client_kwargs={"endpoint_url": f"http://{host}:{port}", "region_name": "us-east-1"},
        )
        bucket = f"b{uuid.uuid4().hex[:12]}"  # moto's state is per process, not per server
        fs.call_s3("create_bucket", Bucket=bucket)
        df = spark.sql("SELECT id, array(CAST(id AS float), 1.0f) AS v FROM range(500)")
        df.write.format("mds").options(**options).option("shard_size", "2KiB").save(
            f"s3://{bucket}/ds"
        )
        assert fs.exists(f"{bucket}/ds/index.json") and fs.exists(f"{bucket}/ds/spark_dl.json")
        with pytest.raises(Exception, match="already exists"):
            df.write.format("mds").options(**options).save(f"s3://{bucket}/ds")
        back = spark.read.format("mds").options(**options).load(f"s3://{bucket}/ds")
        assert sorted(r.id for r in back.collect()) == list(range(500))
    finally:
        server.stop()


def test_losing_task_attempts_leave_nothing(tmp_path: Any) -> None:
    """A speculative or retried attempt whose report the driver did not take is deleted at
    commit; abort deletes everything the job wrote. (Driven directly, without Spark.)"""
    from pyspark.sql.types import LongType, StructField, StructType

    from spark_dl.datasource import MDSWriter

    path = str(tmp_path / "spec")
    schema = StructType([StructField("x", LongType(), False)])
    batch = pa.record_batch([pa.array(np.arange(100, dtype=np.int64))], names=["x"])
    writer = MDSWriter({"path": path, "shard_size": "256"}, schema, overwrite=False)
    winner = writer.write(iter([batch]))
    loser = writer.write(iter([batch]))  # the same partition, written twice
    assert len(loser.shards) > 1
    writer.commit([winner])
    ds = open_dataset(path)
    assert len(ds) == 100
    _listed_exactly(path)

    failed = MDSWriter({"path": path, "shard_size": "256"}, schema, overwrite=True)
    failed.write(iter([batch]))
    failed.abort([None])
    _listed_exactly(path)
    assert open_dataset(path).fingerprint == ds.fingerprint


_MOSAIC_WRITE = """
import sys
sys.path.insert(0, sys.argv[2])
import mosaic_shim
mosaic_shim.install()
import numpy as np
from streaming import MDSWriter
columns = {"id": "int64", "x": "float32", "name": "str", "v": "ndarray:float32:3", "u": "uint8"}
with MDSWriter(out=sys.argv[1], columns=columns, compression="zstd", size_limit=4096) as w:
    for i in range(200):
        w.write({"id": np.int64(i), "x": np.float32(i / 2), "name": f"n{i}",
                 "v": np.arange(3, dtype=np.float32) + i, "u": np.uint8(i % 256)})
"""


@pytest.mark.mosaic
def test_reads_a_dataset_written_by_mosaic(spark: Any, tmp_path: Any) -> None:
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    python = root / ".venv-mosaic" / "bin" / "python"
    if not python.exists():
        pytest.skip("no .venv-mosaic (make mosaic-env)")
    out = tmp_path / "mosaic"
    subprocess.run(
        [str(python), "-c", _MOSAIC_WRITE, str(out), str(root / "tests" / "interop")], check=True
    )
    assert not (out / "spark_dl.json").exists()
    back = spark.read.format("mds").load(str(out))
    rows = sorted(back.collect(), key=lambda r: r.id)
    assert len(rows) == 200
    assert rows[7].x == 3.5 and rows[7].name == "n7" and rows[7].u == 7
    assert rows[7].v == [7.0, 8.0, 9.0]


def test_spec_option_that_is_not_json_names_the_option() -> None:
    from spark_dl.datasource import spec_from_options
    from spark_dl_core import SpecError

    with pytest.raises(SpecError, match="option 'spec' must be JSON"):
        spec_from_options({"spec": "{compression: zstd}"})
    with pytest.raises(SpecError, match="option 'spec' must be a JSON dict"):
        spec_from_options({"spec": "[1]"})


def test_maps_round_trip_through_spark(classic_spark: Any, tmp_path: Any) -> None:
    spark = classic_spark
    df = spark.sql(
        "SELECT id, IF(id % 3 = 0, map(), map(CAST(id AS INT), 'v', -1, NULL)) AS by_int, "
        "IF(id % 4 = 0, map(), map('k', id)) AS by_str FROM range(12)"
    )
    path = str(tmp_path / "spark")
    df.write.format("mds").option("nulls", "mask").save(path)
    want = {r.id: (r.by_int, r.by_str) for r in df.collect()}
    back = spark.read.format("mds").load(path)
    assert back.schema["by_int"].dataType.simpleString() == "map<int,string>"
    assert {r.id: (r.by_int, r.by_str) for r in back.collect()} == want
    (batch,) = open_dataset(path).iter_batches(batch_size=16)
    assert {int(i): m for i, m in zip(batch["id"], batch["by_int"])} == {
        i: v[0] for i, v in want.items()
    }
    core = str(tmp_path / "core")  # written by the core, read by Spark
    write_mds(open_dataset(path).to_arrow(), core)
    assert {
        r.id: (r.by_int, r.by_str) for r in spark.read.format("mds").load(core).collect()
    } == want


def test_nested_bytes_round_trip_through_spark(classic_spark: Any, tmp_path: Any) -> None:
    """Bytes inside arrays, structs and maps keep every byte (>= 0x80 included) both ways."""
    spark = classic_spark
    df = spark.sql(
        "SELECT id, array(unhex('00FF80C328'), unhex('')) AS lb, "
        "named_struct('b', unhex(hex(id + 200)), 'x', id) AS sb, "
        "map('k', unhex('FEFF')) AS mb, "
        "array(named_struct('m', map('a', array(unhex('9F00'))))) AS deep FROM range(4)"
    )
    path = str(tmp_path / "spark")
    df.write.format("mds").save(path)
    want = [r.asDict(recursive=True) for r in df.orderBy("id").collect()]
    back = [r.asDict(recursive=True) for r in spark.read.format("mds").load(path).collect()]
    assert sorted(back, key=lambda r: r["id"]) == want
    assert want[0]["lb"] == [b"\x00\xff\x80\xc3(", b""]
    ds = open_dataset(path)
    by_id = {r["id"]: r for r in ds.to_arrow().to_pylist(maps_as_pydicts="strict")}
    assert by_id[1]["sb"] == {"b": bytes([201]), "x": 1} and by_id[1]["mb"] == {"k": b"\xfe\xff"}
    first = ds[int(np.flatnonzero(ds["id"] == 0)[0])]
    assert first["deep"] == [{"m": {"a": [b"\x9f\x00"]}}] and first["lb"] == want[0]["lb"]


def test_write_errors_name_the_partition_and_row(classic_spark: Any, tmp_path: Any) -> None:
    df = (
        classic_spark.sql("SELECT id, IF(id = 13, NULL, id) AS v FROM range(20)")
        .repartition(2, "id")
        .sortWithinPartitions("id")
    )
    parts = df.rdd.glom().map(lambda rows: [r.id for r in rows]).collect()
    part = next(p for p, ids in enumerate(parts) if 13 in ids)
    row = parts[part].index(13)
    with pytest.raises(Exception, match=rf"'v'.*first at row {row} of partition {part}\b"):
        df.write.format("mds").save(str(tmp_path / "x"))


def test_bad_values_name_the_row_with_what_to_do(classic_spark: Any, tmp_path: Any) -> None:
    """A 1-byte jpeg value and a null inside an array named no row; both now name partition
    and row, and the array one says to fill the nulls or store the column as json."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(out, format="JPEG")
    jpeg = out.getvalue()
    rows = [(i, jpeg if i != 7 else b"\xff", [i, None] if i == 5 else [i]) for i in range(10)]
    df = classic_spark.createDataFrame(rows, "id long, img binary, arr array<int>").coalesce(1)
    images = df.select("id", "img").write.format("mds").option("columns", '{"img": "jpeg"}')
    with pytest.raises(Exception, match=r"'img'.*1 byte.*too short to be a jpeg.*row 7 of part"):
        images.save(str(tmp_path / "img"))
    with pytest.raises(Exception, match=r"'arr'.*null elements.*json.*row 5 of partition 0"):
        df.select("id", "arr").write.format("mds").save(str(tmp_path / "arr"))


def test_writing_where_a_file_is_refused_before_the_job(classic_spark: Any, tmp_path: Any) -> None:
    """It failed inside a worker's traceback (FileExistsError) after the job started."""
    afile = tmp_path / "part.csv"
    afile.write_text("id\n1\n")
    df = classic_spark.range(5)
    with pytest.raises(Exception, match=r"part\.csv is a file, and a dataset is a directory"):
        df.write.format("mds").mode("overwrite").save(str(afile))
    assert afile.read_text() == "id\n1\n"
