"""A dataset that follows a table, whatever its format: ``snapshot.write_mds(path,
mode="update")`` for a Delta version or an Iceberg snapshot. A format hands the update a
:class:`FollowedTable` (the snapshot, plus the few facts only it knows: which number its
versions are ordered by, whether a new version continues the one held, how to reopen the
version a plain export was written from); everything else is here.

An export cuts shards within each data file, never across two, files in the snapshot's path
order. So a data file's rows are the same shards in every version that keeps the file, and
updating a dataset from the version it holds to version N only has to:

- convert the data files added since (their shards get a prefix of their own);
- keep the shards of files still live, drop files no longer listed (a compaction or an
  overwrite removes files; their rows come back in the files that replace them);
- for a kept file whose deletes grew (a deletion vector, position or equality deletes),
  write nothing: the version records *virtual shards*, the shards a fresh export would cut
  from the file's live rows, as runs of samples of the shards on disk (see
  :mod:`spark_dl_core.versions`), with the content hashes a fresh export would record.

Hence the rule the tests hold: the dataset of version N reached by updates is a fresh export
of version N (same shards' content and sizes, same fingerprint, same batches). A change of
columns or types (schema evolution) converts every file again; deletes that shrank (a
RESTORE), or a changed file of a filtered snapshot, convert that file again.

Each version is committed as a manifest created only if absent (two updaters cannot both
commit a version). The root ``index.json`` / ``spark_dl.json`` (what Mosaic and other MDS
readers open) are the latest version when it has no virtual shards; while the latest
version has some, the root index is removed, so no plain MDS reader serves a deleted row.
"""

from __future__ import annotations

import dataclasses
import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...commit import abort_write, commit_dataset, new_prefix, spec_for, written_schema
from ...errors import FollowError
from ...format.compact import COMPACT_FILE
from ...format.compression import parse_compression
from ...format.encodings import merge_shapes
from ...format.index import INDEX_FILE, META_FILE, PREVIOUS_META_FILE, FileInfo, ShardInfo
from ...format.index import index_text as _index_text
from ...meta import ColumnPlan, ShardRecords, build_meta, plan_columns, plans_from_meta, read_meta
from ...spec import DatasetSpec, planned_spec
from ...store.storage import Store
from ...versions import (
    Piece,
    assembled_hash,
    held_versions,
    read_version,
    sample_spans,
    write_version,
)
from ...writer import ShardWriter, WriteResult
from .table_files import file_key

Ranges = list[list[int]]  # sorted, disjoint [start, stop) runs of row numbers


class FollowedTable(ABC):
    """A snapshot of a table being followed, and what only its format knows. ``snap`` is
    the pinned snapshot (files in path order, ``_keep`` masks, ``export_batches``,
    ``lineage``, ``filter``, ``since``); ``number`` the held version it becomes (the
    manifest's ``_follow/v<number>.json``: increasing along the table's history)."""

    kind: str  # the lineage's "kind" a plain export of this format records
    label: str  # how messages name the format's tables ("Delta table")

    def __init__(self, snap: Any) -> None:
        self.snap = snap

    @property
    def table(self) -> str:
        """The table's identity in a manifest (its location)."""
        return str(self.snap.table_uri)

    @property
    def named(self) -> str:
        """How messages name the table."""
        return repr(self.table)

    @property
    @abstractmethod
    def number(self) -> int: ...

    @property
    def table_id(self) -> str | None:
        return None

    @property
    def timestamp(self) -> str | None:
        return self.snap.timestamp

    def manifest_extra(self) -> dict[str, Any]:
        """Fields of the format's own a version's manifest records."""
        return {}

    def point(self, number: int, manifest: dict[str, Any] | None) -> str:
        """A held version in words (``manifest``: its manifest, when there is one)."""
        return f"version {number}"

    @property
    def here(self) -> str:
        return self.point(self.number, self.manifest_extra())

    def exported_from(self, source: dict[str, Any]) -> bool:
        """Whether a plain export's lineage names this table."""
        return source.get("kind") == self.kind and source.get("table") == self.table

    @abstractmethod
    def reopen_exported(self, source: dict[str, Any]) -> tuple[int, Any]:
        """(number, snapshot) of the version a plain export of this table was written from
        (unfiltered, its columns)."""

    @abstractmethod
    def continues(self, number: int, manifest: dict[str, Any], timestamp: str | None) -> str | None:
        """Why the snapshot does not continue the held version (None: it does): the table's
        history no longer holds it, or the table was replaced."""

    def error(self, message: str, path: str, held: list[int], asked: int) -> FollowError:
        return FollowError(message, table=self.table, path=path, held=held, asked=asked)


