"""One snapshot of an Iceberg table, pinned, as the Parquet layer reads it in place
(:class:`~..parquet.table_files.TableFiles`): its data files planned once from the manifests
(by PyIceberg's planner, which applies sequence numbers and partition scopes to delete
files), each file's position deletes (Parquet delete files and v3 deletion vectors, each
delete file read once however many data files it names) as a keep-mask, the snapshot's
schema resolved by field id (:mod:`.columns`). Files are in path order, as a Delta
snapshot's: the order a read, an export and a resume share.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import SpecError
from ...sources.dataset import Dataset
from ...spec import DatasetSpec
from ...writer import WriteResult, source_boundary, write_mds
from ..parquet.filter import filter_columns
from ..parquet.table_files import ReadInPlace, file_batches, file_key, first_line, past_the_end
from . import deletes
from .columns import FieldIds
from .errors import IcebergFilterError, IcebergSnapshotError, UnsupportedIcebergFeatureError
from .plan_cache import PlanStore, SnapshotPlan, plan_key


@dataclass(frozen=True)
class IcebergKind:
    """What a snapshot hands on to the modules built on it, given by the face that opens it
    (:mod:`.table`), so that this module names none of them: the dataset read in place
    (:mod:`.in_place`), a dataset following the table (:mod:`.follow`), runs carried on
    across snapshots (:mod:`.carry`), and how to open another snapshot of the same table
    (``open_iceberg``)."""

    in_place: Callable[..., Dataset]  # (snapshot, spec=None, **options)
    update: Callable[..., WriteResult]  # (snapshot, out_path, spec, storage_options=)
    reopen: Callable[..., IcebergSnapshot]  # open_iceberg's signature
    carrier: Any  # record / carry_on / row_layout of a run over a snapshot read in place


@dataclass
class IcebergSnapshot(ReadInPlace):
    """One snapshot of an Iceberg table: the same rows, in the same order, every time.

    Use :func:`~.table.open_iceberg`. ``version`` is the snapshot id (0: a table with no
    snapshot yet); ``projection`` the columns ``columns=`` picked; ``filter`` a pyarrow
    compute expression applied after deletes."""

    table_uri: str  # the table's location
    version: int
    files: list[str]
    schema: pa.Schema
    name: str  # as messages name the table: catalog.namespace.table, or its metadata file
    metadata_location: str
    schema_id: int
    timestamp: str | None = None
    catalog: str | None = None
    identifier: str | None = None
    ref: str | None = None
    projection: list[str] | None = None
    filter: Any = None
    column_mapping: FieldIds | None = None
    partition_columns: list[str] = field(default_factory=list)  # Iceberg files hold them all
    storage_options: dict[str, str] | None = None
    since: int | None = None
    sequence_number: int | None = None  # the snapshot's (v2 and later): a followed version's
    table_uuid: str | None = None
    plan_dir: str | None = field(default=None, compare=False)  # where plans are cached
    _identity: dict[str, set[str]] = field(default_factory=dict, repr=False)
    _partition_values: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    _keep: dict[str, Any] = field(default_factory=dict, repr=False)
    _sizes: dict[str, int] = field(default_factory=dict, repr=False)
    _mtimes: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    _inplace: Any = field(default=None, repr=False, compare=False)
    _pafs: tuple[Any, str] | None = field(default=None, repr=False, compare=False)
    # what the modules built on this one give (None only for a snapshot built by hand)
    kind: IcebergKind | None = field(default=None, repr=False, compare=False)

    # -- facts

    @property
    def shown(self) -> str:
        if self.since is not None:  # the rows appended since an earlier snapshot
            return f"{self.name}@snapshot={self.since}..{self.version}"
        return f"{self.name}@snapshot={self.version}"

    @property
    def output_schema(self) -> pa.Schema:
        if self.projection is None:
            return self.schema
        missing = [c for c in self.projection if c not in self.schema.names]
        if missing:
            raise self.table_error(f"has no column(s) {missing}; it has {self.schema.names}")
        return pa.schema([self.schema.field(c) for c in self.projection])

    @property
    def file_names(self) -> list[str]:
        return [file_key(u).rsplit("/", 1)[-1] for u in self.files]

    def lineage(self) -> dict[str, Any]:
        """What a dataset written from this snapshot records as its source."""
        return {
            "kind": "iceberg",
            "table": self.name,
            "catalog": self.catalog,
            "location": self.table_uri,
            "metadata": self.metadata_location,
            "snapshot_id": self.version,
            "schema_id": self.schema_id,
            "timestamp": self.timestamp,
            "ref": self.ref,
            "columns": list(self.projection) if self.projection is not None else None,
            "filter": None if self.filter is None else str(self.filter),
            "reader": "pyiceberg",
            **({"since": self.since} if self.since is not None else {}),
        }

    def file_size(self, uri: str) -> int | None:
        return self._sizes.get(file_key(uri))

    def deleted_rows(self) -> dict[str, list[int]]:
        """Row indexes each file's position deletes remove, by file base name."""
        out = {}
        for uri in self.files:
            keep = self._keep.get(file_key(uri))
            if keep is not None and not keep.all():
                out[file_key(uri).rsplit("/", 1)[-1]] = np.flatnonzero(~keep).tolist()
        return out

    # -- what the Parquet layer asks (TableFiles)

    def file_columns(self, file_schema: pa.Schema, names: list[str], uri: str) -> Any:
        assert self.column_mapping is not None
        identity = self._identity.get(file_key(uri), set())
        return self.column_mapping.resolve(
            file_schema, names, identity, lambda why: self.table_error(f"data file {uri} {why}")
        )

    def table_error(self, message: str) -> IcebergSnapshotError:
        return IcebergSnapshotError(self.name, message, snapshot=self.version)

    def filter_error(self, message: str, column: str | None = None) -> IcebergFilterError:
        return IcebergFilterError(self.name, message, snapshot=self.version, column=column)

    def _filesystem(self) -> tuple[Any, str]:
        """A pyarrow filesystem for the table's files and the URI prefix its paths drop:
        a remote table's from its ``storage_options`` (the endpoint and credentials its
        metadata was read with), made once."""
        if self._pafs is None:
            from pyarrow import fs as pafs

            from ..parquet.remote import is_remote_table, remote_filesystem

            if is_remote_table(self):
                self._pafs = remote_filesystem(self.table_uri, self.storage_options)
            else:
                self._pafs = (pafs.LocalFileSystem(), "")
        return self._pafs

    @staticmethod
    def _fs_path(uri: str, prefix: str) -> str:
        if prefix and uri.startswith(prefix):
            return uri[len(prefix) :]
        return file_key(uri)

    def parquet_file(self, uri: str) -> Any:
        """A data or delete file of the table, opened where it lies (local or remote)."""
        import pyarrow.parquet as pq

        filesystem, prefix = self._filesystem()
        return pq.ParquetFile(self._fs_path(uri, prefix), filesystem=filesystem)

    def _finish(
        self,
        table: pa.Table,
        uri: str,
        schema: pa.Schema,
        *,
        filtered: bool = True,
        combine: bool = True,
    ) -> Iterator[pa.RecordBatch]:
        """A file's rows as the snapshot's: its types (promotions cast), nulls for columns
        added after the file, the filter (unless not ``filtered``)."""
        n = table.num_rows
        arrays = []
        for f in schema:
            if f.name in table.column_names:
                arrays.append(self._cast(table.column(f.name), f, uri))
            else:
                arrays.append(pa.nulls(n, type=f.type))
        yield from file_batches(
            arrays,
            schema,
            self.filter,
            lambda why: self.table_error(f"data file {uri} {why}"),
            filtered=filtered,
            combine=combine,
        )

    def _cast(self, column: Any, f: pa.Field, uri: str) -> Any:
        try:
            return column.cast(f.type)
        except (pa.ArrowException, NotImplementedError) as exc:
            raise self.table_error(
                f"data file {uri}: column {f.name!r} ({column.type}) cannot be read as the "
                f"snapshot's type {f.type}: {first_line(exc)}"
            ) from None

    # -- reading whole: the export

    def batches(self) -> Iterator[pa.RecordBatch]:
        yield from self._file_batches(boundaries=False)

    def export_batches(self) -> pa.RecordBatchReader:
        """The snapshot's rows, file by file in path order, a boundary after each file (an
        export's shards never span two files, as for a Delta snapshot)."""
        return pa.RecordBatchReader.from_batches(
            self.output_schema, self._file_batches(boundaries=True)
        )

    def _file_batches(self, boundaries: bool) -> Iterator[pa.RecordBatch]:
        out_schema = self.output_schema
        for uri in self.files:
            try:
                pf = self.parquet_file(uri)
                columns = self.file_columns(pf.schema_arrow, out_schema.names, uri)
                keep = self._keep.get(file_key(uri))
                start = 0
                for batch in pf.iter_batches(columns=columns.read, batch_size=65536):
                    n = batch.num_rows
                    table = columns.logical(pa.Table.from_batches([batch]))
                    if keep is not None:
                        mask = np.ones(n, dtype=bool)
                        part = keep[start : start + n]
                        mask[: len(part)] = part
                        table = table.filter(pa.array(mask))
                    start += n
                    yield from self._finish(table, uri, out_schema)
            except IcebergSnapshotError:
                raise
            except (OSError, pa.ArrowException, ValueError) as exc:
                raise self.table_error(
                    f"data file {uri} cannot be read: {first_line(exc)}"
                ) from None
            if keep is not None and not keep[start:].all():
                raise self.table_error(f"data file {uri} {past_the_end(start)}")
            if boundaries:
                yield source_boundary(out_schema)

    def to_arrow(self) -> pa.Table:
        return pa.Table.from_batches(list(self.batches()), schema=self.output_schema)

    def write_mds(
        self,
        out_path: str,
        spec: DatasetSpec | dict[str, Any] | None = None,
        *,
        mode: str = "error",
        progress: bool = False,
        storage_options: dict[str, Any] | None = None,
    ) -> WriteResult:
        """Write this snapshot as an MDS dataset whose spark_dl.json names table, snapshot
        and schema. ``mode="update"`` makes ``out_path`` follow the table: only the data
        files added since the snapshot it holds are converted (:mod:`.follow`)."""
        if str(mode).strip().lower() == "update":
            return self._kind.update(self, out_path, spec, storage_options=storage_options)
        return write_mds(
            self.export_batches(),
            out_path,
            spec,
            mode=mode,  # type: ignore[arg-type]
            source=self.lineage(),
            progress=progress,
            storage_options=storage_options,
        )

    # -- read in place: the snapshot as a dataset (tables/parquet/in_place)

    def dataset(self, spec: DatasetSpec | dict[str, Any] | None = None, **options: Any) -> Dataset:
        """This snapshot as a dataset read in place: shards are its files' row groups;
        ``options`` are :class:`~..parquet.in_place.InPlaceDataset`'s."""
        in_place = self._kind.in_place
        if spec is None and not options:
            if self._inplace is None:
                self._inplace = in_place(self)
            return self._inplace
        return in_place(self, spec, **options)

    @property
    def _kind(self) -> IcebergKind:
        if self.kind is None:
            raise RuntimeError(
                f"Iceberg snapshot {self.version} of {self.name!r} was built by hand: open it "
                "with spark_dl_core.open_iceberg to read or follow it"
            )
        return self.kind

    def reopen(self, snapshot_id: int, since: int | None = None, **changes: Any) -> Any:
        """Another snapshot of this table, opened from this one's metadata file (which names
        every snapshot the table keeps) with its storage options, columns and filter, for a
        run carried on or a dataset following the table; ``changes`` override those
        arguments."""
        asked: dict[str, Any] = {
            "storage_options": self.storage_options,
            "columns": self.projection,
            "filter": self.filter,
            "since": since,
            "plan_cache": self.plan_dir or False,
        }
        return self._kind.reopen(
            self.metadata_location, snapshot_id=int(snapshot_id), **{**asked, **changes}
        )


