"""How a rank's batches are grouped into the units a reader decodes at once.

Why apart: the decode unit is its own concept beside the workers' batches and the loader
(:mod:`.loader`). A unit of several batches pays a decode's fixed costs once (planning, a
gather call per shard, Python). :class:`GroupedBatches` groups consecutive batches, dealt
round-robin to DataLoader workers; in-process, a streamed order's batches are grouped a
stream at a time (:class:`StreamUnits`), so each unit is one take of one stream and a gather
from its one or two shards, and the loader puts the batches back in order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from ...order import EpochPlan


class GroupedBatches(Sequence[np.ndarray]):
    """One worker's groups of plan batches, each as one index array, computed when asked.

    Global group ``k`` holds ``min(group, 2**k)`` consecutive batches; worker ``w`` of ``W``
    takes groups ``w, w + W, ...``. Arithmetic only: nothing per batch is held.
    """

    def __init__(self, plan: EpochPlan, group: int, worker: int, workers: int) -> None:
        self.plan, self.worker, self.workers = plan, worker, workers
        n = len(plan)
        self.starts = [0]  # starts of the doubling head's groups (sizes 1, 2, 4, ... < group)
        while (1 << (len(self.starts) - 1)) < group:
            self.starts.append(self.starts[-1] + (1 << (len(self.starts) - 1)))
        self.head, self.group, self.n = len(self.starts) - 1, group, n
        if n <= self.starts[-1]:
            self.n_groups = sum(1 for a in self.starts[:-1] if a < n)
        else:
            self.n_groups = self.head + -(-(n - self.starts[-1]) // group)

    def span(self, k: int) -> range:
        """Batches of global group ``k``."""
        if k < self.head:
            return range(self.starts[k], min(self.n, self.starts[k + 1]))
        a = self.starts[-1] + (k - self.head) * self.group
        return range(a, min(self.n, a + self.group))

    def __len__(self) -> int:
        return max(0, -(-(self.n_groups - self.worker) // self.workers))

    def ranges(self) -> Iterator[range]:
        for i in range(len(self)):
            yield self.span(self.worker + i * self.workers)

    def __getitem__(self, i: int) -> np.ndarray:  # type: ignore[override]
        return self.plan.joined(self.span(self.worker + i * self.workers))

    def batch_len(self, i: int) -> int:
        """Samples in group ``i``, without computing their ids."""
        return sum(self.plan.batch_len(j) for j in self.span(self.worker + i * self.workers))


# In-process, a streamed order's batches are decoded a stream at a time (:class:`StreamUnits`)
# when this rank reads at most this many streams: a block's units, one a stream, each of the
# loader's group size (~1 MiB of rows, ~8 MiB of variable columns), are held until their
# batches' turn, so at most this many groups are held.
STREAM_UNITS_HELD = 8


class StreamUnits(Sequence[np.ndarray]):
    """An in-process reader's units of a streamed order, each one stream's consecutive
    batches (its few shards: a gather from one or two shards where a run of consecutive
    batches met every stream's), decoded in the order their first batches come.

    This rank's batch ``k`` and ``k + Q`` are consecutive batches of one stream
    (``plan.stream_period()``). Block ``b`` holds the ``sizes[b] x Q`` batches from
    ``starts[b]`` (1, 2, 4, ... up to ``per_unit`` batches a unit: small first units, a fast
    first batch) and its unit ``r`` the batches ``starts[b] + r + i Q``; a padded last batch
    (``plan.tail``) is a unit of its own. Arithmetic only, nothing per batch held."""

    def __init__(self, plan: EpochPlan, per_unit: int) -> None:
        self.plan, self.period = plan, plan.stream_period()
        self.n = len(plan)
        self.runs = self.n - (plan.tail is not None)  # batches read in stream runs
        q = self.period
        self.starts: list[int] = [0]  # the doubling head's blocks: first batches, sizes
        self.sizes: list[int] = []
        while (1 << len(self.sizes)) < per_unit:
            self.sizes.append(1 << len(self.sizes))
            self.starts.append(self.starts[-1] + self.sizes[-1] * q)
        self.per_unit = per_unit
        head_units = sum(min(q, max(0, self.runs - a)) for a in self.starts[:-1])
        rest = max(0, self.runs - self.starts[-1])
        full, part = divmod(rest, per_unit * q)
        self.units = head_units + full * q + min(q, part) + (self.runs < self.n)

    def _block(self, u: int) -> tuple[int, int, int]:
        """Unit ``u``'s (first batch, batches in its block, residue)."""
        q, head = self.period, len(self.sizes)
        b, r = divmod(u, q)
        if b < head:
            return self.starts[b], self.sizes[b], r
        return self.starts[-1] + (b - head) * self.per_unit * q, self.per_unit, r

    def _padded(self, u: int) -> bool:
        """Whether unit ``u`` is the padded last batch alone."""
        return self.runs < self.n and u == self.units - 1

    def batches_of(self, u: int) -> range:
        """The plan batches unit ``u`` holds, in order."""
        if self._padded(u):
            return range(self.n - 1, self.n)
        first, size, r = self._block(u)
        return range(first + r, min(self.runs, first + size * self.period), self.period)

    def __len__(self) -> int:
        return self.units

    def __getitem__(self, u: int) -> np.ndarray:  # type: ignore[override]
        if self._padded(u):
            return self.plan[self.n - 1]
        ks = self.batches_of(u)
        return self.plan.joined_run(ks[0], len(ks))

    def batch_len(self, u: int) -> int:
        """Samples in unit ``u``, without computing their ids."""
        return sum(self.plan.batch_len(k) for k in self.batches_of(u))


def stream_units(plan: EpochPlan, group: int) -> StreamUnits | None:
    """Stream units of ``plan`` for an in-process reader of ``group``-batch units, when they
    apply: a streamed order read ``Q`` streams at a time, ``2 <= Q <=``
    :data:`STREAM_UNITS_HELD`, and groups of at least two batches. A unit is as large as a
    group (a smaller one paid a decode's fixed costs more often: token documents in units
    of 4 batches instead of 64 read at 0.63x)."""
    period = plan.stream_period()
    if group < 2 or not period or period > STREAM_UNITS_HELD:
        return None
    return StreamUnits(plan, group)
