"""``spark-dl sql``: a .sql file's statements run on a local Spark session with spark_dl
registered, each result printed as columns and rows. The only command that imports
pyspark (and starts a JVM): the others start fast without it."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from spark_dl.cli.output import EXIT_OK, jsonable, print_json


def cmd_sql(args: argparse.Namespace) -> int:
    """Run a .sql file's statements on a local Spark session (spark_dl registered)."""
    from pyspark.sql import SparkSession

    import spark_dl
    from spark_dl.sql import run_sql_file

    if not os.environ.get("PYSPARK_PYTHON"):  # our own session: its workers run this Python
        os.environ["PYSPARK_PYTHON"] = sys.executable  # (the JVM it starts inherits it)
    spark = (
        SparkSession.builder.master(args.master)
        .appName("spark-dl sql")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    try:
        if hasattr(spark_dl, "register"):
            spark_dl.register(spark)
        variables = dict(v.split("=", 1) for v in args.var)  # "NAME=VALUE": checked by argparse
        results = run_sql_file(spark, args.file, variables or None)
        out = [_result_data(r, args.limit) for r in (results or [])]
    finally:
        spark.stop()
    if args.json:
        print_json(out)
    else:
        for i, r in enumerate(out):
            print(f"-- statement {i + 1}")
            if r.get("columns"):
                print("\t".join(r["columns"]))
            for row in r.get("rows", []):
                print("\t".join(str(v) for v in row))
    return EXIT_OK


def _result_data(result: Any, limit: int) -> dict[str, Any]:
    """A statement result (DataFrame, list of Rows, or anything) as columns + rows."""
    statement = None
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], str):
        statement, result = result
    if hasattr(result, "limit") and hasattr(result, "columns"):
        rows = [list(r) for r in result.limit(limit).collect()]
        data: dict[str, Any] = {"columns": list(result.columns), "rows": jsonable(rows)}
    elif isinstance(result, list):
        data = {"columns": [], "rows": jsonable([list(r) for r in result[:limit]])}
    else:
        data = {"columns": [], "rows": [] if result is None else [[jsonable(result)]]}
    if statement is not None:
        data["statement"] = statement
    return data
