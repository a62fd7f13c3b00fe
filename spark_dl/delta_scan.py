"""Delta DataFrames that ``read_delta`` did not make, taken as pinned reads: a catalog table
(``spark.table("db.t")``), SQL time travel (``SELECT * FROM t VERSION AS OF n``) and
``spark.read.format("delta").option("versionAsOf", n).load(path)``, on classic and Spark
Connect sessions.

Such a DataFrame, whole or as a select of its columns, holds the rows of
``read_delta(spark, path, version=n)``: :func:`pin_delta_scan` finds the table's location
and version from the plan and returns that pinned read (with the DataFrame's columns), so
``df.write.format("mds")``, ``df.dl`` and ``in_place=True`` record the table and version
(and the catalog name) and write the snapshot's canonical order, as for ``read_delta``; a
table read without a version is pinned at its latest version now. Anything more than a
scan and a selection of columns (a filter, a join, a computed or renamed column, a
``TIMESTAMP AS OF``) is left as it is.

Where the plan is read:

* the analysed plan's text (classic: the JVM's; Connect: the server's ``explain``) for the
  shape (only ``Project`` of plain columns and ``SubqueryAlias`` above one ``Relation``) and
  the catalog name;
* classic: the relation's file index (Delta's ``TahoeLogFileIndex``) for the table's path
  and the snapshot version it resolved;
* Connect: the physical plan's file index must be Delta's; the version is the parsed plan's
  ``RelationTimeTravel`` (SQL) or the client plan's ``versionAsOf`` reader option; the path
  comes from ``DESCRIBE DETAIL`` of the catalog name, the ``delta.`path``` identifier or the
  reader's path. A time-travel read is then checked against Spark's own: its semantic hash
  must equal ``spark.read.format("delta").option("versionAsOf", n).load(path)``'s.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from .delta import pinned_reads, read_pinned
from .plan_text import explain_sections, plain_leaf

__all__ = ["DeltaScan", "delta_scan", "pin_delta_scan"]

_RELATION = re.compile(r"^Relation (?:(\S+?))?\[.*\] (\w+)$")
_PATH_ALIAS = re.compile(r"^\w+\.delta\.`(.+)`$")
_TIME_TRAVEL = re.compile(r"'RelationTimeTravel .*, (true|false), (\d+)\s*$", re.MULTILINE)
_DELTA_INDEX = re.compile(r"Location: (?:Prepared)?(?:DeltaFileIndex|TahoeLogFileIndex)")


@dataclass(frozen=True)
class DeltaScan:
    """The Delta table a DataFrame scans: its location, the version (None: the latest, to
    be pinned now), the catalog name when read through the catalog, and whether the
    version came from time travel (checked against Spark's own time-travel read)."""

    path: str
    version: int | None
    name: str | None
    time_travel: bool


def pin_delta_scan(df: Any) -> Any | None:
    """``df`` as the pinned read of the Delta snapshot it scans (see the module doc), or
    None: it already holds a pinned read, is no plain scan of one Delta table, or what the
    plan says cannot be confirmed."""
    if pinned_reads(df):
        return None
    scan = delta_scan(df)
    if scan is None:
        return None
    spark = df.sparkSession
    columns = list(df.columns)
    try:
        if scan.time_travel:  # the version read from the plan must be the one Spark reads
            travel = spark.read.format("delta").option("versionAsOf", scan.version)
            if int(travel.load(scan.path).select(*columns).semanticHash()) != int(
                df.select(*columns).semanticHash()
            ):
                return None
        extra = {"catalog_table": scan.name} if scan.name else None
        pinned = read_pinned(spark, scan.path, scan.version, engine="spark", extra=extra)
        if pinned.columns != columns:
            pinned = pinned.select(*columns)
        if _fields(pinned.schema) != _fields(df.schema):
            return None
    except Exception:  # a plan or table that does not read back as described: leave it
        return None
    return pinned


def delta_scan(df: Any) -> DeltaScan | None:
    """The Delta table ``df`` scans when its plan is one Delta relation under nothing but
    aliases and selections of plain columns; else None."""
    with contextlib.suppress(Exception):
        jdf = getattr(df, "_jdf", None)
        if jdf is not None:
            return _classic_scan(jdf)
        return _connect_scan(df)
    return None


def _fields(schema: Any) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


def _plain_shape(analyzed: str) -> tuple[str | None, str | None] | None:
    """From an analysed plan's text: ``(catalog name, delta.`path` path)`` when the plan is
    ``Project`` of plain columns and ``SubqueryAlias`` nodes above one file ``Relation``;
    else None."""
    plain = plain_leaf(analyzed)
    if plain is None:
        return None
    leaf, above = plain
    relation = _RELATION.match(leaf)
    if relation is None or relation.group(2) != "parquet":
        return None
    name = relation.group(1) or None
    path = None
    by_path = _PATH_ALIAS.match(above)
    if by_path is not None:
        path = by_path.group(1)
    elif name is None and "." in above and "`" not in above:
        name = above  # a time-travel read of a catalog table: its alias is the name
    return name, path


def _local(uri: str) -> str:
    """``file:`` URIs as local paths (what ``open_delta`` and the tests name tables by)."""
    if uri.startswith("file:"):
        return unquote(urlparse(uri).path)
    return uri


def _classic_scan(jdf: Any) -> DeltaScan | None:
    analyzed = jdf.queryExecution().analyzed()
    shape = _plain_shape(str(analyzed.toString()))
    if shape is None:
        return None
    node = analyzed
    while node.children().size() == 1:
        node = node.children().apply(0)
    index = node.relation().location()
    if "TahoeLogFileIndex" not in str(index.getClass().getName()):
        return None
    travel = bool(index.isTimeTravelQuery())
    version = int(index.getSnapshot().version())
    return DeltaScan(_local(str(index.path().toString())), version, shape[0], travel)


def _connect_scan(df: Any) -> DeltaScan | None:
    sections = explain_sections(df)
    analyzed = sections.get("Analyzed Logical Plan", "")
    physical = sections.get("Physical Plan", "")
    shape = _plain_shape(analyzed)
    if shape is None or _DELTA_INDEX.search(physical) is None:
        return None
    name, path = shape
    options, paths = _reader_options(df)
    parsed = sections.get("Parsed Logical Plan", "")
    travel = _TIME_TRAVEL.search(parsed)
    if "timestampasof" in options or (travel is None and "RelationTimeTravel" in parsed):
        return None  # time travel by timestamp: not pinned from the plan
    version: int | None = None
    if travel is not None:
        version = int(travel.group(2))
    elif "versionasof" in options:
        version = int(options["versionasof"])
    if path is None and len(paths) == 1:
        path = paths[0]
    if path is None and name is not None:
        spark = df.sparkSession
        path = str(spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]["location"])
    if path is None:
        return None
    return DeltaScan(_local(path), version, name, version is not None)


def _reader_options(df: Any) -> tuple[dict[str, str], list[str]]:
    """The Delta reader's options (lower-cased keys) and paths in a Connect client plan whose
    leaf is ``spark.read.format("delta")...load(path)``; empty otherwise."""
    plan: Any = getattr(df, "_plan", None)
    while plan is not None and getattr(plan, "_child", None) is not None:
        plan = plan._child
    if type(plan).__name__ != "DataSource" or str(plan._format).lower() != "delta":
        return {}, []
    options = {str(k).lower(): str(v) for k, v in (plan._options or {}).items()}
    paths = list(plan._paths or [])
    if not paths and "path" in options:
        paths = [options["path"]]
    return options, paths
