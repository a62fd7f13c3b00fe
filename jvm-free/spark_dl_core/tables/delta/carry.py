"""A run over one version of a Delta table read in place carried on to another:
``loader.load_state_dict(state, strict=False)`` (the rule: :mod:`...sources.row_carry`,
docs/delta.md). The carry is the format-neutral one (:mod:`..parquet.carry`); Delta gives
how to reopen a version (``open_delta`` through the snapshot's kind) and its row ids (Delta
row tracking, :mod:`.row_ids`), which follow rows that a rewrite moved.
"""

from __future__ import annotations

from typing import Any

from ...sources.row_carry import CarriedRows, RowIdentity, VersionCarryError
from ..parquet.carry import InPlaceCarrier
from ..parquet.carry import row_layout as row_layout
from .in_place import DeltaDataset
from .log import DeltaSnapshotError, file_key
from .row_ids import table_row_ids

__all__ = ["CarriedDelta", "DeltaCarrier", "VersionCarryError", "row_layout"]


class CarriedDelta(CarriedRows, DeltaDataset):
    """A Delta version read in place, continuing a run from another version of the table."""

    def open_old(self) -> Any:
        return DeltaCarrier.reopen(self.plain, self.carry.old, self.carry.old_fingerprint)

    def row_identity(self) -> RowIdentity | None:
        """The table's row ids (Delta row tracking) between the old version and this one."""
        old, new = self.old_dataset(), self.plain
        old_names = old.row_layout().files
        known = set(old_names)
        added = [
            (name, file_key(uri))
            for name, uri in zip(new.row_layout().files, new.snapshot.files)
            if name not in known
        ]
        snap = new.snapshot
        return table_row_ids(
            snap.table_uri,
            snap.storage_options,
            old.snapshot.version,
            snap.version,
            dict(zip(old_names, (file_key(uri) for uri in old.snapshot.files))),
            added,
        )


class DeltaCarrier(InPlaceCarrier):
    """The carrier of a Delta table read in place (the ``DELTA`` kind's ``carrier``)."""

    kind = "delta"
    carried = CarriedDelta

    @classmethod
    def reopen_version(cls, plain: Any, version: Any, since: Any) -> Any:
        return plain.snapshot.reopen(version, since=since)

    @classmethod
    def unreadable(cls, plain: Any, rec: dict[str, Any], exc: Any) -> DeltaSnapshotError:
        snap = plain.snapshot
        return DeltaSnapshotError(
            snap.table_uri,
            f"cannot carry a run on to version {snap.version} from the loader state's "
            f"{cls.named(rec)}: that version cannot be read ({exc})",
            asked=f"version {rec.get('version')}",
        )
