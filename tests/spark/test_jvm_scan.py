"""The JVM scan (spark_dl/jvm_scan.py, spark_dl/jvm/*.java): ``format("mds")`` reads planned
in the JVM over only the columns a query uses, with the Python reader's rows and errors."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from spark_dl.jvm_scan import ENABLED, JAR

pytestmark = pytest.mark.skipif(
    not JAR.is_file(), reason=f"{JAR} not built (no javac): reads run on the Python reader"
)

TYPES = (
    "id",
    "CAST(id % 100 - 50 AS tinyint) AS b",
    "CAST(id * 7 % 30000 AS smallint) AS s",
    "CAST(id * 3 AS int) AS i",
    "CAST(id / 3 AS float) AS f",
    "CAST(id / 7 AS double) AS d",
    "CASE WHEN id % 5 = 0 THEN '' ELSE concat('é-', CAST(id AS string)) END AS t",
    "CASE WHEN id % 4 = 0 THEN X'' ELSE CAST(concat('b', CAST(id AS string)) AS binary) END AS bin",
    "id % 3 = 0 AS ok",
)


def _plan(df: Any) -> str:
    """The physical plan's text: the JVM's (classic), the server's explain (Connect)."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return str(df._explain_string(extended=False))
    return str(jdf.queryExecution().executedPlan().toString())


def _both(spark: Any, read: Any) -> tuple[list[Any], list[Any]]:
    """``read()``'s rows through the JVM scan (asserted in the plan) and the Python reader."""
    df = read()
    assert "MdsJvmScan" in _plan(df), _plan(df)
    jvm = sorted(df.collect(), key=repr)
    spark.conf.set(ENABLED, "false")
    try:
        df = read()
        assert "MdsJvmScan" not in _plan(df)
        python = sorted(df.collect(), key=repr)
    finally:
        spark.conf.unset(ENABLED)
    return jvm, python


def _write(spark: Any, path: Path, rows: int, **options: str) -> str:
    frame = spark.sql(f"SELECT {', '.join(TYPES)} FROM range({rows})").repartition(3)
    frame.write.format("mds").options(**options).save(str(path))
    return str(path)


@pytest.mark.parametrize("compression", ["", "zstd"])
def test_every_supported_type_reads_as_the_python_reader(
    classic_spark: Any, tmp_path: Path, compression: str
) -> None:
    spark = classic_spark
    opts = {"compression": compression} if compression else {}
    path = _write(spark, tmp_path / "d", 5000, shard_size="40000", **opts)
    assert len(list((tmp_path / "d").glob("*.mds*"))) > 3  # several shards a partition

    def load(**options: str) -> Any:
        return spark.read.format("mds").options(**options).load(path)

    jvm, python = _both(spark, load)
    assert jvm == python and len(jvm) == 5000
    assert any(r.t == "" for r in jvm) and any(r.bin == b"" for r in jvm)
    for cols in (["t"], ["d", "bin"], ["ok", "b", "s"]):
        jvm, python = _both(spark, lambda c=cols: load().select(*c))
        assert jvm == python
    jvm, python = _both(
        spark, lambda: load(shards_per_partition="2").where("i % 2 = 0").select("f")
    )
    assert jvm == python and len(jvm) == 2500
    assert _both(spark, lambda: load().groupBy().count()) == ([(5000,)], [(5000,)])
    jvm, python = _both(spark, lambda: load(verify_hashes="true").select("id", "t"))
    assert jvm == python
    for_schema = lambda: spark.read.format("mds").schema("ID long, t string").load(path)  # noqa: E731
    jvm, python = _both(spark, for_schema)
    assert jvm == python and jvm[0].__fields__ == ["ID", "t"]


def test_a_count_reads_no_column_and_a_query_only_its_own(
    classic_spark: Any, tmp_path: Path
) -> None:
    path = _write(classic_spark, tmp_path / "d", 100)
    df = classic_spark.read.format("mds").load(path)
    assert "struct<>" in _plan(df.groupBy().count())
    assert "struct<d:double>" in _plan(df.select("d"))


