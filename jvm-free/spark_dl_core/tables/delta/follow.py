"""A dataset that follows a Delta table: ``snapshot.write_mds(path, mode="update")``.

An export cuts shards within each data file, never across two, files in the log's path
order (see :meth:`DeltaSnapshot.export_batches`). So a data file's rows are the same shards
in every version that keeps the file, and updating a dataset from the version it holds to
version N only has to:

- convert the data files added since (their shards get a prefix of their own);
- keep the shards of files still live, drop files no longer listed (OPTIMIZE and overwrites
  remove files; their rows come back in the files that replace them);
- for a kept file whose deletion vector grew, write nothing: the version records *virtual
  shards*, the shards a fresh export would cut from the file's live rows, as runs of samples
  of the shards on disk (see :mod:`spark_dl_core.versions`), with the content hashes a fresh
  export would record.

Hence the rule the tests hold: the dataset of version N reached by updates is a fresh export
of version N (same shards' content and sizes, same fingerprint, same batches). A change of
columns or types (schema evolution) converts every file again; a deletion vector that
shrank (a RESTORE), or one on a filtered snapshot, converts that file again.

Each version is committed as a manifest created only if absent (two updaters cannot both
commit a version). The root ``index.json`` / ``spark_dl.json`` (what Mosaic and other MDS
readers open) are the latest version when it has no virtual shards; while the latest
version has some, the root index is removed, so no plain MDS reader serves a deleted row.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import time
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
from .log import commit_history, file_key
from .snapshot import DeltaSnapshot

Ranges = list[list[int]]  # sorted, disjoint [start, stop) runs of row numbers


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


def _deleted(snap: DeltaSnapshot, key: str) -> np.ndarray:
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
    snap: DeltaSnapshot,
    out_path: str,
    spec: DatasetSpec | dict[str, Any] | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
) -> WriteResult:
    """Update the dataset at ``out_path`` to ``snap``'s version (see the module docstring).

    An empty path gets a first export that later updates follow; a plain export of the same
    table (``write_mds``) is adopted. Raises :class:`FollowError` (nothing written) for an
    update backwards, from another table, or from a history that no longer reaches the
    version held.
    """
    store = Store(out_path, storage_options)
    if snap.since is not None:  # its rows are not a version's: an update would mix the two
        raise FollowError(
            f"open_delta(..., since={snap.since}) is the rows new since a version, not a "
            f"version of the table: it cannot follow {snap.table_uri!r} into {store.display()}"
            "; export it without mode='update', or follow the whole version",
            table=snap.table_uri,
            path=store.display(),
            asked=snap.version,
        )
    given = spec_for(spec)
    held = _held(store, snap, given)
    if held is not None:
        _check_continues(store, snap, held)
        if held.version == snap.version:
            return _result(out_path, _meta_of(store, held.version), skipped=True)
    chosen = held.spec if held is not None else planned_spec(given or DatasetSpec(), None)
    plans = plan_columns(written_schema(snap.output_schema, chosen), chosen)
    reusable = held if held is not None and held.plans == plans else None
    built = _Built()
    try:
        for uri in snap.files:
            _add_file(store, snap, uri, chosen, plans, reusable, built)
        meta = build_meta(chosen, plans, built.records, snap.lineage())
        _commit(store, snap, meta, built, held)
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
    snap: DeltaSnapshot,
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
    built.written += [s.stored.basename for s in records.shards]
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
    store: Store, snap: DeltaSnapshot, uri: str, spec: DatasetSpec, plans: list[ColumnPlan]
) -> ShardRecords:
    """One data file's live rows as shards, exactly as a fresh export cuts them."""
    one = dataclasses.replace(snap, files=[uri], _inplace=None)
    writer = ShardWriter(store, spec, prefix=new_prefix(), plans=plans)
    try:
        for batch in one.export_batches():
            writer.write(batch)
        writer.finish()
    except BaseException:
        abort_write(store, [s.stored.basename for s in writer.shards])
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


def _held(store: Store, snap: DeltaSnapshot, given: DatasetSpec | None) -> _Held | None:
    """The latest version the dataset at ``store`` holds (None: nothing there yet); a plain
    export of the table is adopted as a held version first."""
    version = read_version(store)
    if version is None:
        committed = read_meta(store)
        if committed is None:
            return None
        return _adopt(store, snap, committed)
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
    )
    for key in sorted(given.model_fields_set if given is not None else ()):
        if getattr(given, key) != getattr(held.spec, key):
            why = f"spec {key}={getattr(given, key)!r} differs from the dataset's"
            raise _error(store, snap, held, why)
    return held


