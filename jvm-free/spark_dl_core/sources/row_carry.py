"""Carrying a run on to another version of a dataset whose samples are rows of data files.

A dataset that can name each sample as (data file, row index in the file) plugs in by
giving its :class:`RowLayout` (``row_layout()``) and subclassing :class:`CarriedRows`: the
Delta table read in place does (:mod:`..tables.delta.carry`); so does an export that follows a
table (:mod:`..tables.delta.follow_carry`).

The rule (docs/delta.md, "carry a run on"): a state saved at (epoch ``E``, ``consumed``)
over the old version continues in the new one. Epoch ``E`` finishes over the samples of the
old order at positions ``consumed..`` that are still *live* in the new version, in the old
order; they are the new version's samples, read from its files. A row is live there when its
file is in the new listing and the row is not deleted there, or, where the table gives rows
an identity across files (Delta row tracking, :class:`RowIdentity`), when a row with its id
is live in a file added since (an OPTIMIZE or a copy-on-write DELETE / UPDATE moved it).
Without that identity the rows of a rewritten file cannot be told from deleted ones: they
are dropped from the epoch, and the carry says so
(:class:`~spark_dl_core.errors.RowsDroppedWarning`, naming the files, and the loader's
``stats()["carry"]``). Positions before ``consumed`` are the samples already delivered: the
carried epoch counts them, so its size is ``consumed`` plus the live rest, it starts at
``consumed`` (``set_epoch(E)`` reads the live rest, never the old version's positions) and
padding repeats the live rest. From ``E + 1`` on the order is the new version's own, the
very order a fresh run over it has. A pure function of (old order, new version, carry
point): the same batches at any world size and worker count.
"""

from __future__ import annotations

import copy
import hashlib
import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..errors import RowsDroppedWarning, SpecError
from ..order.choice import _order_of
from ..order.dataset_order import GlobalOrder
from ..order.locality import StreamedOrder
from ..order.state import epoch_total, packed_position

if TYPE_CHECKING:
    from ..order.state import LoaderState


@dataclass(frozen=True)
class RowLayout:
    """Where each sample of a dataset is in the data files it is read from: shards cut
    within files, files' deleted rows left out (``keep``: per file index, its keep mask;
    rows past a mask's end are kept)."""

    files: tuple[str, ...]  # each data file's identity (its path relative to the table)
    shard_file: np.ndarray  # per shard: its file, an index into ``files``
    shard_start: np.ndarray  # per shard: its first row in the file
    shard_rows: np.ndarray  # per shard: rows it spans in the file, deleted ones included
    shard_offsets: np.ndarray  # cumulative live samples, ``shards + 1``
    keep: Mapping[int, np.ndarray]

    def _live_rows(self, shard: int) -> np.ndarray:
        """The file rows of ``shard``'s samples, in sample order."""
        start, rows = int(self.shard_start[shard]), int(self.shard_rows[shard])
        mask = self.keep.get(int(self.shard_file[shard]))
        if mask is None:
            return np.arange(start, start + rows, dtype=np.int64)
        part = np.asarray(mask[start : start + rows], dtype=bool)
        if len(part) < rows:
            part = np.concatenate([part, np.ones(rows - len(part), dtype=bool)])
        return start + np.flatnonzero(part).astype(np.int64)

    def rows_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(file index, row in the file) of each sample id."""
        ids = np.asarray(ids, dtype=np.int64)
        shard = np.searchsorted(self.shard_offsets, ids, side="right") - 1
        within = ids - self.shard_offsets[shard]
        rows = self.shard_start[shard] + within
        masked = np.isin(self.shard_file[shard], np.fromiter(self.keep, np.int64, len(self.keep)))
        for s in np.unique(shard[masked]).tolist():
            here = np.flatnonzero(shard == s)
            rows[here] = self._live_rows(s)[within[here]]
        return self.shard_file[shard].astype(np.int64), rows.astype(np.int64)

    def ids_of(self, files: tuple[str, ...], file: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The sample id of each (``files[file]``, row) here; -1 where that row is not live
        (its file is not listed, or the row is deleted)."""
        out = np.full(len(rows), -1, dtype=np.int64)
        where = {name: i for i, name in enumerate(self.files)}
        by_file: dict[int, list[int]] = {}
        for s, f in enumerate(self.shard_file.tolist()):
            by_file.setdefault(int(f), []).append(s)
        for f in np.unique(file).tolist():
            here = where.get(files[f])
            if here is None:
                continue
            table = self._row_ids(by_file.get(here, []))
            at = np.flatnonzero(file == f)
            r = rows[at]
            ok = r < len(table)
            out[at[ok]] = table[r[ok]]
        return out

    def _row_ids(self, shards: list[int]) -> np.ndarray:
        """File row -> sample id (-1: deleted) over one file's shards."""
        end = max((int(self.shard_start[s] + self.shard_rows[s]) for s in shards), default=0)
        table = np.full(end, -1, dtype=np.int64)
        for s in shards:
            live = self._live_rows(s)
            table[live] = self.shard_offsets[s] + np.arange(len(live), dtype=np.int64)
        return table