@pytest.mark.parametrize("text", [True, False])  # rows of one size, or sized per sample
def test_null_masks_are_read_as_nulls(classic_spark: Any, tmp_path: Path, text: bool) -> None:
    spark = classic_spark
    more = ", IF(id % 4 = 0, NULL, CAST(id AS string)) AS t" if text else ""
    columns = [c.split(" AS ")[-1] for c in TYPES if "AS t" not in c and "AS bin" not in c]
    frame = spark.sql(
        f"SELECT {', '.join(c for c in TYPES if ' AS t' not in c and ' AS bin' not in c)},"
        f" IF(id % 3 = 0, NULL, id) AS n {more} FROM range(300)"
    )
    frame.write.format("mds").option("nulls", "mask").save(str(tmp_path / "n"))
    jvm, python = _both(spark, lambda: spark.read.format("mds").load(str(tmp_path / "n")))
    assert jvm == python and sum(r.n is None for r in jvm) == 100
    jvm, python = _both(
        spark, lambda: spark.read.format("mds").load(str(tmp_path / "n")).select(*columns, "n")
    )
    assert jvm == python


def test_unsupported_reads_keep_the_python_reader(classic_spark: Any, tmp_path: Path) -> None:
    spark = classic_spark
    gz = _write(spark, tmp_path / "gz", 50, compression="gz")
    assert "MdsJvmScan" not in _plan(spark.read.format("mds").load(gz))
    frame = spark.sql("SELECT id, array(CAST(id AS string), 'x') AS words FROM range(50)")
    frame.write.format("mds").save(str(tmp_path / "json"))  # array<string>: a json column
    df = spark.read.format("mds").load(str(tmp_path / "json"))
    assert "MdsJvmScan" in _plan(df.select("id"))  # a supported column alone
    assert "MdsJvmScan" not in _plan(df.select("words"))
    assert sorted(r.words[0] for r in df.collect()) == sorted(str(i) for i in range(50))


# --------------------------------------------------------------------------- ndarray columns

# Every ndarray element type: (the stored dtype, the Arrow type written, sample values).
ARRAY_DTYPES = [
    ("int8", pa.int8(), [-128, -1, 0, 127]),
    ("uint8", pa.uint8(), [0, 1, 200, 255]),
    ("int16", pa.int16(), [-32768, -2, 7, 32767]),
    ("uint16", pa.uint16(), [0, 3, 40000, 65535]),
    ("int32", pa.int32(), [-(2**31), -5, 9, 2**31 - 1]),
    ("uint32", pa.uint32(), [0, 11, 3_000_000_000, 2**32 - 1]),
    ("int64", pa.int64(), [-(2**63), -13, 17, 2**63 - 1]),
    ("float16", pa.float16(), [-65504.0, -0.0, 6e-08, 1.5, 65504.0, float("inf")]),
    ("float32", pa.float32(), [-3.5e38, -0.0, 1.4e-45, 0.1, 3.5e38, float("-inf")]),
    ("float64", pa.float64(), [-1.7e308, -0.0, 5e-324, 0.1, 1.7e308, float("inf")]),
    ("uint8", pa.bool_(), [True, False]),  # array<boolean>: uint8 values, Arrow booleans
]


def _values(pool: list[Any], count: int, seed: int) -> list[Any]:
    return [pool[(seed * 7 + k * 3) % len(pool)] for k in range(count)]


def _array_table(arrow: pa.DataType, pool: list[Any], rows: int, width: int | None) -> pa.Table:
    """``id``, ``fixed`` (``width`` values a row as Arrow fixed-size lists, or 2 x 3 plain
    nested lists where width is None; some rows null in both, booleans too),
    ``var`` (0 to 4 values: empty arrays included) and ``grid`` (a ragged 2-D array per row:
    its first axis 0 to 2 long, its second 0 to 3), each with some null rows."""
    if arrow == pa.float16():
        import numpy as np

        def cast(v: list[Any]) -> Any:
            return pa.array(np.asarray(v, dtype=np.float16), type=arrow)
    else:

        def cast(v: list[Any]) -> Any:
            return pa.array(v, type=arrow)

    def rows_of(make: Any, null_every: int | None) -> list[Any]:
        return [None if null_every and i % null_every == 3 else make(i) for i in range(rows)]

    def fixed(i: int) -> Any:
        if width is not None:
            return cast(_values(pool, width, i)).to_pylist()
        return [cast(_values(pool, 3, i + j)).to_pylist() for j in range(2)]

    def var(i: int) -> Any:
        return cast(_values(pool, i % 5, i)).to_pylist()

    def grid(i: int) -> Any:
        return [cast(_values(pool, i % 4, i + j)).to_pylist() for j in range(i % 3)]

    fixed_type = pa.list_(arrow, width) if width is not None else pa.list_(pa.list_(arrow))
    return pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "fixed": pa.array(rows_of(fixed, 7), fixed_type),
            "var": pa.array(rows_of(var, 5), pa.list_(arrow)),
            "grid": pa.array(rows_of(grid, 6), pa.list_(pa.list_(arrow))),
        }
    )


