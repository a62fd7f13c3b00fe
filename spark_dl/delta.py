"""Version-pinned Delta reads as Spark DataFrames, with or without delta-spark.

:func:`read_delta` returns the DataFrame of one snapshot of a Delta table and records
which snapshot it is, so a dataset written from it (or from a DataFrame derived from it by
``select``, ``filter``, ``withColumn``…) names its source (table, version, commit time) in
``spark_dl.json``, and is written in the snapshot's canonical order.

Two paths, same rows:

* **delta-spark** — when the session can read Delta itself (``spark.sql.extensions``
  names ``DeltaSparkSessionExtension``, the catalog is ``DeltaCatalog``, or the runtime
  ships Delta, e.g. Databricks), we use its time travel:
  ``spark.read.format("delta").option("versionAsOf", N).load(path)``.
* **deltalake** — otherwise the snapshot is resolved on the driver with ``deltalake``
  (delta-rs, no JVM jars): exactly that version's data files are read with
  ``spark.read.parquet(*files)`` and ``basePath`` so partition columns come back, with the
  table schema given explicitly. Deletion vectors become a filter on the file scan's
  ``_metadata.file_name`` / ``_metadata.row_index``; beyond :data:`DV_FILTER_MAX_ROWS`
  deleted rows (or when data file names repeat) the snapshot is read through Arrow on
  the driver instead (``spark.createDataFrame``): correct, but bounded by driver memory.

Lineage travels in the plan: the DataFrame is wrapped in a subquery alias
``__spark_dl_delta_<token>`` (invisible to column names), and :func:`lineage_for` finds
that token in any DataFrame whose plan contains it — on classic sessions in the analysed
plan, on Spark Connect in the client-side plan tree (or the server's plan, for SQL views).

Both paths work with classic and Spark Connect sessions.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from spark_dl_core.tables.delta.columns import names_agree
from spark_dl_core.tables.delta.snapshot import (
    DeltaSnapshot,
    DeltaSnapshotError,
    Timestamp,
    UnsupportedDeltaFeatureError,
)
from spark_dl_core.tables.delta.table import open_delta

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

Engine = Literal["auto", "spark", "deltalake"]

# Above this many rows, the Arrow fallback for deletion vectors warns (driver memory).
ARROW_FALLBACK_WARN_ROWS = 5_000_000
# Up to this many deleted rows, deletion vectors are applied as a filter on the file scan.
DV_FILTER_MAX_ROWS = 100_000

ALIAS_PREFIX = "__spark_dl_delta_"
_ALIAS_RE = re.compile(re.escape(ALIAS_PREFIX) + r"[0-9a-f]{16}")


@dataclass(frozen=True)
class PinnedRead:
    """What :func:`read_delta` recorded about the DataFrames it returned for one snapshot."""

    lineage: dict[str, Any]
    # data file base names in canonical order, when rows carry ``_metadata.file_name``
    files: tuple[str, ...] | None
    semantic_hash: int | None
    # the table's logical schema (nullability from the Delta log), when known
    schema: pa.Schema | None = None
    # every DataFrame returned for this snapshot (each read has its own column ids)
    frames: tuple[Any, ...] = ()
    # how the table was opened (a read in place opens it again: delta_inplace)
    storage_options: dict[str, str] | None = None


# Plan nodes (classic analysed plan, Spark Connect client plan) that pass a column through
# with its values unchanged and add no rows from elsewhere: a column the Delta log declares
# NOT NULL cannot become null through them. Joins, unions, aggregates are not among them.
_KEEPING_NODES = frozenset(
    {
        *("Project", "Filter", "Sort", "Limit", "GlobalLimit", "LocalLimit", "Offset", "Tail"),
        *("SubqueryAlias", "Repartition", "RepartitionByExpression", "Sample", "Deduplicate"),
        *("Distinct", "WithColumns", "WithColumnsRenamed", "Drop", "Hint", "ResolvedHint"),
        "ToDF",
    }
)


# Those of them through which every row still names its data file (the scan's ``_metadata``
# resolves above them): aggregations (``Distinct``, ``Deduplicate``) make new rows.
_FILE_ROW_NODES = _KEEPING_NODES - {"Distinct", "Deduplicate"}


@dataclass(frozen=True)
class FileOrderBlock:
    """Why a DataFrame over one pinned read is not written in the snapshot's file order:
    the plan node in the way (the first from the top), and whether it is a sort the user
    asked for (kept) rather than a node after which rows no longer name their file."""

    node: str
    sorted: bool


_registry: dict[str, PinnedRead] = {}

__all__ = ["DeltaSnapshotError", "lineage_for", "read_delta", "session_reads_delta"]


def session_reads_delta(spark: SparkSession) -> bool:
    """Whether ``spark`` can read Delta itself (delta-spark configured, or a Delta runtime)."""

    def conf(key: str) -> str:
        try:
            return str(spark.conf.get(key, "") or "")
        except Exception:  # Spark Connect may refuse some keys
            return ""

    if "DeltaSparkSessionExtension" in conf("spark.sql.extensions"):
        return True
    if "DeltaCatalog" in conf("spark.sql.catalog.spark_catalog"):
        return True
    return bool(conf("spark.databricks.clusterUsageTags.sparkVersion")) or bool(
        os.environ.get("DATABRICKS_RUNTIME_VERSION")
    )


def read_delta(
    spark: SparkSession,
    path: str | os.PathLike[str],
    *,
    version: int | None = None,
    timestamp: Timestamp | None = None,
    engine: Engine = "auto",
    storage_options: dict[str, str] | None = None,
) -> DataFrame:
    """The DataFrame of ``path`` at ``version`` (or the last commit at/before ``timestamp``).

    With neither, the latest version is resolved now and pinned, so the DataFrame does not
    drift when new commits land. ``engine`` forces a path (``"spark"`` needs delta-spark).
    Errors name the table, the asked version and the versions available.
    """
    return read_pinned(
        spark,
        os.fspath(path),
        version,
        timestamp=timestamp,
        engine=engine,
        storage_options=storage_options,
    )


def read_pinned(
    spark: SparkSession,
    uri: str,
    version: int | None,
    *,
    timestamp: Timestamp | None = None,
    engine: Engine = "auto",
    storage_options: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> DataFrame:
    """:func:`read_delta`, with ``extra`` keys added to the recorded lineage (the catalog
    name of a table pinned from a DataFrame over it: :mod:`spark_dl.delta_scan`)."""
    use_spark = engine == "spark" or (engine == "auto" and session_reads_delta(spark))
    files: tuple[str, ...] | None
    schema: pa.Schema | None = None
    if use_spark:
        df, lineage, files, schema = _read_with_spark(
            spark, uri, version, timestamp, storage_options
        )
    else:
        snapshot = open_delta(
            uri, version=version, timestamp=timestamp, storage_options=storage_options
        )
        df, reader = _read_with_deltalake(spark, snapshot)
        lineage = snapshot.lineage()
        lineage["reader"] = reader
        files = tuple(snapshot.file_names) if reader != "spark-arrow" else None
        schema = snapshot.output_schema
    lineage.update(extra or {})
    # Same snapshot, same token: equal plans keep equal semantic hashes (converter cache).
    identity = json.dumps([lineage, files, df.schema.json()], sort_keys=True, default=str)
    token = ALIAS_PREFIX + hashlib.sha256(identity.encode()).hexdigest()[:16]
    df = df.alias(token)
    semantic: int | None = None
    with contextlib.suppress(Exception):  # a plan that cannot be hashed
        semantic = int(df.semanticHash())
    earlier = _registry.get(token)
    frames = (*earlier.frames, df) if earlier is not None else (df,)
    _registry[token] = PinnedRead(lineage, files, semantic, schema, frames, storage_options)
    return df


def _plan_tokens(df: Any) -> list[str]:
    """The read_delta tokens in ``df``'s plan, in first-seen order."""
    found: list[str] = []
    jdf = getattr(df, "_jdf", None)
    if jdf is not None:  # classic: the analysed plan names every subquery alias
        with contextlib.suppress(Exception):
            found = _ALIAS_RE.findall(jdf.queryExecution().analyzed().toString())
    else:
        plan = getattr(df, "_plan", None)
        if plan is not None:
            found = _walk_connect_plan(plan)
        if not found:  # e.g. a SQL view over a read_delta DataFrame: ask the server
            with contextlib.suppress(Exception):
                found = _ALIAS_RE.findall(df._explain_string(extended=True))
    return list(dict.fromkeys(found))


