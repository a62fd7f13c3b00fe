"""Version-pinned Delta reads as Spark DataFrames, with or without delta-spark.

:func:`read_delta` returns the DataFrame of one snapshot of a Delta table and records
which snapshot it is, so a dataset written from it can name its source (table, version,
commit time) in ``spark_dl.json``.

Two paths, same rows:

* **delta-spark** — when the session can read Delta itself (``spark.sql.extensions``
  names ``DeltaSparkSessionExtension``, the catalog is ``DeltaCatalog``, or the runtime
  ships Delta, e.g. Databricks), we use its time travel:
  ``spark.read.format("delta").option("versionAsOf", N).load(path)``.
* **deltalake** — otherwise the snapshot is resolved on the driver with ``deltalake``
  (delta-rs, no JVM jars): exactly that version's data files are read with
  ``spark.read.parquet(*files)`` and ``basePath`` so partition columns come back, with the
  table schema given explicitly. Plain Parquet cannot apply deletion vectors, so a
  snapshot that has them is read through Arrow on the driver
  (``spark.createDataFrame(arrow_table)``): correct, but bounded by driver memory — fine
  for small and medium tables; for large tables with deletion vectors configure
  delta-spark or run ``OPTIMIZE``/``REORG ... APPLY (PURGE)`` first.

Both paths work with classic and Spark Connect sessions: nothing here touches the JVM
gateway directly.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import TYPE_CHECKING, Any, Literal

from spark_dl_core.delta import DeltaSnapshot, DeltaSnapshotError, Timestamp, open_delta

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

Engine = Literal["auto", "spark", "deltalake"]

# Above this many rows, the Arrow fallback for deletion vectors warns (driver memory).
ARROW_FALLBACK_WARN_ROWS = 5_000_000

_LINEAGE_ATTR = "_spark_dl_lineage"
_registry: dict[int, dict[str, Any]] = {}

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
    version: int | None = None,
    timestamp: Timestamp | None = None,
    *,
    engine: Engine = "auto",
    storage_options: dict[str, str] | None = None,
) -> DataFrame:
    """The DataFrame of ``path`` at ``version`` (or the last commit at/before ``timestamp``).

    With neither, the latest version is resolved now and pinned, so the DataFrame does not
    drift when new commits land. ``engine`` forces a path (``"spark"`` needs delta-spark).
    Errors name the table, the asked version and the versions available.
    """
    uri = os.fspath(path)
    use_spark = engine == "spark" or (engine == "auto" and session_reads_delta(spark))
    if use_spark:
        df, lineage = _read_with_spark(spark, uri, version, timestamp, storage_options)
    else:
        snapshot = open_delta(
            uri, version=version, timestamp=timestamp, storage_options=storage_options
        )
        df = _read_with_deltalake(spark, snapshot)
        lineage = snapshot.lineage()
        lineage["reader"] = "spark-parquet" if not snapshot.has_deletion_vectors else "spark-arrow"
    _remember(df, lineage)
    return df


def lineage_for(df: DataFrame) -> dict[str, Any] | None:
    """The Delta snapshot a DataFrame from :func:`read_delta` came from, or None.

    Matches the very DataFrame object, else one with the same analysed plan
    (``semanticHash``): a derived DataFrame (``select``, ``filter``…) has no lineage of its
    own here — the writer records it as a query over an unknown source.
    """
    found = getattr(df, _LINEAGE_ATTR, None)
    if found is not None:
        return dict(found)
    try:
        key = df.semanticHash()
    except Exception:
        return None
    found = _registry.get(key)
    return dict(found) if found is not None else None


def _remember(df: DataFrame, lineage: dict[str, Any]) -> None:
    with contextlib.suppress(AttributeError):  # slotted DataFrame classes
        setattr(df, _LINEAGE_ATTR, lineage)
    with contextlib.suppress(Exception):  # a plan that cannot be hashed
        _registry[df.semanticHash()] = lineage


# --------------------------------------------------------------------------- delta-spark


def _read_with_spark(
    spark: SparkSession,
    uri: str,
    version: int | None,
    timestamp: Timestamp | None,
    storage_options: dict[str, str] | None,
) -> tuple[DataFrame, dict[str, Any]]:
    """Time travel with delta-spark (not exercised in CI: no Delta jars there).

    The version is pinned before reading — with ``deltalake`` when it is installed (cheap,
    also validates the version with our error message), else ``DESCRIBE HISTORY`` — so the
    recorded lineage names a concrete version even for timestamp or latest reads.
    """
    pinned: int | None = version
    ts: str | None = None
    try:
        snap = open_delta(
            uri, version=version, timestamp=timestamp, storage_options=storage_options
        )
        pinned, ts = snap.version, snap.timestamp
    except ImportError:
        pass
    except DeltaSnapshotError as exc:
        # Only features our reader refuses (column mapping…) are fine for delta-spark.
        if "reader" not in str(exc) and "column mapping" not in str(exc):
            raise
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
    return df, lineage


# --------------------------------------------------------------------------- deltalake


def _read_with_deltalake(spark: SparkSession, snapshot: DeltaSnapshot) -> DataFrame:
    from pyspark.sql.pandas.types import from_arrow_schema

    names = snapshot.schema.names
    if snapshot.has_deletion_vectors or not snapshot.files:
        table = snapshot.to_arrow()
        if table.num_rows > ARROW_FALLBACK_WARN_ROWS:
            warnings.warn(
                f"{snapshot.table_uri}@{snapshot.version} has deletion vectors; its "
                f"{table.num_rows} rows go through driver memory. Configure delta-spark or "
                "purge the deletion vectors for large tables.",
                stacklevel=3,
            )
        if table.num_rows == 0:
            return spark.createDataFrame([], schema=from_arrow_schema(snapshot.schema))
        return spark.createDataFrame(table)
    data_fields = [f for f in snapshot.schema if f.name not in snapshot.partition_columns]
    part_fields = [snapshot.schema.field(c) for c in snapshot.partition_columns]
    import pyarrow as pa

    read_schema = from_arrow_schema(pa.schema(data_fields + part_fields))
    reader = spark.read.schema(read_schema)
    if snapshot.partition_columns:
        reader = reader.option("basePath", snapshot.table_uri)
    return reader.parquet(*snapshot.files).select(*names)
