"""A dataset that follows a Delta table: ``snapshot.write_mds(path, mode="update")``.

The update itself is the format-neutral one (:mod:`..parquet.follow`: convert the files
added since, keep the files still live, deleted rows as virtual shards, one manifest per
version); this module gives it what only Delta knows (:class:`DeltaFollow`): versions are
the log's version numbers, a version held must still be in the log and committed at the
time recorded (else the table was replaced), a plain export is reopened at its version.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from ...spec import DatasetSpec
from ...writer import WriteResult
from ..parquet.follow import FollowedTable
from ..parquet.follow import update_mds as _update
from .log import commit_history
from .snapshot import DeltaSnapshot


class DeltaFollow(FollowedTable):
    """A Delta snapshot being followed: its version is the held version's number."""

    kind = "delta"
    label = "Delta table"
    snap: DeltaSnapshot

    @property
    def number(self) -> int:
        return int(self.snap.version)

    @property
    def table_id(self) -> str | None:
        return self.snap.table_id

    def reopen_exported(self, source: dict[str, Any]) -> tuple[int, Any]:
        version = int(source["version"])
        return version, self.snap.reopen(version, columns=source.get("columns"), filter=None)

    def continues(self, number: int, manifest: dict[str, Any], timestamp: str | None) -> str | None:
        if number == self.number:
            return None
        import deltalake

        snap = self.snap
        table = deltalake.DeltaTable(snap.table_uri, storage_options=snap.storage_options)
        when = dict(commit_history(table)).get(number)
        if when is None:
            return "the table's log no longer holds the version held"
        stamp = _dt.datetime.fromtimestamp(when / 1000, _dt.timezone.utc)
        if timestamp and stamp.isoformat(timespec="milliseconds") != timestamp:
            return "the version held was committed at another time: table replaced"
        return None


def update_mds(
    snap: DeltaSnapshot,
    out_path: str,
    spec: DatasetSpec | dict[str, Any] | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
) -> WriteResult:
    """Update the dataset at ``out_path`` to ``snap``'s version (the update:
    :func:`..parquet.follow.update_mds`)."""
    return _update(DeltaFollow(snap), out_path, spec, storage_options=storage_options)