def _walk_connect_plan(root: Any) -> list[str]:
    from pyspark.sql.connect.plan import LogicalPlan

    out: list[str] = []
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        alias = getattr(node, "_alias", None)
        if isinstance(alias, str) and _ALIAS_RE.fullmatch(alias):
            out.append(alias)
        for value in vars(node).values():
            items = value if isinstance(value, (list, tuple)) else [value]
            stack.extend(v for v in items if isinstance(v, LogicalPlan))
    return out


def pinned_reads(df: DataFrame) -> list[PinnedRead]:
    """What :func:`read_delta` recorded for each pinned read ``df``'s plan contains."""
    return [_registry[t] for t in _plan_tokens(df) if t in _registry]


def delta_fields(df: DataFrame) -> pa.Schema | None:
    """The Delta table's own fields (nullability from its log) for the columns ``df`` takes
    unchanged from one pinned read; None when there are none.

    Spark reads Parquet files as all-nullable, so without this a Spark write would record
    another schema, other null masks and another fingerprint than the core's export of the
    same version. A column counts only when every plan node between ``df`` and the read
    keeps values (:data:`_KEEPING_NODES`) and ``df``'s column is the read's own column (not
    one recomputed under the same name).
    """
    tokens = [t for t in _plan_tokens(df) if t in _registry]
    if len(tokens) != 1 or _registry[tokens[0]].schema is None:
        return None
    read = _registry[tokens[0]]
    assert read.schema is not None
    names = [c for c in df.columns if c in read.schema.names]
    if not names or not _keeps_values(df, tokens[0]):
        return None
    same = False
    with contextlib.suppress(Exception):
        same = read.semantic_hash is not None and int(df.semanticHash()) == read.semantic_hash
    if not same:
        names = _own_columns(df, names, read.frames)
    return pa.schema([read.schema.field(c) for c in names]) if names else None


