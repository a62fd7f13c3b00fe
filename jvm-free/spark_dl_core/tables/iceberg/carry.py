"""A run over one snapshot of an Iceberg table read in place carried on to another:
``loader.load_state_dict(state, strict=False)`` (the rule: :mod:`...sources.row_carry`,
docs/iceberg.md). The carry is the format-neutral one (:mod:`..parquet.carry`, Delta's
too); Iceberg gives how to reopen a snapshot (from the newer snapshot's metadata file,
which names every snapshot the table keeps, through the kind the face handed it). It gives
no row identity: rows of a file that a rewrite replaced are dropped from the carried epoch
with a warning.
"""

from __future__ import annotations

from typing import Any

from ...sources.row_carry import CarriedRows, RowIdentity
from ..parquet.carry import InPlaceCarrier
from .errors import IcebergSnapshotError
from .in_place import IcebergDataset


class CarriedIceberg(CarriedRows, IcebergDataset):
    """An Iceberg snapshot read in place, continuing a run from another of its snapshots."""

    def open_old(self) -> Any:
        return IcebergCarrier.reopen(self.plain, self.carry.old, self.carry.old_fingerprint)

    def row_identity(self) -> RowIdentity | None:
        return None


class IcebergCarrier(InPlaceCarrier):
    """The carrier of an Iceberg table read in place (the ``ICEBERG`` kind's ``carrier``)."""

    kind = "iceberg"
    point = "snapshot"
    carried = CarriedIceberg

    @classmethod
    def reopen_version(cls, plain: Any, version: Any, since: Any) -> Any:
        return plain.snapshot.reopen(int(version), since=since)

    @classmethod
    def unreadable(cls, plain: Any, rec: dict[str, Any], exc: Any) -> IcebergSnapshotError:
        snap = plain.snapshot
        return IcebergSnapshotError(
            snap.name,
            f"cannot carry a run on to snapshot {snap.version} from the loader state's "
            f"{cls.named(rec)}: that snapshot cannot be read ({exc})",
            snapshot=rec.get("version"),
        )