def plan_snapshot(
    table: Any,
    snap: IcebergSnapshot,
    snapshot_id: int | None,
    skip: set[str] | None = None,
    plan_dir: str | None = None,
) -> None:
    """Fill ``snap``'s files, sizes, modification times and keep-masks from the snapshot's
    manifests (but the data files in ``skip``), or from the plan cached under ``plan_dir``
    (:mod:`.plan_cache`); refuse what this reader cannot read right, naming it."""
    if snapshot_id is None:
        return
    listed = functools.partial(deletes.listed_in, table, snapshot_id)
    store = cached_plans(table, snapshot_id, plan_dir)
    plan = None if store is None else store.load()
    if plan is not None:
        try:
            deletes.check_totals(table.metadata.snapshot_by_id(snapshot_id), plan.records)
        except ValueError:  # not the snapshot's files: planned again
            plan = None
    cached = plan is not None
    if plan is None:
        plan = _plan_files(table, snap, snapshot_id, skip, listed)
        if store is not None and not skip:
            store.save(plan)
    # a partition spec's identity columns, worked out once per spec (not once per file)
    identity = functools.cache(lambda spec_id: _identity_columns(table, spec_id, snap.schema_id))
    for uri, size, spec_id in zip(plan.paths, plan.sizes.tolist(), plan.specs.tolist()):
        if skip and uri in skip:
            continue
        if cached:  # checked as a fresh plan checks it (a filesystem may be gone since)
            _scheme_check(snap, uri, listed)
        key = file_key(uri)
        snap.files.append(uri)
        snap._sizes[key] = size
        snap._identity[key] = identity(spec_id)
        keep = plan.keeps.get(uri)
        if keep is not None:
            snap._keep[key] = keep
    _stat_files(snap, listed)


