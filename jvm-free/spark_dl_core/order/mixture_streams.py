"""A mixture's order drawn from fixed streams, so a rank reads only its share of every source.

Why: a mixture's batches draw from every source's whole shuffle window, so every rank needs
every shard of every source and N nodes pull N copies. Here, as for a plain dataset
(:mod:`.locality`), global batch ``g`` of the epoch's ``T`` samples is batch ``g // P`` of
stream ``g % P`` (stream ``s`` serves ``L_s`` samples, :func:`~.locality.stream_lengths`), and
each source's shards are cut once into the same ``P`` streams, so rank ``r`` of a world size
``W`` dividing ``P`` reads only streams ``s = r (mod W)`` of every source.

The counts, all by controlled rounding (:func:`split_counts`: each source's count of a range
of positions split over the streams by the smooth merge of
:func:`~.mixture_order.merged_counts`, so both the per-source and the per-stream totals are
exact):

- *Cut* ``m[i, s]``: source ``i``'s ``n_i`` samples split over the streams in proportion to
  their lengths (the sources' total first split at the streams' cumulative lengths, then that
  total per stream split by the sources' sizes). Fixed for the run: it depends on the
  sources' sizes, ``T``, ``B`` and ``P``, never on the weights, the epoch or the world
  size. Source ``i``'s shards are laid out in a permutation keyed by (its fingerprint, seed)
  and cut at ``m[i, ·]`` (:func:`~.locality.cut_pieces`): a shard is whole in one stream or
  split between two neighbours.
- *Counts* ``c[i, s]`` of each part of an epoch (the whole epoch without a schedule, the
  pieces between stage boundaries with one): the part's per-source counts split over the
  streams' positions in the part. Summed over the streams they are the part's counts exactly,
  so each epoch's per-source totals are the mixture's; summed over the sources, each stream's
  positions in the part.

Source ``i``'s part of stream ``s`` is read as its own endless stream of passes (each its
pieces permuted, keyed by (source fingerprint, ``s``, ``P``, seed, pass)), going on from
where the run's earlier epochs and parts left it, as a source of an unstreamed mixture does
(:func:`~.mixture_order.source_pieces`). With a source's count equal to its size (and the
mixture's epoch the sources' sum) the cut and the counts coincide, so every sample is served
exactly once per epoch; with fewer, no sample repeats within an epoch; with more, every
sample appears at least once. A source too small to give every stream a sample (``m[i, s] =
0`` while the stream takes some of it) is read whole by those streams.

Stream ``s`` is a :class:`~.mixture_order.ScheduledOrder` of its parts (stream coordinates,
each a :class:`~.mixture_order.MixtureOrder` of the chosen batching over the sources' parts),
shuffling windows of ``shuffle_window // P`` pieces. Batching within a stream is the
mixture's: ``"stratified"`` batches hold each source's share of the stream's counts within
about one sample (which are the mixture's shares within about ``2 P / batches``);
``"per_source"`` batches are one source's, each stream's remainders (fewer than a batch per
source) mixing in its last batches; ``"random"`` interleaves the stream's pieces.

A pure function of (the sources' fingerprints and sizes, seed, epoch, weights or schedule,
shuffle window, P, B): a step's rows (global batches ``kW .. kW + W - 1``) are the same at
every world size, and a position counts samples of one order, so resume at another world size
is exact. ``streams=1`` never comes here: the unstreamed order of order version 4 stays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import SpecError
from .locality import (
    RoundRobinOrder,
    check_streamed,
    cut_pieces,
    stream_lengths,
    stream_window,
)
from .mixture_order import MixturePlan, ScheduledOrder, SchedulePart, merged_counts_at


def stream_positions(x: int, streams: int, batch_size: int) -> np.ndarray:
    """Per stream ``s``: how many of an epoch's positions before ``x`` it serves (the
    batches ``g < x // B`` with ``g % P == s`` whole, and the batch ``x`` falls in up to
    ``x``): where position ``x`` lies in each stream's own coordinates."""
    g, r = divmod(int(x), int(batch_size))
    s = np.arange(streams, dtype=np.int64)
    out = np.where(g > s, (g - 1 - s) // streams + 1, 0) * batch_size
    out[g % streams] += r
    return out


def split_counts(counts: Sequence[int], lengths: np.ndarray) -> np.ndarray:
    """``counts`` (per source, summing to ``sum(lengths)``) split over streams of
    ``lengths``: ``[sources, streams]``, whose rows sum to ``counts`` and columns to
    ``lengths``. Stream ``s`` takes the items of the sources' smooth merge
    (:func:`~.mixture_order.merged_counts`) between the streams' cumulative lengths, so
    each source's part of each stream is within about two of its proportional share."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if int(lengths.sum()) != int(sum(counts)):
        raise SpecError(f"{int(sum(counts))} samples split over streams of {int(lengths.sum())}")
    cum = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cum[1:])
    return np.diff(merged_counts_at(counts, cum), axis=0).T


def source_cut(sizes: Sequence[int], total: int, streams: int, batch_size: int) -> np.ndarray:
    """``m[i, s]``: source ``i``'s samples in stream ``s``'s part of it, ``[sources,
    streams]``: the sources' total split at the streams' lengths of an epoch of ``total``
    (cumulative, rounded down), then split by the sources' sizes (:func:`split_counts`).
    Equal to the counts of an epoch whose counts are the sources' sizes."""
    n = int(sum(sizes))
    lengths = stream_lengths(int(total), streams, batch_size)
    cum = np.zeros(streams + 1, dtype=np.int64)
    np.cumsum(lengths, out=cum[1:])
    if n != int(total):  # in Python integers: exact at any size
        cum = np.array([n * int(c) // int(total) for c in cum.tolist()], dtype=np.int64)
    return split_counts([int(v) for v in sizes], np.diff(cum))


# Ids each stream computes ahead of a request, at most, over all streams together: a rank
# reading every stream asks each for one batch in ``streams``, and a stream's merge costs
# mostly per call, so each is asked for up to 16 batches at once (8 MiB of ids in all).
AHEAD_IDS = 1 << 20


class StreamedMixtureOrder(RoundRobinOrder):
    """The lazy order of one epoch of a mixture over ``streams`` fixed streams (see the
    module's text).

    ``parts_of(e)``: epoch ``e``'s parts (offset, length, stage and per-source counts; their
    ``stream_starts`` are not used); every epoch holds ``total`` samples. Holds the sources'
    cut (O(shards)) and, once read, each stream's order.
    """

    def __init__(
        self,
        plan: MixturePlan,
        parts_of: Callable[[int], Sequence[SchedulePart]],
        total: int,
        seed: int,
        epoch: int,
        shuffle: bool,
        window: int,
        streams: int,
        batch_size: int,
    ) -> None:
        check_streamed(streams, batch_size, window, "a streamed mixture order")
        self.plan, self.seed, self.epoch, self.shuffle = plan, int(seed), int(epoch), shuffle
        self.total, self.streams, self.batch_size = int(total), int(streams), int(batch_size)
        self.window = int(window)
        sizes = [np.asarray(s, dtype=np.int64) for s in plan.shard_sizes]
        self.sizes = [int(s.sum()) for s in sizes]
        self.cut = source_cut(self.sizes, self.total, self.streams, self.batch_size)
        self.pools: list[list[tuple[np.ndarray, np.ndarray]]] = []  # [source][stream]
        self.shard_heads: list[np.ndarray] = []  # per source, each shard's first id
        for i, (shards, base, fp) in enumerate(zip(sizes, plan.bases, plan.source_fingerprints)):
            heads = int(base) + np.concatenate([[0], np.cumsum(shards)[:-1]]).astype(np.int64)
            self.shard_heads.append(heads)
            cut = cut_pieces(shards, fp, self.seed, self.cut[i], heads)
            # a stream with no part of a source reads the whole source, should it take some
            self.pools.append([p if len(p[0]) else (shards, heads) for p in cut])
        self.parts = list(parts_of(self.epoch))
        self.before = self._served_before(parts_of)
        self._orders: dict[int, ScheduledOrder] = {}
        self._ahead: dict[int, tuple[int, np.ndarray]] = {}  # stream: (first position, ids)
        self._ahead_len = min(16, max(1, AHEAD_IDS // (self.streams * self.batch_size)))

    def _stream_take(self, s: int, lo: int, hi: int, dense: bool) -> np.ndarray:
        """Stream ``s``'s ids at ``lo:hi``, from a run computed ahead (up to ``16``
        batches of the stream) when the request lies in it: the same ids, fewer merges."""
        kept = self._ahead.get(s)
        if kept is not None and kept[0] <= lo and hi <= kept[0] + len(kept[1]):
            return kept[1][lo - kept[0] : hi - kept[0]].copy()  # callers may write theirs
        length = self.stream(s).total
        stop = min(length, max(hi, lo + self._ahead_len * self.batch_size))
        ids = np.asarray(self.stream(s).take(lo, stop, dense))
        self._ahead[s] = (lo, ids)
        return ids[: hi - lo].copy()

    def _split(self, part: SchedulePart, memo: dict[Any, np.ndarray]) -> np.ndarray:
        """A part's counts per (source, stream), ``[sources, streams]`` (memoized by the
        part's bounds and counts: the whole epochs of one stage are all alike)."""
        key = (part.offset, part.length, tuple(part.counts))
        got = memo.get(key)
        if got is None:
            p, size = self.streams, self.batch_size
            lengths = stream_positions(part.offset + part.length, p, size) - stream_positions(
                part.offset, p, size
            )
            got = split_counts([int(c) for c in part.counts], lengths)
            memo[key] = got
        return got

    def _served_before(self, parts_of: Callable[[int], Sequence[SchedulePart]]) -> np.ndarray:
        """Per (source, stream), the samples the run's epochs before this one took from
        that source's part of that stream: where its passes stand at this epoch's start.
        O(epoch) part lists, each epoch's split computed once per distinct part."""
        memo: dict[Any, np.ndarray] = {}
        self._memo = memo
        out = np.zeros((len(self.sizes), self.streams), dtype=np.int64)
        for e in range(self.epoch):
            for part in parts_of(e):
                out += self._split(part, memo)
        return out

    def stream(self, s: int) -> ScheduledOrder:
        """Stream ``s``'s order this epoch: its parts back to back in stream coordinates,
        each source read from its part of the stream (its own key, so streams shuffle
        apart) where the run left it."""
        order = self._orders.get(s)
        if order is not None:
            return order
        p, size = self.streams, self.batch_size
        at = self.before[:, s].copy()
        parts = []
        for part in self.parts:
            counts = self._split(part, self._memo)[:, s]
            a = int(stream_positions(part.offset, p, size)[s])
            z = int(stream_positions(part.offset + part.length, p, size)[s])
            if z > a:
                parts.append(
                    SchedulePart(a, z - a, part.stage, tuple(map(int, counts)), tuple(map(int, at)))
                )
            at += counts
        pools = [self.pools[i][s] for i in range(len(self.sizes))]
        plan = MixturePlan(
            fingerprint=f"{self.plan.fingerprint}:stream{s}/{p}",
            shard_sizes=tuple(q[0] for q in pools),
            bases=self.plan.bases,
            counts=self.plan.counts,
            source_fingerprints=tuple(f"{fp}:part{s}/{p}" for fp in self.plan.source_fingerprints),
            batching=self.plan.batching,
            shard_firsts=tuple(q[1] for q in pools),
        )
        length = int(stream_lengths(self.total, p, size)[s])
        order = ScheduledOrder(
            plan,
            [],
            length,
            self.seed,
            self.epoch,
            self.shuffle,
            stream_window(self.window, p),
            parts=parts,
            batch_size=size,
        )
        self._orders[s] = order
        return order

    def held(self, streams: list[int]) -> dict[str, Any]:
        """The share of the sources' samples ``streams`` hold, in all and per source (in the
        mixture's order of sources), with the shards they touch (whole or in part)."""
        per = []
        for i, n in enumerate(self.sizes):
            firsts = [self.pools[i][s][1] for s in streams]
            got = sum(int(self.pools[i][s][0].sum()) for s in streams)
            ids = np.concatenate(firsts) if firsts else np.empty(0, np.int64)
            shards = np.unique(np.searchsorted(self.shard_heads[i], ids, side="right") - 1)
            per.append(
                {
                    "data_share": got / max(1, n),
                    "shards_read": len(shards),
                    "shards": len(self.shard_heads[i]),
                }
            )
        held = sum(s["data_share"] * n for s, n in zip(per, self.sizes))
        return {
            "data_share": held / max(1, sum(self.sizes)),
            "shards_read": sum(s["shards_read"] for s in per),
            "shards": sum(s["shards"] for s in per),
            "sources": per,
        }

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_orders"] = {}  # each process builds the streams it reads
        state["_ahead"] = {}
        return state

    @property
    def nbytes(self) -> int:
        """Memory held: the sources' cut and the stream orders built, O(shards)."""
        pools = sum(a.nbytes + b.nbytes for per in self.pools for a, b in per)
        ahead = sum(ids.nbytes for _, ids in self._ahead.values())
        return pools + ahead + sum(o.nbytes for o in self._orders.values())