def _ranges(rows: np.ndarray) -> Ranges:
    """Sorted row numbers as runs ``[[start, stop], ...]`` (compact in JSON)."""
    if len(rows) == 0:
        return []
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [len(rows)]])
    return [[int(rows[a]), int(rows[b - 1]) + 1] for a, b in zip(starts, stops)]


def _rows(ranges: Ranges) -> np.ndarray:
    if not ranges:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges])


def _deleted(snap: Any, key: str) -> np.ndarray:
    keep = snap._keep.get(key)
    if keep is None:
        return np.empty(0, dtype=np.int64)
    return np.flatnonzero(~np.asarray(keep, dtype=bool)).astype(np.int64)


@dataclass
class _Held:
    """What the dataset holds at its latest version, as the update needs it."""

    version: int
    table: str
    table_id: str | None
    timestamp: str | None
    lineage: dict[str, Any]
    spec: DatasetSpec
    plans: list[ColumnPlan]
    records: ShardRecords
    files: dict[str, dict[str, Any]]  # file key -> its entry (first/count into records)
    virtual: dict[str, list[Piece]] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)


def _stub(version: int, table: str, manifest: dict[str, Any] | None = None) -> _Held:
    """A held version known only by its number (for messages)."""
    return _Held(version, table, None, None, {}, DatasetSpec(), [], ShardRecords.empty(), {},
                 manifest=manifest or {})  # fmt: skip


@dataclass
class _Built:
    """The version being built: its records in order, its file entries, virtual shards."""

    records: ShardRecords = field(default_factory=ShardRecords.empty)
    files: list[dict[str, Any]] = field(default_factory=list)
    virtual: dict[str, list[Piece]] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)  # new shard files (deleted on failure)
    converted: int = 0
    masked: int = 0

    def add(self, entry: dict[str, Any], records: ShardRecords) -> None:
        entry["first"], entry["count"] = len(self.records.shards), len(records.shards)
        self.records = self.records + records
        self.files.append(entry)


# --------------------------------------------------------------------------- the update


def update_mds(
    table: FollowedTable,
    out_path: str,
    spec: DatasetSpec | dict[str, Any] | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
) -> WriteResult:
    """Update the dataset at ``out_path`` to ``table``'s version (see the module docstring).

    An empty path gets a first export that later updates follow; a plain export of the same
    table (``write_mds``) is adopted. Raises :class:`FollowError` (nothing written) for an
    update backwards, from another table, or from a history that no longer reaches the
    version held.
    """
    snap = table.snap
    store = Store(out_path, storage_options)
    if snap.since is not None:  # its rows are not a version's: an update would mix the two
        raise table.error(
            f"{snap.shown} (since={snap.since}) is the rows new since an earlier version, not "
            f"a version of the table: it cannot follow {table.label} {table.named} into "
            f"{store.display()}; export it without mode='update', or follow the whole version",
            store.display(),
            [],
            table.number,
        )
    given = spec_for(spec)
    held = _held(store, table, given)
    if held is not None:
        _check_continues(store, table, held)
        if held.version == table.number:
            return _result(out_path, _meta_of(store, held.version), skipped=True)
    chosen = held.spec if held is not None else planned_spec(given or DatasetSpec(), None)
    plans = plan_columns(written_schema(snap.output_schema, chosen), chosen)
    reusable = held if held is not None and held.plans == plans else None
    built = _Built()
    try:
        for uri in snap.files:
            _add_file(store, snap, uri, chosen, plans, reusable, built)
        meta = build_meta(chosen, plans, built.records, snap.lineage())
        _commit(store, table, meta, built, held)
    except BaseException:
        abort_write(store, built.written)
        raise
    _settle_root(store)
    return _result(out_path, meta)


