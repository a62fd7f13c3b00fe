"""The Delta log's vocabulary, below every reader of it: the snapshot error, a data file's
identity and location as the log names it, commit history, and the small conversions the
snapshot, the in-place reader, ``since=``, following and carrying on all share. It imports no
other Delta module, so each of those can import it."""

from __future__ import annotations

import datetime as _dt
from typing import Any
from urllib.parse import unquote

import pyarrow.compute as pc

from ...errors import optional_import
from ...store.storage import uri_location
from ..parquet.table_files import TableError
from ..parquet.table_files import file_key as file_key  # the log's vocabulary, shared
from ..parquet.table_files import first_line as first_line
from ..parquet.table_files import utc_ms as utc_ms

Timestamp = _dt.datetime | str | int | float


class DeltaSnapshotError(TableError):
    """A Delta snapshot that cannot be read: names the table, the version asked, what exists."""

    def __init__(
        self,
        table: str,
        message: str,
        *,
        asked: object = None,
        available: tuple[int, int] | None = None,
    ) -> None:
        parts = [f"Delta table {table!r}"]
        if asked is not None:
            parts.append(f"at {asked}")
        text = " ".join(parts) + f": {message}"
        if available is not None:
            text += f" (versions available: {available[0]}..{available[1]})"
        super().__init__(text)
        self.table = table
        self.asked = asked
        self.available = available


class DeltaFilterError(DeltaSnapshotError):
    """A ``filter=`` that cannot be evaluated on the snapshot's columns: names the table,
    version and the column (``column``) or why."""

    def __init__(self, snap: Any, message: str, column: str | None = None) -> None:
        super().__init__(snap.table_uri, message, asked=f"version {snap.version}")
        self.column = column


class UnsupportedDeltaFeatureError(DeltaSnapshotError):
    """The snapshot is readable by Delta, but uses a feature the JVM-free reader refuses
    (column mapping, an unknown reader feature): delta-spark can still read it."""


def import_deltalake() -> Any:
    return optional_import("deltalake", "reading Delta tables without a JVM")


def iso_ms(ms: int | None) -> str | None:
    if ms is None:
        return None
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).isoformat(
        timespec="milliseconds"
    )


def commit_history(table: Any) -> list[tuple[int, int]]:
    """``(version, commit timestamp ms)`` of every commit still in the log, oldest first."""
    out = [(int(h["version"]), int(h["timestamp"])) for h in table.history() if "version" in h]
    return sorted(out)


def version_range(history: list[tuple[int, int]]) -> tuple[int, int] | None:
    return (history[0][0], history[-1][0]) if history else None


def log_location(uri: str) -> str:
    """A URI from the Delta log (``add.path`` joined to the table URI, a deletion vector's
    file path) as a location (:func:`~spark_dl_core.store.storage.uri_location`): the log
    escapes the already escaped partition directories again, so it is decoded once."""
    return uri_location(uri)


def log_locations(base: str, paths: list[str]) -> list[str]:
    """``[log_location(log_uri(base, p)) for p in paths]``, the table URI decoded once, not
    per file (10⁵ files: ~0.3 s less at open). A relative path's location is the decoded
    ``base + "/"`` then the decoded path: a percent-escape never spans the "/" between
    them (it is not a hex digit)."""
    head = log_location(base + "/")
    if head == "/":  # file:/// alone: its slashes run into the path's (left to log_location)
        return [log_location(log_uri(base, p)) for p in paths]
    out = []
    for p in paths:
        if "://" in p or p.startswith(("file:", "/")):
            out.append(log_location(p))
        else:
            out.append(head + unquote(p) if "%" in p else head + p)
    return out


def as_expression(filter: Any) -> Any:
    if filter is None or isinstance(filter, pc.Expression):
        return filter
    raise TypeError(
        f"filter must be a pyarrow.compute.Expression (e.g. pc.field('x') > 3), "
        f"not {type(filter).__name__}"
    )


def log_uri(base: str, path: str) -> str:
    """A log path as a URI: relative paths (the usual case) resolve against the table URI."""
    if "://" in path or path.startswith(("file:", "/")):
        return path
    return f"{base}/{path}"
