"""An epoch's token documents packed into rows, block by block (see :mod:`.packing`).

Why apart: what the packed rows *are* (which document's tokens lie where, the same for
every rank) is one concept; cutting them into a rank's batches (:mod:`.packed_rows`) is
another. A block is one shuffle window's documents; :class:`EpochPacking` packs blocks on
demand (``concat`` or ``bin``) and keeps each block's token and row counts, so a position
deep in the epoch is reached by counts, not by packing everything before it.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PackError
from ..order import GlobalOrder
from ..order.choice import _order_of
from .settings import PackSpec

if TYPE_CHECKING:
    from ..shard_source import ShardSource

try:  # best fit in C (csrc/packing.c); the Python loop below where it is not built
    from . import _packing
except ImportError:  # pragma: no cover - exercised where no compiler was found
    _packing = None  # type: ignore[assignment]

BLOCK_DOCS = 1 << 16  # documents per block for orders without shuffle windows (mixtures)
# A mixture's documents are ordered for packing in batches of documents (a batch size of
# rows says nothing about documents): of one where the batches only cut the mixture's
# streams (``"random"`` batching: the streams' document counts then differ by one at most,
# :mod:`.packed_streams`), of 64 where each batch interleaves the sources and draws its own
# shuffle key (``"stratified"``, ``"per_source"``): a key a document cost 3.7 us, and a
# streamed bin epoch ran at 0.61x one run's speed.
MIXTURE_DOC_BATCH = {False: 1, True: 64}  # by ``order_uses_batch_size``


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
        self.touched: set[int] = set()  # distinct shards loaded (``stats()["locality"]``)
        self.recorded: np.ndarray | None = None  # per shard, its recorded tokens
        # per shard, its documents' recorded lengths (a streamed ``bin`` epoch's rows were
        # counted from them, so a shard must hold exactly those)
        self.expected: Callable[[int], np.ndarray] | None = None
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
        self.touched.add(s)
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
        if self.recorded is not None and int(lengths.sum()) != int(self.recorded[s]):
            raise PackError(
                f"pack column {self.column!r} holds {int(lengths.sum())} tokens in shard "
                f"{data.file!r}, the dataset's metadata records {int(self.recorded[s])} "
                "(its spark_dl.json, or a table's Parquet footer): the metadata does not "
                "describe this shard (rows would be counted wrong)",
                field="column",
            )
        if self.expected is not None:
            want = self.expected(s)
            if len(want) != len(lengths) or not np.array_equal(want, lengths):
                bad = int(np.flatnonzero(want != lengths)[0]) if len(want) == len(lengths) else 0
                raise PackError(
                    f"pack column {self.column!r} in shard {data.file!r} holds documents of "
                    f"other lengths than its lengths file records (first at sample {bad}): "
                    "the file does not describe this shard (rows would be counted wrong)",
                    field="column",
                )
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


def bin_rows(lengths: np.ndarray, seq_len: int, window: int) -> int:
    """The rows :func:`pack_bin` opens for documents of ``lengths``, without placing them."""
    full, rest = np.divmod(np.asarray(lengths, dtype=np.int64), seq_len)
    return _best_fit(full, rest, seq_len, window)[2]


def _best_fit(
    full: np.ndarray, rest: np.ndarray, seq_len: int, window: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """The sequential part of :func:`pack_bin`, one step per document with a remainder:
    per document the first of its whole rows, and where its remainder went (``row *
    (seq_len + 1) + column``), and the rows opened. Open rows are kept sorted by room, then
    row (best fit: the first with ``free >= rest``; equal room: the older row). In C where
    built (``csrc/packing.c``), else :func:`_best_fit_loop`."""
    if _packing is None:
        return _best_fit_loop(full, rest, seq_len, window)
    n = len(full)
    first_full = np.zeros(n, dtype=np.int64)
    place = np.zeros(n, dtype=np.int64)
    full = np.ascontiguousarray(full, dtype=np.int64)
    rest = np.ascontiguousarray(rest, dtype=np.int64)
    opened = _packing.best_fit(full, rest, int(seq_len), int(window), first_full, place)
    return first_full, place, opened


def _best_fit_loop(
    full: np.ndarray, rest: np.ndarray, seq_len: int, window: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """:func:`_best_fit` in Python, the open rows one sorted list of ``free * 2**40 + row``
    (where the C extension is not built; the oracle its tests compare with)."""
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
    which are kept per epoch (O(blocks)) once a block's document lengths were read; in
    ``concat`` mode over a dataset recording its shards' tokens (``shard_values``), every
    block's tokens are known from the start, without reading a shard.
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
        w = int(shuffle_window)
        docs_batch = MIXTURE_DOC_BATCH[dataset.order_uses_batch_size]
        order = _order_of(dataset, seed, epoch, shuffle, w, docs_batch)
        if isinstance(order, GlobalOrder) and shuffle:
            bounds = np.asarray(order.window_bounds, dtype=np.int64)
        elif isinstance(order, GlobalOrder):
            offsets = np.asarray(dataset.shard_offsets, dtype=np.int64)
            bounds = offsets[np.append(np.arange(0, len(offsets) - 1, w), len(offsets) - 1)]
        else:
            bounds = np.append(np.arange(0, order.total, BLOCK_DOCS), order.total)
        docs = _Docs(dataset, pack.column, keep=max(16, 2 * w + 2), verify=verify_hashes)
        self._setup(
            dataset, pack, order, bounds, docs, (dataset.fingerprint, seed, epoch, shuffle, w, pack)
        )
        if pack.mode == "concat" and self.recorded is not None:
            self.tokens_known = self._recorded_blocks(order, shuffle, w)

    @classmethod
    def of_stream(
        cls,
        dataset: ShardSource,
        pack: PackSpec,
        order: GlobalOrder,
        shards: np.ndarray,
        docs: _Docs,
    ) -> EpochPacking:
        """One stream's packed rows (``concat``): the documents of ``shards`` (whole, in
        the shuffled ``order`` over them, one piece per shard) packed back to back, a block
        per window; every block's tokens from the recorded per-shard tokens."""
        packing = cls.__new__(cls)
        bounds = np.asarray(order.window_bounds, dtype=np.int64)
        packing._setup(dataset, pack, order, bounds, docs, None)
        recorded = packing.recorded
        if recorded is None or pack.mode != "concat":
            raise PackError("a packed stream needs recorded token counts and concat", field="mode")
        in_order = np.asarray(shards, dtype=np.int64)[order.perm]
        cuts = np.append(np.arange(0, len(in_order), order.window), len(in_order))
        sums = np.add.reduceat(recorded[in_order], cuts[:-1]) if len(in_order) else cuts[:0]
        packing.known[:, 0], packing.known[:, 1] = sums, 0
        packing.tokens_known = True
        return packing

    @classmethod
    def of_counts(
        cls,
        dataset: ShardSource,
        pack: PackSpec,
        order: Any,
        bounds: np.ndarray,
        docs: _Docs,
        counts: tuple[np.ndarray, np.ndarray],
    ) -> EpochPacking:
        """One stream's packed rows whose blocks (``order``'s positions cut at ``bounds``)
        were counted from the recorded document lengths: each block's tokens and ``bin``
        rows as ``counts`` gives them, so rows are skipped to and dealt without a shard."""
        packing = cls.__new__(cls)
        packing._setup(dataset, pack, order, np.asarray(bounds, dtype=np.int64), docs, None)
        packing.known[:, 0], packing.known[:, 1] = counts
        packing.tokens_known = True
        return packing

    def _setup(
        self,
        dataset: ShardSource,
        pack: PackSpec,
        order: Any,
        bounds: np.ndarray,
        docs: _Docs,
        key: tuple[Any, ...] | None,
    ) -> None:
        self.dataset, self.pack = dataset, pack
        self.seq_len = pack.seq_len
        self.order, self.bounds, self.docs = order, bounds, docs
        # per block: tokens and bin rows (-1: not read yet), kept per epoch unless ``key`` is
        # None (a stream's, all known from the recorded tokens)
        self.known: np.ndarray = np.full((self.blocks, 2), -1, np.int64)
        if key is not None:
            cache = _BLOCKS.setdefault(dataset, {})
            self.known = cache.setdefault(key, self.known)
            while len(cache) > 4:
                cache.pop(next(iter(cache)))
        # per shard, its tokens as the dataset's metadata records them (None: not recorded)
        self.recorded = dataset.shard_values(pack.column)
        self.docs.recorded = self.recorded
        self.tokens_known = False  # every block's tokens known without reading a shard

    def _recorded_blocks(self, order: Any, shuffle: bool, w: int) -> bool:
        """Each block's tokens from the recorded per-shard tokens, when blocks are whole
        shards (one dataset's windows); ``concat`` rows then need no shard read to count
        (``len``, even batches, skipping to a resumed row). False for other orders."""
        if not isinstance(order, GlobalOrder) or self.recorded is None:
            return False
        shards = len(self.recorded)
        if shards != len(self.dataset.shard_offsets) - 1:
            return False
        in_order = np.asarray(order.perm) if shuffle else np.arange(shards)
        cuts = np.append(np.arange(0, shards, w), shards)
        if len(cuts) - 1 != self.blocks:
            return False
        sums = np.add.reduceat(self.recorded[in_order], cuts[:-1]) if shards else cuts[:0]
        fresh = self.known[:, 0] < 0
        self.known[fresh, 0] = sums[fresh]
        self.known[fresh, 1] = 0
        return True

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
        """Rows in the whole epoch: from the recorded tokens when ``tokens_known``, else
        by reading every block's document lengths once."""
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
                if 0 <= self.known[block, 1] != n:  # counted ahead from other lengths
                    raise PackError(
                        f"block {block} of the epoch packs {n} rows, {self.known[block, 1]} "
                        "were counted from the dataset's recorded document lengths",
                        field="column",
                    )
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
