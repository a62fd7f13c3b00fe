"""A run over one version of a dataset that follows a table (Delta or Iceberg) carried on
to another version of it: ``loader.load_state_dict(state, strict=False)`` over
``open_dataset(path)`` with a state saved over ``open_dataset(path, version=M)`` (the rule:
:mod:`...sources.row_carry`, docs/delta.md).

Each held version's manifest lists its data files, each with the run of the version's
shards cut from it and the rows its deletes remove (:mod:`spark_dl_core.versions`), so a
sample is (data file, row in the file) exactly as in a table read in place. Nothing here
knows a format: a state records the table (as the manifests name it) and the version it
was saved on; a state saved over a plain export the dataset adopted (no record) is found by
its fingerprint among the versions held. The old version is reopened from the same
directory, so it must still be held (a vacuum that let it go is a :class:`FollowError`
naming it). Rows that a rewrite moved are followed where the format gives a row identity
(:attr:`FollowCarrier.row_ids`, by the lineage's kind: Delta row tracking), else dropped
with a :class:`~spark_dl_core.errors.RowsDroppedWarning`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ...errors import FollowError
from ...order.state import epoch_total
from ...sources.mds import MdsDataset
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
from ...versions import held_versions, read_version

if TYPE_CHECKING:
    from ...order.state import LoaderState


def _deleted_rows(ranges: list[list[int]]) -> np.ndarray:
    if not ranges:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges])


def row_layout(ds: MdsDataset) -> RowLayout:
    """Each sample's data file (its key in the manifest) and row in it: a file's shards hold
    its live rows (those its deletion vector at this version keeps), in file order."""
    held = read_version(ds.store, ds.version)
    assert held is not None
    if held.meta.get("source", {}).get("filter") is not None:
        raise VersionCarryError(
            f"{ds.shown} version {ds.version} is a filtered export: its samples are not a "
            "data file's live rows, so a run cannot carry on across its versions"
        )
    samples = np.diff(ds.shard_offsets)
    shard_file = np.full(len(samples), -1, dtype=np.int64)
    shard_start = np.zeros(len(samples), dtype=np.int64)
    shard_rows = np.zeros(len(samples), dtype=np.int64)
    keep: dict[int, np.ndarray] = {}
    for f, entry in enumerate(held.files):
        first, count = int(entry["first"]), int(entry["count"])
        cuts = np.concatenate([[0], np.cumsum(samples[first : first + count])])
        deleted = _deleted_rows(entry["deleted"])
        total = int(cuts[-1]) + len(deleted)  # the file's rows: live ones and deleted ones
        mask = np.ones(total, dtype=bool)
        mask[deleted] = False
        if len(deleted):
            keep[f] = mask
        starts = np.append(np.flatnonzero(mask), total)[cuts]
        shard_file[first : first + count] = f
        shard_start[first : first + count] = starts[:-1]
        shard_rows[first : first + count] = np.diff(starts)
    if (shard_file < 0).any():
        raise VersionCarryError(
            f"{ds.shown} version {ds.version}: shard {int(np.argmax(shard_file < 0))} is not "
            "listed under any data file of its manifest, so its rows cannot be named"
        )
    return RowLayout(
        files=tuple(str(e["path"]) for e in held.files),
        shard_file=shard_file,
        shard_start=shard_start,
        shard_rows=shard_rows,
        shard_offsets=np.asarray(ds.shard_offsets, dtype=np.int64),
        keep=keep,
    )


def _table(ds: MdsDataset) -> str:
    """The table the version follows, as its manifest names it (its location)."""
    found = ds.__dict__.get("_followed_table")
    if found is None:
        held = read_version(ds.store, ds.version)
        assert held is not None
        found = ds.__dict__["_followed_table"] = held.table
    return str(found)


def _kind(ds: MdsDataset) -> str:
    """The followed table's format, as its lineage names it (``delta``, ``iceberg``)."""
    return str(ds.source.get("kind"))


def record(ds: MdsDataset, epoch: int, consumed: int) -> dict[str, Any]:
    """What a loader state records of a position over a followed version: the table and
    version (to reopen it from the directory), the epoch's size, and the carry if any."""
    out: dict[str, Any] = {
        "kind": _kind(ds),
        "table": _table(ds),
        "version": ds.version,
        "export": True,
        "total": epoch_total(ds, epoch),
    }
    if isinstance(ds, CarriedFollow):
        out["carry"] = ds.carry.to_dict()
    return out


def _state_version(ds: MdsDataset, rec: dict[str, Any], fingerprint: str) -> int | None:
    """The version a state was saved on: its record's, else the held version whose
    fingerprint is the state's (a state saved over a plain export the dataset adopted)."""
    if rec.get("kind") == _kind(ds) and rec.get("version") is not None:
        return int(rec["version"])
    for version in held_versions(ds.store):
        held = read_version(ds.store, version)
        if held is not None and held.meta.get("fingerprint") == fingerprint:
            return version
    return None


