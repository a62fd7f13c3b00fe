"""A run over one version of a Delta table carried on to another:
``loader.load_state_dict(state, strict=False)`` (the rule: :mod:`...sources.row_carry`,
docs/delta.md).

A loader state over a table read in place records the table, version (and ``since``) it
was saved on (:func:`record`). A loader over another version refuses it by default, naming
the table and both versions; with ``strict=False`` it reopens the state's version from its
own table, checks that it is the dataset the state was saved on (same fingerprint: same
files, deletions, columns and spec), and carries the run on (:func:`carry_on`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ...order.state import epoch_total
from ...sources.row_carry import (
    CarriedRows,
    RowCarry,
    RowIdentity,
    RowLayout,
    VersionCarryError,
    carried,
    carry_from,
    check_carry,
    own_carry,
)
from .in_place import DeltaDataset
from .log import DeltaSnapshotError, file_key
from .row_ids import table_row_ids

if TYPE_CHECKING:
    from ...order.state import LoaderState


def row_layout(ds: DeltaDataset) -> RowLayout:
    """Each sample's data file (its path relative to the table) and row in it."""
    groups = ds._groups
    keep = {}
    for f in sorted({g.file for g in groups}):
        mask = ds._keep_array(f)
        if mask is not None:
            keep[f] = mask
    return RowLayout(
        files=tuple(str(identity[0]) for identity in ds._file_identities),
        shard_file=np.array([g.file for g in groups], dtype=np.int64),
        shard_start=np.array([g.start for g in groups], dtype=np.int64),
        shard_rows=np.array([g.rows for g in groups], dtype=np.int64),
        shard_offsets=np.asarray(ds.shard_offsets, dtype=np.int64),
        keep=keep,
    )


def record(ds: DeltaDataset, epoch: int, consumed: int) -> dict[str, Any]:
    """What a loader state records of a position over ``ds``: the table and version (so a
    loader over another version can reopen it), the epoch's size, and the carry if any."""
    snap = ds.snapshot
    out: dict[str, Any] = {
        "kind": "delta",
        "table": snap.table_uri,
        "version": snap.version,
        "total": epoch_total(ds, epoch),
    }
    if snap.since is not None:
        out["since"] = snap.since
    if isinstance(ds, CarriedDelta):
        out["carry"] = ds.carry.to_dict()
    return out


def _named(rec: dict[str, Any]) -> str:
    """A state's table and version in words."""
    if rec.get("kind") != "delta":
        return "a dataset that records no Delta table version"
    since = f" since {rec['since']}" if rec.get("since") is not None else ""
    return f"table {rec.get('table')!r} version {rec.get('version')}{since}"


def carry_on(ds: DeltaDataset, state: LoaderState, strict: bool) -> tuple[Any, int, int]:
    """(the dataset to read, epoch, consumed) for a state whose fingerprint is not ``ds``'s:
    the carried run's own states resume as they are; with ``strict`` anything else is
    refused; else the run carries on from the state's version (or a typed error says why)."""
    plain = ds.plain if isinstance(ds, CarriedDelta) else ds
    own = own_carry(plain, CarriedDelta, state, plain.snapshot.version)
    if own is not None:
        return own  # the carried run's own state
    rec = state.source or {}
    snap = plain.snapshot
    here = f"table {snap.table_uri!r} version {snap.version}"
    check_carry(plain, state, strict, _named(rec), here)
    if rec.get("kind") != "delta":
        raise VersionCarryError(
            f"loader state (dataset {state.fingerprint[:16]}…) records no Delta table version "
            f"(field source): it was saved over another dataset or by an older spark-dl, so "
            f"{here} cannot tell which of its rows the run served"
        )
    old = _reopen(plain, rec, state.fingerprint)
    return carry_from(plain, CarriedDelta, state, old, rec, _named(rec), here)


def _reopen(plain: DeltaDataset, rec: dict[str, Any], fingerprint: str) -> Any:
    """The dataset a state was saved on, reopened from ``plain``'s table with its columns
    and spec; refused unless its fingerprint is the state's."""
    snap = plain.snapshot
    version = rec.get("version")
    here = f"table {snap.table_uri!r} version {snap.version}"
    try:
        old_snap = snap.reopen(version, since=rec.get("since"))
        old = old_snap.dataset(plain.user_spec, forms=plain._asked_forms or None, cache=False)
        if rec.get("carry") is not None:
            old = carried(old, CarriedDelta, RowCarry.from_dict(rec["carry"]))
        got = old.fingerprint
    except DeltaSnapshotError as exc:
        raise DeltaSnapshotError(
            snap.table_uri,
            f"cannot carry a run on to version {snap.version} from the loader state's "
            f"{_named(rec)}: that version cannot be read ({exc})",
            asked=f"version {version}",
        ) from None
    if got != fingerprint:
        raise VersionCarryError(
            f"loader state was saved on {_named(rec)} (dataset {fingerprint[:16]}…), but "
            f"table {snap.table_uri!r} version {version} is dataset {got[:16]}… (another "
            f"table, or other columns or spec): it cannot carry on to {here}"
        )
    return old


class CarriedDelta(CarriedRows, DeltaDataset):
    """A Delta version read in place, continuing a run from another version of the table."""

    def open_old(self) -> Any:
        return _reopen(self.plain, self.carry.old, self.carry.old_fingerprint)

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
