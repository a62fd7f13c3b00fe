"""What a dataset that follows a table (Delta or Iceberg) adds to a plain one: the table
version it opened (from the version's manifest, :mod:`spark_dl_core.versions`) and its
carrier, through which a loader carries a run on from another version: handed in by the face
that opens it (:func:`spark_dl_core.tables.kinds.open_dataset` hands its
:class:`~spark_dl_core.tables.kinds.FollowCarrier`, on :mod:`..tables.parquet.follow_carry`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..format.compact import ShardTable
from ..store.storage import Store
from ..versions import Piece, read_version


class FollowedVersion:
    """Mixin of :class:`~.mds.MdsDataset`: ``version`` is the table version opened (None
    for a dataset that follows no table), ``_virtual`` its shards assembled from others,
    ``carrier`` how a run over a version carries on to another (``record``, ``carry_on``,
    ``row_layout``; None: opened by hand, a state of another version is refused)."""

    store: Store
    version: int | None
    _virtual: dict[str, list[Piece]]
    carrier: Any

    def _open_followed(
        self, version: int | None
    ) -> tuple[ShardTable, dict[str, Any] | None, bytes | None] | None:
        """A followed table's version held at the path (the latest, or ``version``): its
        shards, metadata and index text; None for a dataset that follows no table."""
        held = read_version(self.store, version)
        if held is None:
            return None
        self.version, self._virtual = held.version, held.virtual
        return ShardTable.from_infos(held.shards), held.meta, held.index_text

    def position_record(self, epoch: int, consumed: int) -> dict[str, Any] | None:
        if self.version is None or self.carrier is None:
            return None
        return self.carrier.record(self, epoch, consumed)

    @property
    def carry_on(self) -> Callable[[Any, bool], tuple[Any, int, int]] | None:
        """Only a followed table's version takes a state of another version (None: the
        loader compares fingerprints as for any dataset)."""
        if self.version is None or self.carrier is None:
            return None
        return functools.partial(self.carrier.carry_on, self)

    def row_layout(self) -> Any:
        return None if self.carrier is None else self.carrier.row_layout(self)
