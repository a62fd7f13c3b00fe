"""Packing token documents into fixed-length training sequences, at read time.

A step between the stored documents and the framework adapters. The epoch's *global*
document order (:mod:`spark_dl_core.order`: a pure function of fingerprint, seed, epoch and
shuffle settings, whatever the world size) is packed into a *global* stream of rows of
``seq_len`` tokens; the rows from the saved position on are cut into global batches of
``batch_size`` rows and global batch ``g`` goes to rank ``g % world_size`` (its ``j``-th
batch to DataLoader worker ``j % num_workers``), as :class:`~spark_dl_core.order.EpochPlan`
deals sample batches. So the packed sequences are the same on any world size and worker
count, every token is delivered exactly once per epoch, and a position is a count of
global rows: a resumed loader continues a document it had half delivered.

Documents are packed block by block, a block being one shuffle window's documents (with
``shuffle=False``, ``shuffle_window`` consecutive shards): what is held is one or two
blocks' shards and their documents' lengths and byte positions, never O(dataset).

Modes:

- ``concat``: documents in the epoch's order fill rows back to back and are split at row
  ends; only the epoch's last row is padded.
- ``bin``: a document of at most ``seq_len`` tokens is never split. Each ``window``
  consecutive documents are placed by best fit (the open row with the least room that
  holds the document, else a new row; ties to the older row); a longer document is first
  cut into full rows. Rows are delivered in the order they were opened; ``fill`` (real
  tokens / all tokens) is in the loader's ``stats()``.

Each batch holds ``input_ids``, ``labels`` and ``position_ids`` (int64 ``[B, seq_len]``:
the dtype torch's embeddings and ``cross_entropy`` take) and ``cu_seqlens`` (int32, the
flattened batch's segment boundaries from 0 to ``B * seq_len``, FlashAttention's varlen
convention) with ``max_seqlen`` (an int). A *segment* is one document's run of tokens in
one row (padding at a row's end is a segment too); ``position_ids`` count from each
document's first token (a document continued from the previous row keeps counting);
``labels`` equal ``input_ids`` except -100 at each segment's first token and at padding,
so that a model shifting labels by one (as Hugging Face's do) never predicts across
documents.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PackError
from ..format.buffers import copy_pieces
from ..order import GlobalOrder
from ..order.choice import _order_of
from .position import resumed, saved_state
from .settings import LoaderSettings, PackSpec

if TYPE_CHECKING:
    from ..shard_source import ShardSource

IGNORE_INDEX = -100  # torch's cross_entropy ignore_index default
BLOCK_DOCS = 1 << 16  # documents per block for orders without shuffle windows (mixtures)
# Bumped whenever the same settings would pack other rows (a saved row count would mean
# other tokens); a state of another version is refused.
PACK_VERSION = 1


def _tokenize_op(dataset: ShardSource, column: str) -> dict[str, Any] | None:
    """The recorded ``tokenize`` op that wrote ``column``, if any."""
    for op in (dataset.spec or {}).get("transforms", []):
        if op.get("op") == "tokenize" and op.get("output", "tokens") == column:
            return dict(op)
    return None


def check_pack(dataset: ShardSource, pack: PackSpec) -> PackSpec:
    """``pack`` checked against the dataset, with ``pad_id`` resolved: the column must be a
    1-D integer ndarray column; a ``pad_id`` that is an ordinary token of the column's
    recorded tokenizer (not a special token, below its vocabulary size) is refused, since a
    model or collator that masks labels by value would then mask real tokens."""
    column = pack.column
    if column not in dataset.layout.names:
        raise PackError(
            f"pack column {column!r} is not in {dataset.path}; it has {list(dataset.layout.names)}",
            field="column",
        )
    encoding = dataset.encoding(column)
    form = dataset.forms.get(column, ("", None))
    dtype = getattr(encoding, "dtype", None)
    one_d = form[0] in ("jagged", "auto") or (form[0] == "dense" and len(form[1] or ()) == 1)
    if (
        encoding.size is not None
        or not encoding.ndarray
        or not one_d
        or (dtype is not None and np.dtype(dtype).kind not in "iu")
    ):
        raise PackError(
            f"pack column {column!r} is {encoding.name}: packing needs token documents, a "
            "variable-length 1-D integer ndarray column (e.g. written by the tokenize op)",
            field="column",
        )
    op = _tokenize_op(dataset, column)
    pad = pack.pad_id
    if pad is None:
        pad = int(op["eos_id"]) if op and op.get("eos_id") is not None else 0
    elif op and op.get("vocab_size") is not None:
        special = {op.get("eos_id"), op.get("bos_id"), *(op.get("special_ids") or [])}
        if pad < int(op["vocab_size"]) and pad not in special:
            raise PackError(
                f"pack pad_id={pad} is an ordinary token of the tokenizer that wrote {column!r} "
                f"(vocabulary 0..{int(op['vocab_size']) - 1}); padding is masked in labels "
                "by position, but anything masking by value would hide real tokens: use a "
                f"special token's id (eos {op.get('eos_id')}) or an id >= {op['vocab_size']}",
                field="pad_id",
            )
    return pack.model_copy(update={"pad_id": pad})


# --------------------------------------------------------------------------- documents


class _ShardDocs:
    """One loaded shard's documents of the pack column: where their tokens lie, how many."""

    __slots__ = ("dtype", "lengths", "raw", "starts")

    def __init__(self, raw: np.ndarray, starts: np.ndarray, lengths: np.ndarray, dtype: Any):
        self.raw, self.starts, self.lengths, self.dtype = raw, starts, lengths, dtype


