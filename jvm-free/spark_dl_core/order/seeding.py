"""Many keyed generators at once: each batch's ids shuffled by its own key's generator
(``_rng(name, seed, epoch)``), with the same swaps, without constructing one per batch.

A stratified order shuffles every batch with a generator keyed by the batch; constructing a
``PCG64`` (its ``SeedSequence`` hashing, the object) costs about as much as the shuffle it
then draws. Here the ``SeedSequence`` -> ``PCG64`` seeding runs in a few vector steps over
a block of keys (numpy's algorithm in uint32 arithmetic, PCG's seeding step in Python
integers), and one generator is re-pointed to each state in turn. The first use in a
process checks the result against numpy's own seeding; should a numpy release seed
differently, every batch takes a constructed generator instead (never another order).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .dataset_order import _key, _key_hasher, _rng

try:  # optional C extension (csrc/shuffle.c): every slice in one call
    from . import _shuffle
except ImportError:  # not built: numpy's shuffle per slice
    _shuffle = None  # type: ignore[assignment]

# numpy.random.SeedSequence's constants (bit_generator.pyx): pool of 4 words, 32-bit hashes
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = np.uint32(0xCA01F9DD), np.uint32(0x4973F715)
_POOL = 4
# PCG64's 128-bit LCG multiplier (pcg64.h, PCG_DEFAULT_MULTIPLIER_128)
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341
_M128 = (1 << 128) - 1
_checked: str | None = None  # None: not yet; then the path that matches numpy (_fast_path)


def _consts(init: int, mult: int, n: int) -> list[tuple[np.uint32, np.uint32]]:
    """The (xor, multiply) constants of a SeedSequence hash's first ``n`` uses."""
    out, h = [], init
    for _ in range(n):
        nxt = (h * mult) & 0xFFFFFFFF
        out.append((np.uint32(h), np.uint32(nxt)))
        h = nxt
    return out


_HASH_A = _consts(_INIT_A, _MULT_A, _POOL + _POOL * (_POOL - 1) + 4 * _POOL)
_HASH_B = _consts(_INIT_B, _MULT_B, 2 * _POOL)
_SHIFT = np.uint32(16)


def _hashmix(value: np.ndarray, k: tuple[np.uint32, np.uint32]) -> np.ndarray:
    value = (value ^ k[0]) * k[1]
    return value ^ (value >> _SHIFT)


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    result: np.ndarray = x * _MIX_L - y * _MIX_R
    return result ^ (result >> _SHIFT)


def seed_words(keys: Sequence[bytes]) -> np.ndarray:
    """``SeedSequence(np.frombuffer(key, np.uint32)).generate_state(4, np.uint64)`` for each
    32-byte key, as rows of a ``[len(keys), 4]`` uint64 array."""
    entropy = np.frombuffer(b"".join(keys), dtype="<u4").reshape(len(keys), -1)
    with np.errstate(over="ignore"):
        hashes = iter(_HASH_A)
        pool = [_hashmix(entropy[:, i], next(hashes)) for i in range(_POOL)]
        for src in range(_POOL):
            for dst in range(_POOL):
                if src != dst:
                    pool[dst] = _mix(pool[dst], _hashmix(pool[src], next(hashes)))
        for src in range(_POOL, entropy.shape[1]):
            for dst in range(_POOL):
                pool[dst] = _mix(pool[dst], _hashmix(entropy[:, src], next(hashes)))
        words = np.stack([_hashmix(pool[i % _POOL], _HASH_B[i]) for i in range(2 * _POOL)], 1)
    return np.ascontiguousarray(words, dtype="<u4").view("<u8")


def pcg64_state(words: Sequence[int]) -> tuple[int, int]:
    """``(state, inc)`` of a ``PCG64`` seeded from SeedSequence's four words (pcg64.h)."""
    w0, w1, w2, w3 = (int(w) for w in words)
    inc = ((((w2 << 64) | w3) << 1) | 1) & _M128
    return ((inc + ((w0 << 64) | w1)) * _PCG_MULT + inc) & _M128, inc


def _numpy_shuffles(ids: np.ndarray, sizes: Sequence[int], words: np.ndarray) -> None:
    """Each slice shuffled by numpy's Generator re-pointed to the slice's seeded state."""
    bits = np.random.PCG64(0)
    gen = np.random.Generator(bits)
    at = 0
    for row, n in zip(words.tolist(), sizes):
        s, inc = pcg64_state(row)
        bits.state = {
            "bit_generator": "PCG64",
            "state": {"state": s, "inc": inc},
            "has_uint32": 0,
            "uinteger": 0,
        }
        gen.shuffle(ids[at : at + n])
        at += n