@pytest.mark.parametrize(("dtype", "arrow", "pool"), ARRAY_DTYPES, ids=lambda v: str(v)[:8])
def test_ndarray_columns_of_every_dtype_read_as_the_python_reader(
    classic_spark: Any, tmp_path: Path, dtype: str, arrow: pa.DataType, pool: list[Any]
) -> None:
    """Fixed (1-D and 2-D) and variable (1-D with empty arrays, ragged 2-D) ndarray
    columns with null masks, uncompressed and zstd, in shards of several partitions: the JVM
    scan's rows are the Python reader's, for whole rows, a column alone, a filter and a
    count."""
    from spark_dl_core import write_mds

    spark = classic_spark
    for compression, width in ((None, 4), ("zstd", None)):
        table = _array_table(arrow, pool, 400, width)
        shape = "4" if width else "2,3"
        path = str(tmp_path / f"{dtype}-{compression}-{width}")
        spec = {
            "nulls": "mask",
            "compression": compression,
            "shard_size": 4096,
            "columns": {"fixed": f"ndarray:{dtype}:{shape}"},
        }
        write_mds(table, path, spec)
        assert len(list(Path(path).glob("*.mds*"))) > 3

        def load(p: str = path, **options: str) -> Any:
            return spark.read.format("mds").options(**options).load(p)

        jvm, python = _both(spark, load)
        assert jvm == python and len(jvm) == 400
        assert sum(r.var is None for r in jvm) == 80 and any(r.var == [] for r in jvm)
        assert any(r.grid and r.grid[0] == [] for r in jvm)  # an axis of length 0 below
        for cols in (["var"], ["grid", "id"], ["fixed"]):
            jvm, python = _both(spark, lambda c=cols: load().select(*c))
            assert jvm == python
        jvm, python = _both(spark, lambda: load(shards_per_partition="2").where("size(var) > 2"))
        assert jvm == python and len(jvm) == 80  # lengths 3 and 4, less the nulls (3)
        nulls = [(table.column("fixed").null_count,)]
        assert _both(spark, lambda: load().where("fixed IS NULL").groupBy().count()) == (
            nulls,
            nulls,
        )


def test_spark_arrays_read_as_the_python_reader(classic_spark: Any, tmp_path: Path) -> None:
    """Spark's own array columns, written by ``format("mds")``: equal-length arrays stored as
    variable ``ndarray:float`` with one recorded shape (the Python reader's dense form),
    ragged ones, nested ``array<array<double>>``, ``array<boolean>``, and the same columns
    written with ``nulls='mask'``; a fixed ``columns=`` shape too."""
    spark = classic_spark
    frame = spark.sql(
        "SELECT id, CAST(id % 10 AS int) AS label,"
        " transform(sequence(0, 7), i -> CAST(id + i AS float)) AS features,"
        " filter(transform(sequence(0, 2), i -> id * i), (v, i) -> i < id % 4) AS tokens,"
        " array(array(id / 2, 1.5D), array(-0.0D, id)) AS grid,"
        " array(id % 2 = 0, true) AS flags FROM range(3000)"
    ).repartition(3)
    writes = {
        "plain": {},
        "fixed": {"columns": '{"features": "ndarray:float32:8"}', "compression": "zstd"},
    }
    for name, options in writes.items():
        frame.write.format("mds").options(shard_size="20000", **options).save(str(tmp_path / name))
    masked = frame.selectExpr(
        "id", "IF(id % 9 = 0, NULL, features) AS features", "IF(id % 4 = 1, NULL, tokens) AS tokens"
    )
    masked.write.format("mds").option("nulls", "mask").save(str(tmp_path / "masked"))
    meta = (tmp_path / "plain" / "spark_dl.json").read_text()
    assert '"ndarray:float32"' in meta and '"ndarray:int64"' in meta
    for name in (*writes, "masked"):
        path = str(tmp_path / name)
        jvm, python = _both(spark, lambda p=path: spark.read.format("mds").load(p))
        assert jvm == python and len(jvm) == 3000
        jvm, python = _both(
            spark,
            lambda p=path: (
                spark.read.format("mds")
                .load(p)
                .where("id % 3 = 0")
                .selectExpr("sum(features[0])", "count(*)", "sum(size(tokens))")
            ),
        )
        assert jvm == python
    df = spark.read.format("mds").load(str(tmp_path / "plain"))
    assert "MdsJvmScan" in _plan(df)
    rows = df.where("id = 7 OR id = 8").orderBy("id").collect()
    assert rows[0].tokens == [0, 7, 14] and rows[1].tokens == []
    assert rows[0].grid == [[3.5, 1.5], [-0.0, 7.0]] and rows[0].flags == [False, True]
    assert rows[0].features[7] == 14.0