def cached_plans(table: Any, snapshot_id: int, plan_dir: str | None) -> PlanStore | None:
    """Where a snapshot's plan is cached (None: ``plan_dir`` None, or no key to check)."""
    if plan_dir is None:
        return None
    key = plan_key(table, snapshot_id)
    return None if key is None else PlanStore(plan_dir, key)


def _plan_files(
    table: Any,
    snap: IcebergSnapshot,
    snapshot_id: int,
    skip: set[str] | None,
    listed: Callable[[str], str],
) -> SnapshotPlan:
    """The snapshot's data files (but ``skip``) planned from its manifests by PyIceberg's
    planner, each one's deletes read into a keep-mask."""
    from pyiceberg.manifest import FileFormat

    try:
        planned = deletes.plan(table, snapshot_id)
    except (IcebergSnapshotError, SpecError):
        raise
    except Exception as exc:  # a manifest PyIceberg cannot read: which one
        culprit = deletes.unreadable_manifest(table, snapshot_id)
        where = f" ({culprit})" if culprit else f" (from {_manifest_list(table, snapshot_id)})"
        raise snap.table_error(
            f"its manifests cannot be read{where}: {type(exc).__name__}: {first_line(exc)}"
        ) from None
    reader = deletes.DeleteReader(table, snap.table_error, snap.parquet_file)
    unpartitioned = {i for i, spec in table.metadata.specs().items() if spec.is_unpartitioned()}
    equality_files = sorted(planned.equality, key=lambda e: e.data_file.file_path)
    paths: list[str] = []
    sizes, records, specs = [], [], []
    keeps: dict[str, np.ndarray] = {}
    for task in planned.tasks:
        data = task.file
        uri = data.file_path
        if skip and uri in skip:
            continue
        if data.file_format != FileFormat.PARQUET:
            raise _refused(
                snap,
                f"data file {uri} is {data.file_format.name}: only Parquet data files are read",
            )
        _scheme_check(snap, uri, listed)
        paths.append(uri)
        sizes.append(int(data.file_size_in_bytes))
        specs.append(int(data.spec_id))
        rows = int(data.record_count)
        records.append(rows)
        gone = []
        for d in task.delete_files:
            positions = reader.positions(d, uri)
            if positions is not None and len(positions):
                _check_positions(snap, positions, d, uri, rows)
                gone.append(positions)
        keep = None
        if gone:
            positions = np.concatenate(gone)
            keep = np.ones(max(rows, int(positions.max(initial=-1)) + 1), dtype=bool)
            keep[positions] = False
        seq = planned.sequence.get(uri, 0)
        equality = [
            reader.equality_rows(e.data_file)
            for e in equality_files
            if deletes.applies(e.data_file, int(e.sequence_number or 0), data, seq, unpartitioned)
        ]
        if equality:
            matched = deletes.equality_keep(data, equality, snap.table_error, snap.parquet_file)
            if keep is None:
                keep = np.ones(max(rows, len(matched)), dtype=bool)
            keep[: len(matched)] &= matched
        if keep is not None and not keep.all():
            keeps[uri] = keep
    as_array = functools.partial(np.array, dtype=np.int64)
    return SnapshotPlan(paths, as_array(sizes), as_array(records), as_array(specs), keeps)