def _nodes_above(df: Any, token: str) -> tuple[list[str], bool]:
    """The plan's node names from ``df``'s root down towards the read aliased ``token``
    (classic: the analysed plan; Connect: the client's plan), and whether that alias was
    reached through nodes of one child each; the walk stops at its alias, or at the first
    node of another shape (a join, a union: listed) or that cannot be walked."""
    names: list[str] = []
    jdf = getattr(df, "_jdf", None)
    try:
        if jdf is not None:
            node = jdf.queryExecution().analyzed()
            while True:
                name = str(node.nodeName())
                if name == "SubqueryAlias" and str(node.alias()) == token:
                    return names, True
                names.append(name)
                if node.children().size() != 1:
                    return names, False
                node = node.children().apply(0)
        plan = getattr(df, "_plan", None)
        while plan is not None:
            name = type(plan).__name__
            if name == "SubqueryAlias" and getattr(plan, "_alias", None) == token:
                return names, True
            names.append(name)
            plan = getattr(plan, "_child", None)
    except Exception:  # a plan we cannot walk: claim nothing
        pass
    return names, False


def _keeps_values(df: Any, token: str) -> bool:
    """Whether the plan from ``df`` down to the read aliased ``token`` is a chain of nodes
    that keep column values (classic: the analysed plan; Connect: the client's plan)."""
    names, reached = _nodes_above(df, token)
    return reached and all(n in _KEEPING_NODES for n in names)


def file_order_block(df: DataFrame) -> FileOrderBlock | None:
    """What keeps ``df``, which reads one pinned snapshot, from being written in the
    snapshot's file order (None: nothing, its rows still name their file). Decided from
    the plan, never by resolving ``_metadata`` and failing (PySpark logs every failed
    analysis as an ERROR with its stack trace). A sort (``orderBy``, ``sort``,
    ``sortWithinPartitions``) is the user's order: it is kept, not replaced by the files'."""
    tokens = [t for t in _plan_tokens(df) if t in _registry]
    if len(tokens) != 1:
        return FileOrderBlock("several reads", sorted=False)
    names, reached = _nodes_above(df, tokens[0])
    for name in names:
        if name == "Sort":
            return FileOrderBlock(name, sorted=True)
        if name not in _FILE_ROW_NODES:
            return FileOrderBlock(name, sorted=False)
    return None if reached else FileOrderBlock(names[-1] if names else "unknown", sorted=False)


def _own_columns(df: Any, names: list[str], frames: tuple[Any, ...]) -> list[str]:
    """The ``names`` whose column in ``df`` is the pinned read's column itself: Spark
    resolves a read's column reference in ``df`` only then (a ``withColumn`` of the same
    name, an alias or a rename makes a new column)."""

    def resolves(cols: list[str]) -> bool:
        for frame in frames:
            with contextlib.suppress(Exception):
                df.select(*[frame[c] for c in cols]).schema  # noqa: B018 - analysis only
                return True
        return False

    return names if resolves(names) else [c for c in names if resolves([c])]


