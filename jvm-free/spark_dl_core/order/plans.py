"""A rank's plan of an epoch: its global batches of sample indices, lazily, from a position.

Global batch ``g`` goes to rank ``g % world_size``; even batches, padding and ``drop_last``
are decided here, so every framework adapter deals the same batches. With a streamed order
(:mod:`~spark_dl_core.order.locality`) batch ``g`` comes from stream ``g % streams``, so a
rank whose world size divides the streams reads only its own streams' shards.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from ..errors import SpecError
from .choice import _order_of
from .dataset_order import DENSE_WORLD, _Materialized, _Order
from .locality import RoundRobinOrder, locality_report
from .state import resolve_window

if TYPE_CHECKING:
    from ..shard_source import ShardSource


@dataclass(frozen=True)
class EpochPlan(Sequence[np.ndarray]):
    """One rank's batches of one epoch (from ``consumed`` on), as global sample indices.

    A lazy sequence: ``plan[k]`` (an int64 array) is computed when asked, so a plan costs
    the global order's O(shards) whatever the epoch's length. With ``drop_last`` the
    incomplete final global batch is dropped and the tail is cut to a whole number of rounds,
    so every rank gets the same number of steps (DDP needs that). Without it, and with
    ``even_batches`` over several ranks, every rank also gets the same number of batches:
    the last *round* (one batch per rank) splits the samples left over it evenly, each rank
    ``ceil(left / world_size)`` of them, and the fewer than ``world_size`` missing samples
    repeat positions ``0, 1, ...`` of the epoch's order (the *padding*, :meth:`pad_mask`).
    With neither, ranks differ by at most one batch and the last batch may be short (every
    sample exactly once). Only ``order.total`` and ``order.take`` are used, so any order
    (a dataset's, a mixture's) is padded the same way.
    """

    order: _Order
    batch_size: int
    rank: int
    world_size: int
    drop_last: bool
    consumed: int = 0
    even_batches: bool = False
    # Processes this rank's batches are dealt over (DataLoader workers): each reads only a
    # part of every shuffle window, so it computes the order of just the spans it reads.
    readers: int = 1
    global_batches: int = field(init=False)
    # Set when padding applies: (start of the last round, samples per rank in it).
    tail: tuple[int, int] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise SpecError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise SpecError(f"rank {self.rank} is not in 0..{self.world_size - 1}")
        if not 0 <= self.consumed <= self.order.total:
            raise SpecError(f"consumed={self.consumed} is outside 0..{self.order.total}")
        rest = self.order.total - self.consumed
        if self.drop_last:
            n = rest // self.batch_size
            n -= n % self.world_size
        else:
            n = -(-rest // self.batch_size)
        if self.even_batches and self.world_size > 1 and not self.drop_last and rest:
            per_round = self.world_size * self.batch_size
            rounds = -(-rest // per_round)
            start = self.consumed + (rounds - 1) * per_round
            left = self.order.total - start
            object.__setattr__(self, "tail", (start, -(-left // self.world_size)))
            n = rounds * self.world_size
        object.__setattr__(self, "global_batches", n)

    @classmethod
    def build(
        cls,
        dataset: ShardSource,
        *,
        batch_size: int,
        shuffle: bool,
        seed: int,
        epoch: int,
        rank: int,
        world_size: int,
        drop_last: bool,
        shuffle_window: int | None,
        consumed: int = 0,
        even_batches: bool = False,
        streams: int = 1,
    ) -> EpochPlan:
        order = _order_of(
            dataset,
            seed,
            epoch,
            shuffle,
            resolve_window(shuffle_window),
            int(batch_size),
            int(streams),
        )
        return cls(
            order,
            int(batch_size),
            int(rank),
            int(world_size),
            bool(drop_last),
            consumed,
            bool(even_batches),
        )

    @classmethod
    def from_order(
        cls,
        order: np.ndarray,
        batch_size: int,
        rank: int,
        world_size: int,
        drop_last: bool,
        consumed: int = 0,
        even_batches: bool = False,
    ) -> EpochPlan:
        """A plan over an explicit order array (a materialized reference)."""
        return cls(
            _Materialized(order), batch_size, rank, world_size, drop_last, consumed, even_batches
        )

    @property
    def total(self) -> int:
        return self.order.total

    @property
    def batches(self) -> EpochPlan:
        """The plan itself (it is the sequence of batches); kept for older callers."""
        return self

    def __len__(self) -> int:
        return max(0, -(-(self.global_batches - self.rank) // self.world_size))

    def _bounds(self, k: int) -> tuple[int, int]:
        """Positions ``start:stop`` of batch ``k``; with padding, ``stop`` (and in a tiny
        epoch ``start``) may pass the order's end: those positions wrap to its start."""
        if self.tail is not None and k == len(self) - 1:
            start, each = self.tail
            return start + self.rank * each, start + (self.rank + 1) * each
        g = self.rank + k * self.world_size
        start = self.consumed + g * self.batch_size
        return start, min(self.order.total, start + self.batch_size)

    def _take(self, start: int, stop: int) -> np.ndarray:
        """Sample ids at positions ``start:stop``; positions from ``total`` on are padding:
        position ``total + i`` repeats position ``i % total`` of the order."""
        total, dense = self.order.total, self._dense
        if stop <= total:
            return self.order.take(start, stop, dense)
        parts = [self.order.take(start, total, dense)] if start < total else []
        at = max(start, total) - total
        while at < stop - total:
            lo = at % total
            hi = min(total, lo + (stop - total - at))
            parts.append(self.order.take(lo, hi, dense))
            at += hi - lo
        return np.concatenate(parts).astype(np.int64, copy=False)

    @property
    def _dense(self) -> bool:
        """Whether this rank reads most of each shuffle window it meets (see
        ``GlobalOrder.ids``): few ranks, or a streamed order (a dataset's or a mixture's)
        whose streams it reads whole; not one of several DataLoader workers (``readers``),
        which would each compute every window whole to read a part of it."""
        if self.readers > 1:
            return False
        if isinstance(self.order, RoundRobinOrder):
            return self.order.dense_for(self.world_size)
        return self.world_size <= DENSE_WORLD

    def locality(self) -> dict[str, Any]:
        """How local this rank's reads are (:func:`~.locality.locality_report`)."""
        return locality_report(self.order, self.rank, self.world_size)

    @property
    def repeats(self) -> int:
        """Padding samples this rank's batches hold (repeats of the epoch's first samples)."""
        if self.tail is None:
            return 0
        _, stop = self._bounds(len(self) - 1)
        return max(0, min(stop - self.order.total, self.tail[1]))

    def pad_mask(self, k: int) -> np.ndarray:
        """Which rows of batch ``k`` are padding (repeats), as a bool array."""
        start, stop = self._bounds(k)
        return np.arange(start, stop) >= self.order.total

    def batch_len(self, k: int) -> int:
        """Samples in batch ``k``, without computing its indices."""
        start, stop = self._bounds(k)
        return stop - start

    @overload
    def __getitem__(self, k: int) -> np.ndarray: ...
    @overload
    def __getitem__(self, k: slice) -> Sequence[np.ndarray]: ...
    def __getitem__(self, k: int | slice) -> np.ndarray | Sequence[np.ndarray]:
        if isinstance(k, slice):
            return _Slice(self, range(len(self))[k])
        n = len(self)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError(f"batch {k} is not in 0..{n - 1}")
        return self._take(*self._bounds(k))

    def __iter__(self) -> Iterator[np.ndarray]:
        for k in range(len(self)):
            yield self[k]

    def joined(self, batches: range) -> np.ndarray:
        """The ids of consecutive batches ``batches`` as one array: one lookup in the order
        when they are adjacent in it (a single rank), else one per batch."""
        if not len(batches):
            return np.empty(0, dtype=np.int64)
        if self.world_size > 1 and len(batches) > 1:
            return np.concatenate([self[k] for k in batches])
        n = len(self)
        if batches[0] < 0 or batches[-1] >= n:
            raise IndexError(f"batches {batches} are not in 0..{n - 1}")
        start, stop = self._bounds(batches[0])[0], self._bounds(batches[-1])[1]
        return self._take(start, stop)

    def stream_period(self) -> int:
        """``Q`` when this rank's batch ``k`` and ``k + Q`` are consecutive batches of one
        stream of a streamed order (``W`` dividing its ``P`` streams, ``Q = P / W > 1``,
        the position on a batch boundary), so :meth:`joined_run` reads a run of them as
        one take; else 0. A padded last batch (``tail``) is not part of any run."""
        order = self.order
        if not isinstance(order, RoundRobinOrder) or order.batch_size != self.batch_size:
            return 0
        if order.streams % self.world_size or self.consumed % self.batch_size:
            return 0
        period = order.streams // self.world_size
        return period if period > 1 else 0

    def joined_run(self, k: int, count: int) -> np.ndarray:
        """The ids of batches ``k, k + Q, ..., k + (count - 1) Q`` (``Q``:
        :meth:`stream_period`), in that order: one stream's consecutive batches, one take."""
        period = self.stream_period()
        last = k + (count - 1) * period
        if not period or count < 1 or k < 0 or last >= len(self) - (self.tail is not None):
            raise IndexError(f"batches {k}..{last} step {period} are not one stream's run")
        g = self.consumed // self.batch_size + self.rank + k * self.world_size
        order = self.order
        assert isinstance(order, RoundRobinOrder)
        return order.take_run(g, count, self._dense)

    def consumed_after(self, steps: int) -> int:
        """Global samples consumed once every rank has taken ``steps`` batches of this plan:
        the whole epoch once no rank has a batch left (a tail ``drop_last`` drops included)."""
        if steps > 0 and steps * self.world_size >= self.global_batches:
            return self.total
        return min(self.total, self.consumed + steps * self.world_size * self.batch_size)

    def exhausted(self) -> EpochPlan:
        """The same epoch with nothing left (after a full pass), sharing the order."""
        return EpochPlan(
            self.order,
            self.batch_size,
            self.rank,
            self.world_size,
            self.drop_last,
            self.total,
            self.even_batches,
        )


@dataclass(frozen=True)
class _Slice(Sequence[np.ndarray]):
    """A lazy sub-range of a plan's batches (``plan[3:]``)."""

    plan: EpochPlan
    picks: range

    def __len__(self) -> int:
        return len(self.picks)

    @overload
    def __getitem__(self, k: int) -> np.ndarray: ...
    @overload
    def __getitem__(self, k: slice) -> Sequence[np.ndarray]: ...
    def __getitem__(self, k: int | slice) -> np.ndarray | Sequence[np.ndarray]:
        if isinstance(k, slice):
            return _Slice(self.plan, self.picks[k])
        return self.plan[self.picks[k]]

    def batch_len(self, k: int) -> int:
        return self.plan.batch_len(self.picks[k])

    def pad_mask(self, k: int) -> np.ndarray:
        return self.plan.pad_mask(self.picks[k])
