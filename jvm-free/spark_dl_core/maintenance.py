"""Dataset maintenance: ``vacuum`` deletes files that no committed index references.

Writes never make a file visible except through ``index.json``, so anything else a write
left in the directory (shards of failed, killed or losing task attempts, a half-written
``*.tmp-*`` file, shards of a dataset an overwrite replaced while a reader held them) is
dead weight that only :func:`vacuum` or the next Spark commit removes.

What is removed: top-level files that look like ours (``*.mds``, ``*.mds.<codec>``,
``*.mds.lengths``, ``*.tmp-*``) and that ``index.json`` does not name (nor, for a lengths
file, ``spark_dl.json``). ``index.json`` and ``spark_dl.json``
are never removed, nor files of other kinds (a README someone put there), nor anything in
subdirectories.
Without ``index.json`` the shards of a first write that never committed all go; a
directory with none of our files, or a Delta table, is refused (:class:`DatasetError`).

Why a retention period: a file younger than ``retention_seconds`` may belong to a write
still in flight (its tasks write shards long before the driver writes the index), so it
stays. The retention must therefore exceed the longest write job that may run on the
path; ``retention_seconds=0`` is only safe when nothing writes to it. Ages come from the
store's modification times, so on object stores they are subject to clock skew between
this machine and the store; a file whose age cannot be determined counts as new.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import stat
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import DatasetError, SpecError
from .format.index import INDEX_FILE, META_FILE, PREVIOUS_META_FILE, parse_index
from .meta import lengths_info, read_meta
from .store.storage import Store
from .versions import drop_version, held_versions, physical_names, read_version

DEFAULT_RETENTION_SECONDS = 3600.0
_OURS = re.compile(r"\.mds(\.[A-Za-z0-9]+)?$|\.tmp-[0-9a-f]+$")


@dataclass
class VacuumReport:
    """What :func:`vacuum` removed (or, in a dry run, would remove) and what it kept."""

    path: str
    dry_run: bool
    retention_seconds: float
    committed: bool  # whether an index.json was there
    removed: list[str] = field(default_factory=list)
    bytes_removed: int = 0
    kept: list[str] = field(default_factory=list)  # referenced, metadata, or not ours
    too_new: list[str] = field(default_factory=list)  # unreferenced but within retention
    dropped_versions: list[int] = field(default_factory=list)  # a followed table's, by the rule

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Entry:
    name: str
    size: int
    mtime: float | None  # seconds since the epoch; None when the store does not say


def _as_epoch(value: Any) -> float | None:
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return value.timestamp()
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _entries(store: Store) -> list[_Entry]:
    """Plain files directly in the dataset directory, with sizes and modification times."""
    out: list[_Entry] = []
    if store.remote:
        if not store.fs.exists(store.root):
            return out
        for info in store.fs.ls(store.root, detail=True):
            if info.get("type") == "directory":
                continue
            name = str(info["name"]).rstrip("/").rsplit("/", 1)[-1]
            mtime = None
            for key in ("mtime", "LastModified", "last_modified", "modified", "created"):
                mtime = _as_epoch(info.get(key))
                if mtime is not None:
                    break
            out.append(_Entry(name, int(info.get("size") or 0), mtime))
        return out
    if not os.path.isdir(store.root):
        return out
    for name in sorted(os.listdir(store.root)):
        try:
            st = os.lstat(os.path.join(store.root, name))
        except FileNotFoundError:  # removed meanwhile
            continue
        if stat.S_ISDIR(st.st_mode):
            continue
        out.append(_Entry(name, st.st_size, st.st_mtime))
    return out


def referenced(store: Store) -> set[str] | None:
    """Every file name ``index.json`` names (raw and compressed), and the lengths files
    beside those shards that ``spark_dl.json`` (or the metadata a torn commit keeps) names;
    None without an index.

    A corrupt index or metadata raises: vacuum then deletes nothing.
    """
    if not store.exists(INDEX_FILE):
        return None
    shards = parse_index(store.read_bytes(INDEX_FILE), store.display(INDEX_FILE))
    names = {s.raw_data.basename for s in shards}
    names.update(s.zip_data.basename for s in shards if s.zip_data is not None)
    for meta_file in (META_FILE, PREVIOUS_META_FILE):
        if store.exists(meta_file):
            meta = json.loads(store.read_bytes(meta_file))
            names.update(f.basename for m in meta.get("shards", []) if (f := lengths_info(m)))
    return names


def _drop_versions(
    store: Store, keep_versions: int | None, keep_seconds: float | None, dry_run: bool
) -> list[int]:
    """The held versions of a followed table that the rule lets go (their manifests deleted
    unless ``dry_run``): a version stays if it is one of the ``keep_versions`` newest or
    was committed less than ``keep_seconds`` ago; the latest always stays; no rule, all stay."""
    held = held_versions(store)
    if not held or (keep_versions is None and keep_seconds is None):
        return []
    if keep_versions is not None and keep_versions < 1:
        raise SpecError(f"vacuum {store.display()}: keep_versions must be >= 1")
    now = time.time()
    newest = set(held[-keep_versions:]) if keep_versions is not None else set()
    dropped = []
    for version in held[:-1]:
        if version in newest:
            continue
        if keep_seconds is not None:
            created = read_version(store, version)
            assert created is not None
            if now - float(created.manifest.get("created", 0)) < keep_seconds:
                continue
        dropped.append(version)
    if not dry_run:
        for version in dropped:
            drop_version(store, version)
    return dropped


def _kept_names(store: Store, dropped: list[int], dry_run: bool) -> set[str] | None:
    """What the root index and every held version (less those dropped) name; None when
    there is neither."""
    keep = referenced(store)
    held = [v for v in held_versions(store) if v not in dropped]
    if not held:
        return keep
    names = set(keep or ())
    for version in held:
        found = read_version(store, version)
        assert found is not None
        names |= physical_names(found.manifest)
        names.update(f.basename for m in found.meta["shards"] if (f := lengths_info(m)))
    return names


def vacuum_store(
    store: Store,
    *,
    retention_seconds: float = DEFAULT_RETENTION_SECONDS,
    dry_run: bool = False,
    keep_versions: int | None = None,
    keep_seconds: float | None = None,
) -> VacuumReport:
    """:func:`vacuum` on an open :class:`Store` (what a Spark commit calls after its index)."""
    if retention_seconds < 0:
        raise SpecError(f"vacuum {store.display()}: retention_seconds must be >= 0")
    if not store.exists():
        raise DatasetError(f"vacuum: {store.display()} does not exist")
    entries = _entries(store)  # list first: a commit landing after this only adds names
    dropped = _drop_versions(store, keep_versions, keep_seconds, dry_run)
    keep = _kept_names(store, dropped, dry_run)
    if keep is None:
        _check_is_dataset(store, entries)
    report = VacuumReport(store.display(), dry_run, retention_seconds, keep is not None)
    report.dropped_versions = dropped
    now = time.time()
    for entry in entries:
        name = entry.name
        if name in (INDEX_FILE, META_FILE) or not _OURS.search(name) or name in (keep or ()):
            report.kept.append(name)
            continue
        if retention_seconds > 0 and (entry.mtime is None or now - entry.mtime < retention_seconds):
            report.too_new.append(name)
            continue
        report.removed.append(name)
        report.bytes_removed += entry.size
    if keep is not None and any(e.name == PREVIOUS_META_FILE for e in entries):
        report.removed.append(PREVIOUS_META_FILE)
        if not dry_run:
            _settle_metadata(store)
    if not dry_run and report.removed:
        # check again right before deleting: a commit since our first read may name them now
        again = _kept_names(store, dropped, dry_run) or set()
        for name in [n for n in report.removed if n in again]:
            report.removed.remove(name)
            report.kept.append(name)
            report.bytes_removed -= next(e.size for e in entries if e.name == name)
        for name in report.removed:
            store.delete(name)
    return report


def _check_is_dataset(store: Store, entries: list[_Entry]) -> None:
    """Without ``index.json`` only a write that never committed justifies a vacuum: a Delta
    table or a directory with none of our files is refused, so a typo is not an "ok"."""
    if store.exists("_delta_log"):
        raise DatasetError(
            f"vacuum: {store.display()} is a Delta table, not a spark-dl dataset (it has a "
            "_delta_log directory and no index.json); vacuum it with Delta's own VACUUM"
        )
    if not any(_OURS.search(e.name) for e in entries):
        raise DatasetError(
            f"vacuum: there is no dataset at {store.display()} (no index.json, and no shards "
            "or temporary files of a write that never committed)"
        )


def _settle_metadata(store: Store) -> None:
    """Finish a commit torn between its two metadata writes (see commit.commit_dataset).

    ``spark_dl.prev.json`` describes the dataset an interrupted overwrite meant to replace:
    if the index still names that dataset's shards (what :func:`meta.read_meta` falls back
    to), it becomes ``spark_dl.json`` again; either way the fallback file then goes.
    """
    try:
        committed = read_meta(store)
    except DatasetError:  # neither file describes the index: leave them for a person
        return
    if committed is not None and committed.meta_file == PREVIOUS_META_FILE:
        store.write_bytes(META_FILE, store.read_bytes(PREVIOUS_META_FILE))


def vacuum(
    path: str,
    *,
    retention_seconds: float = DEFAULT_RETENTION_SECONDS,
    dry_run: bool = False,
    storage_options: dict[str, Any] | None = None,
    keep_versions: int | None = None,
    keep_seconds: float | None = None,
) -> VacuumReport:
    """Delete files at ``path`` that the committed ``index.json`` does not reference.

    Only files older than ``retention_seconds`` go: a younger one may belong to a write in
    flight. ``dry_run`` reports without deleting. See the module docstring for what counts.
    A dataset that follows a Delta table keeps every version it holds unless a rule lets
    some go: ``keep_versions`` (the newest N) and/or ``keep_seconds`` (committed within);
    a version either rule keeps stays, the latest always; files a kept version needs stay.
    """
    return vacuum_store(
        Store(path, storage_options),
        retention_seconds=retention_seconds,
        dry_run=dry_run,
        keep_versions=keep_versions,
        keep_seconds=keep_seconds,
    )
