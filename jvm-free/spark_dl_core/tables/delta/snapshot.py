"""Delta tables at a pinned version, read with ``deltalake`` (delta-rs): no JVM.

"The training data of run X" is a fact only if it can be named and read back: a table URI
plus a version. :func:`open_delta` resolves that snapshot once and reads exactly its files,
in a fixed order (files sorted by path, rows in file order), so two processes reading the
same version produce the same rows in the same order — which the MDS export, and through it
the loader's shuffle, depends on. ``deltalake``'s own ``DeltaTable.scan()`` honours deletion
vectors but documents that row order is not guaranteed, so it is not used for the rows.

What the reader does per data file: reads the Parquet file with pyarrow, drops the rows its
deletion vector marks deleted (the keep-masks come from ``DeltaTable.deletion_vectors()``),
adds the partition columns from the add action, and casts to the table schema (columns
added later by schema evolution read as nulls). Tables with column mapping (``name``/``id``)
have their files' physical columns mapped back to the logical schema by
:mod:`.columns`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise
from stat import S_ISREG
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ...errors import DatasetError, SpecError
from ...meta import column_names
from ...versions import version_number
from ..parquet.filter import filter_columns
from ..parquet.footer import check_head
from ..parquet.table_files import ReadInPlace, file_batches
from .columns import ColumnMapping, FileColumns, file_columns, mapping_of
from .deletion_vectors import damaged_inline
from .errors import culprit_text, empty_commit, past_the_end, typed_errors
from .log import (
    DeltaFilterError,
    DeltaSnapshotError,
    Timestamp,
    UnsupportedDeltaFeatureError,
    as_expression,
    commit_history,
    file_key,
    first_line,
    import_deltalake,
    iso_ms,
    log_location,
    log_locations,
    utc_ms,
    version_range,
)

if TYPE_CHECKING:  # pragma: no cover
    from ...sources.dataset import Dataset
    from ...spec import DatasetSpec
    from ...writer import WriteResult

# Reader features this module reads correctly. Others (v2Checkpoint handled by deltalake
# itself is fine, but unknown row-level features are not) are refused.
SUPPORTED_READER_FEATURES = frozenset(
    {
        "columnMapping",
        "deletionVectors",
        "timestampNtz",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "variantType",
    }
)


@dataclass(frozen=True)
class DeltaKind:
    """What a snapshot hands on to the modules built on it, given by the face that opens it
    (:mod:`.table`), so that this module names none of them: the dataset read in place
    (:mod:`.in_place`), a dataset following the table (:mod:`.follow`), the rows new since a
    version (:mod:`.since`), runs carried on across versions (:mod:`.carry`), and how to
    open another version of the same table (``open_delta``)."""

    in_place: Callable[..., Dataset]  # (snapshot, spec=None, **options)
    update: Callable[..., WriteResult]  # (snapshot, out_path, spec, storage_options=)
    since: Callable[..., DeltaSnapshot]  # (snapshot, since, deltalake)
    reopen: Callable[..., DeltaSnapshot]  # open_delta's signature
    carrier: Any  # record / carry_on / row_layout of a run over a version read in place
    follows: Any  # the same, over a version of an MDS dataset following the table


@dataclass
class DeltaSnapshot(ReadInPlace):
    """One version of a Delta table, pinned: the same rows, in the same order, every time.

    Use :func:`open_delta`. ``projection``: the columns its ``columns=`` picked (None: every
    column); ``columns``, as for any dataset, the columns read and their encodings.
    ``filter`` is a pyarrow compute expression (or a SQL-ish string recorded in the lineage
    only when it is an expression's text) applied per batch after deletion vectors.
    """

    table_uri: str
    version: int
    timestamp: str | None
    files: list[str]
    schema: pa.Schema
    partition_columns: list[str]
    projection: list[str] | None = None
    filter: Any = None
    storage_options: dict[str, str] | None = None
    available: tuple[int, int] | None = None
    since: int | None = None  # only the rows not live at this version (tables/delta/since)
    column_mapping: ColumnMapping | None = None  # physical columns -> logical (name/id mode)
    table_id: str | None = None  # the log's metaData id (another table: another id)
    _partition_values: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    _keep: dict[str, Any] = field(default_factory=dict, repr=False)
    _sizes: dict[str, int] = field(default_factory=dict, repr=False)
    # local data files' modification times (ns) as listed at open: part of their identity in
    # the per-machine footer cache (tables/parquet/footers)
    _mtimes: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    _inplace: Any = field(default=None, repr=False, compare=False)
    # what the modules built on this one give (None only for a snapshot built by hand)
    kind: DeltaKind | None = field(default=None, repr=False, compare=False)

    # -- facts

    @property
    def shown(self) -> str:
        """The snapshot as messages and mixtures name it: ``TABLE@vN`` (``TABLE@vM..vN``
        for the rows new since version M)."""
        at = f"v{self.since}..v" if self.since is not None else "v"
        return f"{self.table_uri}@{at}{self.version}"

    @property
    def has_deletion_vectors(self) -> bool:
        """True when some file of this snapshot has deleted rows recorded in a deletion vector."""
        return bool(self._keep)

    @cached_property
    def output_schema(self) -> pa.Schema:
        if self.projection is None:
            return self.schema
        missing = [c for c in self.projection if c not in self.schema.names]
        if missing:
            raise DeltaSnapshotError(
                self.table_uri,
                f"has no column(s) {missing}; it has {self.schema.names}",
                asked=f"version {self.version}",
            )
        return pa.schema([self.schema.field(c) for c in self.projection])

    def lineage(self) -> dict[str, Any]:
        """What a dataset written from this snapshot records as its source (spark_dl.json)."""
        return {
            "kind": "delta",
            "table": self.table_uri,
            "version": self.version,
            "timestamp": self.timestamp,
            "columns": list(self.projection) if self.projection is not None else None,
            "filter": None if self.filter is None else str(self.filter),
            "reader": "deltalake",
            **({"since": self.since} if self.since is not None else {}),
        }

    @property
    def file_names(self) -> list[str]:
        """The data files' base names in canonical (log path) order: how a Spark task, which
        sees ``_metadata.file_name``, tells which file of the snapshot a row came from."""
        return [file_key(u).rsplit("/", 1)[-1] for u in self.files]

    def partition_text(self) -> list[dict[str, str | None]]:
        """Each file's partition values from the log (in :attr:`files` order), as text an
        engine casts back to the column's type: timestamps as UTC instants (``...Z``), so
        an engine that parses directory names in its session time zone (Spark) is not
        trusted with them."""
        return [
            {
                c: _as_text(
                    self._partition_values.get(file_key(u), {}).get(c), self.schema.field(c)
                )
                for c in self.partition_columns
            }
            for u in self.files
        ]

    def file_size(self, uri: str) -> int | None:
        """A data file's size in bytes as its add action records it."""
        return self._sizes.get(file_key(uri))

    def deleted_rows(self) -> dict[str, list[int]]:
        """Row indexes each file's deletion vector removes, by file base name."""
        out: dict[str, list[int]] = {}
        for uri in self.files:
            keep = self._keep.get(file_key(uri))
            if keep is not None:
                gone = [i for i, k in enumerate(keep) if not k]
                if gone:
                    out[file_key(uri).rsplit("/", 1)[-1]] = gone
        return out

    # -- reading

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Record batches of the snapshot, file by file in path order (bounded memory)."""
        yield from self._file_batches(boundaries=False)

    def export_batches(self) -> pa.RecordBatchReader:
        """:meth:`batches` with a boundary marker after each data file, for the writer.

        The canonical layout of a snapshot's MDS export: files in log order (sorted by
        path), rows in file order, shards cut by size within each file and never spanning
        two files. A Spark write of the same version (``read_delta``) follows the same rule,
        so both produce the same shards, hence the same fingerprint, at any parallelism.
        """
        return pa.RecordBatchReader.from_batches(
            self.output_schema, self._file_batches(boundaries=True)
        )

    def _file_batches(self, boundaries: bool) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        from ...writer import source_boundary

        filesystem, prefix = self._filesystem()
        out_schema = self.output_schema
        wanted = out_schema.names
        for uri in self.files:
            stored = [n for n in wanted if n not in self.partition_columns]
            try:
                # INT96 (Spark's legacy timestamps) as microseconds, Delta's unit: pyarrow's
                # default, nanoseconds, cannot hold dates past 2262 (9999-12-31 wraps round)
                check_head(filesystem, self._fs_path(uri, prefix))
                pf = pq.ParquetFile(
                    self._fs_path(uri, prefix),
                    filesystem=filesystem,
                    coerce_int96_timestamp_unit="us",
                )
            except FileNotFoundError as exc:
                raise DeltaSnapshotError(
                    self.table_uri,
                    f"data file {uri} is missing ({exc}); the snapshot was probably vacuumed",
                    asked=f"version {self.version}",
                    available=self.available,
                ) from None
            except (OSError, pa.ArrowException, ValueError) as exc:  # not Parquet, or a
                # damaged head or footer: truncated, overwritten, a name that is not UTF-8
                raise self._file_error(uri, f"cannot be read: {first_line(exc)}") from None
            columns = self.file_columns(pf.schema_arrow, stored, uri)
            keep = self._keep.get(file_key(uri))
            start = 0
            for batch in self._read_batches(pf, columns.read, uri):
                n = batch.num_rows
                table = columns.logical(pa.Table.from_batches([batch]))
                if keep is not None:
                    mask = keep[start : start + n]
                    if len(mask) < n:  # rows past the vector's end are kept
                        mask = mask + [True] * (n - len(mask))
                    table = table.filter(pa.array(mask, type=pa.bool_()))
                start += n
                yield from self._finish(table, uri, out_schema)
            if keep is not None and not all(keep[start:]):
                raise self._file_error(uri, past_the_end(start))
            if boundaries:
                yield source_boundary(out_schema)

    def file_columns(self, file_schema: pa.Schema, names: list[str], uri: str) -> FileColumns:
        """Which columns of the data file ``uri`` hold the logical columns ``names`` and how
        they read back under logical names (column mapping); a column the file should hold
        but lacks is an error naming table, version, file and column."""
        return file_columns(
            self.column_mapping, file_schema, names, lambda why: self._file_error(uri, why)
        )

    def _read_batches(self, pf: Any, columns: list[str], uri: str) -> Iterator[pa.RecordBatch]:
        """``pf``'s batches; a file pyarrow cannot decode is an error naming it."""
        try:
            yield from pf.iter_batches(columns=columns, batch_size=65536)
        except (pa.ArrowException, OSError) as exc:
            raise self._file_error(uri, f"cannot be read: {first_line(exc)}") from None

    def table_error(self, message: str) -> DeltaSnapshotError:
        """An error naming the table, this version and the versions available (for the
        Parquet layer reading it in place: :class:`~..parquet.table_files.TableFiles`)."""
        return DeltaSnapshotError(
            self.table_uri, message, asked=f"version {self.version}", available=self.available
        )

    def filter_error(self, message: str, column: str | None = None) -> DeltaFilterError:
        """A ``filter=`` this snapshot cannot evaluate (naming ``column``)."""
        return DeltaFilterError(self, message, column=column)

    def _file_error(self, uri: str, message: str) -> DeltaSnapshotError:
        return DeltaSnapshotError(
            self.table_uri, f"data file {uri} {message}", asked=f"version {self.version}"
        )

    def _cast(self, column: Any, f: pa.Field, uri: str) -> Any:
        """A file's column as the table's type; a value that type cannot hold is an error
        naming the file and column, not a bare ArrowInvalid."""
        try:
            return column.cast(f.type)
        except pa.ArrowException as exc:
            raise self._file_error(
                uri,
                f"column {f.name!r} ({column.type}) cannot be read as the table's type "
                f"{f.type}: {first_line(exc)}",
            ) from None

    def _finish(
        self,
        table: pa.Table,
        uri: str,
        schema: pa.Schema,
        *,
        filtered: bool = True,
        combine: bool = True,
    ) -> Iterator[pa.RecordBatch]:
        """A file's rows as the table's: partition columns, types, the filter (unless not
        ``filtered``: the in-place reader evaluating the filter itself), in one batch
        (unless not ``combine``: the in-place reader lays chunks into place itself, and
        joining a row group's streamed chunks would copy it once more)."""
        n = table.num_rows
        arrays = []
        for f in schema:
            if f.name in self.partition_columns:
                value = self._partition_values.get(file_key(uri), {}).get(f.name)
                # add actions carry typed values (or raw strings, cast like Delta does)
                typed = isinstance(value, str) and not pa.types.is_string(f.type)
                arr = pa.array([value] * n, type=pa.string() if typed else f.type)
                arrays.append(arr.cast(f.type))
            elif f.name in table.column_names:
                arrays.append(self._cast(table.column(f.name), f, uri))
            else:  # added to the schema after this file was written
                arrays.append(pa.nulls(n, type=f.type))
        yield from file_batches(
            arrays,
            schema,
            self.filter,
            lambda why: self._file_error(uri, why),
            filtered=filtered,
            combine=combine,
        )

    def to_arrow(self) -> pa.Table:
        """The whole snapshot as one Arrow table (deletion vectors applied)."""
        batches = list(self.batches())
        return pa.Table.from_batches(batches, schema=self.output_schema)

    def reader(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(self.output_schema, self.batches())

    def write_mds(
        self,
        out_path: str,
        spec: DatasetSpec | dict[str, Any] | None = None,
        *,
        mode: str = "error",
        progress: bool = False,
        storage_options: dict[str, Any] | None = None,
    ) -> WriteResult:
        """Write this snapshot as an MDS dataset whose spark_dl.json names table and version.

        ``mode="update"`` makes ``out_path`` follow the table: only the files added since the
        version it holds are converted (see :mod:`spark_dl_core.tables.delta.follow`).
        """
        from ...writer import write_mds

        if str(mode).strip().lower() == "update":
            return self._kind.update(self, out_path, spec, storage_options=storage_options)

        return write_mds(
            self.export_batches(),  # carries the schema: a filter matching nothing writes 0 rows
            out_path,
            spec,
            mode=mode,  # type: ignore[arg-type]
            source=self.lineage(),
            progress=progress,
            storage_options=storage_options,
        )

    def to_dataset(
        self,
        out_path: str,
        spec: DatasetSpec | dict[str, Any] | None = None,
        **open_kwargs: Any,
    ) -> Dataset:
        """Export to ``out_path`` unless this very snapshot and spec is there; open it.

        Reuse is keyed by lineage and spec: a pinned export is written once.
        """
        from ...sources.mds import MdsDataset
        from ...spec import DatasetSpec as _Spec

        spec_obj = spec if isinstance(spec, _Spec) else _Spec(**(spec or {}))
        carrier = None if self.kind is None else self.kind.follows

        def open_dataset(path: str, **kwargs: Any) -> Dataset:  # as the public face opens it
            return MdsDataset(path, carrier=carrier, **kwargs)

        try:
            existing = open_dataset(out_path, **open_kwargs)
            if existing.source == self.lineage() and existing.spec == spec_obj.canonical():
                return existing
        except (DatasetError, FileNotFoundError, OSError):
            pass
        self.write_mds(out_path, spec_obj, mode="overwrite")  # a stale export is replaced
        return open_dataset(out_path, **open_kwargs)

    # -- read in place (tables/delta/in_place.py): the snapshot as a dataset, no export

    def dataset(self, spec: DatasetSpec | dict[str, Any] | None = None, **options: Any) -> Dataset:
        """This snapshot as a dataset read in place: shards are its files' row groups.

        ``spec`` sets the encodings and transforms, as an export's would; ``options`` are
        :class:`~spark_dl_core.tables.delta.in_place.DeltaDataset`'s. The default one is
        built once and serves ``len(snap)``, ``snap[i]``, ``snap.to_torch(...)``…
        """
        in_place = self._kind.in_place
        if spec is None and not options:
            if self._inplace is None:
                self._inplace = in_place(self)
            return self._inplace
        return in_place(self, spec, **options)

    @property
    def _kind(self) -> DeltaKind:
        if self.kind is None:
            raise RuntimeError(
                f"Delta snapshot of {self.table_uri!r} version {self.version} was built by "
                "hand: open it with spark_dl_core.open_delta to read or follow it"
            )
        return self.kind

    def reopen(self, version: int | None, since: int | None = None, **changes: Any) -> Any:
        """Another version of this table, opened as this one was (storage options, columns,
        filter), for a run carried on or a dataset following the table; ``changes``
        override those arguments."""
        asked: dict[str, Any] = {
            "storage_options": self.storage_options,
            "columns": self.projection,
            "filter": self.filter,
            "since": since,
        }
        return self._kind.reopen(self.table_uri, version=version, **{**asked, **changes})

    # -- filesystem

    def _filesystem(self) -> tuple[Any, str]:
        """A pyarrow filesystem for the table and how its URIs map to that filesystem's paths."""
        return table_filesystem(self.table_uri, self.storage_options)

    @staticmethod
    def _fs_path(uri: str, prefix: str) -> str:
        if prefix and uri.startswith(prefix):
            return uri[len(prefix) :]
        return file_key(uri)


def table_filesystem(table_uri: str, storage_options: dict[str, str] | None) -> tuple[Any, str]:
    """A pyarrow filesystem for a table and the URI prefix its paths drop (``""`` locally)."""
    from pyarrow import fs as pafs

    if "://" not in table_uri or table_uri.startswith("file://"):
        return pafs.LocalFileSystem(), ""
    from ..parquet.remote import remote_filesystem  # the table's endpoint and credentials

    return remote_filesystem(table_uri, storage_options)


def _log_filesystem(base: str, storage_options: dict[str, str] | None) -> tuple[Any, str]:
    """A pyarrow filesystem for the table at ``base`` and the table's root on it: a remote
    table's is built from ``storage_options`` (its endpoint and credentials; pyarrow's own
    from the URI alone would try the default ones, ~6 s of timeouts against another store)."""
    from pyarrow import fs as pafs

    if "://" not in base or base.startswith("file://"):
        return pafs.LocalFileSystem(), base.removeprefix("file://")
    from ..parquet.remote import remote_filesystem

    filesystem, prefix = remote_filesystem(base, storage_options)
    return filesystem, base.removeprefix(prefix)


@typed_errors
def open_snapshot(
    path: str | os.PathLike[str],
    *,
    kind: DeltaKind,
    version: int | str | None = None,
    timestamp: Timestamp | None = None,
    storage_options: dict[str, str] | None = None,
    columns: Sequence[str] | None = None,
    filter: Any = None,
    since: int | str | None = None,
) -> DeltaSnapshot:
    """:func:`~.table.open_delta`'s work, the snapshot handed ``kind`` (what the modules
    built on this one give it)."""
    deltalake = import_deltalake()
    uri = os.fspath(path)
    version = version_number(version, f"open_delta({uri!r})")
    if version is not None and timestamp is not None:
        raise SpecError(f"open_delta({uri!r}): give version or timestamp, not both")
    try:
        latest = deltalake.DeltaTable(uri, storage_options=storage_options)
    except Exception as exc:
        raise DeltaSnapshotError(
            uri, f"cannot be opened{culprit_text(uri)}: {first_line(exc)}"
        ) from None
    history = commit_history(latest)
    available = version_range(history) or (latest.version(), latest.version())
    asked: str | None = None
    if timestamp is not None:
        ms = utc_ms(timestamp, f"open_delta({uri!r})")
        asked = f"timestamp {iso_ms(ms)}"
        eligible = [v for v, t in history if t <= ms]
        if not eligible:
            first = iso_ms(history[0][1]) if history else "?"
            raise DeltaSnapshotError(
                uri,
                f"the timestamp is before the first commit ({first})",
                asked=asked,
                available=available,
            )
        version = max(eligible)
    if version is not None:
        asked = asked or f"version {version}"
        if version < 0 or version > latest.version():
            raise DeltaSnapshotError(
                uri, "no such version", asked=f"version {version}", available=available
            )
        if version < available[0]:
            raise DeltaSnapshotError(
                uri,
                "the log no longer holds that version (log cleanup / checkpoint)",
                asked=asked,
                available=available,
            )
        try:
            table = deltalake.DeltaTable(uri, version=version, storage_options=storage_options)
        except Exception as exc:
            raise DeltaSnapshotError(
                uri,
                f"cannot be loaded{culprit_text(uri)}: {first_line(exc)}",
                asked=asked,
                available=available,
            ) from None
    else:
        table = latest
    pinned = int(table.version())
    asked = asked or f"version {pinned}"
    _check_features(table, uri, asked, available)
    when = dict(history).get(pinned)
    schema = pa.schema(table.schema().to_arrow())
    mapping = _column_mapping(table, schema, uri, asked, available)
    schema = mapping.logical if mapping is not None else schema
    # read as a stream: ``pa.table(...)`` of a foreign table imports pandas (0.2-0.4 s)
    actions = pa.RecordBatchReader.from_stream(table.get_add_actions(flatten=True)).read_all()
    partition_columns = list(table.metadata().partition_columns)
    base = table.table_uri.rstrip("/")
    rel_paths = actions.column("path").to_pylist()
    uris = log_locations(base, rel_paths)
    keys = [file_key(u) for u in uris]
    part_values = _partition_values(actions, partition_columns, keys)
    sizes = dict(zip(keys, actions.column("size_bytes").to_pylist()))
    keep: dict[str, Any] = {}
    # Every deletion vector the log names is applied, the table's reader features aside: a
    # log that adds files with deletion vectors but does not list the feature still deletes
    # those rows for delta-rs's own scan, and serving them would be wrong data.
    # delta-rs aborts on some damaged inline vectors (tables/delta/deletion_vectors): checked first
    damaged = damaged_inline(*_log_filesystem(base, storage_options), pinned)
    if damaged:
        raise DeltaSnapshotError(uri, damaged, asked=asked, available=available)
    try:
        dvs = pa.RecordBatchReader.from_stream(table.deletion_vectors()).read_all()
    except Exception as exc:  # delta-rs names the vector's file (or says it is inline)
        raise DeltaSnapshotError(
            uri,
            f"a deletion vector cannot be read{culprit_text(uri)}: {first_line(exc)}",
            asked=asked,
            available=available,
        ) from None
    for fp, sel in zip(dvs.column("filepath").to_pylist(), dvs.column("selection_vector")):
        keep[file_key(log_location(fp))] = sel.as_py()
    order = sorted(range(len(uris)), key=rel_paths.__getitem__)
    twice = next((uris[a] for a, b in pairwise(order) if uris[a] == uris[b]), None)
    if twice:  # (path, vector) is a log entry's key: a lost remove leaves both entries live
        raise DeltaSnapshotError(
            uri,
            f"data file {twice} is live twice at this version (two add actions, e.g. with "
            "and without a deletion vector): a remove action of the log is missing or damaged",
            asked=asked,
            available=available,
        )
    files = [uris[i] for i in order]
    snap = DeltaSnapshot(
        table_uri=log_location(base) if base.startswith("file:") else base,
        version=pinned,
        timestamp=iso_ms(when),
        files=files,
        schema=schema,
        partition_columns=partition_columns,
        projection=column_names(columns),
        filter=as_expression(filter),
        storage_options=storage_options,
        available=available,
        column_mapping=mapping,
        table_id=table.metadata().id,
        _partition_values=part_values,
        _keep=keep,
        _sizes=sizes,
        kind=kind,
    )
    snap.output_schema  # noqa: B018 - validate columns now, not at first read
    if snap.filter is not None:  # a column it names that is not read: refused now, typed
        filter_columns(snap)
    if since is not None:
        snap = kind.since(snap, since, deltalake)
    _check_files_exist(snap, asked)
    return snap


def _partition_values(
    actions: pa.Table, partition_columns: list[str], keys: list[str]
) -> dict[str, dict[str, Any]]:
    """Each file's partition values from the add actions, by file key (a column converted
    once, not a scalar per file)."""
    present = [c for c in partition_columns if f"partition.{c}" in actions.column_names]
    values = [actions.column(f"partition.{c}").to_pylist() for c in present]
    if not values:
        return {k: {} for k in keys}
    return {k: dict(zip(present, row)) for k, row in zip(keys, zip(*values))}


def _local_stats(paths: list[str]) -> list[tuple[int, int]] | None:
    """Each local file's (size, mtime in ns) by ``os.stat`` (pyarrow's listing builds an
    object per file: ~5 µs more each); None when one is not a regular file that stats, so
    that pyarrow's listing says what it is, as before."""
    out = []
    try:
        for path in paths:
            st = os.stat(path)
            if not S_ISREG(st.st_mode):
                return None
            out.append((st.st_size, st.st_mtime_ns))
    except (OSError, ValueError):
        return None
    return out


def _as_text(value: Any, f: pa.Field) -> str | None:
    """A partition value as text that casts back to ``f.type`` without a time zone guess."""
    if value is None:
        return None
    typ = f.type
    arr = pa.array([value], type=pa.string() if isinstance(value, str) else typ)
    if pa.types.is_timestamp(typ) and typ.tz is not None:
        wall = arr.cast(typ).cast(pa.timestamp(typ.unit))  # the UTC wall clock
        return f"{wall.cast(pa.string())[0]}Z"
    return str(arr.cast(pa.string())[0].as_py())


def _column_mapping(
    table: Any, schema: pa.Schema, uri: str, asked: str, available: tuple[int, int]
) -> ColumnMapping | None:
    """The table's column mapping, honoured where the protocol supports it (reader version
    2, or 3 with the ``columnMapping`` feature), as PROTOCOL.md says."""
    protocol = table.protocol()
    version = protocol.min_reader_version
    if version < 2 or (version >= 3 and "columnMapping" not in (protocol.reader_features or [])):
        return None

    def refuse(why: str) -> Exception:
        return UnsupportedDeltaFeatureError(uri, why, asked=asked, available=available)

    mode = table.metadata().configuration.get("delta.columnMapping.mode")
    return mapping_of(mode, schema, refuse)


def _check_features(table: Any, uri: str, asked: str, available: tuple[int, int]) -> None:
    protocol = table.protocol()
    features = set(protocol.reader_features or [])
    unsupported = sorted(features - SUPPORTED_READER_FEATURES)
    if unsupported or protocol.min_reader_version > 3:
        raise UnsupportedDeltaFeatureError(
            uri,
            f"needs reader feature(s) {unsupported} (reader version "
            f"{protocol.min_reader_version}) that the JVM-free reader does not support",
            asked=asked,
            available=available,
        )


def _check_files_exist(snap: DeltaSnapshot, asked: str) -> None:
    """Fail at open, not mid-export, when a vacuum removed files this snapshot needs."""
    from ..parquet.remote import check_remote_files, is_remote_table

    if is_remote_table(snap):  # one listing, sizes checked too
        return check_remote_files(
            snap,
            lambda why: DeltaSnapshotError(
                snap.table_uri, why, asked=asked, available=snap.available
            ),
            "the Delta log",
        )
    filesystem, prefix = snap._filesystem()
    from pyarrow import fs as pafs

    keys = [file_key(u) for u in snap.files]
    paths = keys if not prefix else [snap._fs_path(u, prefix) for u in snap.files]
    if not paths:
        return
    found = _local_stats(paths) if isinstance(filesystem, pafs.LocalFileSystem) else None
    if found is None:  # another filesystem, or a file missing or not plain: pyarrow lists
        infos = filesystem.get_file_info(paths)
        missing = [u for u, info in zip(snap.files, infos) if info.type == pafs.FileType.NotFound]
        if missing:
            raise DeltaSnapshotError(
                snap.table_uri,
                f"{len(missing)} data file(s) of this snapshot are missing (vacuumed?), "
                f"e.g. {missing[0]}",
                asked=asked,
                available=snap.available,
            )
        found = [(info.size, info.mtime_ns) for info in infos]
    sizes = snap._sizes
    for uri, key, (size, mtime) in zip(snap.files, keys, found):  # truncated, or overwritten
        snap._mtimes[key] = mtime
        logged = sizes.get(key)
        if size is not None and logged is not None and size != logged:
            raise snap._file_error(uri, f"has {size} bytes, its add action says {logged}")
    empty = empty_commit(
        filesystem, snap._fs_path(f"{snap.table_uri}/_delta_log", prefix), snap.version
    )
    if empty:
        raise DeltaSnapshotError(
            snap.table_uri,
            f"commit _delta_log/{empty} is empty (a torn write): its actions are lost",
            asked=asked,
            available=snap.available,
        )
