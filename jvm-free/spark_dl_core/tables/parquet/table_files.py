"""What the Parquet layer reads of a table snapshot: :class:`TableFiles`, the one interface a
table format (Delta, Iceberg) gives to be read in place, and the small vocabulary it shares
(a data file's key, an error's first line, the base error of a snapshot that cannot be read).

A snapshot of any format is: data files (URIs, in the snapshot's canonical order) with their
sizes, modification times and partition values; a keep-mask per file (rows its deletes
remove); the table's schema, the columns read (``output_schema``), the partition columns
(constant per file, not stored in it), a projection and a filter; storage options; a column
mapping (how a file's stored columns resolve to logical ones, by name or field id: its
:meth:`file_columns` and an ``identity`` for fingerprints); its lineage; and an error factory
naming the table and version. This module imports nothing of any table format, so the layer
under ``tables/parquet`` never names one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import pyarrow as pa

from ...errors import DatasetError


class TableError(DatasetError):
    """A table snapshot that cannot be read (Delta's :class:`DeltaSnapshotError`, Iceberg's
    ``IcebergSnapshotError``): the Parquet layer passes these through, typed, and wraps any
    other failure in the snapshot's own error (:meth:`TableFiles.table_error`)."""


def file_key(uri: str) -> str:
    """A data file's identity: its decoded location, local files as plain paths (the keys
    of a snapshot's per-file dicts). Never unquotes."""
    if uri.startswith("file://"):
        return uri[len("file://") :]
    return uri


def first_line(exc: BaseException) -> str:
    """The first line of an error's text: delta-rs appends the Rust error's debug form on a
    second line of its messages; the first says it for a user."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def past_the_end(rows: int) -> str:
    """Why a data file of ``rows`` rows cannot be read with deletes past them."""
    return (
        f"has {rows} rows, and its deletion vector deletes rows past them: the vector "
        "or the file is not the one the log wrote"
    )


class FileColumnsLike(Protocol):
    """How one data file's stored columns read as logical ones (``read``: the file's columns
    to read; ``names``: the logical name of each; :meth:`logical`: a table of them renamed
    and converted; a column the file lacks stays absent, filled with nulls later)."""

    read: list[str]
    names: list[str]

    def logical(self, table: pa.Table) -> pa.Table: ...


class TableFiles(Protocol):
    """A pinned snapshot of a table, as the Parquet layer reads it in place. Per-file dicts
    are keyed by :func:`file_key` of the file's URI."""

    table_uri: str
    version: int
    files: list[str]
    schema: pa.Schema
    partition_columns: list[str]
    projection: list[str] | None
    filter: Any
    storage_options: dict[str, str] | None
    since: int | None
    column_mapping: Any  # None, or an object with identity(names) -> list (fingerprints)
    _partition_values: dict[str, dict[str, Any]]
    _keep: dict[str, Any]  # file key -> keep-mask over its rows (files without deletes absent)
    _sizes: dict[str, int]
    _mtimes: dict[str, int]

    @property
    def output_schema(self) -> pa.Schema: ...
    @property
    def shown(self) -> str: ...
    @property
    def file_names(self) -> list[str]: ...

    def lineage(self) -> dict[str, Any]: ...
    def file_size(self, uri: str) -> int | None: ...
    def file_columns(
        self, file_schema: pa.Schema, names: list[str], uri: str
    ) -> FileColumnsLike: ...
    def _finish(
        self,
        table: pa.Table,
        uri: str,
        schema: pa.Schema,
        *,
        filtered: bool = True,
        combine: bool = True,
    ) -> Iterator[pa.RecordBatch]: ...
    def _filesystem(self) -> tuple[Any, str]: ...
    def _fs_path(self, uri: str, prefix: str) -> str: ...
    def table_error(self, message: str) -> Exception:
        """The snapshot's error (a :class:`TableError`) naming table and version."""
        ...

    def filter_error(self, message: str, column: str | None = None) -> Exception:
        """The snapshot's error for a ``filter=`` it cannot evaluate (naming ``column``)."""
        ...


__all__ = ["FileColumnsLike", "TableError", "TableFiles", "file_key", "first_line", "past_the_end"]
