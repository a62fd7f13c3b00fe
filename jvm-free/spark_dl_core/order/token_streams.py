"""Streams of whole shards balanced by weight (tokens), and global batches dealt over them.

Why: a packed loader (``pack=``) cuts rows from documents packed back to back, so a stream
must own whole documents and know its token total before reading a shard; the sample-count
streams of :mod:`.locality` split shards and balance samples, not tokens. Here each shard
goes whole to one stream (so no shard is shared by two streams), balanced by weight (a
shard's recorded tokens) and keyed by fingerprint and seed only: the streams' totals differ
by at most one shard.

:class:`StreamRounds` deals global batches over streams of unequal batch counts: round
``k`` takes batch ``k`` of every stream that has one, in stream order, so global batch
``g`` is batch ``g // P`` of stream ``g % P`` until the shortest stream runs out, and a
function of the counts alone after it. Neither depends on the world size.
"""

from __future__ import annotations

import heapq
from functools import lru_cache

import numpy as np

from ..errors import SpecError
from .dataset_order import _rng


def weighted_streams(weights: np.ndarray, fingerprint: str, seed: int, streams: int) -> np.ndarray:
    """The stream of each shard: heaviest first (ties in :mod:`.locality`'s seeded shard
    permutation), each to the stream holding the least weight so far (ties: the lower
    stream), so the streams' totals differ by at most one shard's weight, and in practice
    (shards of similar sizes) by far less: the streams then end within a round or two, and
    few batches come from a stream outside a rank's own. Kept per (weights, fingerprint,
    seed, streams)."""
    if streams < 1:
        raise SpecError(f"streams must be >= 1, got {streams}")
    w = np.ascontiguousarray(weights, dtype=np.int64)
    return _weighted_cached(w.tobytes(), fingerprint, int(seed), int(streams)).copy()


@lru_cache(maxsize=8)
def _weighted_cached(raw: bytes, fingerprint: str, seed: int, streams: int) -> np.ndarray:
    w = np.frombuffer(raw, dtype=np.int64)
    perm = _rng(f"streams:{fingerprint}", seed, 0).permutation(len(w)).astype(np.int64)
    heaviest = perm[np.argsort(-w[perm], kind="stable")].tolist()
    loads = [(0, s) for s in range(streams)]
    out = np.empty(len(w), dtype=np.int64)
    weight = w.tolist()
    for shard in heaviest:
        load, s = heapq.heappop(loads)
        out[shard] = s
        heapq.heappush(loads, (load + weight[shard], s))
    return out


class StreamRounds:
    """Global batches dealt over streams of ``counts[s]`` batches by rounds (see the
    module's text): :meth:`locate` maps global batch numbers to (stream, batch in it).

    The rounds after the shortest stream ends come in segments between the streams'
    distinct counts, the same streams alive through each: O(streams^2) memory at most."""

    def __init__(self, counts: np.ndarray) -> None:
        self.counts = np.asarray(counts, dtype=np.int64)
        self.streams = len(self.counts)
        self.total = int(self.counts.sum())
        levels = np.unique(self.counts) if self.streams else np.zeros(1, np.int64)
        # segment i: rounds levels[i] .. levels[i+1] - 1, streams ``alive[i]`` in each
        self.levels = levels
        self.alive = [np.flatnonzero(self.counts > u) for u in levels[:-1].tolist()]
        sizes = np.array([len(a) for a in self.alive], dtype=np.int64)
        spans = np.diff(levels) * sizes
        self.head = int(levels[0]) * self.streams  # rounds with every stream alive
        self.starts = self.head + np.concatenate([[0], np.cumsum(spans)]).astype(np.int64)

    def locate(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(stream, batch within the stream) of each global batch in ``g`` (0 .. total-1)."""
        g = np.asarray(g, dtype=np.int64)
        stream = np.empty_like(g)
        k = np.empty_like(g)
        p = max(1, self.streams)
        head = g < self.head
        stream[head], k[head] = g[head] % p, g[head] // p
        tail = np.flatnonzero(~head)
        if len(tail):
            seg = np.searchsorted(self.starts, g[tail], side="right") - 1
            for i in np.unique(seg).tolist():
                at = tail[seg == i]
                off = g[at] - self.starts[i]
                alive = self.alive[i]
                stream[at] = alive[off % len(alive)]
                k[at] = self.levels[i] + off // len(alive)
        return stream, k