def _result(path: str, meta: dict[str, Any], skipped: bool = False) -> WriteResult:
    shards = len(meta.get("shards", []))
    return WriteResult(path, meta["num_samples"], shards, meta["fingerprint"], meta, skipped)


def _meta_of(store: Store, version: int) -> dict[str, Any]:
    held = read_version(store, version)
    assert held is not None
    return held.meta


def _add_file(
    store: Store,
    snap: Any,
    uri: str,
    spec: DatasetSpec,
    plans: list[ColumnPlan],
    held: _Held | None,
    built: _Built,
) -> None:
    """One data file of the new version: its held shards, masked, or converted afresh."""
    key = file_key(uri)
    deleted = _deleted(snap, key)
    entry = held.files.get(key) if held is not None else None
    if entry is not None and held is not None:
        base = _rows(entry["base"])
        if np.array_equal(_rows(entry["deleted"]), deleted):  # unchanged: reuse as held
            first, count = entry["first"], entry["count"]
            records = _slice(held.records, first, count)
            for info in records.shards:
                name = info.stored.basename
                if name in held.virtual:
                    built.virtual[name] = held.virtual[name]
            built.add(_entry(key, deleted, entry), records)
            return
        extra = np.setdiff1d(deleted, base)
        if snap.filter is None and len(np.intersect1d(base, deleted)) == len(base):
            records = _masked(store, spec, entry, held, base, extra, built)
            built.masked += 1
            built.add(_entry(key, deleted, entry), records)
            return
    records = _convert(store, snap, uri, spec, plans)
    built.written += [name for s in records.shards for name in s.files()]
    built.converted += 1
    physical = {
        "shards": [s.stored.basename for s in records.shards],
        "stored_bytes": [s.stored.bytes for s in records.shards],
        "raw_bytes": [s.raw_data.bytes for s in records.shards],
        "samples": [s.samples for s in records.shards],
        "shapes": [s.shapes for s in records.shards],
        "base": _ranges(deleted),
    }
    built.add(_entry(key, deleted, physical), records)


def _entry(key: str, deleted: np.ndarray, physical: dict[str, Any]) -> dict[str, Any]:
    """A file's entry in a version: its physical shards (and the deletions baked into them)
    and its deletion vector at this version."""
    keys = ("shards", "stored_bytes", "raw_bytes", "samples", "shapes", "base")
    return {"path": key, "deleted": _ranges(deleted), **{k: physical[k] for k in keys}}


def _slice(records: ShardRecords, first: int, count: int) -> ShardRecords:
    stop = first + count
    return ShardRecords(
        records.shards[first:stop],
        records.content_hashes[first:stop],
        records.stored_hashes[first:stop],
    )


def _convert(
    store: Store, snap: Any, uri: str, spec: DatasetSpec, plans: list[ColumnPlan]
) -> ShardRecords:
    """One data file's live rows as shards, exactly as a fresh export cuts them."""
    one = dataclasses.replace(snap, files=[uri], _inplace=None)
    writer = ShardWriter(store, spec, prefix=new_prefix(), plans=plans)
    try:
        for batch in one.export_batches():
            writer.write(batch)
        writer.finish()
    except BaseException:
        abort_write(store, [name for s in writer.shards for name in s.files()])
        raise
    return writer.records


# --------------------------------------------------------------------------- masks


