"""Packed rows cut from streams, so a rank reads only its streams' shards (see :mod:`.packing`).

Why apart: :mod:`.packed_epoch` packs one epoch's documents into one run of rows that every
rank cuts its batches from, so every rank reads every shard. Here (pack version 2) the
shards are cut once into ``P`` streams of whole shards balanced by their recorded tokens
(:func:`~spark_dl_core.order.token_streams.weighted_streams`); each stream shuffles its own
shards every epoch and packs its own documents (``concat`` or ``bin``) into its own rows,
cut into batches of ``batch_size`` rows (its last batch short unless ``drop_last`` drops
it). Global batches go round-robin over the streams by rounds, skipping streams that ran
out (:class:`~spark_dl_core.order.token_streams.StreamRounds`), so global batch ``g`` is
found from the recorded counts alone (a ``concat`` stream's rows from its tokens; a ``bin``
stream's by best fit over its documents' recorded lengths, every stream's counted on every
rank, which reads about 1.5 bytes a document and no shard), and rank ``r`` of ``W`` (taking
``g = r mod W``) reads only streams ``s = r mod W`` until the first stream ends, when ``W``
divides ``P``. A position is a count of global batches: the same batches at every world
size and worker count.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..order import GlobalOrder, rank_streams, resolve_streams, stream_window
from ..order.locality import AUTO_STREAMS
from ..order.token_streams import StreamRounds, weighted_streams
from .packed_epoch import MIXTURE_DOC_BATCH, EpochPacking, _Chunk, _Docs, bin_rows
from .packed_rows import (
    IGNORE_INDEX,
    STRETCH_TOKENS,
    PackedBatch,
    _Stage,
    _Stretch,
    _until,
    assemble,
)
from .settings import LoaderSettings, PackSpec

if TYPE_CHECKING:
    from ..shard_source import ShardSource

# per dataset, an epoch's streams counted from document lengths: (seed, epoch, streams,
# window, pack) -> each stream's tokens and rows per block and its shards (four epochs kept)
_COUNTED: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], dict[int, Any]]] = (
    weakref.WeakKeyDictionary()
)

# ``streams=0``: the automatic streams halved until each stream holds at least this many rows,
# so the padding of a stream's last row and its short last batch stay under 0.1% of its rows.
MIN_STREAM_ROWS = 1024


def packed_streams(dataset: ShardSource, settings: LoaderSettings) -> int:
    """The streams a packed loader's rows are cut from: 1 (one run of rows, pack version 1)
    unless, shuffled, a plain source records its shards' tokens (``concat``) and, for
    ``bin``, each document's length
    (:meth:`~spark_dl_core.shard_source.ShardSource.doc_lengths`), or a mixture drawn from
    streams (:attr:`~spark_dl_core.shard_source.SourceCapabilities.streams_own_order`) whose
    sources all record each document's length; with ``streams`` resolving above 1 (0,
    automatic: halved while a stream would hold fewer than :data:`MIN_STREAM_ROWS` rows)."""
    pack = settings.pack
    if pack is None or not settings.shuffle:
        return 1
    if dataset.orders_itself and not dataset.streams_own_order:
        return 1  # a run carried on, a schedule in tokens: the unstreamed order
    if (pack.mode == "bin" or dataset.orders_itself) and dataset.doc_lengths(
        pack.column, []
    ) is None:
        return 1  # a stream's rows (best fit, or a mixture's share) need each document's length
    if not dataset.orders_itself and dataset.shard_values(pack.column) is None:
        return 1  # a plain stream's shards are balanced by their recorded tokens
    streams = resolve_streams(dataset, True, settings.streams)
    if settings.streams == AUTO_STREAMS and streams > 1:
        rows = _epoch_tokens(dataset, pack.column) // pack.seq_len
        while streams > 1 and rows // streams < MIN_STREAM_ROWS:
            streams //= 2
    return max(1, streams)


def _epoch_tokens(dataset: ShardSource, column: str) -> int:
    """About how many tokens an epoch packs: a plain source's recorded tokens; a mixture's
    epoch of documents times the mean length recorded over its sources' shards."""
    if not dataset.orders_itself:
        recorded = dataset.shard_values(column)
        return 0 if recorded is None else int(np.asarray(recorded).sum())
    got = dataset.doc_lengths(column, range(len(dataset.shard_offsets) - 1)) or []
    docs = sum(len(g) for g in got)
    return int(len(dataset) * sum(int(g.sum()) for g in got) / max(1, docs))


