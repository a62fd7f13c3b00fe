"""A pinned Iceberg snapshot read in place: the Parquet layer's
:class:`~..parquet.in_place.InPlaceDataset` over an :class:`~.snapshot.IcebergSnapshot`
(files in path order, deletes as keep-masks, columns resolved by field id), plus what is
Iceberg's own: its fingerprint kind, how a saved mixture reopens it, and runs carried on
across snapshots (:mod:`.carry`, handed by the face through the snapshot's
:class:`~.snapshot.IcebergKind`).
"""

from __future__ import annotations

from typing import Any

from ..parquet.carry import CarryHooks
from ..parquet.in_place import InPlaceDataset
from .snapshot import IcebergSnapshot


class IcebergDataset(CarryHooks, InPlaceDataset):
    """An :class:`IcebergSnapshot` as a dataset: ``len``, ``fingerprint``, ``ds[i]``,
    ``iter_batches``, ``to_torch``… with no export. Use ``snap.dataset()``. A loader's run
    over one snapshot carries on to another with ``strict=False`` (:mod:`.carry`)."""

    KIND = "iceberg-inplace"
    snapshot: IcebergSnapshot

    @property
    def carrier(self) -> Any:
        """How a run carries on across snapshots (:class:`.carry.IcebergCarrier`, which
        builds on this module), as the face that opened the snapshot handed it (None: built
        by hand)."""
        kind = self.snapshot.kind
        return None if kind is None else kind.carrier

    def in_place_record(self) -> tuple[str, dict[str, Any]]:
        """What reopens this read from a saved mixture: the metadata file (a table's
        metadata file names every snapshot it keeps) and the snapshot id."""
        snap = self.snapshot
        return "iceberg", {
            "metadata": snap.metadata_location,
            "snapshot_id": snap.version,
            "since": snap.since,
            "projection": snap.projection,
            "filter": None if snap.filter is None else str(snap.filter),
            "spec": self.spec,
        }