def _check_positions(
    snap: IcebergSnapshot, positions: np.ndarray, delete: Any, uri: str, rows: int
) -> None:
    """Positions a delete file gives for a data file lie within its rows (the manifest's
    ``record_count``): a negative one would delete a row counted from the end, a huge one
    would size the keep-mask by it (a damaged file is refused, naming it)."""
    low, high = int(positions.min()), int(positions.max())
    if low < 0 or high >= rows:
        bad = low if low < 0 else high
        raise snap.table_error(
            f"delete file {delete.file_path} deletes row {bad} of data file {uri}, which has "
            f"{rows} rows (a damaged delete file or manifest)"
        )


def _manifest_list(table: Any, snapshot_id: int) -> str:
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    return f"manifest list {getattr(snapshot, 'manifest_list', None)}"


def _identity_columns(table: Any, spec_id: int, schema_id: int) -> set[str]:
    from pyiceberg.transforms import IdentityTransform

    spec = table.metadata.specs().get(spec_id)
    schema = table.metadata.schema_by_id(schema_id) or table.metadata.schema()
    out = set()
    for part in spec.fields if spec is not None else []:
        if isinstance(part.transform, IdentityTransform):
            try:
                out.add(schema.find_column_name(part.source_id))
            except Exception:
                continue
    return {n for n in out if n is not None and "." not in n}