class _Docs:
    """The pack column's documents of one dataset (or mixture): the last few loaded
    shards' document tables (where each document's tokens lie, how many)."""

    def __init__(self, dataset: ShardSource, column: str, keep: int, verify: bool | None) -> None:
        self.dataset, self.column, self.keep, self.verify = dataset, column, keep, verify
        self.index = dataset.layout.names.index(column)
        self.recent: dict[int, _ShardDocs] = {}
        self.dtype: np.dtype | None = None

    def shard(self, s: int) -> _ShardDocs:
        found = self.recent.pop(s, None)
        if found is None:
            found = self._load(s)
        self.recent[s] = found  # most recent last
        while len(self.recent) > self.keep:
            self.recent.pop(next(iter(self.recent)))
        return found

    def _load(self, s: int) -> _ShardDocs:
        ds = self.dataset
        data = ds.load_shard(s, self.verify)
        count = data.count
        encoding = ds.encoding(self.column)
        if count == 0:
            empty = np.empty(0, dtype=np.int64)
            return _ShardDocs(data.raw, empty, empty, self.dtype or np.dtype("<u2"))
        starts, sizes = data.positions(np.arange(count, dtype=np.int64))
        spans = getattr(encoding, "value_spans", None)
        got = (
            spans(data.raw, starts[:, self.index], sizes[:, self.index], self.column)
            if spans
            else None
        )
        if got is None or got[2].kind not in "iu":
            raise PackError(
                f"pack column {self.column!r} in shard {data.file!r} does not hold 1-D integer "
                "arrays of one dtype",
                field="column",
            )
        byte_starts, nbytes, dtype = got
        if self.dtype is not None and dtype != self.dtype:
            raise PackError(
                f"pack column {self.column!r} is {dtype} in shard {data.file!r} and "
                f"{self.dtype} in another: packing needs one token dtype",
                field="column",
            )
        self.dtype = dtype
        lengths = (nbytes // dtype.itemsize).astype(np.int64)
        return _ShardDocs(data.raw, byte_starts.astype(np.int64), lengths, dtype)


# --------------------------------------------------------------------------- packing


@dataclass
class _Segments:
    """Pieces of documents placed in rows: for each, its global row, column in the row,
    document (index into the block's table), first token within the document, length."""

    row: np.ndarray
    col: np.ndarray
    doc: np.ndarray
    tok: np.ndarray
    length: np.ndarray


def pack_concat(lengths: np.ndarray, stream_at: int, seq_len: int) -> _Segments:
    """Documents of ``lengths`` placed back to back from token ``stream_at`` of the
    epoch's stream, split at multiples of ``seq_len`` (row ``r`` holds tokens
    ``r * seq_len`` up to ``(r + 1) * seq_len``)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = stream_at + np.cumsum(lengths)
    starts = ends - lengths
    real = lengths > 0
    first = starts // seq_len
    last = (ends - 1) // seq_len
    count = np.where(real, last - first + 1, 0)
    doc = np.repeat(np.arange(len(lengths)), count)
    before = np.cumsum(count) - count
    row = first[doc] + (np.arange(len(doc)) - before[doc])
    lo = np.maximum(starts[doc], row * seq_len)
    hi = np.minimum(ends[doc], (row + 1) * seq_len)
    return _Segments(row, lo - row * seq_len, doc, lo - starts[doc], hi - lo)


def pack_bin(lengths: np.ndarray, row_at: int, seq_len: int, window: int) -> tuple[_Segments, int]:
    """Documents of ``lengths`` placed by best fit within each ``window`` consecutive
    documents (rows numbered from ``row_at`` in the order they are opened); a document
    longer than a row first fills whole rows of its own. Returns the segments (sorted by
    row, then column) and the number of rows."""
    lengths = np.asarray(lengths, dtype=np.int64)
    full, rest = np.divmod(lengths, seq_len)
    first_full, place, opened = _best_fit(full, rest, seq_len, window)
    # whole rows: document d's k-th whole row is row first_full[d] + k, tokens from k * L
    long_docs = np.flatnonzero(full)
    count = full[long_docs]
    doc_f = np.repeat(long_docs, count)
    k = np.arange(len(doc_f)) - np.repeat(np.cumsum(count) - count, count)
    # each document's remainder, where best fit put it
    doc_r = np.flatnonzero(rest)
    row_r, col_r = place[doc_r] // (seq_len + 1), place[doc_r] % (seq_len + 1)
    row = np.concatenate([first_full[doc_f] + k, row_r])
    col = np.concatenate([np.zeros(len(doc_f), np.int64), col_r])
    order = np.lexsort((col, row))
    seg = _Segments(
        row[order] + row_at,
        col[order],
        np.concatenate([doc_f, doc_r])[order],
        np.concatenate([k * seq_len, full[doc_r] * seq_len])[order],
        np.concatenate([np.full(len(doc_f), seq_len, np.int64), rest[doc_r]])[order],
    )
    return seg, opened


def _best_fit(
    full: np.ndarray, rest: np.ndarray, seq_len: int, window: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """The sequential part of :func:`pack_bin`, one step per document with a remainder:
    per document the first of its whole rows, and where its remainder went (``row *
    (seq_len + 1) + column``), and the rows opened. Open rows are kept as one sorted list
    of ``free * 2**40 + row`` (best fit: the first with ``free >= rest``; equal room: the
    older row)."""
    n = len(full)
    first_full = np.zeros(n, dtype=np.int64)
    place = np.zeros(n, dtype=np.int64)
    fulls, rests = full.tolist(), rest.tolist()
    starts, placed = [0] * n, [0] * n
    shift, stride = 1 << 40, seq_len + 1
    bisect_left, insort = bisect.bisect_left, bisect.insort
    opened = 0
    for begin in range(0, n, window):
        room: list[int] = []
        for d in range(begin, min(n, begin + window)):
            f = fulls[d]
            if f:
                starts[d] = opened
                opened += f
            r = rests[d]
            if not r:
                continue
            k = bisect_left(room, r * shift)
            if k < len(room):
                key = room.pop(k)
                free, row = key >> 40, key & (shift - 1)
            else:
                free, row = seq_len, opened
                opened += 1
            placed[d] = row * stride + seq_len - free
            if free > r:
                insort(room, (free - r) * shift + row)
    first_full[:] = starts
    place[:] = placed
    return first_full, place, opened


@dataclass
class _Chunk:
    """One block's documents packed: segments, and per document its shard table and byte
    start (so rows are copied straight from the shard bytes)."""

    seg: _Segments
    shard: np.ndarray  # per document of the block: its shard
    start: np.ndarray  # per document: byte start of its tokens in that shard
    raws: dict[int, np.ndarray]
    dtype: np.dtype
    first_row: int
    complete: int  # rows below this are complete once this chunk is seen
    last_row: int  # the highest row holding a segment of this chunk (-1: none)
    seg_shard: np.ndarray = field(init=False)  # per segment: its shard
    seg_src: np.ndarray = field(init=False)  # per segment: byte start of its tokens

    def __post_init__(self) -> None:
        # per segment, computed once per block: its shard and the byte its tokens start at
        docs = self.seg.doc
        self.seg_shard = self.shard[docs]
        self.seg_src = self.start[docs] + self.seg.tok * self.dtype.itemsize


class EpochPacking:
    """One epoch's packed rows (all ranks'), computed block by block on demand.

    A block is one shuffle window's documents (``shuffle=False``: ``shuffle_window``
    consecutive shards; a mixture's order: ``BLOCK_DOCS`` positions). Global positions are
    rows of the epoch; :meth:`chunks_from` yields packed blocks from the one holding a row
    on, skipping earlier blocks by their token totals (``concat``) or row counts (``bin``),
    which are kept per epoch (O(blocks)) once a block's document lengths were read.
    """

    def __init__(
        self,
        dataset: ShardSource,
        pack: PackSpec,
        *,
        seed: int,
        epoch: int,
        shuffle: bool,
        shuffle_window: int,
        verify_hashes: bool | None = None,
    ) -> None:
        self.dataset, self.pack = dataset, pack
        self.seq_len = pack.seq_len
        w = int(shuffle_window)
        order = _order_of(dataset, seed, epoch, shuffle, w)
        self.order = order
        if isinstance(order, GlobalOrder) and shuffle:
            self.bounds = np.asarray(order.window_bounds, dtype=np.int64)
        elif isinstance(order, GlobalOrder):
            offsets = np.asarray(dataset.shard_offsets, dtype=np.int64)
            self.bounds = offsets[np.append(np.arange(0, len(offsets) - 1, w), len(offsets) - 1)]
        else:
            self.bounds = np.append(np.arange(0, order.total, BLOCK_DOCS), order.total)
        self.docs = _Docs(dataset, pack.column, keep=max(16, 2 * w + 2), verify=verify_hashes)
        key = (dataset.fingerprint, seed, epoch, shuffle, w, pack)
        cache = _BLOCKS.setdefault(dataset, {})
        # per block: tokens and bin rows (-1: not read yet)
        self.known: np.ndarray = cache.setdefault(key, np.full((self.blocks, 2), -1, np.int64))
        while len(cache) > 4:
            cache.pop(next(iter(cache)))

    @property
    def blocks(self) -> int:
        return max(0, len(self.bounds) - 1)

    def _counts(self, b: int) -> tuple[int, int]:
        """Block ``b``'s tokens and ``bin`` rows (reads its document lengths once)."""
        if self.known[b, 0] < 0:
            lengths = self._table(b)[0]
            bins = self.pack.mode == "bin"
            rows = pack_bin(lengths, 0, self.seq_len, self.pack.window)[1] if bins else 0
            self.known[b] = (int(lengths.sum()), rows)
        return int(self.known[b, 0]), int(self.known[b, 1])

    def total_rows(self) -> int:
        """Rows in the whole epoch (reads every block's document lengths once)."""
        if self.pack.mode == "concat":
            tokens = sum(self._counts(b)[0] for b in range(self.blocks))
            return -(-tokens // self.seq_len)
        return sum(self._counts(b)[1] for b in range(self.blocks))

    def _table(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, np.ndarray]]:
        """Block ``b``'s documents in epoch order: lengths, shard, byte start, shard bytes."""
        lo, hi = int(self.bounds[b]), int(self.bounds[b + 1])
        ids = self.order.take(lo, hi, True)
        offsets = self.dataset.shard_offsets
        shard_of = np.searchsorted(offsets, ids, side="right") - 1
        lengths = np.empty(len(ids), dtype=np.int64)
        starts = np.empty(len(ids), dtype=np.int64)
        raws: dict[int, np.ndarray] = {}
        for s in np.unique(shard_of).tolist():
            table = self.docs.shard(int(s))
            where = np.flatnonzero(shard_of == s)
            local = ids[where] - offsets[s]
            lengths[where] = table.lengths[local]
            starts[where] = table.starts[local]
            raws[int(s)] = table.raw
        return lengths, shard_of, starts, raws

    def chunks_from(self, row: int) -> Iterator[_Chunk]:
        """Packed blocks from the one holding row ``row`` on."""
        L = self.seq_len
        b, stream, rows = 0, 0, 0
        concat = self.pack.mode == "concat"
        while b < self.blocks:  # skip blocks before ``row`` (their lengths only)
            if self.known[b, 0] < 0 and (stream >= row * L if concat else rows >= row):
                break  # nothing left to skip: do not pack this block twice for its counts
            tokens, n = self._counts(b)
            if self.pack.mode == "concat" and stream + tokens <= row * L:
                stream += tokens
            elif self.pack.mode == "bin" and rows + n <= row:
                rows += n
            else:
                break
            b += 1
        for block in range(b, self.blocks):
            lengths, shard_of, starts, raws = self._table(block)
            if self.pack.mode == "concat":
                seg = pack_concat(lengths, stream, L)
                stream += int(lengths.sum())
                first = int(seg.row[0]) if len(seg.row) else stream // L
                complete = stream // L if block < self.blocks - 1 else -(-stream // L)
            else:
                seg, n = pack_bin(lengths, rows, L, self.pack.window)
                first, complete = rows, rows + n
                rows += n
                self.known[block, 1] = n
            self.known[block, 0] = int(lengths.sum())
            last = int(seg.row[-1]) if len(seg.row) else -1
            dtype = self.docs.dtype if self.docs.dtype is not None else np.dtype("<u2")
            yield _Chunk(seg, shard_of, starts, raws, dtype, first, complete, last)


