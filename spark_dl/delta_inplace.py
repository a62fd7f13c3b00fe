"""A ``read_delta`` DataFrame trained from in place: no Spark job, no MDS copy.

``df.dl.to_torch(..., in_place=True)`` reads the pinned Delta version itself (the core's
:class:`~spark_dl_core.tables.delta.in_place.DeltaDataset`, row groups as shards) when
``df`` is nothing but that pinned read, optionally with a column selection: its plan is the
read's plan under a ``select`` of plain columns, which Spark's semantic hash tells on classic
and Connect sessions alike. Anything else (a filter, a computed column, a join, a union, a
sample…) changes the rows or values, so only Spark can produce them: refused, saying which
plan node is in the way (or, with ``in_place="auto"``, a warning and the cached copy).
"""

from __future__ import annotations

import contextlib
from typing import Any

from spark_dl_core.errors import SpecError
from spark_dl_core.tables.delta.snapshot import DeltaSnapshot
from spark_dl_core.tables.delta.table import open_delta

from .delta import PinnedRead, pinned_reads

# Plan nodes that only select or name columns (classic analysed plan, Connect client plan).
_SELECTING = frozenset({"Project", "SubqueryAlias"})


class NotInPlaceError(SpecError):
    """``in_place=True`` for a DataFrame that is not only a pinned Delta read (says why)."""


def in_place_snapshot(df: Any) -> DeltaSnapshot:
    """The pinned snapshot ``df`` reads, projected to its columns; else NotInPlaceError."""
    reads = pinned_reads(df)
    if len(reads) != 1:
        why = "no spark_dl.read_delta read" if not reads else f"{len(reads)} pinned reads"
        raise NotInPlaceError(_why_not(why))
    read = reads[0]
    lineage = read.lineage
    where = f"{lineage.get('table')} at version {lineage.get('version')}"
    if not _only_selects(df, read):
        raise NotInPlaceError(_why_not(f"more than the read of {where}: {_in_the_way(df)}"))
    columns = list(df.columns)
    return open_delta(
        str(lineage["table"]),
        version=lineage["version"],
        columns=columns,
        storage_options=read.storage_options,
    )


def _why_not(reason: str) -> str:
    return (
        f"in_place=True: the DataFrame cannot be read in place, its plan has {reason}. "
        "Only spark_dl.read_delta(spark, uri, version=...) itself, or a select of its "
        "columns, can be: filter or transform rows in the loader (transforms=) instead, or "
        "leave in_place out to materialize the DataFrame into the cache (a copy)"
    )


def _only_selects(df: Any, read: PinnedRead) -> bool:
    """Whether ``df``'s plan equals one of the read's DataFrames with ``select(*columns)``."""
    try:
        mine = int(df.semanticHash())
    except Exception:  # a plan Spark cannot hash: claim nothing
        return False
    if read.semantic_hash is not None and mine == read.semantic_hash:
        return True
    for frame in read.frames:
        with contextlib.suppress(Exception):
            if int(frame.select(*df.columns).semanticHash()) == mine:
                return True
    return False


def _in_the_way(df: Any) -> str:
    """The first plan node above the read that is not a column selection, as Spark names
    it (``Filter``, ``Join``, ``Aggregate``…), or "a computed or renamed column"."""
    for name in _node_names(df):
        if name not in _SELECTING:
            return f"a {name}"
    return "a computed or renamed column"


def _node_names(df: Any) -> list[str]:
    """Plan node names from ``df`` down its first children (classic: the analysed plan;
    Connect: the client's plan), stopping at the pinned read's alias."""
    names: list[str] = []
    with contextlib.suppress(Exception):
        jdf = getattr(df, "_jdf", None)
        if jdf is not None:
            node = jdf.queryExecution().analyzed()
            while node is not None and not _is_read(str(node.nodeName()), node, True):
                names.append(str(node.nodeName()))
                children = node.children()
                node = children.apply(0) if children.size() else None
        else:
            plan = getattr(df, "_plan", None)
            while plan is not None and not _is_read(type(plan).__name__, plan, False):
                names.append(type(plan).__name__)
                plan = getattr(plan, "_child", None)
    return names


def _is_read(name: str, node: Any, classic: bool) -> bool:
    if name != "SubqueryAlias":
        return False
    alias = str(node.alias()) if classic else str(getattr(node, "_alias", ""))
    return alias.startswith("__spark_dl_delta_")