class RowIdentity(Protocol):
    """Rows' identity across the data files of two versions (Delta row tracking): what lets
    a carried epoch follow a row that a rewrite of its file moved to another file."""

    def ids_of(self, files: Sequence[str], file: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The stable id of each old-version row (``files[file]``, row in the file); -1
        where the table names none."""
        ...

    def rows_of(self, ids: np.ndarray) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
        """Where each id is in the new version's files added since the old one: (their
        names, as the new layout names files; file index, -1 where none holds it; row)."""
        ...


@dataclass(frozen=True)
class CarryReport:
    """What a carry did with the old epoch's rows not yet served at the switch (``left``):
    carried on in place, followed by row id to another file, deleted at the new version, or
    dropped (their file was rewritten and the table gives rows no identity across files)."""

    epoch: int
    left: int
    carried: int
    followed: int
    deleted: int
    dropped: int
    dropped_files: tuple[str, ...] = field(default=())
    row_ids: bool = False  # rows were followed by their row ids (Delta row tracking)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["dropped_files"] = list(self.dropped_files)
        return out


class VersionCarryError(SpecError):
    """A loader state of another version of a Delta table that cannot be carried on here:
    names the tables and both versions (``strict``, another table, no version recorded, a
    packed position inside an epoch)."""


@dataclass(frozen=True)
class RowCarry:
    """Where a run switched versions: the old state's position and order settings, the old
    dataset's fingerprint and what the old version records of itself (to reopen it)."""

    epoch: int
    consumed: int
    seed: int
    shuffle: bool
    window: int
    old_fingerprint: str
    old: dict[str, Any]
    # The saved order's streams and batch size (``order.locality``); 1: no streams, the
    # order of records written before streams.
    streams: int = 1
    batch_size: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> RowCarry:
        try:
            return cls(
                int(data["epoch"]),
                int(data["consumed"]),
                int(data["seed"]),
                bool(data["shuffle"]),
                int(data["window"]),
                str(data["old_fingerprint"]),
                dict(data["old"]),
                int(data.get("streams", 1)),
                int(data.get("batch_size", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecError(f"loader state field source.carry is not valid: {exc!r}") from None


class CarriedOrder:
    """The carried epoch's order: positions ``consumed..`` are the live rest of the old
    order; positions before it (delivered before the switch) are only ever read as
    padding, which repeats the live rest."""

    def __init__(self, consumed: int, rest: np.ndarray) -> None:
        self.consumed, self.rest = int(consumed), np.asarray(rest, dtype=np.int64)
        self.total = self.consumed + len(self.rest)

    def take(self, start: int, stop: int, dense: bool = False) -> np.ndarray:
        pos = np.arange(start, stop, dtype=np.int64)
        if not len(self.rest):
            return pos[:0]
        at = np.where(pos >= self.consumed, pos - self.consumed, pos % len(self.rest))
        return self.rest[at]


def carried_rest(
    old: Any, new: Any, carry: RowCarry, identity: RowIdentity | None = None
) -> tuple[np.ndarray, CarryReport]:
    """The new version's ids of the old order's samples at positions ``consumed..`` of the
    carried epoch that are live in the new version, in the old order, and what became of
    the others. O(those samples), plus reading the row ids of files rewritten since."""
    order = _order_of(
        old,
        carry.seed,
        carry.epoch,
        carry.shuffle,
        carry.window,
        carry.batch_size,
        carry.streams,
    )
    ids = order.take(carry.consumed, order.total, True)
    source, target = old.row_layout(), new.row_layout()
    file, rows = source.rows_of(ids)
    mapped = target.ids_of(source.files, file, rows)
    kept_files = set(target.files)
    listed = np.array([f in kept_files for f in source.files], dtype=bool)
    lost = np.flatnonzero(mapped < 0)  # deleted, or moved to another file by a rewrite
    named = np.zeros(len(lost), dtype=bool)
    if identity is not None and len(lost):
        row_ids = identity.ids_of(source.files, file[lost], rows[lost])
        named = row_ids >= 0
        files, where, at = identity.rows_of(row_ids[named])
        found = np.full(len(where), -1, dtype=np.int64)
        held = where >= 0
        found[held] = target.ids_of(files, where[held], at[held])
        mapped[lost[named]] = found
    # rows of a rewritten file the table cannot name: deleted or moved, nobody can tell
    unnamed = lost[~named]
    dropped = unnamed[~listed[file[unnamed]]]
    live = mapped >= 0
    _, first = np.unique(mapped[live], return_index=True)  # a row id held twice: once
    keep = np.flatnonzero(live)[np.sort(first)]
    rest = mapped[keep]
    report = CarryReport(
        epoch=carry.epoch,
        left=len(ids),
        carried=len(rest),
        followed=int(np.count_nonzero(np.isin(keep, lost))),
        deleted=len(ids) - len(rest) - len(dropped),
        dropped=len(dropped),
        dropped_files=tuple(source.files[f] for f in np.unique(file[dropped]).tolist()),
        row_ids=identity is not None,
    )
    return rest, report


def digest(content: Any) -> str:
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class CarriedRows:
    """Mixin of a dataset continuing a run from an older version of it (:func:`carried`).

    The subclass reopens the old version (:meth:`open_old`) and may give rows an identity
    across files (:meth:`row_identity`); everything else is the plain dataset's: shards,
    samples, ``len`` (the new version's size, every later epoch's)."""

    orders_itself = True  # the old version's epoch finished, then the new one's order

    carry: RowCarry
    plain: Any  # the same dataset, not carried
    _old: Any
    _rest: tuple[np.ndarray, CarryReport] | None

    def open_old(self) -> Any:
        raise NotImplementedError

    def row_identity(self) -> RowIdentity | None:
        """Rows' identity across the files of the old version and this one (None: rows are
        named by (file, row) alone)."""
        return None

    @property
    def fingerprint(self) -> str:
        """The plain dataset's, with the carry point: its states are its own."""
        return digest({"carried": self.plain.fingerprint, "carry": self.carry.to_dict()})

    def old_dataset(self) -> Any:
        if self._old is None:
            self._old = self.open_old()
        return self._old

    def _carried(self) -> tuple[np.ndarray, CarryReport]:
        if self._rest is None:
            self._rest = carried_rest(
                self.old_dataset(), self.plain, self.carry, self.row_identity()
            )
        return self._rest

    def carried_rest(self) -> np.ndarray:
        return self._carried()[0]

    def carry_report(self) -> dict[str, Any]:
        """What the carry did with the old epoch's rows left at the switch (a loader's
        ``stats()["carry"]``)."""
        return self._carried()[1].as_dict()

    def epoch_total(self, epoch: int) -> int:
        """Samples in ``epoch``: in the carried one, those delivered before the switch plus
        the live rest; in any other, the version's own."""
        if epoch != self.carry.epoch:
            return len(self.plain)
        return self.carry.consumed + len(self.carried_rest())

    def epoch_start(self, epoch: int) -> int:
        """Where a pass of ``epoch`` from its start begins: the carried epoch's positions
        before the switch were the old version's samples, so it begins at the switch."""
        return self.carry.consumed if epoch == self.carry.epoch else 0

    def make_order(
        self, seed: int, epoch: int, shuffle: bool, window: int, batch_size: int, streams: int = 1
    ) -> CarriedOrder | GlobalOrder | StreamedOrder:
        """The carried epoch's live rest, then the version's own order in the run's own
        streams (``carry.streams``; the loader's ``streams`` are those)."""
        if epoch == self.carry.epoch:
            return CarriedOrder(self.carry.consumed, self.carried_rest())
        plain = self.plain
        sizes = np.diff(plain.shard_offsets)
        streams, size = self.carry.streams, self.carry.batch_size
        if shuffle and streams > 1 and size > 0:  # the run's own streamed order
            return StreamedOrder(sizes, plain.fingerprint, seed, epoch, window, streams, size)
        return GlobalOrder(sizes, plain.fingerprint, seed, epoch, shuffle, window)


def carried(plain: Any, kind: type, carry: RowCarry, old: Any = None) -> Any:
    """``plain`` continuing a run from ``carry`` (a copy of class ``kind``, a subclass of
    :class:`CarriedRows` and of ``plain``'s class)."""
    out = copy.copy(plain)
    out.__class__ = kind
    out.__dict__.pop("fingerprint", None)
    out.plain, out.carry, out._old, out._rest = plain, carry, old, None
    return out


def own_carry(plain: Any, kind: type, state: LoaderState, version: Any) -> Any:
    """A carried run's own state on the version it carried on to: it resumes as it is
    ((dataset, epoch, consumed)); None for any other state."""
    rec = state.source or {}
    if rec.get("carry") is None or rec.get("version") != version:
        return None
    same = carried(plain, kind, RowCarry.from_dict(rec["carry"]))
    if same.fingerprint != state.fingerprint:
        return None
    return (same, *state.position(epoch_total(same, state.epoch)))


def check_carry(plain: Any, state: LoaderState, strict: bool, theirs: str, here: str) -> None:
    """What refuses any version's state: ``strict``, and a packed position inside an epoch
    (a packed run carries on only from an epoch's start)."""
    if strict:
        raise VersionCarryError(
            f"loader state is for dataset {state.fingerprint[:16]}… ({theirs}), but this "
            f"loader reads {here} (fingerprint {plain.fingerprint[:16]}…): resuming would mix "
            "up samples; load_state_dict(state, strict=False) carries the run on to this "
            "version (docs/delta.md)"
        )
    if packed_position(state.pack):
        raise VersionCarryError(
            f"loader state ({theirs}) is a packed position inside an epoch (field pack): "
            f"a packed run carries on to {here} only from an epoch's start"
        )


def carry_from(
    plain: Any,
    kind: type,
    state: LoaderState,
    old: Any,
    rec: dict[str, Any],
    theirs: str,
    here: str,
) -> tuple[Any, int, int]:
    """(dataset, epoch, consumed): ``plain`` finishing the state's epoch of ``old`` (the
    version it was saved on, reopened), or ``plain`` itself at an epoch's start. Rows the
    carry has to drop are said, with a :class:`RowsDroppedWarning` (``theirs`` and
    ``here`` name the two versions)."""
    epoch, consumed = state.position(epoch_total(old, state.epoch))
    if not consumed:
        return plain, epoch, 0
    carry = RowCarry(
        epoch,
        consumed,
        state.seed,
        state.shuffle,
        state.shuffle_window,
        state.fingerprint,
        rec,
        state.streams,
        state.batch_size,
    )
    out = carried(plain, kind, carry, old)
    _warn_dropped(out._carried()[1], theirs, here)
    return out, epoch, consumed


def _warn_dropped(report: CarryReport, theirs: str, here: str) -> None:
    if not report.dropped:
        return
    files = list(report.dropped_files)
    shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
    warnings.warn(
        RowsDroppedWarning(
            f"run carried on from {theirs} to {here}: {report.dropped} of the "
            f"{report.left} rows epoch {report.epoch} had left to serve are dropped from it; "
            f"their data files were rewritten since ({shown}: an OPTIMIZE, or a "
            "copy-on-write DELETE or UPDATE) and the table gives rows no identity across "
            "files (Delta row tracking, delta.enableRowTracking, is off), so moved rows "
            f"cannot be told from deleted ones. Those still live are read from epoch "
            f"{report.epoch + 1} on; loader.stats()['carry'] counts them",
            files=files,
            rows=report.dropped,
            epoch=report.epoch,
        ),
        stacklevel=2,
    )