_BLOCKS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], np.ndarray]] = (
    weakref.WeakKeyDictionary()
)


# --------------------------------------------------------------------------- batches


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
        masked = slot  # slots whose label is -100: each segment's first, and padding
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
            masked = np.sort(np.concatenate([masked, p_slots]), kind="stable")  # 2 runs: a merge
        # per batch: its segments and masked labels (ranges), offsets from its first slot
        self.seg_at = np.searchsorted(slot, offs).tolist()
        self.mask_at = np.searchsorted(masked, offs).tolist()
        self.start = slot - np.repeat(offs[:-1], np.diff(self.seg_at))
        self.delta = tok - self.start  # position of batch slot x: x + delta of its segment
        self.length = length
        self.masked = masked - np.repeat(offs[:-1], np.diff(self.mask_at))
        self.max_len = np.maximum.reduceat(length, self.seg_at[:-1]).tolist()
        self.offs = offs.tolist()
        self.tokens, self.stored = tokens, staged.view(dtype)
        self.check = dtype.kind == "i" or (dtype.kind == "u" and dtype.itemsize == 8)

    def batch(self, i: int) -> tuple[dict[str, Any], int]:
        """The stretch's ``i``-th batch (as :func:`assemble` makes it) and its real tokens."""
        L, lo, hi = self.seq_len, self.offs[i], self.offs[i + 1]
        c0, c1 = self.seg_at[i], self.seg_at[i + 1]
        k = (hi - lo) // L
        if self.tokens.dtype == np.int64:
            input_ids = self.tokens[lo:hi].reshape(k, L).copy()
        else:
            input_ids = self.tokens[lo:hi].reshape(k, L).astype(np.int64)
        labels = input_ids.copy()
        labels.reshape(-1)[self.masked[self.mask_at[i] : self.mask_at[i + 1]]] = IGNORE_INDEX
        positions = np.repeat(self.delta[c0:c1], self.length[c0:c1])
        positions += _arange(hi - lo)
        cu_seqlens = np.empty(c1 - c0 + 1, dtype=np.int32)
        cu_seqlens[:-1] = self.start[c0:c1]
        cu_seqlens[-1] = hi - lo
        if self.check:
            stored = self.stored[lo:hi].reshape(k, L)
            _refuse_negative_ids(input_ids, stored, self.column, self.spans[i][0])
        batch = {
            "input_ids": input_ids,
            "labels": labels,
            "position_ids": positions.reshape(k, L),
            "cu_seqlens": cu_seqlens,
            "max_seqlen": int(self.max_len[i]),
        }
        return batch, int(self.reals[i])


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
        """Rows in the epoch (computed once: reads every block's document lengths)."""
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

    def rows_after(self, steps: int) -> int:
        """Global rows consumed once every rank has taken ``steps`` batches of this plan:
        the whole epoch once no rank has a batch left (a tail ``drop_last`` drops included)."""
        if steps > 0 and steps * self.world_size >= self._shape()[0]:
            return self.total
        after = self.rows + steps * self.world_size * self.batch_size
        return min(after, self._total) if self._total is not None else after

    def batches(self, worker: int = 0, workers: int = 1) -> Iterator[tuple[dict[str, Any], int]]:
        """This rank's batches for ``worker`` of ``workers``: (batch, real tokens). Batches
        of real rows only are made a stretch at a time (:class:`_Stretch`, up to
        ``STRETCH_TOKENS`` slots: the next few of this worker's batches gathered at once);
        a batch with repeated rows (an even last round) on its own."""
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
            if stretch is not None and j in stretch.index:
                batch, real = stretch.batch(stretch.index[j])
            else:
                parts = []
                if real_end > a:
                    parts.append(assemble(held, a, real_end, seq_len, pad, column))
                if known and b > max(a, self.total) and self.total:
                    first = max(a, self.total)
                    parts.append(self._repeats(first - self.total, b - first))
                batch, real = _join(parts) if len(parts) > 1 else parts[0]
            if self.pad_mask:
                batch["pad_mask"] = np.arange(a, b) >= self.total
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


