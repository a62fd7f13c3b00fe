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
from .packed_epoch import EpochPacking, _Chunk, _Docs, bin_rows
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

# per dataset, an epoch's ``bin`` streams counted: (seed, epoch, streams, window, pack) ->
# each stream's tokens and rows per block (the last four epochs' kept)
_BIN_BLOCKS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], dict[int, Any]]] = (
    weakref.WeakKeyDictionary()
)

# ``streams=0``: the automatic streams halved until each stream holds at least this many rows,
# so the padding of a stream's last row and its short last batch stay under 0.1% of its rows.
MIN_STREAM_ROWS = 1024


def packed_streams(dataset: ShardSource, settings: LoaderSettings) -> int:
    """The streams a packed loader's rows are cut from: 1 (one run of rows, pack version 1)
    unless a shuffled plain source records its shards' tokens (``concat``) and, for
    ``bin``, each document's length (:meth:`~spark_dl_core.shard_source.ShardSource.doc_lengths`),
    with ``streams`` resolving above 1 (0, automatic: halved while a stream would hold fewer
    than :data:`MIN_STREAM_ROWS` rows)."""
    pack = settings.pack
    if pack is None or not settings.shuffle or dataset.orders_itself:
        return 1
    if pack.mode == "bin" and dataset.doc_lengths(pack.column, []) is None:
        return 1  # a stream's best-fit rows need every document's length
    recorded = dataset.shard_values(pack.column)
    if recorded is None:
        return 1
    streams = resolve_streams(dataset, True, settings.streams)
    if settings.streams == AUTO_STREAMS:
        rows = int(np.asarray(recorded).sum()) // pack.seq_len
        while streams > 1 and rows // streams < MIN_STREAM_ROWS:
            streams //= 2
    return max(1, streams)


class StreamedPacking:
    """One epoch's packed rows over ``streams`` streams (all ranks'): each stream's
    :class:`EpochPacking` made when first read, their rows and batches counted from the
    recorded tokens, and the global batches dealt over them (:attr:`rounds`)."""

    tokens_known = True  # every count comes from the recorded tokens

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
        recorded = dataset.shard_values(pack.column)
        assert recorded is not None  # packed_streams() chose streams for recorded tokens only
        self.dataset, self.pack, self.seq_len = dataset, pack, pack.seq_len
        self.seed, self.epoch, self.streams = int(seed), int(epoch), int(streams)
        self.window = stream_window(int(shuffle_window), self.streams)
        recorded = np.asarray(recorded, dtype=np.int64)
        self.stream_of = weighted_streams(recorded, dataset.fingerprint, self.seed, self.streams)
        self.tokens = np.bincount(self.stream_of, weights=recorded, minlength=self.streams)
        self.tokens = self.tokens.astype(np.int64)
        self.shards = np.bincount(self.stream_of, minlength=self.streams)
        self._orders: dict[int, GlobalOrder] = {}
        # per stream and block (window): its tokens and ``bin`` rows, from recorded lengths
        self._blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if pack.mode == "bin":  # counted once an epoch (a loader plans its length, then a pass)
            cache = _BIN_BLOCKS.setdefault(dataset, {})
            key = (self.seed, self.epoch, self.streams, self.window, pack.model_dump_json())
            self._blocks = cache.get(key) or {s: self._bin_blocks(s) for s in range(streams)}
            cache[key] = cache.pop(key, self._blocks)  # most recent last
            while len(cache) > 4:
                cache.pop(next(iter(cache)))
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
        if pack.mode == "bin":  # a shard whose documents are not those lengths is refused
            self.docs.expected = self._recorded_lengths
        self._packings: dict[int, EpochPacking] = {}

    def _order(self, s: int) -> GlobalOrder:
        """Stream ``s``'s document order this epoch: its shards shuffled with its own key."""
        found = self._orders.get(s)
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

    def _recorded_lengths(self, shard: int) -> np.ndarray:
        got = self.dataset.doc_lengths(self.pack.column, [shard])
        assert got is not None  # packed_streams() chose bin streams for recorded lengths only
        return got[0]

    def _bin_blocks(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """Stream ``s``'s tokens and ``bin`` rows this epoch per block, as
        :class:`EpochPacking` packs them (best fit within each block's documents in order),
        from the recorded document lengths: every rank counts every stream's rows, reading
        no shard."""
        ds, order = self.dataset, self._order(s)
        shards = np.flatnonzero(self.stream_of == s)
        got = ds.doc_lengths(self.pack.column, shards.tolist())
        assert got is not None  # packed_streams() chose bin streams for recorded lengths only
        lengths = np.concatenate(got) if got else np.zeros(0, np.int64)
        offsets = np.asarray(ds.shard_offsets, dtype=np.int64)
        at = np.zeros(len(offsets) - 1, dtype=np.int64)  # each shard's first in ``lengths``
        at[shards] = np.concatenate([[0], np.cumsum([len(g) for g in got])[:-1]]).astype(np.int64)
        bounds = np.asarray(order.window_bounds, dtype=np.int64)
        tokens = np.zeros(len(bounds) - 1, dtype=np.int64)
        rows = np.zeros(len(bounds) - 1, dtype=np.int64)
        for b in range(len(bounds) - 1):
            ids = order.take(int(bounds[b]), int(bounds[b + 1]))
            shard_of = np.searchsorted(offsets, ids, side="right") - 1
            block = lengths[at[shard_of] + ids - offsets[shard_of]].astype(np.int64)
            tokens[b], rows[b] = int(block.sum()), bin_rows(block, self.seq_len, self.pack.window)
        return tokens, rows

    def stream(self, s: int) -> EpochPacking:
        """Stream ``s``'s packed rows this epoch (its own shuffle key)."""
        found = self._packings.get(s)
        if found is None:
            shards = np.flatnonzero(self.stream_of == s)
            found = EpochPacking.of_stream(
                self.dataset, self.pack, self._order(s), shards, self.docs, self._blocks.get(s)
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