def _cuts(lengths: np.ndarray, limit: int, base: int) -> list[tuple[int, int]]:
    """Where :class:`ShardWriter` cuts shards for samples of these byte lengths: greedily,
    a sample joining the shard while header (``base``) plus 4 + length per sample fits
    ``limit``, a sample too big for any shard alone in one."""
    cum = np.cumsum(lengths.astype(np.int64) + 4)
    out = []
    i, n = 0, len(lengths)
    while i < n:
        before = int(cum[i - 1]) if i else 0
        j = max(int(np.searchsorted(cum, before + limit - base, side="right")), i + 1)
        out.append((i, j))
        i = j
    return out


def _masked(
    store: Store,
    spec: DatasetSpec,
    entry: dict[str, Any],
    held: _Held,
    base: np.ndarray,
    extra: np.ndarray,
    built: _Built,
) -> ShardRecords:
    """The shards a fresh export cuts from a kept file whose deletion vector grew by
    ``extra`` rows: virtual shards over its shards on disk (nothing written)."""
    codec = parse_compression(spec.compression)
    raws: dict[str, np.ndarray] = {}

    def raw_of(name: str, stored_bytes: int, raw_bytes: int) -> np.ndarray:
        if name not in raws:
            data = store.read_array(name)
            raws[name] = (
                data
                if codec is None
                else np.frombuffer(codec.decompress(data, raw_bytes), dtype=np.uint8)
            )
        return raws[name]

    names, samples = entry["shards"], entry["samples"]
    lengths, where, config = [], [], b""
    for k, name in enumerate(names):
        offsets, config = sample_spans(
            raw_of(name, entry["stored_bytes"][k], entry["raw_bytes"][k]), name
        )
        lengths.append(np.diff(offsets))
        where.append(np.stack([np.full(samples[k], k), np.arange(samples[k])], axis=1))
    if not names:
        return ShardRecords.empty()
    lengths_all = np.concatenate(lengths)
    where_all = np.concatenate(where)
    # physical sample g is the g-th row the base kept; rows deleted since map onto those
    total = len(lengths_all) + len(base)
    kept = np.ones(total, dtype=bool)
    kept[base] = False
    dead = np.zeros(max(total, int(extra.max(initial=-1)) + 1), dtype=bool)
    dead[extra] = True
    live = ~dead[np.flatnonzero(kept)]
    live_where = where_all[live]
    shapes_of = dict(zip(names, entry["shapes"]))
    config_of = json.loads(config)
    out = ShardRecords.empty()
    for a, b in _cuts(lengths_all[live], spec.shard_size, 8 + len(config)):
        pieces = _pieces(live_where[a:b], entry)
        digest, size = assembled_hash(pieces, raw_of)  # what assemble(pieces) hashes to
        name = f"v-{digest[:20]}-{len(built.virtual):05}.mds"
        built.virtual[name] = pieces
        shapes = _shapes([shapes_of.get(p[0]) for p in pieces])
        info = ShardInfo(
            samples=b - a,
            raw_data=FileInfo(name, size, {}),
            zip_data=None,
            column_names=config_of["column_names"],
            column_encodings=config_of["column_encodings"],
            column_sizes=config_of["column_sizes"],
            size_limit=config_of.get("size_limit"),
            shapes=shapes,
        )
        out = out + ShardRecords([info], [digest], [{}])
    return out


def _shapes(each: list[dict[str, list[int] | None] | None]) -> dict[str, Any] | None:
    """The shapes a shard made of these shards' samples records (None: none recorded)."""
    if not each or any(s is None for s in each):
        return None
    out: dict[str, list[int] | None] | None = None
    for s in each:
        assert s is not None
        out = merge_shapes(out, s)
    return out


def _pieces(live_where: np.ndarray, entry: dict[str, Any]) -> list[Piece]:
    """Runs of consecutive samples of one shard on disk, for ``(shard, sample)`` pairs."""
    shard, sample = live_where[:, 0], live_where[:, 1]
    breaks = np.flatnonzero((np.diff(shard) != 0) | (np.diff(sample) != 1)) + 1
    starts = np.concatenate([[0], breaks]).astype(np.int64)
    stops = np.concatenate([breaks, [len(shard)]]).astype(np.int64)
    names, stored, raw = entry["shards"], entry["stored_bytes"], entry["raw_bytes"]
    runs = zip(shard[starts].tolist(), sample[starts].tolist(), (sample[stops - 1] + 1).tolist())
    return [(names[k], int(stored[k]), int(raw[k]), first, stop) for k, first, stop in runs]


