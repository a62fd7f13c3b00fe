"""A dataset that follows an Iceberg table: ``snapshot.write_mds(path, mode="update")``.

The update is the format-neutral one (:mod:`..parquet.follow`, which Delta's follows too);
this module gives it what only Iceberg knows (:class:`IcebergFollow`). A held version's
number is its snapshot's *sequence number* (snapshot ids are random; sequence numbers grow
along a table's history, from format version 2 on), and its manifest records the snapshot
id. An update continues the held snapshot only when that snapshot is still in the table's
metadata and an ancestor of the one asked: a rollback, another branch, or an expired
snapshot is refused by name.
"""

from __future__ import annotations

from typing import Any

from ...spec import DatasetSpec
from ...writer import WriteResult
from ..parquet.follow import FollowedTable
from ..parquet.follow import update_mds as _update
from .errors import IcebergFollowError, UnsupportedIcebergFeatureError
from .snapshot import IcebergSnapshot


class IcebergFollow(FollowedTable):
    """An Iceberg snapshot being followed: held as its sequence number."""

    kind = "iceberg"
    label = "Iceberg table"
    snap: IcebergSnapshot

    @property
    def named(self) -> str:
        return f"{self.snap.name!r} (at {self.table})"

    @property
    def number(self) -> int:
        snap = self.snap
        if snap.version == 0:  # a table with no snapshot yet
            return 0
        if not snap.sequence_number:
            raise UnsupportedIcebergFeatureError(
                snap.name,
                "its snapshots have no sequence numbers (format version 1): a dataset cannot "
                "follow it (write_mds(mode='update')); upgrade the table to format version 2, "
                "or export snapshots whole",
                snapshot=snap.version,
            )
        return int(snap.sequence_number)

    @property
    def table_id(self) -> str | None:
        return self.snap.table_uuid

    def manifest_extra(self) -> dict[str, Any]:
        return {"snapshot_id": self.snap.version}

    def point(self, number: int, manifest: dict[str, Any] | None) -> str:
        held = (manifest or {}).get("snapshot_id")
        return f"snapshot {held}" if held is not None else f"sequence number {number}"

    def exported_from(self, source: dict[str, Any]) -> bool:
        return source.get("kind") == self.kind and source.get("location") == self.table

    def reopen_exported(self, source: dict[str, Any]) -> tuple[int, Any]:
        old = self.snap.reopen(
            int(source["snapshot_id"]), columns=source.get("columns"), filter=None
        )
        return IcebergFollow(old).number, old

    def continues(self, number: int, manifest: dict[str, Any], timestamp: str | None) -> str | None:
        snap = self.snap
        held = manifest.get("snapshot_id")
        if held == snap.version or held == 0:  # 0: the table had no snapshot (no rows held)
            return None
        if number == self.number:
            return f"snapshot {snap.version} has the same sequence number as snapshot {held}"
        from pyiceberg.table import StaticTable

        meta = StaticTable.from_metadata(snap.metadata_location).metadata
        at = meta.snapshot_by_id(snap.version)
        while at is not None:
            if at.snapshot_id == held:
                return None
            parent = at.parent_snapshot_id
            at = meta.snapshot_by_id(parent) if parent is not None else None
        if held is None or meta.snapshot_by_id(int(held)) is None:
            return (
                f"snapshot {held} held is no longer in the table's metadata (expired, or the "
                "table was replaced), so the history from it cannot be followed; follow into "
                "a new path"
            )
        return (
            f"snapshot {held} held is not an ancestor of snapshot {snap.version} (a rollback, "
            "or another branch): follow into a new path"
        )

    def error(self, message: str, path: str, held: list[int], asked: int) -> IcebergFollowError:
        return IcebergFollowError(
            message, snapshot=self.snap.version, table=self.snap.name, path=path, held=held,
            asked=asked,
        )  # fmt: skip


def update_mds(
    snap: IcebergSnapshot,
    out_path: str,
    spec: DatasetSpec | dict[str, Any] | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
) -> WriteResult:
    """Update the dataset at ``out_path`` to ``snap`` (the update:
    :func:`..parquet.follow.update_mds`)."""
    return _update(IcebergFollow(snap), out_path, spec, storage_options=storage_options)