def lineage_for(df: DataFrame) -> dict[str, Any] | None:
    """The Delta snapshot a DataFrame from :func:`read_delta` came from, or None.

    A DataFrame derived from it (``select``, ``filter``, ``withColumn``, a join…) carries
    the snapshot too, marked ``"derived": true``; one that combines several pinned reads
    gets ``{"kind": "query", "inputs": [...]}``. None when no pinned read is in its plan
    (or the plan went through a checkpoint, ``createDataFrame`` or another process).
    """
    reads = pinned_reads(df)
    if not reads:
        return None
    if len(reads) > 1:
        return {"kind": "query", "inputs": [dict(r.lineage) for r in reads]}
    read = reads[0]
    lineage = dict(read.lineage)
    same = False
    with contextlib.suppress(Exception):
        same = read.semantic_hash is not None and int(df.semanticHash()) == read.semantic_hash
    if not same:
        lineage["derived"] = True
    return lineage


def source_option(df: DataFrame) -> str | None:
    """``lineage_for(df)`` as the JSON the ``mds`` writer's ``source`` option takes."""
    lineage = lineage_for(df)
    return None if lineage is None else json.dumps(lineage, sort_keys=True)


def canonical_files(df: DataFrame) -> tuple[str, ...] | None:
    """The canonical file order to write ``df`` in, when it reads exactly one pinned
    snapshot whose rows can name their data file (``_metadata``); else None."""
    reads = pinned_reads(df)
    if len(reads) != 1 or reads[0].files is None:
        return None
    return reads[0].files


# --------------------------------------------------------------------------- delta-spark


def _read_with_spark(
    spark: SparkSession,
    uri: str,
    version: int | None,
    timestamp: Timestamp | None,
    storage_options: dict[str, str] | None,
) -> tuple[DataFrame, dict[str, Any], tuple[str, ...] | None, pa.Schema | None]:
    """Time travel with delta-spark (the tests' sessions have it: ``with_delta``).

    The version is pinned before reading — with ``deltalake`` when it is installed (cheap,
    also validates the version with our error message), else ``DESCRIBE HISTORY`` — so the
    recorded lineage names a concrete version even for timestamp or latest reads.
    """
    pinned: int | None = version
    ts: str | None = None
    files: tuple[str, ...] | None = None
    schema: pa.Schema | None = None
    try:
        snap = open_delta(
            uri, version=version, timestamp=timestamp, storage_options=storage_options
        )
        pinned, ts, schema = snap.version, snap.timestamp, snap.schema
        names = snap.file_names
        if len(set(names)) == len(names):  # delta-spark exposes _metadata.file_name too
            files = tuple(names)
    except ImportError:
        pass
    except UnsupportedDeltaFeatureError:
        pass  # column mapping and other features the JVM-free reader refuses: fine here
    if pinned is None and timestamp is None:
        row = spark.sql(f"DESCRIBE HISTORY delta.`{uri}` LIMIT 1").collect()[0]
        pinned = int(row["version"])
    reader = spark.read.format("delta")
    if pinned is not None:
        reader = reader.option("versionAsOf", pinned)
    elif timestamp is not None:
        reader = reader.option("timestampAsOf", str(timestamp))
    df = reader.load(uri)
    lineage = {
        "kind": "delta",
        "table": uri,
        "version": pinned,
        "timestamp": ts,
        "columns": None,
        "filter": None,
        "reader": "delta-spark",
    }
    return df, lineage, files, schema


# --------------------------------------------------------------------------- deltalake