# --------------------------------------------------------------------------- held state


def _held(store: Store, table: FollowedTable, given: DatasetSpec | None) -> _Held | None:
    """The latest version the dataset at ``store`` holds (None: nothing there yet); a plain
    export of the table is adopted as a held version first."""
    version = read_version(store)
    if version is None:
        committed = read_meta(store)
        if committed is None:
            return None
        return _adopt(store, table, committed)
    manifest = version.manifest
    held = _Held(
        version=version.version,
        table=version.table,
        table_id=manifest.get("table_id"),
        timestamp=manifest.get("timestamp"),
        lineage=dict(version.meta.get("source") or {}),
        spec=DatasetSpec(**version.meta["spec"]),
        plans=plans_from_meta(version.meta),
        records=ShardRecords.from_meta(version.shards, version.meta),
        files={e["path"]: e for e in version.files},
        virtual=version.virtual,
        manifest=manifest,
    )
    for key in sorted(given.model_fields_set if given is not None else ()):
        if getattr(given, key) != getattr(held.spec, key):
            why = f"spec {key}={getattr(given, key)!r} differs from the dataset's"
            raise _error(store, table, held, why)
    return held


def _adopt(store: Store, table: FollowedTable, committed: Any) -> _Held:
    """A plain export of the table as the first held version: each data file of the
    exported version owns the run of shards whose samples add up to its live rows."""
    shown = store.display()
    source = (committed.meta or {}).get("source") or {}
    if not table.exported_from(source):
        raise table.error(
            f"{shown} holds a dataset exported from {source.get('table') or 'no table'}, not "
            f"from {table.label} {table.named}; update a dataset of that table or write to "
            "a new path",
            shown,
            [],
            table.number,
        )
    stub = _stub(-1, table.table)
    if source.get("filter") is not None or source.get("since") is not None:
        why = "since=" if source.get("since") is not None else "filtered"
        raise _error(store, table, stub, f"a {why} export cannot be adopted")
    try:
        number, old = table.reopen_exported(source)
    except FollowError:
        raise
    except Exception as exc:
        raise _error(store, table, stub, f"the version exported cannot be read: {exc}") from None
    stub = _stub(number, table.table, type(table)(old).manifest_extra())
    if number > table.number:
        raise _error(store, table, stub, "the update would move backwards")
    records = committed.records
    files = _assign(old, records, shown, table)
    meta = build_meta(DatasetSpec(**committed.meta["spec"]), plans_from_meta(committed.meta),
                      records, source)  # fmt: skip
    write_version(
        store, _manifest(type(table)(old), meta, records, files, {})
    )  # a racer's is the same
    held = _held(store, table, None)
    assert held is not None
    return held


def _assign(
    old: Any, records: ShardRecords, shown: str, table: FollowedTable
) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    filesystem, prefix = old._filesystem()
    files, at = [], 0
    for uri in old.files:
        key = file_key(uri)
        path = old._fs_path(uri, prefix)
        rows = pq.ParquetFile(path, filesystem=filesystem).metadata.num_rows
        deleted = _deleted(old, key)
        live = rows - len(deleted)
        first, total = at, 0
        while total < live and at < len(records.shards):
            total += records.shards[at].samples
            at += 1
        if total != live:
            raise table.error(
                f"{shown}: its shards do not line up with the data files of {old.shown} "
                f"(file {uri}); was it written by an older spark-dl, or not from this table?",
                shown,
                [],
                table.number,
            )
        shards = records.shards[first:at]
        entry = {
            "path": key,
            "shards": [s.stored.basename for s in shards],
            "stored_bytes": [s.stored.bytes for s in shards],
            "raw_bytes": [s.raw_data.bytes for s in shards],
            "samples": [s.samples for s in shards],
            "shapes": [s.shapes for s in shards],
            "base": _ranges(deleted),
            "deleted": _ranges(deleted),
            "first": first,
            "count": at - first,
        }
        files.append(entry)
    if at != len(records.shards):
        raise table.error(f"{shown} has more shards than {old.shown}'s files", shown, [],
                          table.number)  # fmt: skip
    return files


