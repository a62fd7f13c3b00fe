"""Schedule boundaries in tokens, placed at documents for a packed loader.

A stage starting at ``T`` tokens starts at the sample position ``S`` where the documents the
run delivered before ``S`` (across epochs, the earlier stages cut at their own placed
positions and the stage before cut at ``S``) first hold at least ``T`` real tokens of the
pack column. So the document holding token ``T - 1`` (or ending exactly at ``T``) is the
previous stage's last, and the stage starts with the next document, whose first token is
at or after ``T``; the packed row that holds both is shared by the two stages.

Which documents lie before ``S`` is each source's stream (its passes, keyed by its
fingerprint and the seed) up to the counts the schedule gives it, never the shuffle inside
a part: so ``S`` is a pure function of (sources' fingerprints, schedule, seed, shuffle,
column), the same for every world size, worker count and batch size. Placing reads each
source's document lengths once per shard (sample headers: sizes only), holds O(shards)
integers per pass touched, and bisects over ``S`` (O(log S) evaluations, each
O(sources x log shards)).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..errors import MixtureError, PackError
from ..order import range_counts
from ..order.dataset_order import _rng

if TYPE_CHECKING:
    from .dataset import Dataset


class Staged(Protocol):
    """What placing token boundaries reads of a mixture (a
    :class:`~..mixture.dataset.Mixture`, which imports this module: it is named here by what
    it offers)."""

    stages: list[tuple[int, Any]] | None
    mixture: Any  # its MixtureSpec: epoch_size and the Source specs (fingerprints)
    sources: list[Any]  # the opened sources, in the spec's order


_LIMIT = 1 << 62  # run positions stay int64


def _doc_lengths(ds: Dataset, shard: int, column: str, verify: bool | None) -> np.ndarray:
    """Tokens of each document of one shard, in stored order (from its sample headers)."""
    data = ds.load_shard(shard, verify)
    if data.count == 0:
        return np.empty(0, dtype=np.int64)
    index = ds.layout.names.index(column)
    starts, sizes = data.positions(np.arange(data.count, dtype=np.int64))
    spans = getattr(ds.encoding(column), "value_spans", None)
    got = spans(data.raw, starts[:, index], sizes[:, index], column) if spans else None
    if got is None or got[2].kind not in "iu":
        raise PackError(
            f"pack column {column!r} in shard {data.file!r} does not hold 1-D integer arrays "
            "of one dtype: schedule boundaries in tokens need token documents",
            field="column",
        )
    return (got[1] // got[2].itemsize).astype(np.int64)


class SourceTokens:
    """Tokens in a source's stream positions ``[0, q)`` (the stream of
    :func:`~spark_dl_core.order.mixture_order.source_pieces`: passes of its shards, each
    pass's shard order keyed by (fingerprint, seed, pass) when shuffling)."""

    def __init__(
        self, ds: Dataset, column: str, fingerprint: str, seed: int, shuffle: bool, verify: Any
    ) -> None:
        self.ds, self.column, self.verify = ds, column, verify
        self.fingerprint, self.seed, self.shuffle = fingerprint, seed, shuffle
        self.sizes = np.diff(np.asarray(ds.shard_offsets, dtype=np.int64))
        self.samples = int(self.sizes.sum())
        self._totals: np.ndarray | None = None
        self._prefix: dict[int, np.ndarray] = {}
        self._passes: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    @property
    def totals(self) -> np.ndarray:
        """Tokens per shard (each shard's headers read once)."""
        if self._totals is None:
            self._totals = np.array(
                [int(self._lengths(s).sum()) for s in range(len(self.sizes))], dtype=np.int64
            )
        return self._totals

    def _lengths(self, shard: int) -> np.ndarray:
        return _doc_lengths(self.ds, shard, self.column, self.verify)

    def _shard_prefix(self, shard: int) -> np.ndarray:
        """Tokens of the shard's first ``i`` documents, for every ``i`` (a few kept)."""
        found = self._prefix.get(shard)
        if found is None:
            found = np.concatenate([[0], np.cumsum(self._lengths(shard))]).astype(np.int64)
            if len(self._prefix) > 8:
                self._prefix.pop(next(iter(self._prefix)))
            self._prefix[shard] = found
        return found

    def _pass(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Pass ``k``: shard order, samples and tokens before each shard of it."""
        found = self._passes.get(k)
        if found is None:
            n = len(self.sizes)
            if self.shuffle:
                perm = _rng(f"stream:{self.fingerprint}", self.seed, k).permutation(n)
            else:
                perm = np.arange(n)
            perm = perm.astype(np.int64)
            cum = np.concatenate([[0], np.cumsum(self.sizes[perm])]).astype(np.int64)
            tok = np.concatenate([[0], np.cumsum(self.totals[perm])]).astype(np.int64)
            if len(self._passes) > 8:
                self._passes.pop(next(iter(self._passes)))
            found = self._passes[k] = (perm, cum, tok)
        return found

    def upto(self, q: int) -> int:
        """Tokens of stream positions ``[0, q)``."""
        if q <= 0 or self.samples == 0:
            return 0
        k, r = divmod(int(q), self.samples)
        tokens = k * int(self.totals.sum())
        if r:
            perm, cum, tok = self._pass(k)
            i = int(np.searchsorted(cum, r, side="right")) - 1
            tokens += int(tok[i])
            if r > cum[i]:
                tokens += int(self._shard_prefix(int(perm[i]))[r - int(cum[i])])
        return tokens


def place_token_stages(
    m: Staged, column: str, seed: int, shuffle: bool, verify: bool | None = None
) -> list[int]:
    """Each stage's start as a sample position (module docstring), stage by stage.

    Refused with a :class:`MixtureError` naming the stage and field ``start``: a boundary
    the stage before cannot reach (its sources hold no tokens, or it lies past int64 run
    positions), or one the run already passed when the stage before starts (that stage
    would be empty)."""
    stages = m.stages or []
    size = int(m.mixture.epoch_size or 0)
    streams = [
        SourceTokens(d, column, str(s.fingerprint), seed, shuffle, verify)
        for d, s in zip(m.sources, m.mixture.sources)
    ]
    starts = [0]
    base = [0] * len(streams)  # stream positions where the previous stage starts
    for k in range(1, len(stages)):
        goal, (begin, weights) = int(stages[k][0]), (starts[-1], stages[k - 1][1])

        def delivered(
            at: int, base: list[int] = base, weights: Any = weights, begin: int = begin
        ) -> int:
            got = range_counts(weights, begin, at, size)
            return sum(t.upto(b + c) for t, b, c in zip(streams, base, got))

        where = f"schedule stage {k} (start={goal} tokens)"
        if delivered(begin) >= goal:
            raise MixtureError(
                f"{where}: the run has delivered {delivered(begin)} tokens when stage "
                f"{k - 1} starts (field start): stage {k - 1} would be empty"
            )
        if not any(w and t.samples and t.totals.sum() for w, t in zip(weights, streams)):
            raise MixtureError(
                f"{where}: stage {k - 1}'s sources hold no tokens of {column!r}, so the run "
                "never reaches this boundary (field start)"
            )
        starts.append(_first_reaching(delivered, begin, goal, where))
        got = range_counts(weights, begin, starts[-1], size)
        base = [b + c for b, c in zip(base, got)]
    return starts


def _first_reaching(delivered: Any, lo: int, goal: int, where: str) -> int:
    """The first position past ``lo`` whose ``delivered`` tokens reach ``goal`` (bisection
    after a doubling search; ``delivered(lo) < goal``)."""
    step = 1
    hi = lo + step
    while delivered(hi) < goal:
        lo, step = hi, step * 2
        hi = lo + step
        if hi >= _LIMIT:
            raise MixtureError(f"{where}: lies past the run's 2**62 samples (field start)")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if delivered(mid) >= goal:
            hi = mid
        else:
            lo = mid
    return hi
