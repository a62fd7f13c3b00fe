"""Iceberg DataFrames of Spark's Iceberg reader, taken as reads of one pinned snapshot.

``spark.table("iceberg.db.t")``, ``spark.read.option("versionAsOf", id).table(...)``,
``SELECT * FROM iceberg.db.t VERSION AS OF id`` and ``spark.read.format("iceberg")
.load(...)``, whole or as a select of plain columns, hold the rows of one Iceberg snapshot:
:func:`iceberg_scan` reads the analysed plan (classic sessions: the JVM's
``DataSourceV2Relation`` over Iceberg's ``SparkTable``) for the catalog name, the snapshot
id Spark resolved (the current one when none was asked) and the table's metadata file.
``df.dl`` then records that table and snapshot as the lineage, writes from the pinned
snapshot (``versionAsOf``) so a commit landing meanwhile does not change what is written,
and ``in_place=True`` reads the snapshot's files through ``open_iceberg`` with no Spark job.

On Spark Connect the same reads are taken from the server's plan text
(:mod:`spark_dl.plan_text`): the physical plan's ``IcebergScan`` names the table and the
snapshot, and the table's ``metadata_log_entries`` its newest metadata file.

Anything more than the scan and a selection of columns (a filter, a join, a computed or
renamed column) or a branch other than ``main`` is not taken.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from .plan_text import explain_sections, plain_leaf

__all__ = ["IcebergScan", "iceberg_in_place", "iceberg_scan", "pin_iceberg_scan"]

_SPARK_TABLE = "org.apache.iceberg.spark.source.SparkTable"
# Connect's plan text: the analysed leaf and the physical plan's scan of an Iceberg table
_RELATION_V2 = re.compile(r"^RelationV2\[.*\] (\S+)(?: VERSION AS OF '\d+')?$")
_ICEBERG_SCAN = re.compile(
    r"IcebergScan\(table=(\S+), schemaId=\d+, snapshotId=(\d+), branch=(\S+), filters=([^,]*),"
)


@dataclass(frozen=True)
class IcebergScan:
    """The Iceberg snapshot a DataFrame reads: catalog name (``iceberg.db.t``), snapshot
    id, the table's metadata file (naming that snapshot) and the DataFrame's columns."""

    name: str
    snapshot_id: int
    metadata: str
    columns: tuple[str, ...]

    def lineage(self) -> dict[str, Any]:
        """What a dataset written from this DataFrame records as its source."""
        return {
            "kind": "iceberg",
            "table": self.name,
            "catalog_table": self.name,
            "snapshot_id": self.snapshot_id,
            "metadata": self.metadata,
            "columns": list(self.columns),
            "reader": "spark",
        }


def iceberg_scan(df: Any) -> IcebergScan | None:
    """The snapshot ``df`` scans when its analysed plan is one Iceberg relation under
    nothing but aliases and selections of plain columns; else None."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:  # Spark Connect: the plan's JVM objects are out of reach
        return _connect_scan(df)
    with contextlib.suppress(Exception):
        node = jdf.queryExecution().analyzed()
        while str(node.nodeName()) in ("Project", "SubqueryAlias"):
            if str(node.nodeName()) == "Project" and not _plain(node):
                return None
            node = node.children().apply(0)
        if not str(node.getClass().getName()).endswith(".DataSourceV2Relation"):
            return None
        table = node.table()
        if str(table.getClass().getName()) != _SPARK_TABLE:
            return None
        branch = table.branch()
        if branch is not None and str(branch) != "main":
            return None
        ice = table.table()
        chosen = table.snapshotId()
        if chosen is None:
            current = ice.currentSnapshot()
            if current is None:
                return None  # no snapshot yet: nothing pinned
            chosen = current.snapshotId()
        metadata = str(ice.operations().current().metadataFileLocation())
        # "iceberg.db.t" for a catalog's table (Iceberg names its tables with the catalog;
        # the catalog object is left alone: Py4J's reflection over Iceberg's SparkCatalog
        # meets view classes that Spark 4.2 no longer has)
        name = str(table.name())
        return IcebergScan(name, int(chosen), _local(metadata), tuple(df.columns))
    return None


def _connect_scan(df: Any) -> IcebergScan | None:
    """:func:`iceberg_scan` from the server's plan text: the analysed plan's shape and the
    one ``IcebergScan`` of the physical plan, which names the table, the snapshot Spark
    resolved, no branch and no pushed filter; the metadata file from the table's
    ``metadata_log_entries``."""
    with contextlib.suppress(Exception):
        sections = explain_sections(df)
        plain = plain_leaf(sections.get("Analyzed Logical Plan", ""))
        relation = _RELATION_V2.match(plain[0]) if plain is not None else None
        scans = _ICEBERG_SCAN.findall(sections.get("Physical Plan", ""))
        if relation is None or len(scans) != 1:
            return None
        table, snapshot, branch, filters = scans[0]
        name = relation.group(1)
        if table != name or branch not in ("null", "main") or filters:
            return None
        newest = df.sparkSession.sql(
            f"SELECT file FROM {name}.metadata_log_entries ORDER BY timestamp DESC LIMIT 1"
        ).collect()
        if newest:
            return IcebergScan(name, int(snapshot), _local(str(newest[0][0])), tuple(df.columns))
    return None


def pin_iceberg_scan(df: Any) -> tuple[Any, IcebergScan] | None:
    """``df`` as the read of its pinned snapshot (``versionAsOf``, the same columns), with
    the scan; None when ``df`` is not a plain Iceberg scan (see :func:`iceberg_scan`)."""
    scan = iceberg_scan(df)
    if scan is None:
        return None
    try:
        pinned = df.sparkSession.read.option("versionAsOf", scan.snapshot_id).table(scan.name)
        pinned = pinned.select(*scan.columns)
        if [(f.name, f.dataType) for f in pinned.schema.fields] != [
            (f.name, f.dataType) for f in df.schema.fields
        ]:
            return None
    except Exception:  # a name or snapshot that does not read back as described
        return None
    return pinned, scan


def iceberg_in_place(df: Any) -> Any | None:
    """The core's pinned snapshot (``open_iceberg``, projected to ``df``'s columns) that a
    plain Iceberg scan reads, or None when ``df`` is not one."""
    scan = iceberg_scan(df)
    if scan is None:
        return None
    from spark_dl_core.tables.iceberg.table import open_iceberg

    return open_iceberg(scan.metadata, snapshot_id=scan.snapshot_id, columns=list(scan.columns))


def _plain(project: Any) -> bool:
    """A ``Project`` whose every item is a column as it is (no alias, no expression)."""
    items = project.projectList()
    return all(
        str(items.apply(i).getClass().getSimpleName()) == "AttributeReference"
        for i in range(items.size())
    )


def _local(uri: str) -> str:
    if uri.startswith("file:"):
        return unquote(urlparse(uri).path)
    return uri
