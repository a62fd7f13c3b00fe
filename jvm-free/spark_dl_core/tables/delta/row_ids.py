"""Delta row tracking: each row's stable id, so that a run carried on to another version
follows rows that a rewrite moved to another file (an OPTIMIZE, a copy-on-write DELETE,
UPDATE or MERGE).

PROTOCOL.md ("Row Tracking"): where ``delta.enableRowTracking`` is true, a row's stable id is
the value of the materialized row-id column (named by the table's configuration
``delta.rowTracking.materializedRowIdColumnName``, a column of the data file hidden from the
schema) where the file has that column and the value is not null, else the file's
``baseRowId`` plus the row's index in the file (deleted rows counted). Writers preserve a
row's stable id when they copy or update it.

A carry needs the ids of two kinds of files only: the old version's files that a commit
since removed or re-added (the rows it lost), and the files added since (where those rows
went). Every ``remove`` and ``add`` action of those commits carries the file's
``baseRowId`` (writers must set it in both), so the commits between the two versions are
all the log that is read: no checkpoint, no older commit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .log import DeltaSnapshotError, file_key, import_deltalake, log_location, log_uri
from .snapshot import DeltaSnapshot, table_filesystem

ENABLED = "delta.enableRowTracking"
SUSPENDED = "delta.rowTrackingSuspended"
MATERIALIZED = "delta.rowTracking.materializedRowIdColumnName"


class RowIdsMissingError(DeltaSnapshotError):
    """A table with row tracking on whose log names a data file without a ``baseRowId`` (the
    ``rowTracking`` feature requires one): a run cannot be carried on by row ids across it.
    Names the table, the version carried to, the commit and the file."""


@dataclass
class DeltaRowIds:
    """Stable row ids of a table's files between an old version and a new one (a
    :class:`~...sources.row_carry.RowIdentity`). Files are named as the carried layouts name them:
    ``old_keys`` maps the old layout's names to file keys, ``added`` lists the new layout's
    files added since (name, key)."""

    table_uri: str
    storage_options: dict[str, str] | None
    base_row_ids: dict[str, int]  # file key -> baseRowId, from the commits between
    column: str | None  # the materialized row-id column's name in the data files
    old_keys: Mapping[str, str]
    added: Sequence[tuple[str, str]]
    _filesystem: Any = field(default=None, repr=False)
    # file key -> (version, action) of a commit between that named it without a baseRowId
    # (and none gave it one): the table breaks rowTracking, its rows have no stable ids
    unnamed: dict[str, tuple[int, str]] = field(default_factory=dict)
    new_version: int = -1

    def ids_of(self, files: Sequence[str], file: np.ndarray, rows: np.ndarray) -> np.ndarray:
        out = np.full(len(rows), -1, dtype=np.int64)
        for f in np.unique(file).tolist():
            ids = self._file_ids(self.old_keys.get(files[f], ""))
            if ids is None:
                continue
            at = np.flatnonzero(file == f)
            inside = rows[at] < len(ids)
            out[at[inside]] = ids[rows[at][inside]]
        return out

    def rows_of(self, ids: np.ndarray) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
        names = tuple(name for name, _ in self.added)
        file = np.full(len(ids), -1, dtype=np.int64)
        row = np.zeros(len(ids), dtype=np.int64)
        held, owner, index = [], [], []
        for i, (_, key) in enumerate(self.added):
            got = self._file_ids(key)
            if got is not None:
                held.append(got)
                owner.append(np.full(len(got), i, dtype=np.int64))
                index.append(np.arange(len(got), dtype=np.int64))
        if not held or not len(ids):
            return names, file, row
        every, owners, rows = np.concatenate(held), np.concatenate(owner), np.concatenate(index)
        by_id = np.argsort(every, kind="stable")
        where = np.minimum(np.searchsorted(every[by_id], ids), len(every) - 1)
        hit = every[by_id[where]] == ids
        file[hit] = owners[by_id[where[hit]]]
        row[hit] = rows[by_id[where[hit]]]
        return names, file, row

    def _file_ids(self, key: str) -> np.ndarray | None:
        """The stable id of each row of the data file ``key`` (None: the log gives it no
        ``baseRowId``, or the file cannot be read)."""
        base = self.base_row_ids.get(key)
        if base is None:
            if key in self.unnamed:
                version, kind = self.unnamed[key]
                raise RowIdsMissingError(
                    self.table_uri,
                    f"row tracking is on ({ENABLED}=true), but the commit of version {version} "
                    f"{kind}s data file {key!r} without a baseRowId, as the rowTracking table "
                    "feature requires of writers: its rows have no stable ids, so a run carried "
                    "on across it could repeat or drop them. Resume with this version's own "
                    "state, or start the epoch afresh",
                    asked=f"version {self.new_version}",
                )
            return None
        import pyarrow.parquet as pq

        filesystem, prefix = self._open_filesystem()
        try:
            with filesystem.open_input_file(DeltaSnapshot._fs_path(key, prefix)) as stream:
                parquet = pq.ParquetFile(stream)
                ids = base + np.arange(parquet.metadata.num_rows, dtype=np.int64)
                if self.column is not None and self.column in parquet.schema_arrow.names:
                    kept = parquet.read(columns=[self.column]).column(0)
                    valid = kept.is_valid().to_numpy(zero_copy_only=False)
                    values = kept.fill_null(0).to_numpy().astype(np.int64)
                    ids[valid] = values[valid]
        except OSError:
            return None  # vacuumed since: its rows cannot be named
        return ids

    def _open_filesystem(self) -> tuple[Any, str]:
        if self._filesystem is None:
            self._filesystem = table_filesystem(self.table_uri, self.storage_options)
        return self._filesystem


def table_row_ids(
    table_uri: str,
    storage_options: dict[str, str] | None,
    old_version: int,
    new_version: int,
    old_keys: Mapping[str, str],
    added: Sequence[tuple[str, str]],
) -> DeltaRowIds | None:
    """The table's stable row ids between the two versions, or None where it has none to
    give: row tracking not enabled (or suspended) at the new version, or the commits between
    no longer in the log."""
    deltalake = import_deltalake()
    try:
        table = deltalake.DeltaTable(
            table_uri, version=new_version, storage_options=storage_options
        )
        configuration = dict(table.metadata().configuration)
    except Exception:
        return None
    if not _tracking_on(configuration):
        return None
    found = DeltaRowIds(
        table_uri, storage_options, {}, configuration.get(MATERIALIZED), old_keys, added
    )
    found.new_version = new_version
    filesystem, prefix = found._open_filesystem()
    base = table_uri.rstrip("/")
    tracking = _tracking_at(deltalake, table_uri, storage_options, old_version)
    for version in range(old_version + 1, new_version + 1):
        log = f"{base}/_delta_log/{version:020}.json"
        try:
            with filesystem.open_input_stream(DeltaSnapshot._fs_path(log, prefix)) as stream:
                text = stream.read().decode()
        except OSError:
            return None
        actions = [json.loads(line) for line in text.splitlines() if line.strip()]
        for action in actions:  # row tracking as this commit leaves it
            if "metaData" in action:
                tracking = _tracking_on(action["metaData"].get("configuration") or {})
        for action in actions:
            for kind in ("add", "remove"):
                entry = action.get(kind)
                if entry is None:
                    continue
                key = file_key(log_location(log_uri(base, entry["path"])))
                if entry.get("baseRowId") is not None:
                    found.base_row_ids[key] = int(entry["baseRowId"])
                elif tracking:  # only a commit under row tracking must name its files
                    found.unnamed.setdefault(key, (version, kind))
    return found


def _tracking_on(configuration: Mapping[str, str]) -> bool:
    """Whether a table configuration has row tracking on (enabled, not suspended)."""
    return (
        configuration.get(ENABLED, "").lower() == "true"
        and configuration.get(SUSPENDED, "").lower() != "true"
    )


def _tracking_at(
    deltalake: Any, table_uri: str, storage_options: dict[str, str] | None, version: int
) -> bool:
    """Whether row tracking was on at ``version`` (False where that version cannot be read:
    its commits then name no file the carry would refuse)."""
    try:
        table = deltalake.DeltaTable(table_uri, version=version, storage_options=storage_options)
        return _tracking_on(dict(table.metadata().configuration))
    except Exception:
        return False
