"""A run over one version of a table read in place carried on to another, whatever its
format: ``loader.load_state_dict(state, strict=False)`` (the rule: :mod:`...sources.row_carry`,
docs/delta.md).

A loader state over a table read in place records the table, version (and ``since``) it
was saved on (:meth:`InPlaceCarrier.record`). A loader over another version refuses it by
default, naming the table and both versions; with ``strict=False`` it reopens the state's
version from its own table, checks that it is the dataset the state was saved on (same
fingerprint: same files, deletes, columns and spec), and carries the run on
(:meth:`InPlaceCarrier.carry_on`). A format gives a subclass of :class:`InPlaceCarrier`
(its kind, its carried dataset class, how to reopen a version of the table and name one
that cannot be read) and its
dataset the hooks of :class:`CarryHooks`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ...order.state import epoch_total
from ...sources.row_carry import (
    RowCarry,
    RowLayout,
    VersionCarryError,
    carried,
    carry_from,
    check_carry,
    own_carry,
)
from .table_files import TableError

if TYPE_CHECKING:
    from ...order.state import LoaderState
    from .in_place import InPlaceDataset


def row_layout(ds: InPlaceDataset) -> RowLayout:
    """Each sample's data file (its identity in the snapshot) and row in it."""
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


class InPlaceCarrier:
    """How a run over a version of one format's table read in place carries on to another.
    A subclass gives ``kind`` (what states record), ``point`` (how messages name a version:
    ``"version"``, ``"snapshot"``), ``carried`` (its dataset's subclass of
    :class:`~...sources.row_carry.CarriedRows`), :meth:`reopen_version` and
    :meth:`unreadable`."""

    kind: ClassVar[str]
    point: ClassVar[str] = "version"
    carried: ClassVar[type[Any]]
    row_layout = staticmethod(row_layout)

    @classmethod
    def reopen_version(cls, plain: InPlaceDataset, version: Any, since: Any) -> Any:
        """Version ``version`` (rows ``since``) of ``plain``'s table, opened as ``plain``'s
        snapshot was (columns, filter); a :class:`TableError` when it cannot be read."""
        raise NotImplementedError

    @classmethod
    def unreadable(cls, plain: Any, rec: dict[str, Any], exc: TableError) -> TableError:
        """The error for a state's version that cannot be read (``exc`` says why)."""
        raise NotImplementedError

    @classmethod
    def record(cls, ds: InPlaceDataset, epoch: int, consumed: int) -> dict[str, Any]:
        """What a loader state records of a position over ``ds``: the table and version (so
        a loader over another version can reopen it), the epoch's size, the carry if any."""
        snap = ds.snapshot
        out: dict[str, Any] = {
            "kind": cls.kind,
            "table": snap.table_uri,
            "version": snap.version,
            "total": epoch_total(ds, epoch),
        }
        if snap.since is not None:
            out["since"] = snap.since
        if isinstance(ds, cls.carried):
            out["carry"] = ds.carry.to_dict()
        return out

    @classmethod
    def named(cls, rec: dict[str, Any]) -> str:
        """A state's table and version in words."""
        if rec.get("kind") != cls.kind:
            return f"a dataset that records no {cls.kind.capitalize()} table {cls.point}"
        since = f" since {rec['since']}" if rec.get("since") is not None else ""
        return f"table {rec.get('table')!r} {cls.point} {rec.get('version')}{since}"

    @classmethod
    def carry_on(cls, ds: Any, state: LoaderState, strict: bool) -> tuple[Any, int, int]:
        """(the dataset to read, epoch, consumed) for a state whose fingerprint is not
        ``ds``'s: the carried run's own states resume as they are; with ``strict`` anything
        else is refused; else the run carries on from the state's version (or a typed error
        says why)."""
        plain = ds.plain if isinstance(ds, cls.carried) else ds
        own = own_carry(plain, cls.carried, state, plain.snapshot.version)
        if own is not None:
            return own  # the carried run's own state
        rec = state.source or {}
        snap = plain.snapshot
        here = f"table {snap.table_uri!r} {cls.point} {snap.version}"
        check_carry(plain, state, strict, cls.named(rec), here)
        if rec.get("kind") != cls.kind:
            raise VersionCarryError(
                f"loader state (dataset {state.fingerprint[:16]}…) records no "
                f"{cls.kind.capitalize()} table {cls.point} (field source): it was saved over "
                f"another dataset or by an older spark-dl, so {here} cannot tell which of its "
                "rows the run served"
            )
        old = cls.reopen(plain, rec, state.fingerprint)
        return carry_from(plain, cls.carried, state, old, rec, cls.named(rec), here)

    @classmethod
    def reopen(cls, plain: Any, rec: dict[str, Any], fingerprint: str) -> Any:
        """The dataset a state was saved on, reopened from ``plain``'s table with its
        columns and spec; refused unless its fingerprint is the state's."""
        snap = plain.snapshot
        version = rec.get("version")
        here = f"table {snap.table_uri!r} {cls.point} {snap.version}"
        try:
            old_snap = cls.reopen_version(plain, version, rec.get("since"))
            old = old_snap.dataset(plain.user_spec, forms=plain._asked_forms or None, cache=False)
            if rec.get("carry") is not None:
                old = carried(old, cls.carried, RowCarry.from_dict(rec["carry"]))
            got = old.fingerprint
        except TableError as exc:
            raise cls.unreadable(plain, rec, exc) from None
        if got != fingerprint:
            raise VersionCarryError(
                f"loader state was saved on {cls.named(rec)} (dataset {fingerprint[:16]}…), "
                f"but table {snap.table_uri!r} {cls.point} {version} is dataset {got[:16]}… "
                f"(another table, or other columns or spec): it cannot carry on to {here}"
            )
        return old


class CarryHooks:
    """The loader's carry-on hooks of a dataset read in place, handed over to its
    ``carrier`` (an :class:`InPlaceCarrier`; None: built by hand, the loader compares
    fingerprints as for any dataset)."""

    carrier: Any

    def position_record(self, epoch: int, consumed: int) -> dict[str, Any] | None:
        if self.carrier is None:
            return None
        return self.carrier.record(self, epoch, consumed)

    @property
    def carry_on(self) -> Callable[[Any, bool], tuple[Any, int, int]] | None:
        """A state of another version of the table carries on (None: no carrier)."""
        if self.carrier is None:
            return None
        return functools.partial(self.carrier.carry_on, self)

    def row_layout(self) -> Any:
        return None if self.carrier is None else self.carrier.row_layout(self)