def _scheme_check(snap: IcebergSnapshot, uri: str, listed: Callable[[str], str]) -> None:
    """A data file the reader reaches: a local one of a local table, or one under a remote
    table's location on an object store fsspec can open (the table's ``storage_options``
    reach it); anything else is refused by its scheme or place, never read from elsewhere."""
    scheme = uri.split("://", 1)[0] if "://" in uri else "file"
    root = snap.table_uri.split("://", 1)[0] if "://" in snap.table_uri else "file"
    if scheme == "file" and root == "file":
        return
    if scheme != root:
        raise _refused(
            snap,
            f"data file {uri}{listed(uri)} is on scheme {scheme!r}, the table's location "
            f"{snap.table_uri} on {root!r}: only data files on the table's own storage are read",
        )
    if not uri.startswith(snap.table_uri.rstrip("/") + "/"):
        raise _refused(
            snap,
            f"data file {uri}{listed(uri)} lies outside the table's location {snap.table_uri}"
            " (write.data.path elsewhere): not read in place from an object store",
        )
    if not _reachable(scheme):
        raise _refused(
            snap,
            f"data file {uri}{listed(uri)} is on scheme {scheme!r}, which no installed fsspec "
            "filesystem reads (install its package, e.g. s3fs, gcsfs, adlfs)",
        )


@functools.cache
def _reachable(scheme: str) -> bool:
    import fsspec

    try:
        fsspec.get_filesystem_class(scheme)
    except (ImportError, ValueError):
        return False
    return True


def _refused(snap: IcebergSnapshot, message: str) -> UnsupportedIcebergFeatureError:
    return UnsupportedIcebergFeatureError(snap.name, message, snapshot=snap.version)


def _stat_files(snap: IcebergSnapshot, listed: Callable[[str], str]) -> None:
    """Every data file present with its manifest's size (else: expired, or truncated), and
    its modification time (part of its identity in the footer cache); an error names the
    manifest that lists the file (``listed``: a damaged manifest can name another path).
    A remote table's files are checked with one listing of its location (no modification
    times: a data file is never rewritten in place)."""
    from ..parquet.remote import check_remote_files, is_remote_table

    if is_remote_table(snap):
        return check_remote_files(snap, snap.table_error, "its manifest")
    for uri in snap.files:
        key = file_key(uri)
        try:
            st = os.stat(key)
        except FileNotFoundError:
            raise snap.table_error(
                f"data file {uri} is missing{listed(uri)}: the snapshot's files were probably "
                "removed (expire_snapshots, remove_orphan_files)"
            ) from None
        except (OSError, ValueError) as exc:  # a damaged path (a NUL byte, too long...)
            raise snap.table_error(
                f"data file {uri!r}{listed(uri)} cannot be read: {type(exc).__name__}: {exc}"
            ) from None
        logged = snap._sizes.get(key)
        if logged is not None and st.st_size != logged:
            raise snap.table_error(
                f"data file {uri}{listed(uri)} has {st.st_size} bytes, its manifest says "
                f"{logged} (truncated?)"
            )
        snap._mtimes[key] = st.st_mtime_ns


def check_filter(snap: IcebergSnapshot) -> None:
    if snap.filter is not None:
        filter_columns(snap)
