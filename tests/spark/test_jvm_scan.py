"""The JVM scan (spark_dl/jvm_scan.py, spark_dl/jvm/*.java): ``format("mds")`` reads planned
in the JVM over only the columns a query uses, with the Python reader's rows and errors."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

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
    return str(df._jdf.queryExecution().executedPlan().toString())


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
    frame = spark.sql("SELECT id, array(id, id + 1) AS arr FROM range(50)")
    frame.write.format("mds").save(str(tmp_path / "arr"))
    df = spark.read.format("mds").load(str(tmp_path / "arr"))
    assert "MdsJvmScan" in _plan(df.select("id"))  # a supported column alone
    assert "MdsJvmScan" not in _plan(df.select("arr"))
    assert sorted(r.arr for r in df.collect()) == [[i, i + 1] for i in range(50)]


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


def test_a_connect_session_reads_on_the_python_reader(connect_spark: Any, tmp_path: Path) -> None:
    """Spark Connect has no JVM in the client: the scan is not installed there (no JVM
    attribute touched) and its reads, through the patched ``load()``, give the dataset's
    rows as the core reads them."""
    from spark_dl.jvm_scan import _classic_jsession, install_jvm_scan
    from spark_dl_core import open_dataset

    path = _write(connect_spark, tmp_path / "d", 40)
    assert _classic_jsession(connect_spark) is None
    assert not install_jvm_scan(connect_spark)
    df = connect_spark.read.format("mds").load(path)
    assert df.count() == 40
    want = open_dataset(path).to_arrow().column("id").to_pylist()
    assert sorted(r["id"] for r in df.select("id").collect()) == sorted(want)
