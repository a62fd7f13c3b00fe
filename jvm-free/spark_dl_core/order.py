"""The order of samples in an epoch, each rank's and worker's share of it, and resume state.

Three rules make runs reproducible and elastic:

1. The *global order* of an epoch is a pure function of (dataset fingerprint, seed, epoch,
   shuffle, shuffle window); it never looks at world size or worker count.
2. The remaining order (after ``consumed`` samples) is cut into *global batches* of
   ``batch_size``; global batch ``g`` goes to rank ``g % world_size``. Within a rank, its
   ``j``-th batch goes to DataLoader worker ``j % num_workers``, which is exactly the order
   in which ``torch.utils.data.DataLoader`` hands worker outputs back, so a rank's batch
   sequence does not depend on the number of workers either.
3. Resume state is "how many samples of the global order are consumed". Data-parallel
   training steps all ranks together, so after ``k`` steps on each of ``W`` ranks the first
   ``k * W`` global batches are consumed, whatever ``W`` was; a restart at any other world
   size deals the rest afresh: none seen twice, none lost.

Shuffling is two-level (as in Mosaic Streaming's block shuffles): shards are permuted, then
samples are permuted within *windows* of ``shuffle_window`` consecutive shards of that
permutation. A reader only ever needs the shards of one window (plus prefetch) in memory:
memory ~ ``shuffle_window x shard size`` per reader, while shuffle quality grows with the
window (:func:`shuffle_quality` measures it).

Nothing here is ever as large as the dataset (contract 6): the order is *lazy*. What is
materialized is O(shards): the shard permutation and the cumulative sample counts in
permuted order. The permutation of a window's samples is a keyed bijection of its range
(a Feistel network with cycle walking, :func:`window_permute`), evaluated only for the
positions asked for, so position ``p`` of the epoch maps to a global sample id in
O(log shards) without touching the positions before it. Batch ``k`` of a rank is therefore
computed on demand (:class:`EpochPlan` is a lazy sequence), and resuming after ``consumed``
samples is O(1) in ``consumed``.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

import numpy as np

from .errors import PackError, SpecError

if TYPE_CHECKING:
    from .sources.dataset import Dataset

DEFAULT_WINDOW = 4
# Up to this many ranks, a rank reads enough of each window that computing the window's
# whole permutation once (O(window samples)) is cheaper than per-position evaluation.
DENSE_WORLD = 8
# Bumped whenever the same (fingerprint, seed, epoch, settings) would give another order;
# a saved state records it, and a state of another version is refused (its ``consumed``
# counts samples of an order this code no longer produces).
# 1: materialized permutation per window (spark-dl 0.1). 2: lazy Feistel window permutation.
ORDER_VERSION = 2
_ROUNDS = 6
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_ROUND_KEYS = [np.uint64(((r + 1) * 0x9E3779B97F4A7C15) % (1 << 64)) for r in range(_ROUNDS)]


def _key(fingerprint: str, seed: int, epoch: int) -> bytes:
    return hashlib.sha256(f"spark-dl:{fingerprint}:{seed}:{epoch}".encode()).digest()


def _rng(fingerprint: str, seed: int, epoch: int) -> np.random.Generator:
    key = _key(fingerprint, seed, epoch)
    return np.random.Generator(np.random.PCG64(np.frombuffer(key, dtype=np.uint32)))


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a fast, well-spread 64-bit hash (wrapping uint64 arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def window_permute(positions: np.ndarray, sizes: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Element-wise keyed bijection of ``range(sizes[i])`` applied to ``positions[i]``.

    A balanced Feistel network over the smallest even number of bits covering the range,
    with cycle walking (re-applying while the value falls outside the range), so it is a
    permutation of exactly ``0..size-1`` for each key. Vectorized: every element may have
    its own range and key (the positions of one batch can span several windows).
    """
    x = np.asarray(positions, dtype=np.uint64).copy()
    n = np.asarray(sizes, dtype=np.uint64)
    keys = np.asarray(keys, dtype=np.uint64)
    if x.size == 0:
        return x.astype(np.int64)
    bits = np.ceil(np.log2(np.maximum(n, 2).astype(np.float64))).astype(np.int64)
    # float log2 may round near powers of two: fix up so that 2**bits >= n exactly.
    bits += (np.left_shift(np.uint64(1), bits.astype(np.uint64)) < n).astype(np.int64)
    half = np.maximum(1, (bits + 1) // 2).astype(np.uint64)
    mask = (np.uint64(1) << half) - np.uint64(1)
    todo = np.arange(x.size)
    while todo.size:
        v, h, m, k = x[todo], half[todo], mask[todo], keys[todo]
        left, right = v >> h, v & m
        for round_key in _ROUND_KEYS:
            f = _mix(right ^ k ^ round_key) & m
            left, right = right, left ^ f
        v = (left << h) | right
        x[todo] = v
        todo = todo[v >= n[todo]]
    return x.astype(np.int64)


def _permute_range(n: int, key: np.uint64) -> np.ndarray:
    """``window_permute(arange(n), n, key)`` for a whole range with one key: the same
    bijection with scalar widths and key (several times fewer array operations)."""
    bits = max(1, (n - 1).bit_length())
    half = np.uint64(max(1, (bits + 1) // 2))
    mask = (np.uint64(1) << half) - np.uint64(1)
    size = np.uint64(n)
    x = np.arange(n, dtype=np.uint64)
    todo: np.ndarray | None = None  # None: every element
    while True:
        v = x if todo is None else x[todo]
        left, right = v >> half, v & mask
        for round_key in _ROUND_KEYS:
            f = _mix(right ^ (key ^ round_key)) & mask
            left, right = right, left ^ f
        v = (left << half) | right
        if todo is None:
            x = v
            todo = np.flatnonzero(v >= size)
        else:
            x[todo] = v
            todo = todo[v >= size]
        if not todo.size:
            return x.astype(np.int64)


class GlobalOrder:
    """The lazy global order of one epoch: position ``p`` → global sample id.

    Holds O(shards) arrays: the shard permutation and the permuted shards' cumulative
    sample counts (window boundaries are every ``window``-th entry of it).
    """

    def __init__(
        self,
        shard_sizes: np.ndarray,
        fingerprint: str,
        seed: int,
        epoch: int,
        shuffle: bool,
        window: int = DEFAULT_WINDOW,
        *,
        bases: np.ndarray | None = None,
    ) -> None:
        sizes = np.asarray(shard_sizes, dtype=np.int64)
        self.shuffle = bool(shuffle)
        self.offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=self.offsets[1:])
        self.total = int(self.offsets[-1])
        # Where each block's samples start in the id space (None: blocks are the shards of
        # one dataset, back to back). Mixtures order blocks that are pieces of shards of
        # several datasets (see :class:`MixtureOrder`).
        self.bases = None if bases is None else np.asarray(bases, dtype=np.int64)
        if not self.shuffle:
            return
        if window < 1:
            raise SpecError(f"shuffle_window must be >= 1 shard, got {window}")
        self.window = int(window)
        rng = _rng(fingerprint, seed, epoch)
        self.perm = rng.permutation(len(sizes)).astype(np.int64)
        self.permuted_offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes[self.perm], out=self.permuted_offsets[1:])
        cuts = np.append(np.arange(0, len(sizes), self.window), len(sizes))
        self.window_bounds = self.permuted_offsets[cuts]
        window_key = hashlib.sha256(b"window:" + _key(fingerprint, seed, epoch)).digest()
        self.base_key = np.frombuffer(window_key[:8], dtype="<u8")[0]

    def __len__(self) -> int:
        return self.total

    def _keys(self, w: np.ndarray) -> np.ndarray:
        return _mix(np.uint64(self.base_key) ^ (w.astype(np.uint64) * _GOLDEN + _GOLDEN))

    def _window_ids(self, w: int) -> np.ndarray:
        """The ids at every position of window ``w``, in order (kept for the last two windows
        asked): a dense reader's positions are then a slice or a gather of it."""
        cache = self.__dict__.setdefault("_dense", {})
        ids = cache.get(w)
        if ids is None:
            start, stop = int(self.window_bounds[w]), int(self.window_bounds[w + 1])
            member = start + _permute_range(stop - start, self._keys(np.array([w]))[0])
            # the window's shards only: permuted_offsets[first..last] bound its members
            first = w * self.window
            last = min(first + self.window, len(self.perm))
            k = (
                first
                - 1
                + np.searchsorted(self.permuted_offsets[first : last + 1], member, side="right")
            )
            ids = self._ids_of(member, k)
            while len(cache) >= 2:
                cache.pop(next(iter(cache)))
            cache[w] = ids
        return ids

    def _ids_of(self, member: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Ids of positions ``member`` of the permuted shards' concatenation, in shard ``k``."""
        shard = self.perm[k]
        starts = self.offsets if self.bases is None else self.bases
        return np.asarray(starts[shard] + (member - self.permuted_offsets[k]), np.int64)

    def ids(self, positions: np.ndarray, dense: bool = False) -> np.ndarray:
        """Global sample ids at ``positions`` (each in ``0..len-1``) of this epoch's order.

        ``dense``: the caller reads most of each window (one rank, or a few), so computing
        and keeping a window's whole order (O(window samples)) beats evaluating the
        bijection per position; sparse readers (many ranks) evaluate only their positions.
        """
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size == 0 or (not self.shuffle and self.bases is None):
            return pos.copy()
        if not self.shuffle:
            assert self.bases is not None
            block = np.searchsorted(self.offsets, pos, side="right") - 1
            return np.asarray(self.bases[block] + (pos - self.offsets[block]), np.int64)
        bounds = self.window_bounds
        w = np.searchsorted(bounds, pos, side="right") - 1
        start = bounds[w]
        if dense:
            out = np.empty_like(pos)
            for window in np.unique(w).tolist():
                here = w == window
                out[here] = self._window_ids(window)[pos[here] - start[here]]
            return out
        size = bounds[w + 1] - start
        member = start + window_permute(pos - start, size, self._keys(w))
        return self._ids_of(member, np.searchsorted(self.permuted_offsets, member, "right") - 1)

    def take(self, start: int, stop: int, dense: bool = False) -> np.ndarray:
        if not (dense and self.shuffle) or stop <= start:
            return self.ids(np.arange(start, stop, dtype=np.int64), dense)
        # consecutive positions: slices of the windows' orders, no per-position lookup
        bounds = self.window_bounds
        w = int(np.searchsorted(bounds, start, side="right")) - 1
        parts = []
        while start < stop:
            lo, hi = int(bounds[w]), int(bounds[w + 1])
            end = min(stop, hi)
            if end > start:
                parts.append(self._window_ids(w)[start - lo : end - lo])
                start = end
            w += 1
        return parts[0].copy() if len(parts) == 1 else np.concatenate(parts)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_dense", None)  # a cache: each process computes its own windows
        return state

    @property
    def nbytes(self) -> int:
        """Memory held by the order: O(shards), whatever the number of samples."""
        arrays = [self.offsets] if self.bases is None else [self.offsets, self.bases]
        if self.shuffle:
            arrays += [self.perm, self.permuted_offsets, self.window_bounds]
        return sum(a.nbytes for a in arrays)


class _Materialized:
    """An explicit order array behind :class:`GlobalOrder`'s interface (tests, references)."""

    def __init__(self, order: np.ndarray) -> None:
        self.order = np.asarray(order, dtype=np.int64)
        self.total = len(self.order)

    def take(self, start: int, stop: int, dense: bool = False) -> np.ndarray:
        return self.order[start:stop]


class _Order(Protocol):
    total: int

    def take(self, start: int, stop: int, dense: bool = False) -> np.ndarray: ...


_ORDERS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], _Order]] = weakref.WeakKeyDictionary()


