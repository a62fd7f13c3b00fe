"""``read_delta(spark, uri, version=N).write.format("mds").mode("update").save(path)``: a
dataset that follows a Delta table, updated from Spark (docs/delta.md, docs/spark.md).

Spark has no ``update`` save mode (the JVM writer refuses the name, and Python data sources
see only append and overwrite), so ``import spark_dl``'s client-side writer takes it
(:mod:`.save_modes`) and hands it here. An update converts only the data files added since
the version the dataset holds and masks rows deleted since: it is the core's
``open_delta(uri, version=N, columns=...).write_mds(path, mode="update")``, run in the
client process with no Spark job. Hence it is only for a DataFrame that *is* the pinned
read (or a selection of its columns, the core's ``columns=``): anything else (a filter, a
computed column, a join…) is rows only Spark can produce, so it is refused, naming the
plan node in the way.
"""

from __future__ import annotations

from typing import Any

from spark_dl_core.errors import FollowError, SpecError
from spark_dl_core.tables.delta.snapshot import DeltaSnapshot
from spark_dl_core.tables.delta.table import open_delta
from spark_dl_core.writer import WriteResult

from .delta import pinned_reads
from .delta_inplace import _in_the_way, _only_selects
from .mds_options import OPTION_PREFIXES, SPEC_OPTIONS, _storage_options, spec_from_options

UPDATE = "update"
# options an update takes: the dataset's path, its spec (compared with the dataset's), storage
_UPDATE_OPTIONS = frozenset({"path", *SPEC_OPTIONS})


def is_update(mode: Any) -> bool:
    return mode is not None and str(mode).strip().lower() == UPDATE


def followed_snapshot(df: Any, path: str) -> DeltaSnapshot:
    """The pinned snapshot ``df`` is (projected to its columns when it selects some); a
    :class:`FollowError` naming the path (and table) for any other DataFrame."""
    reads = pinned_reads(df)
    if len(reads) != 1:
        what = "no spark_dl.read_delta read" if not reads else f"{len(reads)} pinned reads"
        raise FollowError(_refused(path, f"its plan has {what}"), path=path)
    read = reads[0]
    table, version = str(read.lineage["table"]), int(read.lineage["version"])
    if not _only_selects(df, read):
        why = f"its plan has more than the read of {table!r} version {version}: {_in_the_way(df)}"
        raise FollowError(_refused(path, why), table=table, path=path, asked=version)
    own = [list(frame.columns) for frame in read.frames]
    columns = None if list(df.columns) in own else list(df.columns)
    return open_delta(table, version=version, columns=columns, storage_options=read.storage_options)


def _refused(path: str, why: str) -> str:
    return (
        f"mode('update') of {path}: the DataFrame is not a pinned Delta version ({why}). An "
        "update converts only the data files added since the version the dataset holds, so "
        "it takes spark_dl.read_delta(spark, uri, version=N) itself, or a select of its "
        "columns; write other DataFrames with another mode (a full export). Nothing was "
        "written"
    )


def update_from_frame(df: Any, path: str, options: dict[str, str]) -> WriteResult:
    """Update the followed dataset at ``path`` to the version ``df`` reads (see the module
    docstring); ``options`` are the writer's (keys lowercased), spec and storage only."""
    lowered = {k.lower(): str(v) for k, v in options.items()}
    for key in lowered:
        if key not in _UPDATE_OPTIONS and not key.startswith(OPTION_PREFIXES):
            raise SpecError(
                f"option {key!r} has no meaning for mode('update') of format('mds') (an "
                "update takes the dataset's spec options and storage.<key> only)"
            )
    snap = followed_snapshot(df, path)
    spec_keys = [k for k in lowered if k in SPEC_OPTIONS or k.startswith("encoding.")]
    spec = spec_from_options(lowered, df.columns) if spec_keys else None
    storage = _storage_options(lowered) or None
    return snap.write_mds(path, spec, mode=UPDATE, storage_options=storage)