def _fast_path(key: bytes) -> str:
    """Which path gives numpy's own shuffles in this process: ``"c"`` (the extension),
    ``"numpy"`` (vector seeding, numpy's shuffle) or ``"each"`` (a generator per slice);
    checked once, on the first key, against a generator numpy seeds itself."""
    global _checked
    if _checked is None:  # found in a local, then published whole: threads may ask too
        real = np.random.PCG64(np.frombuffer(key, dtype=np.uint32))
        words = seed_words([key])
        state = real.state["state"]
        found = "each"
        if pcg64_state(words[0].tolist()) == (state["state"], state["inc"]):
            found = "numpy"
            want = np.arange(1000, dtype=np.int64)
            np.random.Generator(real).shuffle(want)
            got = np.arange(1000, dtype=np.int64)
            if _shuffle is not None:
                _shuffle.shuffle_slices(got, np.array([1000], dtype=np.int64), words)
                if np.array_equal(got, want):
                    found = "c"
        _checked = found
    return _checked


class BatchShuffles:
    """The per-batch shuffles of one order: batch ``b``'s ids shuffled in place exactly as
    ``_rng(f"{prefix}{b}", seed, epoch).shuffle`` would. The seeding of ``BLOCK``
    consecutive batches is computed at once and kept for the last few blocks (a reader asks
    for a few batches at a time); a request for fewer than ``FEW`` batches (a rank of many
    reading its own) constructs each generator instead."""

    BLOCK = 1024  # seed_words costs the same for 256 keys or 1024 (numpy's per-call cost)
    FEW = 8

    def __init__(self, prefix: str, seed: int, epoch: int) -> None:
        self.prefix, self.seed, self.epoch = prefix, seed, epoch
        self._blocks: dict[int, np.ndarray] = {}

    def _words(self, first: int, stop: int) -> np.ndarray:
        out = []
        for block in range(first // self.BLOCK, (stop - 1) // self.BLOCK + 1):
            words = self._blocks.get(block)
            if words is None:
                at = block * self.BLOCK
                words = seed_words(self._keys(at, at + self.BLOCK))
                while len(self._blocks) >= 4:
                    self._blocks.pop(next(iter(self._blocks)))
                self._blocks[block] = words
            lo = max(first - block * self.BLOCK, 0)
            out.append(words[lo : stop - block * self.BLOCK])
        return np.concatenate(out) if len(out) > 1 else out[0]

    def _key(self, b: int) -> bytes:
        return _key(f"{self.prefix}{b}", self.seed, self.epoch)

    def _keys(self, first: int, stop: int) -> list[bytes]:
        """``[self._key(b) for b in range(first, stop)]``, hashing the shared prefix once."""
        head = _key_hasher(self.prefix)
        tail = f":{self.seed}:{self.epoch}"
        out = []
        for b in range(first, stop):
            h = head.copy()
            h.update(f"{b}{tail}".encode())
            out.append(h.digest())
        return out

    def interleaved(
        self, parts: Sequence[np.ndarray], lengths: np.ndarray, first: int
    ) -> np.ndarray | None:
        """Batches ``first, first + 1, ...`` built and shuffled in one C pass: batch ``b``
        takes ``lengths[b, s]`` items from each of ``parts[s]`` in turn (the next ones),
        then is shuffled as :meth:`shuffle` would. None where the extension is not built
        or does not match numpy here (the caller then builds and shuffles them itself)."""
        count = len(lengths)
        if _shuffle is None or count < self.FEW or _fast_path(self._key(first)) != "c":
            return None
        ids = np.empty(int(lengths.sum()), dtype=np.int64)
        words = self._words(first, first + count)
        parts = [np.ascontiguousarray(p, dtype=np.int64) for p in parts]
        _shuffle.interleave_shuffle(ids, parts, np.ascontiguousarray(lengths), words)
        return ids

    def shuffle(self, ids: np.ndarray, first: int, sizes: Sequence[int]) -> None:
        """Shuffle ``ids``' consecutive slices of ``sizes``, batches ``first``, ``first + 1``,
        ... in turn."""
        path = _fast_path(self._key(first)) if len(sizes) >= self.FEW else "each"
        if path == "each":
            at = 0
            for b, n in enumerate(sizes, start=first):
                _rng(f"{self.prefix}{b}", self.seed, self.epoch).shuffle(ids[at : at + n])
                at += n
            return
        words = self._words(first, first + len(sizes))
        if path == "c" and _shuffle is not None and ids.flags.c_contiguous:
            _shuffle.shuffle_slices(ids, np.asarray(sizes, dtype=np.int64), words)
        else:
            _numpy_shuffles(ids, sizes, words)