def _order_of(
    dataset: Dataset, seed: int, epoch: int, shuffle: bool, window: int, batch_size: int = 0
) -> _Order:
    """The dataset's global order for these settings; the last two are kept per dataset, so
    a loader and its resumed or re-planned passes share one O(shards) order. A mixture
    (anything with ``make_order``) makes its own, which may depend on the batch size."""
    make = getattr(dataset, "make_order", None)
    if make is None or not getattr(dataset, "order_uses_batch_size", False):
        batch_size = 0
    key = (dataset.fingerprint, int(seed), int(epoch), bool(shuffle), int(window), batch_size)
    kept = _ORDERS.setdefault(dataset, {})
    order = kept.get(key)
    if order is None:
        if make is not None:
            order = make(int(seed), int(epoch), bool(shuffle), int(window), batch_size)
        else:
            order = GlobalOrder(
                np.diff(dataset.shard_offsets), dataset.fingerprint, seed, epoch, shuffle, window
            )
        while len(kept) >= 2:
            kept.pop(next(iter(kept)))
        kept[key] = order
    return order


# --------------------------------------------------------------------------- mixtures

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


def source_pieces(
    sizes: np.ndarray, base: int, count: int, epoch: int, fingerprint: str, seed: int, shuffle: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The pieces of shards one source gives to ``epoch`` of a mixture: (sizes, first ids).

    A source is read as an endless *stream* of passes; each pass is every shard once, in a
    permutation keyed by (source fingerprint, seed, pass) when shuffling. Epoch ``e`` takes
    stream positions ``[e * count, (e + 1) * count)``, so no sample is drawn again before
    every sample of the source has been drawn (a subset per epoch walks on through the
    pass), and with ``count`` = r x the source's size each sample appears floor(r) or ceil(r)
    times in an epoch. Cost: O(shards x passes the epoch touches).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    n = int(sizes.sum())
    if count <= 0 or n == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    start, stop = epoch * count, (epoch + 1) * count
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
        out_bases.append((base + offsets[perm[ranks]] + (lo - cum[ranks]))[keep])
    return np.concatenate(out_sizes), np.concatenate(out_bases)


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
    ) -> None:
        if plan.batching not in BATCHING:
            raise SpecError(f"batching={plan.batching!r}: must be one of {BATCHING}")
        self.plan, self.seed, self.epoch, self.shuffle = plan, seed, epoch, shuffle
        self.counts = [int(c) for c in plan.counts]
        self.total = int(sum(self.counts))
        self.batch_size = int(batch_size)
        pieces = [
            source_pieces(sizes, base, count, epoch, fp, seed, shuffle)
            for sizes, base, count, fp in zip(
                plan.shard_sizes, plan.bases, self.counts, plan.source_fingerprints
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
        self.full = [c // self.batch_size for c in self.counts]  # per_source: whole batches
        self._key = _key(plan.fingerprint, seed, epoch)
        self._dense = len(self.counts) <= DENSE_WORLD
        self._merged: dict[int, list[int]] = {}

    @property
    def nbytes(self) -> int:
        if self.plan.batching == "random":
            return self.mixed.nbytes
        return sum(s.nbytes for s in self.streams)

    def take(self, start: int, stop: int, dense: bool = False) -> np.ndarray:
        if self.plan.batching == "random":
            return self.mixed.take(start, stop, dense)
        if stop <= start:
            return np.empty(0, dtype=np.int64)
        size = self.batch_size
        if self.plan.batching == "stratified":
            first = start // size
            ids = self._stratified(first, (stop - 1) // size + 1)
            return ids[start - first * size : stop - first * size]
        parts = []
        for b in range(start // size, (stop - 1) // size + 1):
            chunk = self._batch(b)
            parts.append(chunk[max(start - b * size, 0) : min(stop - b * size, len(chunk))])
        return np.concatenate(parts)

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

    def _stratified(self, first: int, stop: int) -> np.ndarray:
        """The ids of stratified batches ``first..stop-1``, back to back, in their order.

        One merge of every boundary (:func:`merged_counts_at`) and one lookup per source
        stream for the whole range; each batch's part of a stream is then a slice of it.
        The same ids in the same order as taking batch by batch (a test holds the two equal).
        """
        size, n_src = self.batch_size, len(self.counts)
        bounds = np.minimum(np.arange(first, stop + 1, dtype=np.int64) * size, self.total)
        got = merged_counts_at(self.counts, bounds)  # [batches + 1, sources]
        lo, hi = got[0], got[-1]
        parts = [
            self.streams[s].take(int(lo[s]), int(hi[s]), self._dense)
            if hi[s] > lo[s]
            else np.empty(0, np.int64)
            for s in range(n_src)
        ]
        streams = np.concatenate(parts).astype(np.int64, copy=False)
        stream_at = np.zeros(n_src + 1, dtype=np.int64)
        np.cumsum(hi - lo, out=stream_at[1:])
        # block (batch, source): that source's items in that batch, blocks batch-major
        lengths = np.diff(got, axis=0).reshape(-1)
        block_from = (stream_at[:-1] + got[:-1] - lo).reshape(-1)
        block_to = np.cumsum(lengths) - lengths
        where = np.repeat(block_from - block_to, lengths) + np.arange(int(lengths.sum()))
        ids = streams[where]
        per_batch = np.diff(bounds)
        if self.shuffle:
            at, fingerprint = 0, self.plan.fingerprint
            for b, n in enumerate(per_batch.tolist(), start=first):
                # in place: the same swaps as indexing by ``permutation(n)`` of this generator
                _rng(f"batch:{fingerprint}:{b}", self.seed, self.epoch).shuffle(ids[at : at + n])
                at += n
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
        size = self.batch_size
        x0, x1 = b * size, min((b + 1) * size, self.total)
        whole = sum(self.full)
        if b < whole:  # a whole batch of one source: which one is the merge's b-th
            before, after = self._counts_at(self.full, b), self._counts_at(self.full, b + 1)
            s = next(i for i, (u, v) in enumerate(zip(before, after)) if v > u)
            k = before[s]
            return self.streams[s].take(k * size, (k + 1) * size, self._dense)
        # the sources' remainders, back to back, cut at this batch's bounds
        tails = np.cumsum([0] + [c - f * size for c, f in zip(self.counts, self.full)])
        lo_t, hi_t = x0 - whole * size, x1 - whole * size
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


def global_order(
    shard_sizes: np.ndarray,
    fingerprint: str,
    seed: int,
    epoch: int,
    shuffle: bool,
    window: int = DEFAULT_WINDOW,
) -> np.ndarray:
    """Every sample index once, materialized: for small datasets, tests and quality figures.

    Loaders never call this; they ask :class:`GlobalOrder` for the positions they need.
    """
    order = GlobalOrder(shard_sizes, fingerprint, seed, epoch, shuffle, window)
    return order.take(0, order.total)


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
    # Packed loaders: {"settings": pack settings, "rows": global rows consumed, "version"}
    # (see spark_dl_core.loaders.packing); ``consumed`` is then 0.
    pack: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.pack is None:
            del out["pack"]
        return out

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> LoaderState:
        if not isinstance(state, dict):
            raise SpecError(f"loader state must be a dict, got {type(state).__name__}")
        missing = {f for f in cls.__dataclass_fields__ if f not in ("version", "pack")} - set(state)
        if missing:
            raise SpecError(f"loader state lacks {sorted(missing)}; was it made by spark-dl?")
        version = state.get("version", 1)
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

    def check(self, dataset: Dataset, **settings: Any) -> None:
        """Raise if this state belongs to another dataset or other order settings. A packed
        position is refused unless ``pack`` (the loader's pack settings) is given."""
        if self.pack is not None and settings.pop("pack", None) is None:
            raise PackError(
                "loader state is a position in packed rows (saved with pack=); pass the same "
                "pack= to resume it",
                field="pack",
            )
        settings.pop("pack", None)
        if self.fingerprint != dataset.fingerprint:
            raise SpecError(
                f"loader state is for dataset {self.fingerprint[:16]}…, but {dataset.path} has "
                f"fingerprint {dataset.fingerprint[:16]}…: resuming would mix up samples"
            )
        for name, value in settings.items():
            if name == "batch_size" and not getattr(dataset, "order_uses_batch_size", False):
                continue  # positions count samples: the batch size may change on resume
            if getattr(self, name) != value:
                raise SpecError(
                    f"loader state was saved with {name}={getattr(self, name)!r}, the loader "
                    f"has {name}={value!r}; pass the same value to resume exactly"
                )
        if not 0 <= self.consumed <= len(dataset):
            raise SpecError(f"loader state consumed={self.consumed} is outside 0..{len(dataset)}")


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
        dataset: Dataset,
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
    ) -> EpochPlan:
        order = _order_of(
            dataset, seed, epoch, shuffle, resolve_window(shuffle_window), int(batch_size)
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
        total, dense = self.order.total, self.world_size <= DENSE_WORLD
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


# --------------------------------------------------------------------------- quality


def shuffle_quality(order: np.ndarray, shard_sizes: np.ndarray | None = None) -> dict[str, float]:
    """How well ``order`` (a permutation of 0..n-1) hides the source order.

    - ``position_correlation``: Pearson correlation of output position and source index
      (1.0 unshuffled, ~0 for a uniform shuffle).
    - ``adjacent_neighbours``: fraction of consecutive outputs that were source neighbours
      (|a - b| == 1): 1.0 unshuffled, ~2/n for a uniform shuffle.
    - ``mean_step``: mean |source distance| of consecutive outputs over n / 3 (its value
      for a uniform shuffle), so 1.0 means "as spread as uniform".
    - ``same_shard_adjacent`` (with ``shard_sizes``): fraction of consecutive outputs from
      the same shard: ~1/window for a windowed shuffle, ~1/num_shards for a uniform one.
      This is the figure the window trades against memory.
    """
    order = np.asarray(order, dtype=np.int64)
    n = len(order)
    if n < 3:
        return {"position_correlation": 1.0, "adjacent_neighbours": 1.0, "mean_step": 0.0}
    position = np.arange(n, dtype=np.float64)
    corr = float(np.corrcoef(position, order.astype(np.float64))[0, 1])
    steps = np.abs(np.diff(order))
    out = {
        "position_correlation": corr,
        "adjacent_neighbours": float(np.mean(steps == 1)),
        "mean_step": float(steps.mean() / (n / 3)),
    }
    if shard_sizes is not None:
        offsets = np.concatenate([[0], np.cumsum(shard_sizes)])
        shard = np.searchsorted(offsets, order, side="right") - 1
        out["same_shard_adjacent"] = float(np.mean(shard[1:] == shard[:-1]))
    return out
