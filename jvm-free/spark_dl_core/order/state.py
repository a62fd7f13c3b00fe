"""Resume state: a position counted in samples of the global order, and the epoch it is in.

A position is checked against the dataset and the order settings it was saved under, and
moved between epochs only when every rank's share of the epoch is consumed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..errors import PackError, SpecError
from .choice import resolve_streams, streamed
from .dataset_order import DEFAULT_WINDOW, ORDER_VERSION
from .locality import AUTO_STREAMS, stream_window

# The order version before streams: its order is this version's with ``streams=1``.
STREAMLESS_VERSION = 2
# The version whose streams each shuffled windows of the whole ``shuffle_window``: its order
# with window ``w`` and ``P`` streams is this version's with window ``w * P``.
WHOLE_WINDOW_STREAMS_VERSION = 3
# The last version whose mixtures had no streams (whatever ``streams`` a state of one
# records): a mixture's state of it, or of an earlier version, resumes with ``streams=1``.
STREAMLESS_MIXTURES_VERSION = 4


def _mixture_record(state: dict[str, Any]) -> bool:
    """Whether a saved state is a (not packed) position in a mixture: its ``source`` record
    lists per-source positions."""
    source = state.get("source")
    return isinstance(source, dict) and "sources" in source and state.get("pack") is None


def packed_position(pack: dict[str, Any] | None) -> int:
    """How far into its epoch a packed loader's ``pack`` entry stands: rows consumed (pack
    version 1) or global batches consumed over streams (version 2); 0 at an epoch's start
    and for a position that is not packed."""
    if pack is None:
        return 0
    return int(pack.get("rows", 0)) or int(pack.get("batches", 0))


if TYPE_CHECKING:
    from ..shard_source import ShardSource


@dataclass(frozen=True)
class LoaderState:
    """Where an epoch stands, independent of world size: enough to resume exactly.

    ``consumed`` counts samples of the global order already delivered (all ranks together).
    ``version`` is the order version (:data:`ORDER_VERSION`) the position counts in.
    """

    fingerprint: str
    seed: int
    epoch: int
    shuffle: bool
    shuffle_window: int
    batch_size: int
    drop_last: bool
    consumed: int
    version: int = ORDER_VERSION
    # Streams the shuffled order is drawn from (``order.locality``); 1: no streams, the
    # order of version 2 (a version 2 state is read as ``streams=1``). Loaders record the
    # number their setting resolved to; 0 (automatic) is resolved against the dataset.
    streams: int = AUTO_STREAMS
    # Packed loaders: {"settings": pack settings, "rows": global rows consumed, "version"},
    # or "batches" (global batches over streams, version 2: see spark_dl_core.loaders.
    # packing, :func:`packed_position`); ``consumed`` is then 0.
    pack: dict[str, Any] | None = None
    # What the source records about the position (``ShardSource.position_record``): a
    # mixture, each source's stream position, so a changed mixture can carry on.
    source: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for optional in ("pack", "source"):
            if out[optional] is None:
                del out[optional]
        return out

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> LoaderState:
        if not isinstance(state, dict):
            raise SpecError(f"loader state must be a dict, got {type(state).__name__}")
        optional = ("version", "pack", "source", "streams")
        missing = {f for f in cls.__dataclass_fields__ if f not in optional} - set(state)
        if missing:
            raise SpecError(f"loader state lacks {sorted(missing)}; was it made by spark-dl?")
        version = state.get("version", 1)
        if version in (2, 3, STREAMLESS_MIXTURES_VERSION) and _mixture_record(state):
            # a mixture's order before version 5 had no streams, whatever was recorded
            state = {**state, "version": ORDER_VERSION, "streams": 1}
            version = ORDER_VERSION
        if version == STREAMLESS_MIXTURES_VERSION:  # a plain dataset's order is unchanged
            state = {**state, "version": ORDER_VERSION}
            version = ORDER_VERSION
        if version == STREAMLESS_VERSION and "streams" not in state:
            # version 2's order is this version's order with one stream
            state = {**state, "version": ORDER_VERSION, "streams": 1}
            version = ORDER_VERSION
        if version == WHOLE_WINDOW_STREAMS_VERSION:
            # version 3's streams each shuffled windows of shuffle_window pieces: this
            # version's order with a window streams times as large (stream_window)
            streams = int(state.get("streams", 1))
            window = int(state["shuffle_window"]) * max(1, streams)
            state = {**state, "version": ORDER_VERSION, "streams": streams}
            state["shuffle_window"] = window
            version = ORDER_VERSION
        if version != ORDER_VERSION:
            raise SpecError(
                f"loader state has order version {version!r}, this spark-dl computes order "
                f"version {ORDER_VERSION}: the same seed gives another sample order, so its "
                f"position (consumed={state['consumed']}) would repeat or skip samples; finish "
                "the epoch with the spark-dl that saved it, or start the epoch afresh"
            )
        return cls(**{k: state[k] for k in cls.__dataclass_fields__ if k in state})

    def position(self, total: int) -> tuple[int, int]:
        """(epoch, consumed) to resume at, for an epoch of ``total`` samples.

        A ``drop_last`` state with less than one of its batches left had finished its epoch:
        no batch of the loader that saved it takes that tail, at any world size (states saved
        by earlier versions at such an end count short of ``total``).
        """
        consumed = self.consumed
        if self.drop_last and consumed and total - consumed < self.batch_size:
            consumed = total
        return epoch_position(self.epoch, consumed, total)

    def resume(
        self, dataset: ShardSource, strict: bool = True, **settings: Any
    ) -> tuple[ShardSource, int, int]:
        """(the dataset to read, epoch, consumed) to resume this state in a loader over
        ``dataset`` with ``settings`` (those :meth:`check` compares).

        The dataset decides what a state saved for another version of it means
        (``carry_on(state, strict)``, e.g. a mixture whose weights changed): it returns
        itself, or the variant of itself that continues the run (then the fingerprint is
        not compared), or raises. ``strict`` (the default) refuses any other fingerprint.
        """
        if self.streams == AUTO_STREAMS:  # made by hand: the dataset's automatic streams
            own = resolve_streams(dataset, self.shuffle, AUTO_STREAMS)
            return replace(self, streams=own).resume(dataset, strict, **settings)
        carry_on = dataset.carry_on
        if carry_on is None or self.fingerprint == dataset.fingerprint:
            self.check(dataset, **settings)
            return (dataset, *self.position(epoch_total(dataset, self.epoch)))
        carried, epoch, consumed = carry_on(self, strict)
        self.check(carried, fingerprint=False, **settings)
        # The carried epoch may hold fewer samples than the saved one (rows deleted or
        # dropped since): where nothing is left, the next epoch starts, for every loader.
        return (carried, *epoch_position(epoch, consumed, epoch_total(carried, epoch)))

    def check(self, dataset: ShardSource, fingerprint: bool = True, **settings: Any) -> None:
        """Raise if this state belongs to another dataset or other order settings. A packed
        position is refused unless ``pack`` (the loader's pack settings) is given.
        ``fingerprint=False``: the dataset already took the state as its own (carried on)."""
        if self.pack is not None and settings.pop("pack", None) is None:
            raise PackError(
                "loader state is a position in packed rows (saved with pack=); pass the same "
                "pack= to resume it",
                field="pack",
            )
        settings.pop("pack", None)
        if fingerprint and self.fingerprint != dataset.fingerprint:
            raise SpecError(
                f"loader state is for dataset {self.fingerprint[:16]}…, but {dataset.path} has "
                f"fingerprint {dataset.fingerprint[:16]}…: resuming would mix up samples"
            )
        streams = settings.pop("streams", None)
        # 0 (automatic): the loader takes the state's streams (``adopted``)
        if streams not in (None, AUTO_STREAMS) and streams != self.streams:
            before = (
                " (saved before order version 3, or a mixture's before version 5: its order "
                "is streams=1)"
            ) * (self.streams == 1)
            raise SpecError(
                f"loader state was saved with streams={self.streams}{before}, the loader has "
                f"streams={streams}: each gives another order, so the position would repeat "
                f"or skip samples; pass streams={self.streams} to resume exactly"
            )
        by_streams = streamed(dataset, self.shuffle, self.streams)
        by_batch = dataset.order_uses_batch_size or by_streams
        window = settings.pop("shuffle_window", None)
        if window is not None and (
            stream_window(window, self.streams) != stream_window(self.shuffle_window, self.streams)
            if by_streams
            else window != self.shuffle_window
        ):
            per = stream_window(self.shuffle_window, self.streams)
            why = f" ({self.streams} streams of {per}-piece windows)" * by_streams
            raise SpecError(
                f"loader state was saved with shuffle_window={self.shuffle_window}{why}, the "
                f"loader has shuffle_window={window}; pass shuffle_window={self.shuffle_window} "
                "to resume exactly"
            )
        for name, value in settings.items():
            if name == "batch_size" and not by_batch:
                continue  # positions count samples: the batch size may change on resume
            if getattr(self, name) != value:
                raise SpecError(
                    f"loader state was saved with {name}={getattr(self, name)!r}, the loader "
                    f"has {name}={value!r}; pass the same value to resume exactly"
                )
        total = epoch_total(dataset, self.epoch) if fingerprint else 0
        if fingerprint and not 0 <= self.consumed <= total:
            raise SpecError(f"loader state consumed={self.consumed} is outside 0..{total}")


def epoch_total(dataset: ShardSource, epoch: int) -> int:
    """Samples in ``epoch`` of ``dataset``: ``len(dataset)``, unless its epochs differ in
    size (a run carried on to another Delta version: the epoch of the switch)."""
    return int(dataset.epoch_total(epoch))


def epoch_start(dataset: ShardSource, epoch: int) -> int:
    """The position a pass of ``epoch`` from its start begins at: 0, unless the dataset's
    epochs start elsewhere (a run carried on to another Delta version: the carried epoch
    begins at the switch, its earlier positions being the old version's samples)."""
    return int(dataset.epoch_start(epoch))


def position_record(dataset: ShardSource, epoch: int, consumed: int) -> dict[str, Any] | None:
    """What ``dataset`` records about a position in the states loaders save (None for a
    plain dataset; a mixture, each source's stream position)."""
    return dataset.position_record(epoch, consumed)


def resolve_window(window: int | None) -> int:
    return DEFAULT_WINDOW if window is None else int(window)


def epoch_position(epoch: int, consumed: int, total: int) -> tuple[int, int]:
    """A position at the end of its epoch (all ranks' samples consumed) is the next epoch's
    start; any other position stays in its epoch."""
    if consumed and consumed >= total:
        return epoch + 1, 0
    return epoch, consumed


class _Positioned(Protocol):
    @property
    def total(self) -> int: ...


P = TypeVar("P", bound=_Positioned)


def plan_position(build: Callable[[int, int], P], epoch: int, at: int) -> tuple[int, int, P]:
    """The position a loader saves and the plan its next pass reads, from ``(epoch, at)``
    (samples, or packed rows, consumed by all ranks).

    Whether the epoch is over is a global fact (:func:`epoch_position`), never this rank's:
    a rank whose plan is empty inside the epoch (the other ranks hold the last batches, or
    ``drop_last`` at this batch size leaves no whole round) makes an empty pass of that
    epoch. Dealing it the next epoch instead would deliver samples twice, and a trainer's
    ``set_epoch(current)`` would then restart the epoch in progress.
    """
    plan = build(epoch, at)
    if at and at >= plan.total:  # (``total`` only when needed: a packed plan reads for it)
        epoch, at = epoch_position(epoch, at, plan.total)
        plan = build(epoch, at)
    return epoch, at, plan
