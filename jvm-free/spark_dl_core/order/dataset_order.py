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

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from ..errors import SpecError

try:  # the same permutation computed in C (csrc/shuffle.c); numpy below is the definition
    from . import _shuffle
except ImportError:  # pragma: no cover - a build without the C extensions
    _shuffle = None  # type: ignore[assignment]

DEFAULT_WINDOW = 4
# Windows of fewer positions are kept two ahead on the window thread, two a job.
AHEAD_TWO_BELOW = 1 << 15
# Up to this many ranks, a rank reads enough of each window that computing the window's
# whole permutation once (O(window samples)) is cheaper than per-position evaluation.
DENSE_WORLD = 8
# Bumped whenever the same (fingerprint, seed, epoch, settings) would give another order;
# a saved state records it, and a state of another version is refused (its ``consumed``
# counts samples of an order this code no longer produces).
# 1: materialized permutation per window (spark-dl 0.1). 2: lazy Feistel window permutation.
# 3: shuffled orders drawn from fixed streams of shards (``order.locality``); its order with
# ``streams=1`` is version 2's, so a version 2 state resumes with ``streams=1``.
# 4: each stream shuffles windows of ``shuffle_window // streams`` pieces (at least 1), and
# ``streams=0`` (the default) is ``auto_streams`` of the dataset. A version 3 order with
# window ``w`` and ``P`` streams is version 4's with window ``w * P`` (the same windows per
# stream), so a version 3 state resumes exactly (``LoaderState.from_dict``).
# 5: mixtures and schedules are drawn from streams too (``order.mixture_streams``), and
# ``streams=0`` resolves for them from their sources; plain datasets' orders are version 4's,
# and a mixture's with ``streams=1`` is version 4's, so a version 4 state of a mixture
# resumes with ``streams=1`` and any other version 4 state as it is.
ORDER_VERSION = 5
_ROUNDS = 6
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_ROUND_KEYS = [np.uint64(((r + 1) * 0x9E3779B97F4A7C15) % (1 << 64)) for r in range(_ROUNDS)]


def _key(fingerprint: str, seed: int, epoch: int) -> bytes:
    return hashlib.sha256(f"spark-dl:{fingerprint}:{seed}:{epoch}".encode()).digest()


def _key_hasher(head: str) -> hashlib._Hash:
    """The hash state after ``_key``'s text up to ``head`` (a fingerprint's start): keys of
    fingerprints sharing it go on from a copy (``{rest}:{seed}:{epoch}``)."""
    return hashlib.sha256(f"spark-dl:{head}".encode())


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
    if _shuffle is not None and x.ndim == 1:
        out = np.empty(x.size, dtype=np.int64)
        each_n = np.ascontiguousarray(np.broadcast_to(n, x.shape))
        each_key = np.ascontiguousarray(np.broadcast_to(keys, x.shape))
        _shuffle.window_permute(x, each_n, each_key, out)
        return out
    return _window_permute_numpy(x, n, keys)