def test_token_documents_written_through_write_time_ops_read_on_the_jvm_scan(
    classic_spark: Any, tmp_path: Path
) -> None:
    """Token documents (``list<uint16>`` stored as ``ndarray:uint16``, as the tokenize op
    writes them) of a dataset whose spec records write-time ops: those ops shaped the
    shards and a read does not run them, so the JVM scan reads it; a read-time op keeps
    the Python reader, which applies it."""
    from spark_dl_core import write_mds

    docs = [[*range(i % 9), 65535] for i in range(500)]
    table = pa.table({"text": pa.array(docs, pa.list_(pa.uint16())), "n": range(500)})
    written = {"op": "rename", "mapping": {"text": "tokens"}}
    write_mds(table, str(tmp_path / "w"), {"transforms": [written], "shard_size": 2048})
    load = lambda: classic_spark.read.format("mds").load(str(tmp_path / "w"))  # noqa: E731
    jvm, python = _both(classic_spark, load)
    assert jvm == python and sorted(r.tokens for r in jvm) == sorted(docs)
    read_op = {"op": "cast", "column": "n", "to": "int32", "at": "read"}
    write_mds(table, str(tmp_path / "r"), {"transforms": [read_op]})
    df = classic_spark.read.format("mds").load(str(tmp_path / "r"))
    assert "MdsJvmScan" not in _plan(df)
    assert dict(df.dtypes)["n"] == "int"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (bytes([1 << 2 | 3]), "an ndarray shape header is truncated"),  # 8-byte dims
        (bytes([1 << 2, 5]), r"ndarray values do not match their shape \(5,\)"),
        (bytes([2 << 2, 1, 3]), "recorded as 1-D arrays but holds arrays of other rank"),
    ],
    ids=["truncated", "shape", "rank"],
)
def test_damaged_ndarray_values_fail_naming_the_file_as_the_python_reader(
    classic_spark: Any, tmp_path: Path, damage: bytes, message: str
) -> None:
    """A variable ndarray value whose header lies (the file's size kept): both readers fail
    naming the shard file and the column, in the same words."""
    import struct

    from spark_dl_core import write_mds

    table = pa.table({"x": pa.array([[1, 2], [3, 4, 5, 6], [7]], pa.list_(pa.int8()))})
    write_mds(table, str(tmp_path / "d"))
    shard = next((tmp_path / "d").glob("*.mds"))
    data = bytearray(shard.read_bytes())
    # sample 1: [its value's size] [header: 1 axis, 1-byte dims] [dim 4] [4 int8 values]
    value = struct.unpack_from("<I", data, 4 + 4)[0] + 4
    assert data[value : value + 6] == bytes([1 << 2, 4, 3, 4, 5, 6])
    data[value : value + len(damage)] = damage
    shard.write_bytes(bytes(data))
    for enabled in ("true", "false"):
        classic_spark.conf.set(ENABLED, enabled)
        try:
            df = classic_spark.read.format("mds").option("verify_hashes", "false")
            df = df.load(str(tmp_path / "d"))
            assert ("MdsJvmScan" in _plan(df)) == (enabled == "true")
            with pytest.raises(Exception, match=rf"{shard.name}'?: column 'x'.*{message}"):
                df.collect()
        finally:
            classic_spark.conf.unset(ENABLED)


