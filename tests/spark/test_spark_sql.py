"""SQL: views over MDS datasets, register_dataset, and the runnable sql_examples/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import spark_dl
from spark_dl.sql import run_sql_file, split_statements
from spark_dl_core.errors import SpecError

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "sql_examples").glob("*.sql"))


def test_split_statements_respects_quotes_and_comments() -> None:
    text = "SELECT 1; -- a; comment\nSELECT ';' AS s /* ; */;\n\n SELECT `a;b` FROM t"
    assert split_statements(text) == ["SELECT 1", "SELECT ';' AS s", "SELECT `a;b` FROM t"]


@pytest.mark.spark
def test_create_temporary_view_using_mds(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "ds")
    spark.range(40).write.format("mds").save(path)
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW nums USING mds OPTIONS (path '{path}')")
    assert spark.sql("SELECT sum(id) AS s FROM nums").collect()[0].s == sum(range(40))


@pytest.mark.spark
def test_catalog_tables_using_mds(classic_spark: Any, tmp_path: Any) -> None:
    """``CREATE TABLE t USING mds LOCATION`` used to fail on Spark's own ``owner`` option,
    and every read of a catalog table said the source "needs a path" (Spark passes its
    readers no options): now both forms read the dataset, and a table declared with a
    column list (whose location Spark drops) is refused saying what works instead.

    On Spark's own session catalog: Delta's ``DeltaCatalog`` (the shared session's, as
    ``with_delta`` sets) resolves a non-Delta provider through Spark's V1 lookup, which
    knows no Python data source ("mds is not a valid Spark SQL Data Source"; docs/spark.md).
    """
    spark = classic_spark.newSession()  # same SparkContext, its own catalog setting
    spark.conf.set("spark.sql.catalog.spark_catalog", "builtin")
    spark_dl.register(spark)
    path = str(tmp_path / "ds")
    spark.range(40).selectExpr("id", "CAST(id AS string) AS s").write.format("mds").save(path)
    try:
        spark.sql(f"CREATE TABLE cat_loc USING mds LOCATION '{path}'")
        spark.sql(f"CREATE TABLE cat_opt USING mds OPTIONS (path '{path}', verify_hashes 'true')")
        for table in ("cat_loc", "cat_opt"):
            got = spark.sql(f"SELECT sum(id) AS n, max(s) AS m FROM {table} WHERE id > 1")
            assert got.collect()[0].asDict() == {"n": sum(range(2, 40)), "m": "9"}
        spark.sql(f"CREATE TABLE cat_cols (id BIGINT) USING mds LOCATION '{path}'")
        with pytest.raises(Exception, match=r"column list.*CREATE TABLE t USING mds LOCATION"):
            spark.sql("SELECT * FROM cat_cols").collect()
    finally:
        for table in ("cat_loc", "cat_opt", "cat_cols"):
            spark.sql(f"DROP TABLE IF EXISTS {table}")
    assert spark.read.format("mds").load(path).count() == 40  # dropping kept the data


@pytest.mark.spark
def test_register_dataset(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "ds")
    spark.range(10).write.format("mds").save(path)
    spark_dl.register_dataset(spark, "by_path", path=path)
    spark_dl.register_dataset(spark, "by_query", query="SELECT id * 2 AS d FROM by_path")
    spark_dl.register_dataset(spark, "by_frame", dataframe=spark.range(3))
    assert spark.sql("SELECT max(d) AS m FROM by_query").collect()[0].m == 18
    assert spark.sql("SELECT count(*) AS n FROM by_frame").collect()[0].n == 3
    with pytest.raises(ValueError, match="exactly one"):
        spark_dl.register_dataset(spark, "none")
    for given in ({"query": "SELECT 1"}, {"dataframe": spark.range(3)}):
        with pytest.raises(SpecError, match=r"version=3 applies to delta= .* and path="):
            spark_dl.register_dataset(spark, "versioned", version=3, **given)
    with pytest.raises(Exception, match=r"does not follow a Delta table .* no version 3"):
        spark_dl.register_dataset(spark, "versioned", path=path, version=3)
    assert not spark.catalog.tableExists("versioned")


@pytest.mark.spark
def test_register_delta_at_a_version(spark: Any, tmp_path: Any) -> None:
    deltalake = pytest.importorskip("deltalake")
    import pyarrow as pa

    table = str(tmp_path / "delta")
    deltalake.write_deltalake(table, pa.table({"a": [1, 2]}))
    deltalake.write_deltalake(table, pa.table({"a": [3]}), mode="append")
    spark_dl.register_dataset(spark, "pinned", delta=table, version=0)
    spark_dl.register_dataset(spark, "latest", delta=table)
    assert spark.sql("SELECT count(*) AS n FROM pinned").collect()[0].n == 2
    assert spark.sql("SELECT count(*) AS n FROM latest").collect()[0].n == 3


@pytest.mark.spark
@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_sql_example_runs(spark: Any, tmp_path: Any, example: Path) -> None:
    results = run_sql_file(spark, example, variables={"out": str(tmp_path)})
    rows = results[-1].collect()
    assert rows, f"{example.name}: the last statement returned no rows"


@pytest.mark.spark
def test_undefined_variable_is_an_error_naming_it(spark: Any, tmp_path: Any) -> None:
    from spark_dl_core.errors import SpecError

    script = tmp_path / "out.sql"
    script.write_text("INSERT OVERWRITE DIRECTORY '${out}/ds' USING mds SELECT 1 AS one;")
    with pytest.raises(SpecError, match=r"\$\{out\}"):
        run_sql_file(spark, script)
    assert not (Path.cwd() / "${out}").exists()
    run_sql_file(spark, script, variables={"out": str(tmp_path)})
    assert (tmp_path / "ds" / "index.json").exists()
