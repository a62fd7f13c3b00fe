"""An Iceberg snapshot's deletes as keep-masks per data file: position deletes (Parquet
delete files, v3 deletion vectors) and equality deletes, which PyIceberg's planner refuses
and this reader applies itself.

Planning goes through PyIceberg's manifest planner (partition scopes and sequence numbers of
position deletes), with the equality-delete entries taken aside before it sees them. An
equality delete file applies, as the spec says, to the data files with a *lower* data
sequence number, in its partition (or every partition, from an unpartitioned spec); a row
is deleted when its values of the file's ``equality_ids`` columns (resolved by field id)
equal one of the file's rows, a null equal to a null. Every delete file is read once,
however many data files it applies to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..parquet.table_files import first_line
from .columns import field_id
from .deletion_vectors import Vector, entry_vector, read_vectors, vector_target

Fail = Callable[[str], Exception]
Open = Callable[[str], pq.ParquetFile]  # a file of the table opened where it lies


@dataclass(frozen=True)
class Task:
    """One live data file and the position-delete files that apply to it."""

    file: Any  # PyIceberg's DataFile
    delete_files: list[Any]  # position delete files, then its deletion vector (at most one)


@dataclass
class Planned:
    """The snapshot's data files (in path order), each one's data sequence number, and the
    equality-delete entries set aside."""

    tasks: list[Task]
    sequence: dict[str, int] = field(default_factory=dict)
    equality: list[Any] = field(default_factory=list)


# Snapshots this process planned from their manifests (not served from the plan cache).
plans_run = 0


def plan(table: Any, snapshot_id: int) -> Planned:
    """The snapshot's data files planned from its manifests, as PyIceberg's planner plans
    an unfiltered scan (its manifest reader, sequence-number inheritance and position-delete
    index; files of no records left out), without what a scan without a filter does not
    need (a residual expression built per data file, a second read of each manifest to
    count its entries). Each manifest's entries are counted against its manifest list's
    counts, the totals against the snapshot's summary. A local table's manifests are
    decoded in this thread: on threads, the GIL-bound decoding of 10^5 files' entries took
    7.0 s of wall where one thread took 4.2 (an object store's latency is overlapped)."""
    from pyiceberg.manifest import DataFileContent, FileFormat, ManifestEntryStatus
    from pyiceberg.table.delete_file_index import DeleteFileIndex
    from pyiceberg.utils.concurrent import ExecutorFactory

    global plans_run
    plans_run += 1
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    manifests = snapshot.manifests(table.io) if snapshot is not None else []
    out = Planned([])
    index = DeleteFileIndex()
    # deletion vectors by the data file their entry names: PyIceberg's index pairs them by
    # partition, in sets of DataFiles equal by path, where the vectors of one Puffin file
    # (one path, many blobs) would collapse into one
    vectors: dict[str, list[Any]] = {}
    data_entries = []
    read: Iterable[list[Any]]
    version = int(table.metadata.format_version)
    if _is_local(table.metadata.location):
        read = (manifest_entries(table.io, m, version) for m in manifests)
    else:  # an object store's latency overlapped
        read = ExecutorFactory.get_or_create().map(
            lambda m: manifest_entries(table.io, m, version), manifests
        )
    for entries in read:
        for entry in entries:
            data = entry.data_file
            if entry.status == ManifestEntryStatus.DELETED or data.record_count == 0:
                continue
            if data.content == DataFileContent.DATA:
                data_entries.append(entry)
                out.sequence[data.file_path] = int(entry.sequence_number or 0)
            elif data.content == DataFileContent.POSITION_DELETES:
                if data.file_format == FileFormat.PUFFIN:
                    vectors.setdefault(vector_target(data), []).append(entry)
                else:
                    index.add_delete_file(entry, partition_key=data.partition)
            elif data.content == DataFileContent.EQUALITY_DELETES:
                out.equality.append(entry)
            else:
                raise ValueError(f"manifest entry of unknown content {data.content}: {data}")
    data_entries.sort(key=lambda e: e.data_file.file_path)
    for e in data_entries:
        data = e.data_file
        seq = e.sequence_number or 0
        applied = sorted(index.for_data_file(seq, data, data.partition), key=_path_of)
        found = vectors.get(data.file_path, [])
        mine = [v.data_file for v in found if (v.sequence_number or 0) >= seq]
        if len(mine) > 1:
            raise ValueError(
                f"data file {data.file_path} has {len(mine)} deletion vectors, one is allowed "
                f"(in {', '.join(sorted({v.file_path for v in mine}))})"
            )
        out.tasks.append(Task(data, applied + mine))
    check_totals(snapshot, [int(t.file.record_count) for t in out.tasks])
    return out


def _path_of(data_file: Any) -> str:
    return str(data_file.file_path)


def _is_local(location: str) -> bool:
    return "://" not in location or location.startswith("file:")


def manifest_entries(io: Any, manifest: Any, format_version: int = 2) -> list[Any]:
    """Every entry of a manifest (added, existing and deleted), decoded once and counted
    against its manifest list's counts: a manifest cut at an Avro block boundary reads as
    fewer files, whose rows (or deletes) would be dropped silently. A format-version 3
    table's delete manifests are decoded with their v3 fields (:func:`_v3_delete_entries`)."""
    from pyiceberg.manifest import ManifestContent

    if format_version >= 3 and manifest.content == ManifestContent.DELETES:
        entries = _v3_delete_entries(io, manifest)
    else:
        entries = manifest.fetch_manifest_entry(io, discard_deleted=False)
    counts = [manifest.added_files_count, manifest.existing_files_count]
    counts.append(manifest.deleted_files_count)
    if all(c is not None for c in counts) and len(entries) != sum(counts):  # optional in v1
        raise ValueError(
            f"manifest {manifest.manifest_path} has {len(entries)} entries, its manifest list "
            f"counts {sum(counts)} (truncated?)"
        )
    return entries


def _v3_delete_entries(io: Any, manifest: Any) -> list[Any]:
    """A v3 delete manifest's entries with the fields PyIceberg's reader drops (it decodes
    every manifest with the v2 schema): a deletion vector's ``referenced_data_file``,
    ``content_offset`` and ``content_size_in_bytes``, which say whose rows its blob deletes
    and where the blob lies. Without them a vector can only be matched by the data file its
    Puffin footer names, and the footer has no checksum: a damaged name moves one file's
    deletes to another, or drops them (found by fuzzing, tests/sources)."""
    from pyiceberg.avro.file import AvroFile
    from pyiceberg.manifest import (
        MANIFEST_ENTRY_SCHEMAS,
        DataFile,
        DataFileContent,
        FileFormat,
        ManifestEntry,
        ManifestEntryStatus,
        _inherit_from_manifest,
    )

    with AvroFile[ManifestEntry](
        io.new_input(manifest.manifest_path),
        MANIFEST_ENTRY_SCHEMAS[3],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    ) as reader:
        return [_inherit_from_manifest(entry, manifest) for entry in reader]


def check_totals(snapshot: Any, records: Any) -> None:
    """The planned data files and their ``records`` add up to the snapshot summary's totals
    (``total-data-files``, ``total-records``), where it records them: a manifest list cut at
    an Avro block boundary reads as fewer manifests, whose files' rows would be dropped
    silently (the list itself counts nothing to check it against)."""
    summary = getattr(snapshot, "summary", None)
    if summary is None:
        return
    for key, found in (("total-data-files", len(records)), ("total-records", int(sum(records)))):
        said = summary.get(key)
        if said is not None and str(said).isdigit() and int(said) != found:
            raise ValueError(
                f"the manifests give {key}={found}, the snapshot's summary says {said} "
                "(a truncated manifest list or manifest?)"
            )


def unreadable_manifest(table: Any, snapshot_id: int) -> str | None:
    """Which of the snapshot's manifest list and manifests cannot be read ("manifest list
    PATH", or "manifest PATH listed in manifest list PATH": a damaged list can name a
    manifest that is not there), once planning failed: the error then names the file."""
    from pyiceberg.manifest import read_manifest_list

    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None or not snapshot.manifest_list:
        return None
    try:
        manifests = list(read_manifest_list(table.io.new_input(snapshot.manifest_list)))
    except Exception:
        return f"manifest list {snapshot.manifest_list}"
    for manifest in manifests:
        try:
            manifest.fetch_manifest_entry(table.io, discard_deleted=False)
        except Exception:
            return f"manifest {manifest.manifest_path} listed in {snapshot.manifest_list}"
    return None


def listed_in(table: Any, snapshot_id: int, path: str) -> str:
    """`` (listed in manifest M)``: which of the snapshot's manifests lists data file
    ``path``, for an error about the file (read again only then); empty if none does."""
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    try:
        for manifest in snapshot.manifests(table.io) if snapshot is not None else []:
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.data_file.file_path == path:
                    return f" (listed in manifest {manifest.manifest_path})"
    except Exception:
        return ""
    return ""


class DeleteReader:
    """Delete files read once each: positions per data file, equality rows per file."""

    def __init__(self, table: Any, fail: Fail, open_file: Open) -> None:
        self.table = table
        self.fail = fail
        self.open_file = open_file
        self._positions: dict[str, dict[str, Any]] = {}
        self._vectors: dict[str, dict[int, Vector]] = {}  # a Puffin file's, by blob offset
        self._rows: dict[str, pa.Table] = {}

    def positions(self, delete: Any, uri: str) -> np.ndarray | None:
        """Positions of data file ``uri`` that ``delete`` (a position delete file, or a
        deletion vector checked against its blob: :mod:`.deletion_vectors`) deletes."""
        from pyiceberg.io.pyarrow import _read_deletes
        from pyiceberg.manifest import FileFormat

        path = delete.file_path
        try:
            if delete.file_format == FileFormat.PUFFIN:
                if path not in self._vectors:
                    with self.table.io.new_input(path).open() as f:
                        self._vectors[path] = read_vectors(f.read())
                vector = entry_vector(self._vectors[path], delete, uri)
                return None if vector is None else vector.positions
            if path not in self._positions:
                self._positions[path] = _read_deletes(self.table.io, delete)
        except Exception as exc:
            raise self.fail(f"delete file {path} cannot be read: {first_line(exc)}") from None
        found = self._positions[path].get(uri)
        return None if found is None else np.asarray(found, dtype=np.int64)

    def equality_rows(self, delete: Any) -> pa.Table:
        """The delete file's rows, one column per equality id (named by the id)."""
        if delete.file_path not in self._rows:
            ids = [int(i) for i in delete.equality_ids or []]
            if not ids:
                raise self.fail(f"equality delete file {delete.file_path} names no columns")
            try:
                pf = self.open_file(delete.file_path)
                by_id = {field_id(f): f.name for f in pf.schema_arrow}
                missing = [i for i in ids if i not in by_id]
                if missing:
                    raise ValueError(f"it has no column for field id(s) {missing}")
                rows = pf.read(columns=[by_id[i] for i in ids])
            except Exception as exc:
                raise self.fail(
                    f"equality delete file {delete.file_path} cannot be read: {first_line(exc)}"
                ) from None
            self._rows[delete.file_path] = rows.rename_columns([str(i) for i in ids])
        return self._rows[delete.file_path]


def applies(delete: Any, delete_seq: int, data: Any, data_seq: int, global_specs: set[int]) -> bool:
    """Whether an equality delete (entry data, sequence number) applies to a data file."""
    if delete_seq <= data_seq:
        return False
    if delete.spec_id in global_specs:
        return True
    return bool(delete.spec_id == data.spec_id and delete.partition == data.partition)


def equality_keep(data: Any, deletes: list[pa.Table], fail: Fail, open_file: Open) -> np.ndarray:
    """The data file's rows no equality delete matches (True: kept)."""
    uri = data.file_path
    wanted = sorted({int(c) for rows in deletes for c in rows.column_names})
    try:
        pf = open_file(uri)
        by_id = {field_id(f): f.name for f in pf.schema_arrow}
        missing = [i for i in wanted if i not in by_id]
        if missing:
            raise ValueError(f"it has no column for the equality delete field id(s) {missing}")
        keys = pf.read(columns=[by_id[i] for i in wanted]).rename_columns([str(i) for i in wanted])
    except Exception as exc:
        raise fail(
            f"data file {uri} cannot be read for its equality deletes: {first_line(exc)}"
        ) from None
    keep = np.ones(keys.num_rows, dtype=bool)
    for rows in deletes:
        names = rows.column_names
        if len(names) == 1:
            column = keys.column(names[0])
            values = rows.column(names[0]).cast(column.type)
            hit = pc.is_in(column, value_set=values.combine_chunks(), skip_nulls=False)
            keep &= ~hit.to_numpy(zero_copy_only=False).astype(bool)
            continue
        gone = set(zip(*(rows.column(n).cast(keys.column(n).type).to_pylist() for n in names)))
        mine = zip(*(keys.column(n).to_pylist() for n in names))
        keep &= np.fromiter((t not in gone for t in mine), dtype=bool, count=keys.num_rows)
    return keep
