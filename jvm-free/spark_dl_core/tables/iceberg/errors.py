"""An Iceberg snapshot's errors: each names the table, the snapshot and, where one is to
blame, the file; a feature this reader cannot read right is refused by name, never read
wrong. Imports no other Iceberg module (each of them imports this one)."""

from __future__ import annotations

from typing import Any

from ...errors import FollowError, optional_import
from ..parquet.table_files import TableError, utc_ms


class IcebergSnapshotError(TableError):
    """An Iceberg snapshot that cannot be read: names the table and the snapshot asked."""

    def __init__(self, table: str, message: str, *, snapshot: object = None) -> None:
        text = f"Iceberg table {table!r}"
        if snapshot is not None:
            text += f" at snapshot {snapshot}"
        super().__init__(f"{text}: {message}")
        self.table = table
        self.snapshot = snapshot


class UnsupportedIcebergFeatureError(IcebergSnapshotError):
    """The snapshot uses a feature this reader refuses rather than read wrong (ORC or Avro
    data files, files without Parquet field ids, nested schema evolution, a storage
    scheme it cannot reach)."""


class IcebergFilterError(IcebergSnapshotError):
    """A ``filter=`` that cannot be evaluated on the snapshot's columns (``column``)."""

    def __init__(self, table: str, message: str, *, snapshot: object, column: str | None) -> None:
        super().__init__(table, message, snapshot=snapshot)
        self.column = column


class IcebergFollowError(FollowError):
    """An update of a dataset that follows an Iceberg table which cannot be made (another
    table, backwards, a snapshot held that is expired or not an ancestor of the one asked):
    names the table, the snapshot asked (``snapshot``) and the dataset path. Nothing was
    written."""

    def __init__(self, message: str, *, snapshot: int, **where: Any) -> None:
        super().__init__(message, **where)
        self.snapshot = snapshot


def import_pyiceberg() -> Any:
    return optional_import("pyiceberg", "reading Iceberg tables")


def timestamp_ms(ts: Any) -> int:
    """Milliseconds since the epoch (:func:`~..parquet.table_files.utc_ms`): a
    :class:`SpecError` names ``open_iceberg``'s ``timestamp=`` for anything else."""
    return utc_ms(ts, "open_iceberg")
