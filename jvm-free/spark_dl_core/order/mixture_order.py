"""A mixture's order: blocks of its sources' shards merged by exact per-source counts.

Per-source counts follow the mixture's proportions exactly (largest remainders), and the
merge of sources into batches is a pure function of (fingerprints, seed, epoch, batching).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import SpecError
from .dataset_order import DEFAULT_WINDOW, DENSE_WORLD, GlobalOrder, Once, _key, _rng
from .seeding import BatchShuffles

if TYPE_CHECKING:
    pass

BATCHING = ("random", "stratified", "per_source")


@dataclass(frozen=True)
class MixturePlan:
    """What fixes a mixture's order (pure data, O(shards)): per source its shard sizes, the
    first id of its samples in the mixture's id space (sources back to back), its
    fingerprint and how many samples it gives per epoch; the mixture's fingerprint and
    batching."""

    fingerprint: str
    shard_sizes: tuple[np.ndarray, ...]
    bases: tuple[int, ...]
    counts: tuple[int, ...]
    source_fingerprints: tuple[str, ...]
    batching: str = "random"
    # Where each source's stream starts for this order (a schedule's part); None: the
    # epoch's own start, ``epoch * count``.
    stream_starts: tuple[int, ...] | None = None
    # Per source, each of its "shards"' first id where they are not back to back from its
    # base: a streamed mixture's source is its pieces of one stream (``mixture_streams``).
    shard_firsts: tuple[np.ndarray, ...] | None = None


def source_pieces(
    sizes: np.ndarray,
    base: int,
    count: int,
    epoch: int,
    fingerprint: str,
    seed: int,
    shuffle: bool,
    start: int | None = None,
    firsts: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The pieces of shards one source gives to ``epoch`` of a mixture: (sizes, first ids).

    A source is read as an endless *stream* of passes; each pass is every shard once, in a
    permutation keyed by (source fingerprint, seed, pass) when shuffling. Epoch ``e`` takes
    stream positions ``[e * count, (e + 1) * count)``, so no sample is drawn again before
    every sample of the source has been drawn (a subset per epoch walks on through the
    pass), and with ``count`` = r x the source's size each sample appears floor(r) or ceil(r)
    times in an epoch. ``start`` overrides the stream position (a schedule's part of an
    epoch starts where the source's previous part ended). ``firsts``: each shard's first id
    (default: ``base`` plus the shards back to back). Cost: O(shards x passes touched).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    n = int(sizes.sum())
    if count <= 0 or n == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    heads = base + offsets[:-1] if firsts is None else np.asarray(firsts, dtype=np.int64)
    start = epoch * count if start is None else int(start)
    stop = start + count
    out_sizes, out_bases = [], []
    for k in range(start // n, (stop - 1) // n + 1):
        if shuffle:
            perm = _rng(f"stream:{fingerprint}", seed, k).permutation(len(sizes)).astype(np.int64)
        else:
            perm = np.arange(len(sizes), dtype=np.int64)
        cum = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes[perm], out=cum[1:])
        a, b = max(start - k * n, 0), min(stop - k * n, n)
        ranks = np.arange(
            np.searchsorted(cum, a, side="right") - 1, np.searchsorted(cum, b, side="left")
        )
        lo = np.maximum(cum[ranks], a)
        hi = np.minimum(cum[ranks + 1], b)
        keep = hi > lo
        out_sizes.append((hi - lo)[keep])
        out_bases.append((heads[perm[ranks]] + (lo - cum[ranks]))[keep])
    return np.concatenate(out_sizes), np.concatenate(out_bases)


def proportional_counts(weights: Sequence[float], size: int) -> list[int]:
    """``size`` split by ``weights``: ``floor(size * share)`` each, the samples left one each
    to the largest remainders (ties: the earlier one), so the counts sum to ``size``."""
    total = math.fsum(weights)
    exact = [size * w / total for w in weights]
    counts = [math.floor(e) for e in exact]
    left = size - sum(counts)
    by_remainder = sorted(range(len(counts)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[:left]:
        counts[i] += 1
    return counts


def merged_counts(counts: Sequence[int], x: int) -> list[int]:
    """How many items of each sequence are among the first ``x`` of their smooth merge.

    Of ``S`` sequences, sequence ``s`` has ``counts[s]`` items; its item ``j`` sits at time
    (j + (2s + 1) / 2S) / counts[s] in [0, 1) (phases staggered so that sources of equal
    size do not tie), and the merge orders all items by (time, s). Every prefix then holds
    each sequence's share of it to within about one item (a divisor method, in exact
    rational arithmetic), and the counts never decrease as ``x`` grows, so consecutive
    prefixes give each batch a non-negative, proportional number of items.
    """
    return [int(v) for v in merged_counts_at(counts, np.array([int(x)], dtype=np.int64))[0]]


# Exact int64 arithmetic in :func:`merged_counts_at` while its products stay below this;
# larger mixtures take the scalar path in Python integers.
_INT64_SAFE = 1 << 62
# Candidates per prefix (sources x items to move) up to which the merge's last-items fix-up
# compares every pair in numpy; beyond it the scalar heap does it.
_PAIRWISE = 64


def merged_counts_at(counts: Sequence[int], xs: np.ndarray) -> np.ndarray:
    """:func:`merged_counts` of many prefixes at once: an int64 array ``[len(xs), S]``.

    Exactly the same counts, in numpy integer arithmetic: each sequence's items up to time
    ``x / total`` in one vector step, then the few items too many (or too few) per prefix
    are dropped (added) by comparing the candidates' times as exact cross products. Where
    those products could leave int64 the prefixes go through :func:`_merged_counts_exact`.
    """
    c = [int(v) for v in counts]
    xs = np.asarray(xs, dtype=np.int64).reshape(-1)
    n_src, total = len(c), sum(c)
    out = np.zeros((len(xs), n_src), dtype=np.int64)
    if not len(xs) or total == 0:
        return out
    q = 2 * n_src
    cmax = max(c)
    if cmax * total * q >= _INT64_SAFE or (cmax * q + q) ** 2 >= _INT64_SAFE:
        for i, x in enumerate(xs.tolist()):
            out[i] = _merged_counts_exact(c, x)
        return out
    xs = np.clip(xs, 0, total)
    ca = np.array(c, dtype=np.int64)
    phase = 2 * np.arange(n_src, dtype=np.int64) + 1
    v = ca * xs[:, None] * q - phase * total  # items with time <= x / total
    got = np.where(v < 0, 0, np.minimum(ca, v // (q * total) + 1))
    extra = got.sum(axis=1) - xs
    for sign in (1, -1):  # 1: drop the latest items included, -1: add the earliest left out
        rows = np.flatnonzero(extra * sign > 0)
        for chunk in range(0, len(rows), 256):
            r = rows[chunk : chunk + 256]
            got[r] = _fix_up(ca, got[r], extra[r] * sign, sign, q)
    return got


def _fix_up(ca: np.ndarray, got: np.ndarray, e: np.ndarray, sign: int, q: int) -> np.ndarray:
    """Move ``e`` items per row out of (``sign`` 1) or into (-1) the prefixes ``got``: the
    latest included ones, later sources first on equal times, or the earliest left out,
    earlier sources first (the merge's (time, source) order)."""
    n_src = len(ca)
    k_max = int(e.max())
    if n_src * k_max > _PAIRWISE:
        c = ca.tolist()
        return np.array(
            [_merged_counts_exact(c, int(g.sum() - sign * k)) for g, k in zip(got, e)],
            dtype=np.int64,
        ).reshape(got.shape)
    k = np.arange(k_max, dtype=np.int64)
    if sign > 0:
        j = got[:, :, None] - 1 - k  # [rows, sources, k]: the last items included
        valid = j >= 0
    else:
        j = got[:, :, None] + k  # the first items left out
        valid = j < ca[None, :, None]
    rows = len(got)
    src = np.repeat(np.arange(n_src), k_max)
    num = (j * q + (2 * np.arange(n_src) + 1)[None, :, None]).reshape(rows, -1)
    den = np.repeat(ca * q, k_max)
    valid = valid.reshape(rows, -1)
    # before[r, a, b]: candidate a precedes b in the merge (time, then source)
    lhs = num[:, :, None] * den[None, None, :]
    rhs = num[:, None, :] * den[None, :, None]
    before = (lhs < rhs) | ((lhs == rhs) & (src[:, None] < src[None, :]))
    if sign > 0:  # dropped: fewer than e valid candidates come after it
        beyond = (before & valid[:, None, :]).sum(axis=2)
    else:  # added: fewer than e valid candidates come before it
        beyond = (before & valid[:, :, None]).sum(axis=1)
    moved = valid & (beyond < e[:, None])
    per_source = moved.reshape(rows, n_src, k_max).sum(axis=2)
    return np.asarray(got - sign * per_source, dtype=np.int64)


def _merged_counts_exact(counts: list[int], x: int) -> list[int]:
    """:func:`merged_counts` in Python integers and fractions, one prefix at a time (any
    size; the reference the vectorized path is tested against)."""
    from fractions import Fraction
    from heapq import heapify, heappop, heappush

    total, q = sum(counts), 2 * len(counts)
    x = max(0, min(int(x), total))

    def time(s: int, j: int) -> Fraction:
        return Fraction(j * q + 2 * s + 1, counts[s] * q)

    got = []
    for s, c in enumerate(counts):  # items with time <= x / total
        v = c * x * q - (2 * s + 1) * total
        got.append(0 if v < 0 else min(c, v // (q * total) + 1))
    extra = sum(got) - x
    if extra > 0:  # drop the latest items included: the largest times, later sources first
        late = [(-time(s, g - 1), -s) for s, g in enumerate(got) if g]
        heapify(late)
        for _ in range(extra):
            s = -heappop(late)[1]
            got[s] -= 1
            if got[s]:
                heappush(late, (-time(s, got[s] - 1), -s))
    elif extra < 0:  # add the earliest items left out: the smallest times, earlier sources first
        early = [(time(s, g), s) for s, g in enumerate(got) if g < counts[s]]
        heapify(early)
        for _ in range(-extra):
            s = heappop(early)[1]
            got[s] += 1
            if got[s] < counts[s]:
                heappush(early, (time(s, got[s]), s))
    return got


class MixtureOrder:
    """The lazy order of one epoch of a mixture: position -> id in the mixture's id space.

    Each source contributes the pieces :func:`source_pieces` gives it for the epoch, so the
    per-source counts are exact. ``batching``:

    - ``"random"``: all pieces are ordered like the shards of one dataset
      (:class:`GlobalOrder`: pieces permuted, samples permuted within windows of pieces), so
      sources interleave through the shuffle and a reader holds a window of pieces.
    - ``"stratified"``: each source's pieces form its own windowed order; batch ``b`` takes
      from each source the items :func:`merged_counts` assigns to positions
      ``[b * batch_size, (b + 1) * batch_size)`` (its share of every batch, within about one
      sample), shuffled within the batch.
    - ``"per_source"``: each batch holds one source's samples; the sources' whole batches
      follow their smooth merge (each source in proportion across the epoch); the sources'
      remainders (fewer than a batch each) form the epoch's last batches, which may mix.

    ``lead``: where this order's first position falls inside a batch of the whole epoch (a
    schedule's part starting mid-batch): its batches then keep to the epoch's batch grid,
    the first one ``batch_size - lead`` long. For ``"per_source"`` that short first batch
    is taken from the sources' remainders (the latest whole batches of the merge become
    remainders when those are too few), so it may mix sources, as the last ones may.

    Holds O(pieces) arrays, whatever the epoch's length.
    """

    def __init__(
        self,
        plan: MixturePlan,
        seed: int,
        epoch: int,
        shuffle: bool,
        window: int = DEFAULT_WINDOW,
        batch_size: int = 0,
        lead: int = 0,
    ) -> None:
        if plan.batching not in BATCHING:
            raise SpecError(f"batching={plan.batching!r}: must be one of {BATCHING}")
        self.plan, self.seed, self.epoch, self.shuffle = plan, seed, epoch, shuffle
        self.counts = [int(c) for c in plan.counts]
        self.total = int(sum(self.counts))
        self.batch_size = int(batch_size)
        starts = plan.stream_starts or (None,) * len(self.counts)
        firsts = plan.shard_firsts or (None,) * len(self.counts)
        pieces = [
            source_pieces(sizes, base, count, epoch, fp, seed, shuffle, start, heads)
            for sizes, base, count, fp, start, heads in zip(
                plan.shard_sizes, plan.bases, self.counts, plan.source_fingerprints, starts, firsts
            )
        ]
        if plan.batching == "random":
            sizes = np.concatenate([p[0] for p in pieces]) if pieces else np.empty(0, np.int64)
            bases = np.concatenate([p[1] for p in pieces]) if pieces else np.empty(0, np.int64)
            self.mixed = GlobalOrder(
                sizes, plan.fingerprint, seed, epoch, shuffle, window, bases=bases
            )
            return
        if self.batch_size < 1:
            raise SpecError(f"batching={plan.batching!r} needs a batch size >= 1")
        self.streams = [
            GlobalOrder(p[0], f"{plan.fingerprint}:{s}", seed, epoch, shuffle, window, bases=p[1])
            for s, p in enumerate(pieces)
        ]
        self.lead = int(lead) % self.batch_size
        self.head = min(self.total, (self.batch_size - self.lead) % self.batch_size)
        self.full = self._whole_batches()  # per_source: whole batches per source
        self._key = _key(plan.fingerprint, seed, epoch)
        self._dense = len(self.counts) <= DENSE_WORLD
        self._merged: dict[int, list[int]] = {}
        self._counts: dict[int, np.ndarray] = {}  # stratified: merged counts per block
        # stratified: batch b shuffled by _rng(f"batch:{fingerprint}:{b}", seed, epoch)
        self._shuffles = BatchShuffles(f"batch:{plan.fingerprint}:", seed, epoch)

    @property
    def nbytes(self) -> int:
        if self.plan.batching == "random":
            return self.mixed.nbytes
        return sum(s.nbytes for s in self.streams)

    def _orders(self) -> list[GlobalOrder]:
        return [self.mixed] if self.plan.batching == "random" else self.streams

    def prepare(self) -> None:
        """Start each stream's first window on a thread (see :meth:`GlobalOrder.prepare`)."""
        for order in self._orders():
            order.prepare()

    def then(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once, when the first of its streams reaches its last window."""
        once = Once(fn)
        for order in self._orders():
            order.then(once)

    COUNT_BLOCK = 256  # batches whose bounds are merged at once (stratified)

    def take(self, start: int, stop: int, dense: bool = False) -> np.ndarray:
        if self.plan.batching == "random":
            return self.mixed.take(start, stop, dense)
        if stop <= start:
            return np.empty(0, dtype=np.int64)
        size, lead = self.batch_size, self.lead
        if self.plan.batching == "stratified":
            first = (start + lead) // size
            ids = self._stratified(first, (stop - 1 + lead) // size + 1)
            at = max(first * size - lead, 0)
            return ids[start - at : stop - at]
        parts = []
        for b in range((start + lead) // size, (stop - 1 + lead) // size + 1):
            chunk = self._batch(b)
            at = max(b * size - lead, 0)
            parts.append(chunk[max(start - at, 0) : min(stop - at, len(chunk))])
        return np.concatenate(parts)

    def _whole_batches(self) -> list[int]:
        """``per_source``: each source's whole batches; with a short first batch (``lead``)
        the remainders must fill it, so the merge's latest whole batches turn into
        remainders when they are too few."""
        size = self.batch_size
        full = [c // size for c in self.counts]
        short = self.head - (self.total - size * sum(full))
        if short <= 0:
            return full
        demoted = -(-short // size)  # whole batches that become remainders
        return merged_counts(full, sum(full) - demoted)

    def _counts_at(self, counts: list[int], x: int) -> list[int]:
        """``merged_counts(counts, x)`` for ``per_source``'s whole batches, kept for the
        last few ``x`` (consecutive batches share a bound)."""
        got = self._merged.get(x)
        if got is None:
            got = merged_counts(counts, x)
            while len(self._merged) >= 8:
                self._merged.pop(next(iter(self._merged)))
            self._merged[x] = got
        return got

    def _bound_counts(self, first: int, stop: int) -> np.ndarray:
        """``merged_counts_at`` the bounds of batches ``first..stop`` (``[stop - first + 1,
        sources]``), from blocks of ``COUNT_BLOCK`` batches merged once each and kept: a
        reader asks for 16 batches at a time, and a merge's cost is mostly per call. A few
        batches (a rank of many reads its own one by one) are merged on their own."""
        block, parts, at = self.COUNT_BLOCK, [], first
        if stop - first < 8:
            edges = np.arange(first, stop + 1, dtype=np.int64)
            bounds = np.clip(edges * self.batch_size - self.lead, 0, self.total)
            return merged_counts_at(self.counts, bounds)
        while True:
            k = at // block
            got = self._counts.get(k)
            if got is None:
                edges = np.arange(k * block, (k + 1) * block + 1, dtype=np.int64)
                bounds = np.clip(edges * self.batch_size - self.lead, 0, self.total)
                got = merged_counts_at(self.counts, bounds)
                while len(self._counts) >= 2:
                    self._counts.pop(next(iter(self._counts)))
                self._counts[k] = got
            end = min(stop, (k + 1) * block)
            parts.append(got[at - k * block : end - k * block + 1])
            if end >= stop:
                return parts[0] if len(parts) == 1 else np.concatenate(parts)
            at = end + 1

    def _stratified(self, first: int, stop: int) -> np.ndarray:
        """The ids of stratified batches ``first..stop-1``, back to back, in their order.

        One merge of every boundary (:func:`merged_counts_at`, kept per block of batches)
        and one lookup per source stream for the whole range; each batch's part of a stream
        is then a slice of it, copied into place and shuffled in one C pass where the
        extension is built. The same ids in the same order as taking batch by batch (a test
        holds the two equal).
        """
        n_src = len(self.counts)
        got = self._bound_counts(first, stop)  # [batches + 1, sources]
        lo, hi = got[0], got[-1]
        parts = [
            self.streams[s].take(int(lo[s]), int(hi[s]), self._dense)
            if hi[s] > lo[s]
            else np.empty(0, np.int64)
            for s in range(n_src)
        ]
        if self.shuffle:  # each batch's blocks copied and shuffled in one C pass
            fused = self._shuffles.interleaved(parts, np.diff(got, axis=0), first)
            if fused is not None:
                return fused
        per_batch = np.diff(got.sum(axis=1))
        streams = np.concatenate(parts).astype(np.int64, copy=False)
        stream_at = np.zeros(n_src + 1, dtype=np.int64)
        np.cumsum(hi - lo, out=stream_at[1:])
        # block (batch, source): that source's items in that batch, blocks batch-major
        lengths = np.diff(got, axis=0).reshape(-1)
        block_from = (stream_at[:-1] + got[:-1] - lo).reshape(-1)
        block_to = np.cumsum(lengths) - lengths
        where = np.repeat(block_from - block_to, lengths) + np.arange(int(lengths.sum()))
        ids = streams[where]
        if self.shuffle:  # in place: the same swaps as ``permutation(n)`` of each generator
            self._shuffles.shuffle(ids, first, per_batch.tolist())
            return ids
        # each batch in merge time, as :meth:`_from_streams` computes it
        source = np.repeat(np.tile(np.arange(n_src), len(per_batch)), lengths)
        j = (where - stream_at[source] + lo[source]).astype(np.float64)
        phase = (2 * np.arange(n_src) + 1) / (2 * n_src)
        times = (j + phase[source]) / np.asarray(self.counts, dtype=np.float64)[source]
        at = 0
        for n in per_batch.tolist():  # a stable sort per batch (one lexsort is slower)
            ids[at : at + n] = ids[at : at + n][np.argsort(times[at : at + n], kind="stable")]
            at += n
        return ids

    def _from_streams(self, lo: list[int], hi: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Ids of stream ranges ``[lo[s], hi[s])`` with each one's merge time."""
        ids, times = [], []
        for s, (a, b) in enumerate(zip(lo, hi)):
            if b > a:
                ids.append(self.streams[s].take(a, b, self._dense))
                j = np.arange(a, b, dtype=np.float64)
                phase = (2 * s + 1) / (2 * len(self.counts))
                times.append((j + phase) / self.counts[s])
        if not ids:
            return np.empty(0, np.int64), np.empty(0, np.float64)
        return np.concatenate(ids), np.concatenate(times)

    def _batch(self, b: int) -> np.ndarray:
        """A ``per_source`` mixture's ids at positions ``[b * batch_size, (b + 1) *
        batch_size)`` in their order."""
        size, head = self.batch_size, self.head
        x0, x1 = max(b * size - self.lead, 0), min((b + 1) * size - self.lead, self.total)
        whole = sum(self.full)
        w = (x0 - head) // size
        if x0 >= head and w < whole:  # a whole batch of one source: the merge's w-th
            before, after = self._counts_at(self.full, w), self._counts_at(self.full, w + 1)
            s = next(i for i, (u, v) in enumerate(zip(before, after)) if v > u)
            k = before[s]
            return self.streams[s].take(k * size, (k + 1) * size, self._dense)
        # the sources' remainders, back to back: the first ``head`` of them fill the short
        # first batch, the rest the last ones; cut at this batch's bounds
        tails = np.cumsum([0] + [c - f * size for c, f in zip(self.counts, self.full)])
        skip = 0 if x0 < head else whole * size
        lo_t, hi_t = x0 - skip, x1 - skip
        lo = [
            f * size + int(np.clip(lo_t - t, 0, n))
            for f, t, n in zip(self.full, tails[:-1], np.diff(tails))
        ]
        hi = [
            f * size + int(np.clip(hi_t - t, 0, n))
            for f, t, n in zip(self.full, tails[:-1], np.diff(tails))
        ]
        ids, times = self._from_streams(lo, hi)
        if self.shuffle:
            return ids[
                _rng(f"batch:{self.plan.fingerprint}:{b}", self.seed, self.epoch).permutation(
                    len(ids)
                )
            ]
        return ids[np.argsort(times, kind="stable")]


@dataclass(frozen=True)
class SchedulePart:
    """The piece of one epoch that lies in one stage of a schedule: where it starts in the
    epoch, its length, its stage, each source's count and where each source's stream stands
    at its start."""

    offset: int
    length: int
    stage: int
    counts: tuple[int, ...]
    stream_starts: tuple[int, ...]


def range_counts(weights: Sequence[float], a: int, z: int, epoch_size: int) -> list[int]:
    """Per source, the samples a stage gives over run positions ``[a, z)``: the range is cut
    at epoch ends and each part counted by :func:`proportional_counts` (O(1) parts: the whole
    epochs in the middle share one count)."""
    n = len(weights)
    if z <= a:
        return [0] * n
    first_end = min(z, (a // epoch_size + 1) * epoch_size)
    got = proportional_counts(weights, first_end - a)
    if first_end == z:
        return got
    last_start = max(first_end, (z // epoch_size) * epoch_size)
    full = (last_start - first_end) // epoch_size
    if full:
        whole = proportional_counts(weights, epoch_size)
        got = [g + full * w for g, w in zip(got, whole)]
    if z > last_start:
        got = [g + t for g, t in zip(got, proportional_counts(weights, z - last_start))]
    return got


def schedule_parts(
    stages: Sequence[tuple[int, Sequence[float]]], epoch_size: int, epoch: int
) -> list[SchedulePart]:
    """Epoch ``epoch`` of a schedule cut at the stage boundaries inside it.

    ``stages``: (first run position, per-source weights), starting at 0, increasing. Each
    part's counts are its stage's weights applied to the part's length; each source's stream
    starts where everything before the part (every earlier epoch's parts) left it, so no
    sample of a source repeats before the source is exhausted. O(stages) per epoch.
    """
    lo, hi = epoch * epoch_size, (epoch + 1) * epoch_size
    ends = [s for s, _ in stages[1:]] + [max(hi, stages[-1][0] + 1)]
    at = [0] * len(stages[0][1])
    for (start, weights), end in zip(stages, ends):
        done = range_counts(weights, start, min(end, lo), epoch_size)
        at = [x + d for x, d in zip(at, done)]
    parts = []
    for k, ((start, weights), end) in enumerate(zip(stages, ends)):
        a, z = max(start, lo), min(end, hi)
        if a >= z:
            continue
        counts = proportional_counts(weights, z - a)
        parts.append(SchedulePart(a - lo, z - a, k, tuple(counts), tuple(at)))
        at = [x + c for x, c in zip(at, counts)]
    return parts


class ScheduledOrder:
    """The lazy order of one epoch of a scheduled mixture: the epoch's parts
    (:func:`schedule_parts`) back to back, each a ``"random"`` :class:`MixtureOrder` of its
    counts whose sources' streams continue where the previous part left them."""

    def __init__(
        self,
        plan: MixturePlan,
        stages: Sequence[tuple[int, Sequence[float]]],
        epoch_size: int,
        seed: int,
        epoch: int,
        shuffle: bool,
        window: int = DEFAULT_WINDOW,
        *,
        parts: Sequence[SchedulePart] | None = None,
        batch_size: int = 0,
    ) -> None:
        """``parts``: the epoch's parts when given (a mixture carried on from another one's
        position, :meth:`~spark_dl_core.Mixture.carry_on`), else the schedule's."""
        self.parts = list(parts) if parts is not None else schedule_parts(stages, epoch_size, epoch)
        self.total = int(epoch_size)
        self.offsets = np.array([p.offset for p in self.parts] + [self.total], dtype=np.int64)
        self.orders = [
            MixtureOrder(
                replace(
                    plan,
                    fingerprint=f"{plan.fingerprint}:stage{p.stage}:at{p.offset}",
                    counts=p.counts,
                    stream_starts=p.stream_starts,
                ),
                seed,
                epoch,
                shuffle,
                window,
                batch_size,
                # stratified / per_source: a part keeps to the epoch's batch grid
                lead=p.offset % batch_size if plan.batching != "random" and batch_size else 0,
            )
            for p in self.parts
        ]
        self._chain()

    def _chain(self) -> None:
        """Each part's first windows start on a thread while the part before is in its
        last window, so a stage change does not stop the pass."""
        for part, following in zip(self.orders, self.orders[1:]):
            part.then(following.prepare)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._chain()  # an order's callbacks are not pickled

    def prepare(self) -> None:
        if self.orders:
            self.orders[0].prepare()

    def then(self, fn: Callable[[], None]) -> None:
        if self.orders:
            self.orders[-1].then(fn)

    @property
    def nbytes(self) -> int:
        return sum(o.nbytes for o in self.orders)

    def take(self, start: int, stop: int, dense: bool = False) -> np.ndarray:
        out = []
        for k, order in enumerate(self.orders):
            a, z = int(self.offsets[k]), int(self.offsets[k + 1])
            if start < z and stop > a:
                out.append(order.take(max(start, a) - a, min(stop, z) - a, dense))
        if not out:
            return np.empty(0, dtype=np.int64)
        return np.concatenate(out).astype(np.int64, copy=False)