def pack_state(pack: PackSpec, rows: int) -> dict[str, Any]:
    """The nested ``pack`` entry of a loader state: the settings rows are counted in."""
    return {"settings": pack_key(pack), "rows": int(rows), "version": PACK_VERSION}


def pack_key(pack: PackSpec | None) -> dict[str, Any] | None:
    return None if pack is None else pack.model_dump(mode="json")


def state_rows(state: dict[str, Any] | None, pack: PackSpec) -> int:
    """Rows consumed that a loader state's ``pack`` entry records, checked against
    ``pack`` (a state of other settings counts other rows: refused, naming the field)."""
    entry = (state or {}).get("pack")
    if not isinstance(entry, dict):
        raise PackError(
            "loader state has no pack position (it was saved by a loader without pack=); "
            "packed rows cannot resume from a document count",
            field="pack",
        )
    if entry.get("version") != PACK_VERSION:
        raise PackError(
            f"loader state has pack version {entry.get('version')!r}, this spark-dl packs "
            f"version {PACK_VERSION}",
            field="pack",
        )
    saved = entry.get("settings") or {}
    mine = pack_key(pack) or {}
    for name in sorted(set(saved) | set(mine)):
        if saved.get(name) != mine.get(name):
            raise PackError(
                f"loader state was saved with pack {name}={saved.get(name)!r}, the loader "
                f"has {name}={mine.get(name)!r}; pass the same pack settings to resume",
                field=f"pack.{name}",
            )
    rows = entry.get("rows")
    if not isinstance(rows, int) or rows < 0:
        raise PackError(f"loader state pack rows={rows!r} is not a row count", field="pack.rows")
    return rows