def _check_continues(store: Store, table: FollowedTable, held: _Held) -> None:
    """Refuse an update that does not continue the held history: another table, backwards,
    other columns or filter, a history that no longer holds the version held (the format's
    :meth:`FollowedTable.continues`)."""
    lineage = table.snap.lineage()
    if held.table != table.table:
        raise _error(store, table, held, f"the dataset follows {held.table!r}")
    if held.table_id and table.table_id and held.table_id != table.table_id:
        raise _error(store, table, held, "the table's id changed: another table is at that path")
    if table.number < held.version:
        raise _error(store, table, held, "the update would move backwards")
    if held.lineage.get("columns") != lineage["columns"]:
        raise _error(store, table, held, f"the dataset holds columns {held.lineage['columns']}")
    if held.lineage.get("filter") != lineage["filter"]:
        raise _error(store, table, held, f"the dataset holds filter {held.lineage['filter']}")
    why = table.continues(held.version, held.manifest, held.timestamp)
    if why is not None:
        raise _error(store, table, held, why)


def _error(store: Store, table: FollowedTable, held: _Held, why: str) -> FollowError:
    shown = store.display()
    return table.error(
        f"cannot update {shown} from {table.point(held.version, held.manifest)} to "
        f"{table.here} of {table.label} {table.named}: {why}; nothing was written",
        shown,
        held_versions(store) or [held.version],
        table.number,
    )


# --------------------------------------------------------------------------- commit


def _manifest(
    table: FollowedTable,
    meta: dict[str, Any],
    records: ShardRecords,
    files: list[dict[str, Any]],
    virtual: dict[str, list[Piece]],
) -> dict[str, Any]:
    """A version's manifest: its metadata and index, its files and virtual shards."""
    return {
        "format_version": 1,
        "table": table.table,
        "table_id": table.table_id,
        "version": table.number,
        "timestamp": table.timestamp,
        "created": time.time(),
        "meta": meta,
        "index": _index_text(records.shards),
        "files": files,
        "virtual": {k: [list(p) for p in v] for k, v in virtual.items()},
        **table.manifest_extra(),
    }


def _commit(
    store: Store, table: FollowedTable, meta: dict[str, Any], built: _Built, held: _Held | None
) -> None:
    """Create the version's manifest (the commit point) unless another updater made it, or
    made a later version, meanwhile."""
    newer = [v for v in held_versions(store) if v > table.number]
    stub = held or _stub(table.number, table.table, table.manifest_extra())
    if newer:
        raise _error(store, table, stub, f"version {newer[-1]} was committed meanwhile")
    manifest = _manifest(table, meta, built.records, built.files, built.virtual)
    if not write_version(store, manifest):
        raise _error(store, table, stub, f"another updater committed {table.here}")


def _settle_root(store: Store) -> None:
    """The root index is the latest held version when it has no virtual shards, else absent
    (see the module docstring). Rewritten from the latest manifest, so racing updaters end
    with the latest one's."""
    latest = read_version(store)
    assert latest is not None
    if latest.virtual:
        for name in (COMPACT_FILE, INDEX_FILE, META_FILE, PREVIOUS_META_FILE):
            store.delete(name)
        return
    current = read_meta(store)
    mine = (latest.meta["fingerprint"], latest.meta.get("source"))
    found = current.meta if current is not None else None
    if found is not None and (found.get("fingerprint"), found.get("source")) == mine:
        return
    records = ShardRecords.from_meta(latest.shards, latest.meta)
    spec = DatasetSpec(**latest.meta["spec"])
    plans = plans_from_meta(latest.meta)
    commit_dataset(store, spec, plans, records, latest.meta.get("source"), current=current)