def _adopt(store: Store, snap: DeltaSnapshot, committed: Any) -> _Held:
    """A plain export of ``snap``'s table as the first held version: each data file of the
    exported version owns the run of shards whose samples add up to its live rows."""
    shown = store.display()
    source = (committed.meta or {}).get("source") or {}
    if source.get("kind") != "delta" or source.get("table") != snap.table_uri:
        raise FollowError(
            f"{shown} holds a dataset exported from {source.get('table') or 'no Delta table'}"
            f", not from Delta table {snap.table_uri!r}; update a dataset of that table or "
            "write to a new path",
            table=snap.table_uri,
            path=shown,
            asked=snap.version,
        )
    old_version = int(source["version"])
    held_stub = _Held(old_version, snap.table_uri, None, source.get("timestamp"), source,
                      DatasetSpec(), [], ShardRecords.empty(), {})  # fmt: skip
    if source.get("filter") is not None or source.get("since") is not None:
        why = "since=" if source.get("since") is not None else "filtered"
        raise _error(store, snap, held_stub, f"a {why} export cannot be adopted")
    if old_version > snap.version:
        raise _error(store, snap, held_stub, "the update would move backwards")
    try:
        old = snap.reopen(old_version, columns=source.get("columns"), filter=None)
    except Exception as exc:
        raise _error(
            store, snap, held_stub, f"version {old_version} cannot be read: {exc}"
        ) from None
    records = committed.records
    files = _assign(old, records, shown)
    meta = build_meta(DatasetSpec(**committed.meta["spec"]), plans_from_meta(committed.meta),
                      records, source)  # fmt: skip
    write_version(store, _manifest(old, meta, records, files, {}))  # a racer's is the same
    held = _held(store, snap, None)
    assert held is not None
    return held


def _assign(old: DeltaSnapshot, records: ShardRecords, shown: str) -> list[dict[str, Any]]:
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
            raise FollowError(
                f"{shown}: its shards do not line up with the data files of version "
                f"{old.version} of {old.table_uri!r} (file {uri}); was it written by an "
                "older spark-dl, or not from this table?",
                table=old.table_uri,
                path=shown,
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
        raise FollowError(f"{shown} has more shards than version {old.version}'s files",
                          table=old.table_uri, path=shown)  # fmt: skip
    return files


def _check_continues(store: Store, snap: DeltaSnapshot, held: _Held) -> None:
    """Refuse an update that does not continue the held history: another table, backwards,
    a log that no longer holds the version held (so the table may have been replaced)."""
    if held.table != snap.table_uri:
        raise _error(store, snap, held, f"the dataset follows {held.table!r}")
    if held.table_id and snap.table_id and held.table_id != snap.table_id:
        raise _error(store, snap, held, "the table's id changed: another table is at that path")
    if snap.version < held.version:
        raise _error(store, snap, held, "the update would move backwards")
    if held.lineage.get("columns") != snap.lineage()["columns"]:
        raise _error(store, snap, held, f"the dataset holds columns {held.lineage['columns']}")
    if held.lineage.get("filter") != snap.lineage()["filter"]:
        raise _error(store, snap, held, f"the dataset holds filter {held.lineage['filter']}")
    if snap.version == held.version:
        return
    import deltalake

    table = deltalake.DeltaTable(snap.table_uri, storage_options=snap.storage_options)
    when = dict(commit_history(table)).get(held.version)
    if when is None:
        raise _error(store, snap, held, "the table's log no longer holds the version held")
    stamp = _dt.datetime.fromtimestamp(when / 1000, _dt.timezone.utc)
    if held.timestamp and stamp.isoformat(timespec="milliseconds") != held.timestamp:
        raise _error(
            store, snap, held, "the version held was committed at another time: table replaced"
        )


def _error(store: Store, snap: DeltaSnapshot, held: _Held, why: str) -> FollowError:
    shown = store.display()
    return FollowError(
        f"cannot update {shown} from version {held.version} to version {snap.version} of "
        f"Delta table {snap.table_uri!r}: {why}; nothing was written",
        table=snap.table_uri,
        path=shown,
        held=held_versions(store) or [held.version],
        asked=snap.version,
    )


# --------------------------------------------------------------------------- commit


def _manifest(
    snap: DeltaSnapshot,
    meta: dict[str, Any],
    records: ShardRecords,
    files: list[dict[str, Any]],
    virtual: dict[str, list[Piece]],
) -> dict[str, Any]:
    """A version's manifest: its metadata and index, its files and virtual shards."""
    return {
        "format_version": 1,
        "table": snap.table_uri,
        "table_id": snap.table_id,
        "version": snap.version,
        "timestamp": snap.timestamp,
        "created": time.time(),
        "meta": meta,
        "index": _index_text(records.shards),
        "files": files,
        "virtual": {k: [list(p) for p in v] for k, v in virtual.items()},
    }


def _commit(
    store: Store, snap: DeltaSnapshot, meta: dict[str, Any], built: _Built, held: _Held | None
) -> None:
    """Create the version's manifest (the commit point) unless another updater made it, or
    made a later version, meanwhile."""
    newer = [v for v in held_versions(store) if v > snap.version]
    stub = held or _Held(snap.version, snap.table_uri, None, None, {}, DatasetSpec(), [],
                         ShardRecords.empty(), {})  # fmt: skip
    if newer:
        raise _error(store, snap, stub, f"version {newer[-1]} was committed meanwhile")
    manifest = _manifest(snap, meta, built.records, built.files, built.virtual)
    if not write_version(store, manifest):
        raise _error(store, snap, stub, f"another updater committed version {snap.version}")


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