def _window_permute_numpy(x: np.ndarray, n: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """:func:`window_permute` in numpy: the definition the C extension reproduces."""
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
    if _shuffle is not None:
        out = np.empty(n, dtype=np.int64)
        _shuffle.permute_range(out, int(key))
        return out
    return _permute_range_numpy(n, key)


def _permute_span(start: int, count: int, n: int, key: np.uint64) -> np.ndarray:
    """``window_permute(arange(start, start + count), n, key)``: the positions of one span
    of a window (what a DataLoader worker, or one of many ranks, reads of it), computed as a
    whole range is (several times cheaper per position than per-position widths and keys)."""
    if _shuffle is not None:
        out = np.empty(count, dtype=np.int64)
        _shuffle.permute_span(out, int(start), int(n), int(key))
        return out
    if start == 0 and count == n:  # a whole window: scalar widths and key
        return _permute_range_numpy(n, key)
    positions = np.arange(start, start + count, dtype=np.uint64)
    each_n, each_key = np.full(count, n, np.uint64), np.full(count, key, np.uint64)
    return _window_permute_numpy(positions, each_n, each_key)


def _permute_range_numpy(n: int, key: np.uint64) -> np.ndarray:
    """:func:`_permute_range` in numpy (the definition; the C extension's fallback)."""
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
        """The ids at every position of window ``w``, in order (kept for the last windows
        asked): a dense reader's positions are then a slice or a gather of it. The next
        window's are computed meanwhile on a thread (the permutation releases the GIL), so
        a pass does not stop at each later window's start for O(window samples) of work."""
        ahead = self._own_ahead()
        if ahead is not None and w in ahead[0]:
            _wait_ahead(ahead[1])  # computed ahead: wait for it rather than compute it again
        ids = self.__dict__.setdefault("_dense", {}).get(w)
        if ids is None:
            ids = self._keep(w, self._compute_window(w))
        self._start_ahead(w + 1)
        if w == len(self.window_bounds) - 2:
            then = self.__dict__.pop("_then", None)
            if then is not None:
                then()
        self.__dict__["_last"] = (int(self.window_bounds[w]), int(self.window_bounds[w + 1]), ids)
        return ids

    def prepare(self) -> None:
        """Start computing the first window's ids on a thread: called while the order read
        before this one (the previous epoch, or schedule part) is in its last window, so
        this pass does not start with an O(window samples) stop."""
        if self.shuffle:
            self._start_ahead(0)

    def then(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once, when this order's last window is first read whole (not kept
        across pickling: a process that reads the order sets its own)."""
        self.__dict__["_then"] = fn

    def _compute_window(self, w: int) -> np.ndarray:
        """Window ``w``'s ids at every position: its whole range as one span."""
        return self._span_ids(int(self.window_bounds[w]), int(self.window_bounds[w + 1]))

    def _keep(self, w: int, ids: np.ndarray) -> np.ndarray:
        """Cache window ``w``'s ids, forgetting the oldest beyond three (the window read,
        the one before it for a batch across their boundary, the one computed ahead)."""
        cache = self.__dict__.setdefault("_dense", {})
        cache[w] = ids
        while len(cache) > 3 + self._small(w):  # small windows: two kept ahead
            cache.pop(next(iter(cache)))
        return ids

    def _small(self, w: int) -> bool:
        """Whether window ``w`` has fewer than :data:`AHEAD_TWO_BELOW` positions: then the
        thread keeps two windows ahead, computed two at a time (a streamed order's windows
        are one shard each, and a reader of a stream's runs reaches the next one soon)."""
        bounds = self.window_bounds
        return int(bounds[w + 1] - bounds[w]) < AHEAD_TWO_BELOW

    def _start_ahead(self, w: int) -> None:
        """Compute window ``w``'s ids on a thread, unless known, being computed, or past the
        last window (and only with the C permutation: numpy's holds the GIL)."""
        last = len(self.window_bounds) - 1
        if _shuffle is None or w >= last:
            return
        cache = self.__dict__.get("_dense", {})
        if w in cache:  # small windows: the one after it too
            if not self._small(w) or w + 1 >= last or w + 1 in cache:
                return
            w += 1
        ahead = self._own_ahead()
        if ahead is not None and (w in ahead[0] or not ahead[1].done()):
            return
        todo = (w, w + 1) if w + 1 < last and self._small(w) else (w,)

        def compute() -> None:
            for x in todo:
                self._keep(x, self._compute_window(x))

        self.__dict__["_ahead"] = (todo, _ahead_thread().submit(compute), os.getpid())

    def _own_ahead(self) -> tuple[tuple[int, ...], Future[Any], int] | None:
        """The window this process is computing ahead, if any. A forked DataLoader worker
        inherits its parent's (a job of a thread that does not exist there, which would
        never finish): it has none."""
        ahead = self.__dict__.get("_ahead")
        return ahead if ahead is not None and ahead[2] == os.getpid() else None

    def _window_members_ids(self, member: np.ndarray, first: int, last: int) -> np.ndarray:
        """:meth:`_ids_of` for positions ``member`` of permuted shards ``first..last-1``
        (one window): in place in one pass where the C extension is (each position moves by
        its shard's shift), else a search and three gathers of window-sized arrays."""
        bounds = self.permuted_offsets[first : last + 1]
        if _shuffle is not None and hasattr(_shuffle, "runs_to_ids"):
            _shuffle.runs_to_ids(member, bounds, self._shifts()[first:last])
            return member
        k = first - 1 + np.searchsorted(bounds, member, side="right")
        return self._ids_of(member, k)

    def _shifts(self) -> np.ndarray:
        """Per permuted shard, its first id less its first position: what
        :meth:`_window_members_ids` adds to a member (kept, O(shards); every span of a
        sparse reader used to compute its window's again)."""
        shifts = self.__dict__.get("_shift_of")
        if shifts is None:
            starts = self.offsets if self.bases is None else self.bases
            shifts = np.ascontiguousarray(starts[self.perm] - self.permuted_offsets[:-1])
            self.__dict__["_shift_of"] = shifts
        return shifts

    def _window_key(self, w: int) -> np.uint64:
        """Window ``w``'s permutation key (every window's computed once, kept: O(windows))."""
        keys = self.__dict__.get("_window_keys")
        if keys is None:
            keys = self._keys(np.arange(len(self.window_bounds) - 1)).tolist()
            self.__dict__["_window_keys"] = keys
        return np.uint64(keys[w])

    def _ids_of(self, member: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Ids of positions ``member`` of the permuted shards' concatenation, in shard ``k``."""
        shard = self.perm[k]
        starts = self.offsets if self.bases is None else self.bases
        return np.asarray(starts[shard] + (member - self.permuted_offsets[k]), np.int64)

    def _in_head(self, start: int, stop: int) -> bool:
        """Whether ``start..stop`` lies in the first 1/64 of a window whose whole order is not
        computed yet: those positions are evaluated one by one (the same ids), so a loader's
        first batches do not wait for an O(window samples) permutation (~0.1 s at 2M). Past
        its first 1/128 (after the first batches, whose shard loads need both cores) the
        window's whole order starts on the thread."""
        bounds = self.window_bounds
        w = int(np.searchsorted(bounds, start, side="right")) - 1
        lo, hi = int(bounds[w]), int(bounds[w + 1])
        if w in self.__dict__.get("_dense", {}) or stop - lo > (hi - lo) // 64:
            return False
        if start - lo >= (hi - lo) // 128:
            self._start_ahead(w)
        return True

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
        if not self.shuffle or stop <= start:
            return self.ids(np.arange(start, stop, dtype=np.int64), dense)
        if not dense:  # a reader of a part of each window: only its spans' positions
            return self._span_ids(start, stop)
        last = self.__dict__.get("_last")  # the window read last: most takes lie in it
        if last is not None and last[0] <= start and stop <= last[1]:
            return last[2][start - last[0] : stop - last[0]].copy()
        if self._in_head(start, stop):  # per position, before the window's whole order
            return self.ids(np.arange(start, stop, dtype=np.int64))
        # consecutive positions: slices of the windows' orders, no per-position lookup
        parts = [
            self._window_ids(w)[a - lo : b - lo] for w, lo, _, a, b in self._pieces(start, stop)
        ]
        return parts[0].copy() if len(parts) == 1 else np.concatenate(parts)

    def _pieces(self, start: int, stop: int) -> Iterator[tuple[int, int, int, int, int]]:
        """(window, its first and end positions, the piece's) of each window that positions
        ``start:stop`` meet, in order."""
        bounds = self.window_bounds
        w = int(np.searchsorted(bounds, start, side="right")) - 1
        while start < stop:
            lo, hi = int(bounds[w]), int(bounds[w + 1])
            end = min(stop, hi)
            if end > start:
                yield w, lo, hi, start, end
                start = end
            w += 1

    def _span_ids(self, start: int, stop: int) -> np.ndarray:
        """Ids at consecutive positions ``start:stop``, each window's piece permuted as a
        span (:func:`_permute_span`) and mapped to ids in one pass: O(stop - start), the
        same ids as :meth:`ids`, nothing kept."""
        parts = []
        for w, lo, hi, a, b in self._pieces(start, stop):
            member = _permute_span(a - lo, b - a, hi - lo, self._window_key(w))
            member += lo
            # the window's shards only: permuted_offsets[first..last] bound its members
            first = w * self.window
            last = min(first + self.window, len(self.perm))
            parts.append(self._window_members_ids(member, first, last))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_dense", None)  # a cache: each process computes its own windows
        state.pop("_last", None)
        state.pop("_ahead", None)
        state.pop("_then", None)
        state.pop("_shift_of", None)  # derived: each process computes its own
        state.pop("_window_keys", None)
        return state

    @property
    def nbytes(self) -> int:
        """Memory held by the order: O(shards), whatever the number of samples."""
        arrays = [self.offsets] if self.bases is None else [self.offsets, self.bases]
        if self.shuffle:
            arrays += [self.perm, self.permuted_offsets, self.window_bounds]
            arrays += [self.__dict__["_shift_of"]] if "_shift_of" in self.__dict__ else []
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


class Once:
    """``fn`` called at most once, however many orders (a mixture's streams) may call it."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn: Callable[[], None] | None = fn

    def __call__(self) -> None:
        fn, self.fn = self.fn, None
        if fn is not None:
            fn()


# The thread computing windows ahead, one per process for every order: a thread started
# per window cost ~4 ms each on a loaded 2-core machine (Thread.start waits until the new
# thread runs), which a streamed order with windows of one shard paid at every shard. Its
# work is joined at interpreter exit by concurrent.futures (each job is O(window) of C).
_AHEAD: tuple[int, ThreadPoolExecutor] | None = None
_AHEAD_LOCK = threading.Lock()


def _ahead_thread() -> ThreadPoolExecutor:
    """This process's window thread (a forked DataLoader worker makes its own: the
    parent's executor thread does not exist there)."""
    global _AHEAD
    with _AHEAD_LOCK:
        if _AHEAD is None or _AHEAD[0] != os.getpid():
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spark-dl-order-ahead")
            _AHEAD = (os.getpid(), pool)
        return _AHEAD[1]


def _lock_of_the_child() -> None:
    """A forked child's window-thread lock, new: the parent's may have been held at the
    fork by a thread the child does not have."""
    global _AHEAD_LOCK
    _AHEAD_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_lock_of_the_child)


def _wait_ahead(job: Future[Any]) -> None:
    """Wait for a window computed ahead; if it failed, the reader computes it again and
    meets the error there."""
    with contextlib.suppress(Exception):
        job.result()