def test_broken_shards_fail_naming_the_file(classic_spark: Any, tmp_path: Path) -> None:
    spark = classic_spark
    path = _write(spark, tmp_path / "d", 200)
    shard = sorted((tmp_path / "d").glob("*.mds"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[:-3] + bytes([data[-3] ^ 1]) + data[-2:])
    df = spark.read.format("mds").load(path)
    with pytest.raises(Exception, match=rf"HashMismatchError.*{shard.name}.*xxh3_64"):
        df.collect()
    shard.write_bytes(data[:-7])
    with pytest.raises(Exception, match=rf"{shard.name}.*has {len(data) - 7} bytes"):
        df.select("id").collect()
    with pytest.raises(Exception, match=rf"{shard.name}.*has {len(data) - 7} bytes"):
        df.count()  # a count opens no shard, but checks each is there at its size


def test_a_dataset_replaced_after_planning_is_reported(classic_spark: Any, tmp_path: Path) -> None:
    spark = classic_spark
    path = _write(spark, tmp_path / "d", 200)
    plan = spark.read.format("mds").load(path).select("id")._jdf.queryExecution().executedPlan()
    spark.range(10).write.format("mds").mode("overwrite").save(path)
    with pytest.raises(Exception, match="changed while it was being read"):
        plan.executeCollect()


def test_xxh3_matches_pythons(tmp_path: Path) -> None:
    """The JVM's xxh3_64 (every length class of the algorithm) is xxhash's."""
    import xxhash

    sizes = [0, 1, 3, 4, 8, 9, 16, 17, 64, 128, 129, 200, 240, 241, 1024, 1025, 5000, 70001]
    files = []
    for n in sizes:
        f = tmp_path / str(n)
        f.write_bytes(os.urandom(n))
        files.append(f)
    java = Path(os.environ.get("JAVA_HOME", "/usr"), "bin", "java")
    out = subprocess.run(
        [str(java), "-cp", str(JAR), "sparkdl.jvm.Xxh3", *map(str, files)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == [xxhash.xxh3_64_hexdigest(f.read_bytes()) for f in files]


def test_the_conf_keeps_a_session_on_the_python_reader_until_turned_on(
    classic_spark: Any, tmp_path: Path
) -> None:
    from spark_dl.jvm_scan import install_jvm_scan

    path = _write(classic_spark, tmp_path / "d", 20)
    other = classic_spark.newSession()  # same SparkContext, its own optimizer rules
    other.conf.set(ENABLED, "false")
    assert not install_jvm_scan(other)
    assert "MdsJvmScan" not in _plan(other.read.format("mds").load(path))
    rules = other._jsparkSession.experimental().extraOptimizations()
    assert "MdsScanRule" not in rules.toString()  # no rule added while off
    other.conf.unset(ENABLED)
    df = other.read.format("mds").load(path)  # the first load after: installed
    assert "MdsJvmScan" in _plan(df) and df.count() == 20
    assert not install_jvm_scan(other)  # once
    rules = other._jsparkSession.experimental().extraOptimizations()
    assert rules.toString().count("MdsScanRule") == 1


def test_a_connect_server_built_with_the_extension_reads_on_the_jvm_scan(
    connect_spark: Any, tmp_path: Path
) -> None:
    """Spark Connect has no JVM in the client: ``install_jvm_scan`` touches nothing there. The
    shared Connect server is built with ``with_jvm_scan`` (tests/conftest.py), whose session
    extension gives it the scan: its plans name MdsJvmScan, over only the columns a query
    uses, with the Python reader's rows, and the conf turns it off per session."""
    from spark_dl.jvm_scan import _classic_jsession, has_jvm_scan_extension, install_jvm_scan
    from spark_dl_core import open_dataset

    spark = connect_spark
    path = _write(spark, tmp_path / "d", 40)
    assert _classic_jsession(spark) is None
    assert has_jvm_scan_extension(spark)
    assert not install_jvm_scan(spark)
    jvm, python = _both(spark, lambda: spark.read.format("mds").load(path))
    assert jvm == python and len(jvm) == 40
    want = open_dataset(path).to_arrow().column("id").to_pylist()
    assert sorted(r["id"] for r in jvm) == sorted(want)
    only = spark.read.format("mds").load(path).select("i")
    assert "struct<i:int>" in _plan(only), _plan(only)
    assert spark.read.format("mds").load(path).filter("id % 2 = 0").count() == 20


def test_with_jvm_scan_adds_the_jar_and_extension_keeping_the_builders_own() -> None:
    """Composed with other helpers in either order and applied twice, the builder keeps every
    jar and extension once (checked on the builder: no session is started)."""
    from pyspark.sql import SparkSession

    import spark_dl
    from spark_dl.delta_session import EXTENSION as DELTA
    from spark_dl.jvm_scan import EXTENSION

    builder = SparkSession.Builder().config("spark.sql.extensions", "my.Extension")
    builder = builder.config("spark.jars", "/opt/my.jar")
    options = spark_dl.with_jvm_scan(spark_dl.with_jvm_scan(builder))._options
    assert options["spark.sql.extensions"] == f"my.Extension,{EXTENSION}"
    assert options["spark.jars"] == f"/opt/my.jar,{JAR}"
    both = spark_dl.with_delta(spark_dl.with_jvm_scan(SparkSession.Builder()))._options
    assert both["spark.sql.extensions"].split(",") == [EXTENSION, DELTA]
    assert str(JAR) in both["spark.jars"].split(",")
