"""A rank's packed batches cut from an epoch's packed rows (see :mod:`.packing`).

Why apart: :mod:`.packed_epoch` says which tokens lie in every row of the epoch; this module
deals global batches of rows to a rank and its workers (:class:`PackedPlan`), pads an even
last round, and builds each batch's arrays (``input_ids``, ``labels``, ``position_ids``,
``cu_seqlens``) straight from the shards' bytes, a stretch of batches at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import PackError
from ..format.buffers import copy_pieces
from .packed_epoch import EpochPacking, _Chunk

IGNORE_INDEX = -100  # torch's cross_entropy ignore_index default


def _refuse_negative_ids(
    input_ids: np.ndarray, stored: np.ndarray, column: str, first_row: int
) -> None:
    """Token ids become int64 ``input_ids``: a uint64 id >= 2**63 would wrap to a negative
    one and a negative stored id would pass through (and -100 reads as an ignored label),
    so any negative id in the batch is refused, naming the column, the packed row and the
    stored value. One vectorized pass over the batch, only for dtypes that can go negative."""
    if not input_ids.size or input_ids.min() >= 0:
        return
    at = int(np.argmax(input_ids.reshape(-1) < 0))
    value = stored.reshape(-1)[at].item()
    why = (
        "above the int64 range of input_ids (2**63 - 1)"
        if stored.dtype.kind == "u"
        else "negative; token ids must be 0 or more"
    )
    raise PackError(
        f"pack column {column!r} holds token id {value} ({stored.dtype}) in packed row "
        f"{first_row + at // input_ids.shape[1]}: {why}",
        field="column",
    )


def assemble(
    chunks: list[_Chunk], a: int, b: int, seq_len: int, pad_id: int, column: str = "tokens"
) -> tuple[dict[str, Any], int]:
    """Rows ``a`` to ``b`` (exclusive) as a batch (input_ids, labels, position_ids,
    cu_seqlens, max_seqlen; see the module's docstring) and its count of real tokens.
    Tokens are copied once, straight from the shards' bytes into the batch; ids that do
    not fit int64 ``input_ids`` as themselves are refused naming ``column``."""
    L, k = seq_len, b - a
    parts = []
    for ch in chunks:
        lo = int(np.searchsorted(ch.seg.row, a, side="left"))
        hi = int(np.searchsorted(ch.seg.row, b, side="left"))
        if hi > lo:
            parts.append((ch, lo, hi))
    dtype = parts[0][0].dtype if parts else np.dtype("<u2")
    size = dtype.itemsize
    out = np.empty(k * L * size, dtype=np.uint8)
    at_parts, tok_parts, len_parts = [], [], []
    for ch, lo, hi in parts:
        seg = ch.seg
        at = (seg.row[lo:hi] - a) * L + seg.col[lo:hi]
        tok, length, docs = seg.tok[lo:hi], seg.length[lo:hi], seg.doc[lo:hi]
        shards = ch.shard[docs]
        src = ch.start[docs] + tok * size
        for s in np.unique(shards).tolist():
            sel = np.flatnonzero(shards == s) if len(ch.raws) > 1 else slice(None)
            copy_pieces(out, at[sel] * size, ch.raws[s], src[sel], length[sel] * size)
        at_parts.append(at)
        tok_parts.append(tok)
        len_parts.append(length)
    at = np.concatenate(at_parts) if at_parts else np.empty(0, dtype=np.int64)
    tok = np.concatenate(tok_parts) if tok_parts else np.empty(0, dtype=np.int64)
    length = np.concatenate(len_parts) if len_parts else np.empty(0, dtype=np.int64)
    input_ids = out.view(dtype).reshape(k, L).astype(np.int64)
    fill = np.bincount(at // L, weights=length, minlength=k).astype(np.int64)
    padded = np.flatnonzero(fill < L)
    starts, first_tok = at, tok
    if len(padded):  # a row's padding is a segment of its own, at the row's end
        starts = np.concatenate([at, padded * L + fill[padded]])
        first_tok = np.concatenate([tok, np.zeros(len(padded), dtype=np.int64)])
        order = np.argsort(starts, kind="stable")
        starts, first_tok = starts[order], first_tok[order]
    seg_len = np.diff(np.append(starts, k * L))
    positions = np.arange(k * L, dtype=np.int64) + np.repeat(first_tok - starts, seg_len)
    labels = input_ids.copy()
    labels.reshape(-1)[starts] = IGNORE_INDEX
    for r in padded.tolist():
        input_ids[r, fill[r] :] = pad_id
        labels[r, fill[r] :] = IGNORE_INDEX
    if dtype.kind == "i" or (dtype.kind == "u" and dtype.itemsize == 8):
        _refuse_negative_ids(input_ids, out.view(dtype).reshape(k, L), column, a)
    batch = {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": positions.reshape(k, L),
        "cu_seqlens": np.append(starts, k * L).astype(np.int32),
        "max_seqlen": int(seg_len.max()) if len(seg_len) else 0,
    }
    return batch, int(length.sum())


STRETCH_TOKENS = 1 << 19  # token slots of the batches gathered at once (see _Stretch)


def _arange(n: int) -> np.ndarray:
    """``0..n-1`` (int64): a read-only view of one array kept for the process."""
    global _ARANGE
    if len(_ARANGE) < n:
        grown = np.arange(max(n, 2 * len(_ARANGE)), dtype=np.int64)
        grown.flags.writeable = False
        _ARANGE = grown
    return _ARANGE[:n]


_ARANGE = np.arange(0, dtype=np.int64)


class _Stage:
    """A reader's staging bytes, reused from one stretch to the next (never handed out)."""

    def __init__(self) -> None:
        self.data = np.empty(0, dtype=np.uint8)

    def take(self, nbytes: int) -> np.ndarray:
        if len(self.data) < nbytes:
            self.data = np.empty(nbytes, dtype=np.uint8)
        return self.data[:nbytes]


class _Stretch:
    """A few batches' rows made at once: :func:`assemble`'s rows (tested equal) with its
    per-batch Python and numpy calls paid once per stretch. The stretch's tokens are copied
    from the shards into one staging buffer (one copy per shard), padding written there,
    and every segment's place, length and position offset found in a few vectorized steps;
    :meth:`batch` then makes one batch in a handful of whole-array operations, into fresh
    arrays (a batch the consumer keeps is never overwritten)."""

    def __init__(
        self,
        chunks: list[_Chunk],
        spans: list[tuple[int, int]],
        js: list[int],
        seq_len: int,
        pad_id: int,
        column: str,
        stage: _Stage,
    ) -> None:
        L, n = seq_len, len(spans)
        self.seq_len, self.column, self.spans = L, column, spans
        self.index = {j: i for i, j in enumerate(js)}
        a = np.array([s[0] for s in spans], dtype=np.int64)
        b = np.array([s[1] for s in spans], dtype=np.int64)
        offs = np.zeros(n + 1, dtype=np.int64)
        np.cumsum((b - a) * L, out=offs[1:])
        slots = int(offs[-1])
        base = offs[:-1] - a * L  # a batch's row r, column c is slot base + r * L + c
        cut = np.empty(2 * n, dtype=np.int64)
        cut[0::2], cut[1::2] = a, b
        parts: list[tuple[np.ndarray, ...]] = []  # per chunk: slot, byte start, length,
        # first token, shard, batch
        for ch in chunks:
            seg = ch.seg
            lohi = np.searchsorted(seg.row, cut, side="left")
            lo, hi = lohi[0::2], lohi[1::2]
            count = hi - lo
            total = int(count.sum())
            if not total:
                continue
            if n == 1 or bool((hi[:-1] == lo[1:]).all()):  # one run of segments
                idx: Any = slice(int(lo[0]), int(hi[-1]))
            else:
                idx = np.repeat(lo - (np.cumsum(count) - count), count) + _arange(total)
            batch_of = np.repeat(_arange(n), count)
            slot = seg.row[idx] * L + seg.col[idx] + base[batch_of]
            parts.append(
                (slot, ch.seg_src[idx], seg.length[idx], seg.tok[idx], ch.seg_shard[idx], batch_of)
            )
        raws = {s: r for ch in chunks for s, r in ch.raws.items()}
        dtype = chunks[0].dtype if chunks else np.dtype("<u2")
        if not parts:  # no real token (never in a plan's rows): padding only
            parts.append(tuple(np.empty(0, dtype=np.int64) for _ in range(6)))
        if len(parts) == 1:
            slot, src, length, tok, shard, batch_of = parts[0]
        else:  # rows across a block boundary: segments of two chunks, put in row order
            slot, src, length, tok, shard, batch_of = (np.concatenate(x) for x in zip(*parts))
            order = np.argsort(slot, kind="stable")
            slot, src, length, tok, shard = (
                slot[order],
                src[order],
                length[order],
                tok[order],
                shard[order],
            )
        size = dtype.itemsize
        staged = stage.take(slots * size)
        present = np.unique(shard).tolist() if len(raws) > 1 else list(raws)
        if not len(slot):
            pass
        elif len(present) == 1:
            copy_pieces(staged, slot * size, raws[present[0]], src, length * size)
        else:
            by = np.argsort(shard, kind="stable")
            ends = np.searchsorted(shard[by], present, side="right").tolist()
            start = 0
            for s, end in zip(present, ends):
                sel = by[start:end]
                copy_pieces(staged, slot[sel] * size, raws[s], src[sel], length[sel] * size)
                start = end
        self.reals = np.bincount(batch_of, weights=length, minlength=n).astype(np.int64).tolist()
        # a row's padding, from its real tokens to its end, is a segment of its own
        fill = np.bincount(slot // L, weights=length, minlength=slots // L).astype(np.int64)
        padded = np.flatnonzero(fill < L)
        tokens = staged.view(dtype)
        if len(padded):
            p_start = padded * L + fill[padded]
            p_len = L - fill[padded]
            p_slots = np.repeat(p_start - (np.cumsum(p_len) - p_len), p_len) + _arange(
                int(p_len.sum())
            )
            info = np.iinfo(dtype)
            if not info.min <= pad_id <= info.max:  # a pad id the stored dtype cannot hold
                tokens = tokens.astype(np.int64)
            tokens[p_slots] = pad_id
            order = np.argsort(np.concatenate([slot, p_start]), kind="stable")
            slot = np.concatenate([slot, p_start])[order]
            length = np.concatenate([length, p_len])[order]
            tok = np.concatenate([tok, np.zeros(len(padded), dtype=np.int64)])[order]
        # per batch: its segments, offsets from its first slot
        self.seg_at = np.searchsorted(slot, offs).tolist()
        self.start = slot - np.repeat(offs[:-1], np.diff(self.seg_at))
        self.delta = tok - self.start  # position of batch slot x: x + delta of its segment
        self.length = length
        self.max_len = np.maximum.reduceat(length, self.seg_at[:-1]).tolist()
        self.fill = fill
        self.offs = offs.tolist()
        self.tokens, self.stored = tokens, staged.view(dtype)
        self.check = dtype.kind == "i" or (dtype.kind == "u" and dtype.itemsize == 8)

    def compact(self, i: int) -> tuple[PackedBatch, int]:
        """The stretch's ``i``-th batch in its compact form (its tokens as stored and its
        segments; :meth:`PackedBatch.widen` makes :func:`assemble`'s arrays) and its real
        tokens. Ids that do not fit int64 ``input_ids`` are refused here, where they are read."""
        L, lo, hi = self.seq_len, self.offs[i], self.offs[i + 1]
        c0, c1 = self.seg_at[i], self.seg_at[i + 1]
        k = (hi - lo) // L
        tokens = self.tokens[lo:hi].copy()  # the staging buffer is reused by the next stretch
        if self.check:
            ids = tokens.view(np.int64) if tokens.dtype == np.uint64 else tokens
            stored = self.stored[lo:hi].reshape(k, L)
            _refuse_negative_ids(ids.reshape(k, L), stored, self.column, self.spans[i][0])
        batch = PackedBatch(
            tokens,
            L,
            self.start[c0:c1].astype(np.int32),
            self.delta[c0:c1],
            self.length[c0:c1],
            self.fill[lo // L : hi // L],
            int(self.max_len[i]),
        )
        return batch, int(self.reals[i])

    def batch(self, i: int) -> tuple[dict[str, Any], int]:
        """The stretch's ``i``-th batch (as :func:`assemble` makes it) and its real tokens."""
        batch, real = self.compact(i)
        return batch.widen(), real


class PackedBatch:
    """A packed batch as a worker sends it: the tokens in their stored dtype and the
    segments (start slot, length, position offset) and each row's real tokens, about a
    tenth of the widened arrays' bytes and plain numpy arrays, pickled in one message.

    Why: a DataLoader worker hands each torch tensor over in shared memory, one file
    descriptor passed over a fresh socket per tensor (about 1 ms each on a busy 2-core
    machine), and the widened batch is four tensors of 8 bytes a token; the main process
    widens this form instead (:meth:`widen`), in about the time of one copy."""

    __slots__ = ("delta", "extra", "fill", "length", "max_seqlen", "seq_len", "starts", "tokens")

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        starts: np.ndarray,
        delta: np.ndarray,
        length: np.ndarray,
        fill: np.ndarray,
        max_seqlen: int,
    ) -> None:
        self.tokens, self.seq_len = tokens, seq_len
        self.starts, self.delta, self.length, self.fill = starts, delta, length, fill
        self.max_seqlen = max_seqlen
        self.extra: dict[str, Any] = {}  # arrays passed through as they are (``pad_mask``)

    def __getstate__(self) -> tuple[Any, ...]:
        return tuple(getattr(self, k) for k in self.__slots__)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for k, v in zip(self.__slots__, state):
            setattr(self, k, v)

    def widen(self) -> dict[str, Any]:
        """``input_ids``, ``labels`` (-100 at each segment's first slot and on padding),
        ``position_ids``, ``cu_seqlens`` and ``max_seqlen``, as :func:`assemble` makes them."""
        L, n = self.seq_len, len(self.tokens)
        k = n // L
        input_ids = self.tokens.reshape(k, L).astype(np.int64)
        labels = input_ids.copy()
        labels.reshape(-1)[self.starts] = IGNORE_INDEX
        for r in np.flatnonzero(self.fill < L).tolist():  # a row's padding, to its end
            labels[r, self.fill[r] :] = IGNORE_INDEX
        positions = np.repeat(self.delta, self.length)
        positions += _arange(n)
        cu_seqlens = np.empty(len(self.starts) + 1, dtype=np.int32)
        cu_seqlens[:-1] = self.starts
        cu_seqlens[-1] = n
        batch = {
            "input_ids": input_ids,
            "labels": labels,
            "position_ids": positions.reshape(k, L),
            "cu_seqlens": cu_seqlens,
            "max_seqlen": self.max_seqlen,
        }
        return batch | self.extra


def widened(batch: dict[str, Any] | PackedBatch) -> dict[str, Any]:
    """A batch as :meth:`PackedPlan.batches` yields it with ``compact=True``, widened."""
    return batch.widen() if isinstance(batch, PackedBatch) else batch


class PackedPlan:
    """One rank's packed batches of one epoch from ``rows`` consumed global rows on.

    Global batch ``g`` holds rows ``rows + g * batch_size`` onwards and goes to rank
    ``g % world_size``; the rank's ``j``-th batch goes to worker ``j % workers``. With
    ``drop_last`` the incomplete last global batch is dropped and the tail cut to whole
    rounds. Without it, over several ranks with ``even_batches`` (as
    :class:`~spark_dl_core.order.EpochPlan` pads samples) the last round's rows are split
    evenly, ``ceil(left / world_size)`` per rank, and the fewer than ``world_size`` rows
    missing repeat the epoch's first rows whole, with every label -100 (so no token's loss
    counts twice) and marked in ``pad_mask`` when asked. With neither, ranks differ by one
    batch at most and every row is delivered exactly once.
    """

    def __init__(
        self,
        packing: EpochPacking,
        batch_size: int,
        rank: int,
        world_size: int,
        drop_last: bool,
        rows: int = 0,
        even_batches: bool = False,
        pad_mask: bool = False,
    ) -> None:
        self.packing, self.batch_size = packing, int(batch_size)
        self.rank, self.world_size, self.drop_last = int(rank), int(world_size), drop_last
        self.rows = int(rows)
        self.even = bool(even_batches) and self.world_size > 1 and not drop_last
        self.pad_mask = pad_mask
        self._total: int | None = None

    @property
    def total(self) -> int:
        """Rows in the epoch (computed once: from recorded token counts where the packing
        has them, else by reading every block's document lengths)."""
        if self._total is None:
            self._total = self.packing.total_rows()
        return self._total

    def _shape(self) -> tuple[int, tuple[int, int] | None]:
        """Global batches, and (start row, rows per rank) of a padded last round."""
        rest = max(0, self.total - self.rows)
        B, W = self.batch_size, self.world_size
        if self.drop_last:
            n = rest // B
            return n - n % W, None
        if self.even and rest:
            rounds = -(-rest // (W * B))
            start = self.rows + (rounds - 1) * W * B
            return rounds * W, (start, -(-(self.total - start) // W))
        return -(-rest // B), None

    def __len__(self) -> int:
        return max(0, -(-(self._shape()[0] - self.rank) // self.world_size))

    def locality(self) -> dict[str, Any]:
        """How local this rank's reads are: one run of rows packed from the whole epoch's
        documents, so every rank reads every shard (see :mod:`.packed_streams`)."""
        return {
            "streams": 1,
            "streams_read": 1,
            "data_share": 1.0,
            "ideal_share": 1 / self.world_size,
        }

    @property
    def touched(self) -> set[int]:
        """The shards this plan's packing has read (in this process)."""
        return self.packing.docs.touched

    def rows_after(self, steps: int) -> int:
        """Global rows consumed once every rank has taken ``steps`` batches of this plan:
        the whole epoch once no rank has a batch left (a tail ``drop_last`` drops included)."""
        if steps > 0 and steps * self.world_size >= self._shape()[0]:
            return self.total
        after = self.rows + steps * self.world_size * self.batch_size
        return min(after, self._total) if self._total is not None else after

    def batches(
        self, worker: int = 0, workers: int = 1, compact: bool = False
    ) -> Iterator[tuple[Any, int]]:
        """This rank's batches for ``worker`` of ``workers``: (batch, real tokens). Batches
        of real rows only are made a stretch at a time (:class:`_Stretch`, up to
        ``STRETCH_TOKENS`` slots: the next few of this worker's batches gathered at once);
        a batch with repeated rows (an even last round) on its own. ``compact``: a
        stretch's batches come as :class:`PackedBatch` (:func:`widened` makes the dict), for
        a DataLoader worker to send."""
        B, W = self.batch_size, self.world_size
        known = self.drop_last or self.even
        tail = self._shape()[1] if known else None
        mine = len(self) if known else None
        chunks = self.packing.chunks_from(self.rows)
        held: list[_Chunk] = []
        complete = self.rows
        exhausted = False
        j = worker
        seq_len, pad = self.packing.seq_len, int(self.packing.pack.pad_id or 0)
        column = self.packing.pack.column
        stretch: _Stretch | None = None
        ahead = max(1, STRETCH_TOKENS // (B * seq_len))  # batches per stretch
        stage = _Stage()

        def rows_of(j: int) -> tuple[int, int]:
            if tail is not None and mine is not None and j == mine - 1:
                return tail[0] + self.rank * tail[1], tail[0] + (self.rank + 1) * tail[1]
            a = self.rows + (self.rank + j * W) * B
            return a, a + B

        def load(row: int) -> None:  # read blocks until the rows below ``row`` are complete
            nonlocal complete, exhausted
            want = row if self._total is None else min(row, self._total)
            while not exhausted and complete < want:
                chunk = next(chunks, None)
                if chunk is None:
                    exhausted = True
                    break
                held.append(chunk)
                complete = max(complete, chunk.complete)
            if exhausted and self._total is None:
                self._total = complete

        def plain(a: int, b: int) -> bool:  # real rows only (no repeats)
            return (self._total is None or a < self._total) and not (
                known and b > max(a, self.total) and self.total
            )

        while True:
            if mine is not None and j >= mine:
                return
            a, b = rows_of(j)
            load(b)
            real_end = b if self._total is None else min(b, self._total)
            if not known and a >= real_end:
                return
            if stretch is None or j not in stretch.index:
                held[:] = [ch for ch in held if ch.last_row >= a]
                stretch = None
                if plain(a, b):  # this batch and the next few of this worker's
                    spans = [(a, real_end)]
                    js = [j]
                    more = j + workers
                    while len(spans) < ahead and (mine is None or more < mine - (tail is not None)):
                        na, nb = rows_of(more)
                        load(nb)
                        if not plain(na, nb) or (self._total is not None and nb > self._total):
                            break
                        spans.append((na, nb))
                        js.append(more)
                        more += workers
                    stretch = _Stretch(held, spans, js, seq_len, pad, column, stage)
            batch: Any
            if stretch is not None and j in stretch.index:
                make = stretch.compact if compact else stretch.batch
                batch, real = make(stretch.index[j])
            else:
                parts = []
                if real_end > a:
                    parts.append(assemble(held, a, real_end, seq_len, pad, column))
                if known and b > max(a, self.total) and self.total:
                    first = max(a, self.total)
                    parts.append(self._repeats(first - self.total, b - first))
                batch, real = _join(parts) if len(parts) > 1 else parts[0]
            if self.pad_mask:
                (batch.extra if isinstance(batch, PackedBatch) else batch)["pad_mask"] = (
                    np.arange(a, b) >= self.total
                )
            yield batch, real
            j += workers

    def _repeats(self, first: int, count: int) -> tuple[dict[str, Any], int]:
        """``count`` padding rows: the epoch's rows from ``first`` on (wrapping), every label
        -100, no real tokens counted."""
        total, L = self.total, self.packing.seq_len
        pad = int(self.packing.pack.pad_id or 0)
        parts = []
        at = first % total
        while count > 0:
            take = min(count, total - at)
            chunks = list(_until(self.packing.chunks_from(at), at + take))
            parts.append(assemble(chunks, at, at + take, L, pad, self.packing.pack.column))
            count -= take
            at = 0
        batch, _ = _join(parts) if len(parts) > 1 else parts[0]
        batch["labels"][:] = IGNORE_INDEX
        return batch, 0


def _until(chunks: Iterator[_Chunk], row: int) -> Iterator[_Chunk]:
    """Chunks until the one that completes the rows below ``row``."""
    for chunk in chunks:
        yield chunk
        if chunk.complete >= row:
            return


def _join(parts: list[tuple[dict[str, Any], int]]) -> tuple[dict[str, Any], int]:
    """Batches of rows one after the other as one batch (segment boundaries shifted)."""
    out: dict[str, Any] = {}
    for key in ("input_ids", "labels", "position_ids"):
        out[key] = np.concatenate([p[0][key] for p in parts])
    bounds, at = [np.zeros(1, dtype=np.int32)], 0
    for p, _ in parts:
        bounds.append(p["cu_seqlens"][1:] + at)
        at += p["input_ids"].size
    out["cu_seqlens"] = np.concatenate(bounds).astype(np.int32)
    out["max_seqlen"] = max(p[0]["max_seqlen"] for p in parts)
    return out, sum(p[1] for p in parts)
