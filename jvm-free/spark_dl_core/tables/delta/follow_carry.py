"""What a run carried on across the versions of a dataset that follows a Delta table needs of
Delta (the carry itself is the format-neutral one, :mod:`..parquet.follow_carry`): the rows
a rewrite moved, followed by their row ids (Delta row tracking, :mod:`.row_ids`) between the
two versions, read from the table's log and files when it can still be reached (a manifest
names each data file by its location in the table)."""

from __future__ import annotations

from typing import Any, ClassVar

from ...sources.row_carry import RowIdentity
from ..parquet import follow_carry as _follow_carry
from .row_ids import table_row_ids


def follow_row_identity(ds: Any, table: str) -> RowIdentity | None:
    """The row ids of ``table`` between the old version of the carried ``ds`` (a
    :class:`~..parquet.follow_carry.CarriedFollow`) and its own."""
    old_names = ds.old_dataset().row_layout().files
    known = set(old_names)
    added = [(n, n) for n in ds.plain.row_layout().files if n not in known]
    old_version = int(ds.carry.old["version"])
    return table_row_ids(
        table, None, old_version, ds.plain.version, {n: n for n in old_names}, added
    )


class FollowCarrier(_follow_carry.FollowCarrier):
    """The carrier of a dataset that follows a Delta table, its rows followed by row id."""

    row_ids: ClassVar[dict[str, Any]] = {"delta": follow_row_identity}