def packed_source(dataset: ShardSource, settings: LoaderSettings) -> ShardSource:
    """The dataset a packed loader reads: a mixture whose schedule boundaries are in tokens
    has them placed at documents for this loader's column, seed and shuffle (cached)."""
    if settings.pack is None:
        return dataset
    placed: ShardSource = dataset.at_tokens(
        settings.pack.column, settings.seed, settings.shuffle, settings.verify_hashes
    )
    return placed


def packed_plan(
    dataset: ShardSource,
    settings: LoaderSettings,
    *,
    epoch: int,
    rows: int,
    rank: int,
    world_size: int,
) -> PackedPlan:
    """A rank's :class:`PackedPlan` for ``settings`` (with ``pack``)."""
    dataset = packed_source(dataset, settings)
    pack = check_pack(dataset, settings.pack)
    packing = EpochPacking(
        dataset,
        pack,
        seed=settings.seed,
        epoch=epoch,
        shuffle=settings.shuffle,
        shuffle_window=settings.shuffle_window,
        verify_hashes=settings.verify_hashes,
    )
    return PackedPlan(
        packing,
        settings.batch_size,
        rank,
        world_size,
        settings.drop_last,
        rows,
        even_batches=settings.even_batches,
        pad_mask=settings.pad_mask,
    )