def _read_with_deltalake(spark: SparkSession, snapshot: DeltaSnapshot) -> tuple[DataFrame, str]:
    """The snapshot's DataFrame and how it was read (``spark-parquet`` / ``spark-arrow``)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    deleted = snapshot.deleted_rows()
    unique = len(set(snapshot.file_names)) == len(snapshot.files)
    too_many = sum(len(rows) for rows in deleted.values()) > DV_FILTER_MAX_ROWS
    keys = _relative_paths(snapshot) if snapshot.partition_columns else None
    unkeyed = bool(snapshot.partition_columns) and keys is None
    by_name = _readable_by_name(snapshot)
    if not snapshot.files or (deleted and (too_many or not unique)) or unkeyed or not by_name:
        table = snapshot.to_arrow()
        if table.num_rows > ARROW_FALLBACK_WARN_ROWS:
            warnings.warn(
                f"{snapshot.table_uri}@{snapshot.version}: its {table.num_rows} rows go "
                "through driver memory (many deleted rows, repeated data file names, data "
                "files outside the table's directory, or column ids that name other columns "
                "than their physical names). Configure delta-spark or purge the deletion "
                "vectors for large tables.",
                stacklevel=3,
            )
        if table.num_rows == 0:
            empty = spark.createDataFrame([], schema=from_arrow_schema(snapshot.schema))
            return empty, "spark-arrow"
        return spark.createDataFrame(table), "spark-arrow"
    data_fields = [f for f in snapshot.schema if f.name not in snapshot.partition_columns]
    read_schema = pa.schema(data_fields)
    if snapshot.column_mapping is not None:  # the files' physical names, renamed at the end
        read_schema = snapshot.column_mapping.physical_schema(read_schema.names)
    # Leaf files, no basePath: Spark infers no partition columns from directory names
    # (which it would unescape its own way and parse in the session time zone).
    df = spark.read.schema(from_arrow_schema(read_schema)).parquet(*snapshot.files)
    if deleted:  # deletion vectors as a filter on each row's (file, row index)
        gone = None
        for name, rows in deleted.items():
            hit = (F.col("_metadata.file_name") == name) & F.col("_metadata.row_index").isin(rows)
            gone = hit if gone is None else gone | hit
        assert gone is not None
        df = df.filter(~gone)
    if keys is not None:
        df = _with_partition_values(df, snapshot, keys)
    return df.select(*_logical_columns(snapshot)), "spark-parquet"


def _readable_by_name(snapshot: DeltaSnapshot) -> bool:
    """Whether Spark, which resolves Parquet columns by name, reads the snapshot's files
    right: always without column mapping; under it, each file's footer is checked (a file
    lacking a column it should hold raises the core's error naming it)."""
    mapping = snapshot.column_mapping
    if mapping is None or not snapshot.files:
        return True
    import pyarrow.parquet as pq

    filesystem, prefix = snapshot._filesystem()
    names = [n for n in snapshot.schema.names if n not in snapshot.partition_columns]

    def agrees(uri: str) -> bool:
        try:
            schema = pq.read_schema(snapshot._fs_path(uri, prefix), filesystem=filesystem)
        except (OSError, pa.ArrowException):
            return False  # the Arrow path reads it and names what is wrong
        snapshot.file_columns(schema, names, uri)
        return names_agree(mapping, schema)

    with ThreadPoolExecutor(max_workers=min(16, len(snapshot.files))) as pool:
        return all(pool.map(agrees, snapshot.files))


def _logical_columns(snapshot: DeltaSnapshot) -> list[Any]:
    """The snapshot's columns under their logical names: physical columns renamed (nested
    structs cast, which Spark does field by field in order) under column mapping."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type

    mapping = snapshot.column_mapping
    if mapping is None:
        return list(snapshot.schema.names)
    out = []
    for f in snapshot.schema:
        if f.name in snapshot.partition_columns:
            out.append(F.col(f.name))
        else:
            physical = F.col(f"`{mapping.physical_name(f.name)}`")
            out.append(physical.cast(from_arrow_type(f.type)).alias(f.name))
    return out


def _relative_paths(snapshot: DeltaSnapshot) -> list[str] | None:
    """Each data file's path under the table root (decoded), when all files lie under it at
    one depth, as Hive-partitioned tables' files do: what a row's file is known by."""
    from urllib.parse import unquote

    root = snapshot.table_uri if "://" not in snapshot.table_uri else unquote(snapshot.table_uri)
    root = root.rstrip("/") + "/"
    rel = [f[len(root) :] for f in snapshot.files if f.startswith(root)]
    if len(rel) != len(snapshot.files) or len({r.count("/") for r in rel}) != 1:
        return None
    return rel


def _with_partition_values(df: DataFrame, snapshot: DeltaSnapshot, keys: list[str]) -> DataFrame:
    """Partition columns from the log's values, looked up by each row's data file.

    The same values the core reads (timestamps as UTC instants), whatever the session time
    zone and however the writer escaped the directory names. A row's file is its
    ``_metadata.file_path`` (a URI) decoded once, cut to the depth of ``keys``.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type

    uri = F.regexp_replace(F.col("_metadata.file_path"), r"\+", "%2B")  # '+' is literal
    file = F.substring_index(F.url_decode(uri), "/", -(keys[0].count("/") + 1))
    texts = snapshot.partition_text()
    for c in snapshot.partition_columns:
        spark_type = from_arrow_type(snapshot.schema.field(c).type)
        pairs = [x for k, t in zip(keys, texts) if t[c] is not None for x in (k, t[c])]
        value = F.element_at(F.create_map(*map(F.lit, pairs)), file) if pairs else F.lit(None)
        df = df.withColumn(c, value.cast(spark_type))
    return df