def _named(rec: dict[str, Any], table: str | None, version: int | None, kind: str) -> str:
    if version is None:
        return "a dataset that records no table version"
    how = "" if rec.get("kind") != kind or rec.get("export") else " (read in place)"
    return f"table {table!r} version {version}{how}"


def carry_on(ds: MdsDataset, state: LoaderState, strict: bool) -> tuple[Any, int, int]:
    """(the dataset to read, epoch, consumed) for a state whose fingerprint is not ``ds``'s
    (the steps every carry-on shares: :mod:`...sources.row_carry`)."""
    plain = ds.plain if isinstance(ds, CarriedFollow) else ds
    own = own_carry(plain, CarriedFollow, state, plain.version)
    if own is not None:
        return own  # the carried run's own state
    rec = state.source or {}
    table = _table(plain)
    version = _state_version(plain, rec, state.fingerprint)
    theirs = _named(rec, rec.get("table", table), version, _kind(plain))
    here = f"table {table!r} version {plain.version} (followed in {plain.shown})"
    check_carry(plain, state, strict, theirs, here)
    if version is None:
        raise VersionCarryError(
            f"loader state (dataset {state.fingerprint[:16]}…) records no table version and "
            f"is no version {plain.shown} holds: {here} cannot tell which rows the run served"
        )
    if rec.get("kind") == _kind(plain) and rec.get("table") != table:
        raise VersionCarryError(
            f"loader state was saved on {theirs}, another table than {here}: it cannot carry on"
        )
    old = _reopen(plain, version, rec, state.fingerprint)
    rec = {**rec, "kind": _kind(plain), "table": table, "version": version, "export": True}
    return carry_from(plain, CarriedFollow, state, old, rec, theirs, here)


def _reopen(plain: MdsDataset, version: int, rec: dict[str, Any], fingerprint: str) -> Any:
    """Version ``version`` of ``plain``'s directory, as the state was saved on it; refused
    unless it is still held and its fingerprint is the state's."""
    table = _table(plain)
    here = f"table {table!r} version {plain.version}"
    try:
        old: Any = MdsDataset(
            plain.path,
            cache_dir=plain.cache_dir,
            allow_unsafe=plain.allow_unsafe,
            storage_options=plain.store.storage_options,
            version=version,
            node_cache=plain.node_cache,
            carrier=plain.carrier,
        )
    except FollowError as exc:
        raise FollowError(
            f"cannot carry a run on to {here} from the loader state's version {version}: "
            f"{plain.shown} no longer holds it (vacuumed; versions held: {exc.held})",
            table=table,
            path=plain.shown,
            held=exc.held,
            asked=version,
        ) from None
    if rec.get("carry") is not None:
        old = carried(old, CarriedFollow, RowCarry.from_dict(rec["carry"]))
    if old.fingerprint != fingerprint:
        theirs = _named(rec, rec.get("table", table), version, _kind(plain))
        raise VersionCarryError(
            f"loader state was saved on {theirs} "
            f"(dataset {fingerprint[:16]}…), but {plain.shown} version {version} is dataset "
            f"{old.fingerprint[:16]}… (another table, a read in place, or other columns or "
            f"spec): it cannot carry on to {here}"
        )
    return old


class CarriedFollow(CarriedRows, MdsDataset):
    """A followed export's version continuing a run from another version it holds."""

    def open_old(self) -> Any:
        return _reopen(self.plain, int(self.carry.old["version"]), self.carry.old,
                       self.carry.old_fingerprint)  # fmt: skip

    def row_identity(self) -> RowIdentity | None:
        """The followed table's row ids between the two versions, where its format gives
        them (the carrier's ``row_ids``); None: rows of rewritten files are dropped."""
        found = self.carrier.row_ids.get(_kind(self.plain)) if self.carrier is not None else None
        return None if found is None else found(self, _table(self.plain))


class FollowCarrier:
    """The carrier of a dataset that follows a table (``FollowedVersion.carrier``): handed
    in by the face that opens it (``tables/kinds.open_dataset``), as a class so that a
    dataset pickled for a DataLoader worker names it. ``row_ids``: by the lineage's kind,
    ``(carried dataset, table) -> RowIdentity | None``, given by a subclass above the
    formats (this layer names none)."""

    row_ids: ClassVar[dict[str, Callable[[CarriedFollow, str], RowIdentity | None]]] = {}
    record = staticmethod(record)
    carry_on = staticmethod(carry_on)
    row_layout = staticmethod(row_layout)