def resume_position(
    dataset: ShardSource,
    settings: LoaderSettings,
    state: dict[str, Any] | None,
    strict: bool = True,
) -> tuple[ShardSource, int, int]:
    """(the dataset to read, epoch, rows consumed) of a packed loader: from ``state``
    (checked against dataset, order and pack settings; ``strict=False`` lets the dataset
    take a state of another version of it, if it can), else the settings' epoch from its
    start."""
    dataset = packed_source(dataset, settings)
    if state is None:
        return dataset, settings.epoch, 0
    pack = check_pack(dataset, settings.pack)
    loaded, dataset, _, _ = resumed(dataset, settings, state, strict, pack=pack_key(pack))
    return dataset, loaded.epoch, state_rows(state, pack)


def iter_packed(
    dataset: ShardSource,
    settings: LoaderSettings,
    state: dict[str, Any] | None = None,
    strict: bool = True,
) -> Iterator[dict[str, Any]]:
    """numpy batches of packed rows for ``Dataset.iter_batches(pack=...)``; the settings
    and ``state`` are checked now, before the first batch."""
    dataset, epoch, rows = resume_position(dataset, settings, state, strict)
    rank = 0 if settings.rank is None else settings.rank
    world = 1 if settings.world_size is None else settings.world_size
    plan = packed_plan(dataset, settings, epoch=epoch, rows=rows, rank=rank, world_size=world)
    return (batch for batch, _ in plan.batches())


def packed_state(
    dataset: ShardSource, settings: LoaderSettings, epoch: int, rows: int
) -> dict[str, Any]:
    """The loader state of a packed position (``consumed`` 0, rows in ``pack``)."""
    dataset = packed_source(dataset, settings)
    pack = check_pack(dataset, settings.pack)
    return saved_state(dataset, settings, epoch, 0, pack=pack_state(pack, rows))
