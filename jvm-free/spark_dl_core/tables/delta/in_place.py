"""A pinned Delta snapshot read in place: the Parquet layer's
:class:`~..parquet.in_place.InPlaceDataset` over a :class:`DeltaSnapshot` (files in the
log's path order, deletion vectors as keep-masks, column mapping), plus what is Delta's own:
its fingerprint kind, how a saved mixture reopens it, and runs carried on across versions
(:mod:`.carry`, handed by the face through the snapshot's :class:`~.snapshot.DeltaKind`).
"""

from __future__ import annotations

from typing import Any

from ..parquet import in_place as _generic
from ..parquet.carry import CarryHooks
from ..parquet.in_place import InPlaceDataset
from .snapshot import DeltaSnapshot

INPLACE_VERSION = _generic.INPLACE_VERSION
CONVERTED_FORMAT = _generic.CONVERTED_FORMAT
DEFAULT_CACHED_SHARDS = _generic.DEFAULT_CACHED_SHARDS


def __getattr__(name: str) -> Any:
    if name == "conversions":  # row groups converted by this process (the Parquet layer's)
        return _generic.conversions
    raise AttributeError(name)


class DeltaDataset(CarryHooks, InPlaceDataset):
    """A :class:`DeltaSnapshot` as a dataset: ``len``, ``fingerprint``, ``ds[i]``,
    ``iter_batches``, ``to_torch``… with no export. Use ``snap.dataset()``; the options are
    :class:`~..parquet.in_place.InPlaceDataset`'s."""

    KIND = "delta-inplace"
    snapshot: DeltaSnapshot

    def in_place_record(self) -> tuple[str, dict[str, Any]]:
        """What reopens this read from a saved mixture (``tables/kinds``): ``open_delta``'s
        arguments and the read's spec; a filter as its text only."""
        snap = self.snapshot
        return "delta", {
            "table": snap.table_uri,
            "version": snap.version,
            "since": snap.since,
            "projection": snap.projection,
            "filter": None if snap.filter is None else str(snap.filter),
            "spec": self.spec,
        }

    # -- a run carried on to another version (tables/delta/carry.py)

    @property
    def carrier(self) -> Any:
        """How a run carries on across versions (:class:`.carry.DeltaCarrier`, which builds
        on this module), as the face that opened the snapshot handed it (None: built by
        hand)."""
        kind = self.snapshot.kind
        return None if kind is None else kind.carrier