# A packed mixture stream's blocks (the documents packed at once, best fit's reach in bin)
# hold as many documents as the sources' shards do on average, within these bounds: a rank
# that takes another stream's last batches (once the shortest stream ended) reads that
# stream's last block, about a shard, as a plain source's streams read a window of one shard.
# Blocks of 4,096 documents over 128 KiB shards of ~250 made simulated nodes land 0.40 of
# the dataset each (4 nodes x 1), not 0.25.
MIXTURE_BLOCK_DOCS = (64, 1 << 16)


class StreamedPacking:
    """One epoch's packed rows over ``streams`` streams (all ranks'): each stream's
    :class:`EpochPacking` made when first read, their rows and batches counted from the
    recorded tokens or document lengths, and the global batches dealt over them
    (:attr:`rounds`).

    A plain source's streams are whole shards balanced by tokens; a mixture's are the
    streams of its own streamed order (each source's shards cut over them), whose documents
    a stream packs in blocks of about a shard's documents."""

    tokens_known = True  # every count comes from the recorded tokens or lengths

    def __init__(
        self,
        dataset: ShardSource,
        pack: PackSpec,
        *,
        seed: int,
        epoch: int,
        shuffle_window: int,
        streams: int,
        batch_size: int,
        drop_last: bool,
        verify_hashes: bool | None = None,
    ) -> None:
        self.dataset, self.pack, self.seq_len = dataset, pack, pack.seq_len
        self.seed, self.epoch, self.streams = int(seed), int(epoch), int(streams)
        self.mixed = dataset.orders_itself  # a mixture: its own streamed order's streams
        self._orders: dict[int, Any] = {}
        if self.mixed:
            self.window = int(shuffle_window)
            docs_batch = MIXTURE_DOC_BATCH[dataset.order_uses_batch_size]
            self._mixture_order = dataset.make_order(
                self.seed, self.epoch, True, self.window, docs_batch, self.streams
            )
        else:
            recorded = dataset.shard_values(pack.column)
            assert recorded is not None  # packed_streams() chose streams for recorded tokens
            self.window = stream_window(int(shuffle_window), self.streams)
            recorded = np.asarray(recorded, dtype=np.int64)
            fp = dataset.fingerprint
            self.stream_of = weighted_streams(recorded, fp, self.seed, self.streams)
            self.tokens = np.bincount(self.stream_of, weights=recorded, minlength=self.streams)
            self.tokens = self.tokens.astype(np.int64)
            self.shards = np.bincount(self.stream_of, minlength=self.streams)
        # per stream: each block's tokens and ``bin`` rows, and the shards it reads, counted
        # from the recorded document lengths (a mixture's streams, and ``bin``)
        self._blocks: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}
        self.from_lengths = self.mixed or pack.mode == "bin"
        if self.from_lengths:  # counted once an epoch (a loader plans its length, then a pass)
            cache = _COUNTED.setdefault(dataset, {})
            key = (self.seed, self.epoch, self.streams, self.window, pack.model_dump_json())
            self._blocks = cache.get(key) or {s: self._count(s) for s in range(streams)}
            cache[key] = cache.pop(key, self._blocks)  # most recent last
            while len(cache) > 4:
                cache.pop(next(iter(cache)))
            self.tokens = np.array([int(self._blocks[s][0].sum()) for s in range(streams)])
            self.shards = np.array([self._blocks[s][2] for s in range(streams)])
        if pack.mode == "bin":
            self.rows = np.array([int(self._blocks[s][1].sum()) for s in range(streams)])
        else:
            self.rows = -(-self.tokens // self.seq_len)  # per stream (its last row padded)
        b = int(batch_size)
        self.batch_size = b
        self.stream_batches = self.rows // b if drop_last else -(-self.rows // b)
        self.rounds = StreamRounds(self.stream_batches)
        # a stream's blocks are read once a pass and hold their own shards' bytes: the
        # tables kept are the plain packing's few windows, not one set per stream
        keep = max(16, 2 * self.window + 2)
        self.docs = _Docs(dataset, pack.column, keep=keep, verify=verify_hashes)
        if self.from_lengths:  # a shard whose documents are not those lengths is refused
            self.docs.expected = self._recorded_lengths
        self._packings: dict[int, EpochPacking] = {}

    def _order(self, s: int) -> Any:
        """Stream ``s``'s document order this epoch: a plain source's shards of the stream
        shuffled with the stream's own key; a mixture's stream of its streamed order."""
        found = self._orders.get(s)
        if found is None and self.mixed:
            found = self._orders[s] = self._mixture_order.stream(s)
        if found is None:
            ds = self.dataset
            shards = np.flatnonzero(self.stream_of == s)
            offsets = np.asarray(ds.shard_offsets, dtype=np.int64)
            found = self._orders[s] = GlobalOrder(
                offsets[shards + 1] - offsets[shards],
                f"{ds.fingerprint}:packed-stream{s}/{self.streams}",
                self.seed,
                self.epoch,
                True,
                self.window,
                bases=offsets[shards],
            )
        return found

    def _bounds(self, s: int) -> np.ndarray:
        """Stream ``s``'s blocks: a plain stream's windows, a mixture stream's runs of
        about a shard's documents (:data:`MIXTURE_BLOCK_DOCS`)."""
        order = self._order(s)
        if not self.mixed:
            return np.asarray(order.window_bounds, dtype=np.int64)
        offsets = self.dataset.shard_offsets
        low, high = MIXTURE_BLOCK_DOCS
        size = min(high, max(low, int(offsets[-1]) // max(1, len(offsets) - 1)))
        return np.append(np.arange(0, order.total, size), order.total).astype(np.int64)

    def _recorded_lengths(self, shard: int) -> np.ndarray:
        got = self.dataset.doc_lengths(self.pack.column, [shard])
        assert got is not None  # packed_streams() chose these streams for recorded lengths
        return got[0]

    def _count(self, s: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Stream ``s``'s tokens and ``bin`` rows this epoch per block, as
        :class:`EpochPacking` packs them (best fit within each block's documents in order),
        and the shards its documents lie in, from the recorded document lengths: every rank
        counts every stream, reading no shard."""
        ds, order, bounds = self.dataset, self._order(s), self._bounds(s)
        offsets = np.asarray(ds.shard_offsets, dtype=np.int64)
        tables: dict[int, np.ndarray] = {}
        tokens = np.zeros(len(bounds) - 1, dtype=np.int64)
        rows = np.zeros(len(bounds) - 1, dtype=np.int64)
        bins = self.pack.mode == "bin"
        for b in range(len(bounds) - 1):
            ids = np.asarray(order.take(int(bounds[b]), int(bounds[b + 1])), dtype=np.int64)
            shard_of = np.searchsorted(offsets, ids, side="right") - 1
            by_shard = np.argsort(shard_of, kind="stable")
            ordered = shard_of[by_shard]
            cuts = np.flatnonzero(np.diff(ordered)) + 1
            new = [int(x) for x in np.unique(ordered) if int(x) not in tables]
            if new:
                got = ds.doc_lengths(self.pack.column, new)
                assert got is not None  # packed_streams() chose streams for recorded lengths
                tables.update(zip(new, got))
            block = np.empty(len(ids), dtype=np.int64)
            for run in np.split(by_shard, cuts) if len(ids) else []:
                shard = int(shard_of[run[0]])
                block[run] = tables[shard][ids[run] - offsets[shard]]
            tokens[b] = int(block.sum())
            rows[b] = bin_rows(block, self.seq_len, self.pack.window) if bins else 0
        return tokens, rows, len(tables)

    def stream(self, s: int) -> EpochPacking:
        """Stream ``s``'s packed rows this epoch (its own shuffle key)."""
        found = self._packings.get(s)
        if found is None:
            order, counted = self._order(s), self._blocks.get(s)
            if counted is None:  # a plain stream's concat rows: from its shards' tokens
                shards = np.flatnonzero(self.stream_of == s)
                found = EpochPacking.of_stream(self.dataset, self.pack, order, shards, self.docs)
            else:
                found = EpochPacking.of_counts(
                    self.dataset, self.pack, order, self._bounds(s), self.docs, counted[:2]
                )
            self._packings[s] = found
        return found

    def span(self, s: int, k: int) -> tuple[int, int]:
        """Stream ``s``'s rows of its batch ``k``."""
        a = k * self.batch_size
        return a, min(a + self.batch_size, int(self.rows[s]))


class _StreamReads:
    """What one rank's pass holds of one stream: its packed blocks from the first row it
    reads on, the blocks still needed, and its staging bytes."""

    def __init__(self, packing: EpochPacking, row: int) -> None:
        self.chunks = packing.chunks_from(row)
        self.held: list[_Chunk] = []
        self.complete = row
        self.stage = _Stage()

    def load(self, a: int, b: int) -> list[_Chunk]:
        """The blocks holding rows ``a`` to ``b`` (read on until they are complete)."""
        while self.complete < b:
            chunk = next(self.chunks, None)
            if chunk is None:
                break
            self.held.append(chunk)
            self.complete = max(self.complete, chunk.complete)
        self.held[:] = [ch for ch in self.held if ch.last_row >= a]
        return self.held


class StreamedPackedPlan:
    """One rank's packed batches of one epoch from ``batches`` consumed global batches on.

    Global batch ``g`` goes to rank ``g % world_size`` (its ``j``-th to worker ``j %
    workers``). ``drop_last``: each stream's short last batch is dropped and the epoch's
    tail cut to whole rounds of ``world_size``. Over several ranks with ``even_batches``
    the last round is filled with repeats of the epoch's first batches, every label -100 (and
    ``pad_mask`` all true when asked). With neither, ranks differ by one batch at most.
    The same interface as :class:`~.packed_rows.PackedPlan`, its position in batches.
    """

    def __init__(
        self,
        packing: StreamedPacking,
        rank: int,
        world_size: int,
        drop_last: bool,
        batches: int = 0,
        even_batches: bool = False,
        pad_mask: bool = False,
    ) -> None:
        self.packing = packing
        self.rank, self.world_size, self.drop_last = int(rank), int(world_size), drop_last
        self.rows = int(batches)  # the position, in global batches (``rows`` for the loaders)
        self.even = bool(even_batches) and self.world_size > 1 and not drop_last
        self.pad_mask = pad_mask
        self.total = packing.rounds.total

    def _count(self) -> int:
        """Global batches dealt from the position on (repeats of an even last round in)."""
        rest, w = max(0, self.total - self.rows), self.world_size
        if self.drop_last:
            return rest - rest % w
        if self.even:
            return -(-rest // w) * w
        return rest

    def __len__(self) -> int:
        return max(0, -(-(self._count() - self.rank) // self.world_size))

    def rows_after(self, steps: int) -> int:
        """Global batches consumed once every rank has taken ``steps`` batches of this plan:
        the whole epoch once no rank has a batch left."""
        if steps > 0 and steps * self.world_size >= self._count():
            return self.total
        return min(self.total, self.rows + steps * self.world_size)

    def locality(self) -> dict[str, Any]:
        """How local this rank's reads are: the streams its batches come from (until the
        first stream ends), their share of the epoch's tokens and of the shards, beside the
        ideal share ``1 / world_size``."""
        p = self.packing
        mine = rank_streams(p.streams, self.rank, self.world_size)
        tokens = max(1, int(p.tokens.sum()))
        return {
            "streams": p.streams,
            "streams_read": len(mine),
            "data_share": float(p.tokens[mine].sum()) / tokens,
            "shard_share": float(p.shards[mine].sum()) / max(1, int(p.shards.sum())),
            "ideal_share": 1 / self.world_size,
        }

    @property
    def touched(self) -> set[int]:
        """The shards this plan's streams have read (in this process)."""
        return self.packing.docs.touched

    def batches(
        self, worker: int = 0, workers: int = 1, compact: bool = False
    ) -> Iterator[tuple[Any, int]]:
        """This rank's batches for ``worker`` of ``workers``: (batch, real tokens). A stream's
        next few batches for this worker are made at once (a :class:`_Stretch`); a repeat
        of an even last round on its own. ``compact``: as :meth:`PackedPlan.batches`."""
        p, w = self.packing, self.world_size
        mine = len(self)
        seq_len, pad, column = p.seq_len, int(p.pack.pad_id or 0), p.pack.column
        # each stream read stages its own stretch of STRETCH_TOKENS slots (its tokens' bytes:
        # 1-2 MiB a stream). Splitting one budget over the streams made 4 streams' stretches a
        # quarter as long, at 0.82-0.85x one run's batches/s in-process; whole: 0.94-0.95x
        spread = p.streams // math.gcd(w, p.streams)  # streams this rank reads
        ahead = max(1, STRETCH_TOKENS // (p.batch_size * seq_len))
        reads: dict[int, _StreamReads] = {}
        made: dict[int, tuple[_Stretch, int]] = {}  # batch j -> its stretch and index there
        scan = ahead * spread  # this worker's next batches holding ``ahead`` of one stream
        for j in range(worker, mine, workers):
            g = self.rows + self.rank + j * w
            if g >= self.total:  # an even last round's repeat
                again, _ = self._repeat(g - self.total)
                if self.pad_mask:
                    again["pad_mask"] = np.ones(again["input_ids"].shape[0], dtype=bool)
                yield again, 0
                continue
            if j not in made:  # this stream's next few batches (its earlier ones were taken)
                js = [x for x in range(j, min(mine, j + scan * workers), workers)]
                gs = np.array([self.rows + self.rank + x * w for x in js], dtype=np.int64)
                live = gs < self.total
                js = [x for x, keep in zip(js, live.tolist()) if keep]
                streams, ks = p.rounds.locate(gs[live])
                s = int(streams[0])
                pick = [i for i in range(len(js)) if int(streams[i]) == s][:ahead]
                spans = [p.span(s, int(ks[i])) for i in pick]
                read = reads.get(s)
                if read is None:
                    read = reads[s] = _StreamReads(p.stream(s), spans[0][0])
                held = read.load(spans[0][0], spans[-1][1])
                picked = [js[i] for i in pick]
                stretch = _Stretch(held, spans, picked, seq_len, pad, column, read.stage)
                made.update({x: (stretch, i) for i, x in enumerate(picked)})
            stretch, i = made.pop(j)
            batch: Any
            batch, real_tokens = stretch.compact(i) if compact else stretch.batch(i)
            if self.pad_mask:
                rows = (batch.tokens.shape[0] // seq_len) if compact else len(batch["input_ids"])
                mask = np.zeros(rows, dtype=bool)
                if isinstance(batch, PackedBatch):
                    batch.extra["pad_mask"] = mask
                else:
                    batch["pad_mask"] = mask
            yield batch, real_tokens

    def _repeat(self, g: int) -> tuple[dict[str, Any], int]:
        """Global batch ``g % total`` again, every label -100, no real tokens counted."""
        p = self.packing
        streams, ks = p.rounds.locate(np.array([g % max(1, self.total)]))
        s = int(streams[0])
        a, b = p.span(s, int(ks[0]))
        chunks = list(_until(p.stream(s).chunks_from(a), b))
        batch, _ = assemble(chunks, a, b, p.seq_len, int(p.pack.pad_id or 0), p.pack.column)
        batch["labels"][:] = IGNORE_INDEX
        return batch, 0
