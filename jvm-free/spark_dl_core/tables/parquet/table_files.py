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

import datetime as _dt
from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast

import pyarrow as pa

from ...errors import DatasetError, SpecError


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


def utc_ms(ts: Any, call: str) -> int:
    """Milliseconds since the epoch; naive datetimes and ISO strings without zone are UTC.
    Anything else is a :class:`SpecError` naming ``call``'s ``timestamp=`` and the accepted
    forms."""
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        return int(ts)
    point: Any = ts
    if isinstance(ts, str):
        try:
            point = _dt.datetime.fromisoformat(ts.strip().replace("Z", "+00:00"))
        except ValueError:
            point = None
    if not isinstance(point, _dt.datetime):
        raise SpecError(
            f"{call}: timestamp={ts!r} is not a point in time; give a datetime (without a "
            "zone: UTC), an ISO 8601 string such as '2024-05-01T12:00:00Z' or '2024-05-01', "
            "or milliseconds since the epoch (an int)"
        )
    if point.tzinfo is None:
        point = point.replace(tzinfo=_dt.timezone.utc)
    return int(point.timestamp() * 1000)


def past_the_end(rows: int) -> str:
    """Why a data file of ``rows`` rows cannot be read with deletes past them."""
    return (
        f"has {rows} rows, and its deletion vector deletes rows past them: the vector "
        "or the file is not the one the log wrote"
    )


def file_batches(
    arrays: list[Any],
    schema: pa.Schema,
    row_filter: Any,
    file_error: Callable[[str], Exception],
    *,
    filtered: bool,
    combine: bool,
) -> Iterator[pa.RecordBatch]:
    """The end of every format's :meth:`TableFiles._finish`: a data file's columns, already
    the table's, as batches. Checked in full first (Parquet readers do not check UTF-8: a
    damaged page is caught here, not in decode; ``file_error`` words it for the file), then
    ``row_filter`` unless not ``filtered``, one batch unless not ``combine``."""
    result = pa.Table.from_arrays(arrays, schema=schema)
    try:
        result.validate(full=True)
    except pa.ArrowException as exc:
        raise file_error(f"holds invalid data: {first_line(exc)}") from None
    if filtered and row_filter is not None:
        result = result.filter(row_filter)
    yield from (result.combine_chunks() if combine else result).to_batches()


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


class ReadInPlace:
    """A pinned snapshot's loading face (Delta's, Iceberg's): every read goes through the
    dataset that reads it in place, :meth:`dataset`, which the format defines."""

    def dataset(self, spec: Any = None, **options: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} defines dataset()")

    def __bool__(self) -> bool:
        return True  # a snapshot is a value, even with 0 rows (and len() reads footers)

    def __len__(self) -> int:
        """Live rows of the snapshot (footers and deletes: no data read)."""
        return len(self.dataset())

    def __getitem__(self, key: Any) -> Any:
        """``snap[i]``, ``snap[rows]``, ``snap["col"]``: as :meth:`Dataset.__getitem__`."""
        return self.dataset()[key]

    @property
    def fingerprint(self) -> str:
        """The in-place dataset's fingerprint (see :attr:`.in_place.InPlaceDataset.fingerprint`)."""
        return cast(str, self.dataset().fingerprint)

    @property
    def columns(self) -> dict[str, str]:
        """The columns a read in place gives and their encodings, as a dataset's
        ``columns`` (the ``columns=`` asked at open is :attr:`projection`)."""
        return cast("dict[str, str]", self.dataset().columns)

    def iter_batches(self, batch_size: int | None = None, **settings: Any) -> Iterator[Any]:
        """Batches read in place, as :meth:`Dataset.iter_batches` (no export)."""
        return cast("Iterator[Any]", self.dataset().iter_batches(batch_size, **settings))

    def sample_order(self, batch_size: int | None = None, **settings: Any) -> Any:
        return self.dataset().sample_order(batch_size, **settings)

    def to_torch(self, batch_size: int | None = None, **settings: Any) -> Any:
        """A PyTorch loader reading the snapshot in place (see :meth:`Dataset.to_torch`)."""
        return self.dataset().to_torch(batch_size, **settings)

    def to_tf(self, batch_size: int | None = None, **settings: Any) -> Any:
        """A ``tf.data.Dataset`` reading the snapshot in place (see :meth:`Dataset.to_tf`)."""
        return self.dataset().to_tf(batch_size, **settings)


__all__ = [
    "FileColumnsLike",
    "ReadInPlace",
    "TableError",
    "TableFiles",
    "file_batches",
    "file_key",
    "first_line",
    "past_the_end",
    "utc_ms",
]
