"""SQL access: named datasets as temporary views, and running ``.sql`` files.

``CREATE TEMPORARY VIEW v USING mds OPTIONS (path '...')`` works once the source is
registered; :func:`register_dataset` does the same from Python for a path, a Delta table at
a version, a query or a DataFrame. :func:`run_sql_file` runs a script statement by
statement (the ``spark-dl sql FILE`` command uses it).

Writing a query out as MDS from SQL: Spark's own ``INSERT OVERWRITE DIRECTORY 'path' USING
mds [OPTIONS (...)] SELECT ...`` is refused by Spark for Python data sources (it only routes
that statement to file formats), and ``CREATE TABLE ... USING mds AS SELECT`` never passes
the location to the source. So :func:`run_sql_file` (and :func:`sql`) run exactly that
``INSERT OVERWRITE DIRECTORY`` form themselves, through ``DataFrameWriter``, with the same
atomic commit as ``df.write.format("mds").mode("overwrite")``.
"""

from __future__ import annotations

import os
import re
from typing import Any

from spark_dl_core.errors import SpecError

from .datasource import FORMAT


def register_dataset(
    spark: Any,
    name: str,
    *,
    path: str | None = None,
    query: str | None = None,
    dataframe: Any = None,
    delta: str | None = None,
    version: int | None = None,
    options: dict[str, str] | None = None,
) -> Any:
    """Register exactly one of an MDS ``path``, a ``delta`` table, a SQL ``query`` or a
    ``dataframe`` as the temporary view ``name``; returns its DataFrame. ``version`` reads
    a Delta table as of that version, or an MDS path that follows a table at a version it
    holds (as ``open_dataset(path, version=N)``)."""
    given = [x for x in (path, query, dataframe, delta) if x is not None]
    if len(given) != 1:
        raise ValueError("register_dataset takes exactly one of path=, query=, dataframe=, delta=")
    if version is not None and path is None and delta is None:
        raise SpecError(
            f"register_dataset: version={version} applies to delta= (a table as of a version) "
            "and path= (a dataset that follows a table, at a version it holds); a query or a "
            "DataFrame has no versions"
        )
    from . import register

    register(spark)
    if path is not None:
        read = dict(options or {})
        if version is not None:
            read["version"] = str(version)
        df = spark.read.format(FORMAT).options(**read).load(path)
    elif delta is not None:
        from .delta import read_delta

        df = read_delta(spark, delta, version=version)
    elif query is not None:
        df = spark.sql(query)
    else:
        df = dataframe
    df.createOrReplaceTempView(name)
    return df


_INSERT_DIR = re.compile(
    r"^\s*INSERT\s+OVERWRITE\s+(?:LOCAL\s+)?DIRECTORY\s+'(?P<path>(?:[^'\\]|\\.)*)'\s+"
    r"USING\s+mds\s*(?:OPTIONS\s*\((?P<options>[^)]*)\))?\s*(?P<query>.+)$",
    re.IGNORECASE | re.DOTALL,
)
_VARIABLE = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")
_OPTION = re.compile(r"""\s*([\w.]+)\s*=?\s*'((?:[^'\\]|\\.)*)'\s*(?:,|$)""")


def _parse_options(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    out = {}
    pos = 0
    while pos < len(text.strip()):
        match = _OPTION.match(text, pos)
        if not match:
            raise ValueError(f"cannot read OPTIONS ({text}); write key 'value', ...")
        out[match.group(1)] = match.group(2).replace("\\'", "'")
        pos = match.end()
    return out


def sql(spark: Any, statement: str) -> Any:
    """``spark.sql(statement)``, plus ``INSERT OVERWRITE DIRECTORY '…' USING mds <query>``.

    Returns the statement's DataFrame (for the MDS write: the written dataset, read back).
    """
    match = _INSERT_DIR.match(statement)
    if match is None:
        return spark.sql(statement)
    path = match.group("path")
    writer = spark.sql(match.group("query")).write.format(FORMAT).mode("overwrite")
    for key, value in _parse_options(match.group("options")).items():
        writer = writer.option(key, value)
    writer.save(path)
    return spark.read.format(FORMAT).load(path)


def split_statements(text: str) -> list[str]:
    """Split SQL text on top-level ``;`` (not inside quotes or comments); drop empties."""
    statements: list[str] = []
    current: list[str] = []
    i, n = 0, len(text)
    quote: str | None = None
    while i < n:
        c = text[i]
        if quote:
            current.append(c)
            if c == "\\" and i + 1 < n:
                current.append(text[i + 1])
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in ("'", '"', "`"):
            quote = c
            current.append(c)
        elif text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        elif c == ";":
            statements.append("".join(current))
            current = []
        else:
            current.append(c)
        i += 1
    statements.append("".join(current))
    return [s.strip() for s in statements if s.strip()]


def run_sql_file(
    spark: Any, path: str | os.PathLike[str], variables: dict[str, str] | None = None
) -> list[Any]:
    """Run each statement of a ``.sql`` file in order; returns their DataFrames.

    ``${name}`` placeholders are replaced from ``variables`` first (e.g. an output dir).
    """
    from . import register

    register(spark)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for key, value in (variables or {}).items():
        text = text.replace("${" + key + "}", value)
    undefined = sorted(set(_VARIABLE.findall(text)))
    if undefined:
        names = ", ".join("${" + n + "}" for n in undefined)
        raise SpecError(
            f"{path}: undefined variable(s) {names}; give a value for each "
            f"(spark-dl sql --var {undefined[0]}=VALUE, or variables={{{undefined[0]!r}: ...}})"
        )
    results = []
    for statement in split_statements(text):
        try:
            results.append(sql(spark, statement))
        except Exception as exc:
            first = statement.splitlines()[0][:80]
            raise RuntimeError(f"{path}: statement failed: {first!r}: {exc}") from exc
    return results
