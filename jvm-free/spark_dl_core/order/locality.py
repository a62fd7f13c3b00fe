"""A locality-aware global order: the epoch's batches drawn round-robin from fixed streams.

Why: with one shuffle over the whole dataset every rank needs every shard, so N nodes pull N
copies of the data per epoch. Here the shards are split once (per fingerprint, seed, batch
size and number of streams, never per epoch or world size) into ``streams`` (P) streams of
balanced sample counts; each stream is shuffled on its own every epoch (a
:class:`~spark_dl_core.order.dataset_order.GlobalOrder` over its pieces of shards), and
global batch ``g`` is batch ``g // P`` of stream ``g % P``. Rank ``r`` of ``W`` reads global
batches ``g = r (mod W)``, so when ``W`` divides ``P`` it reads only streams ``s = r (mod W)``:
the same ``P / W`` streams every epoch, whose shards its node's cache then holds.

Stream ``s`` holds exactly the samples of the batches it serves (``B`` each, the epoch's short
last batch included), so every position of the epoch is one sample and batch ``g`` is
positions ``[g B, (g + 1) B)``, as for every other order. Streams are cut from one fixed
permutation of the shards, in bit-reversed order of their numbers when ``P`` is a power of
two: the streams of one rank (equal low bits) then lie side by side, and only the shards at
the ``W - 1`` boundaries between ranks are shared by two of them.

Memory (order version 4): a rank reading P streams holds each one's current window, so each
stream shuffles windows of ``shuffle_window // P`` pieces (at least 1, :func:`stream_window`):
the streams' windows together are the old window whenever ``P <= shuffle_window``, and
``P`` pieces when ``P`` is larger, whatever the world size. With fixed streams a stream must
keep its window's shards until it moves on, so one rank alone (``W = 1``) holds about
``max(shuffle_window, P)`` shards at once; ``P`` is therefore bounded (at most
:data:`MAX_AUTO_STREAMS` by default), never a share of the dataset.

``streams=0`` (the default, :data:`AUTO_STREAMS`) takes :func:`auto_streams` of the
dataset's shard count: the largest power of two up to 64 that leaves every stream at least
:data:`SHARDS_PER_STREAM` shards. It is derived from the dataset only (never the world size),
so every rank and every resume resolves the same number, and a state records it.

The order depends on (fingerprint, seed, epoch, shuffle window, P, B) only: a step's rows
(global batches ``kW .. kW + W - 1``) are the same at every world size, and a position counts
samples of the same order whatever the world size, so elastic resume stays exact.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import SpecError
from .dataset_order import DENSE_WORLD, GlobalOrder, _rng

if TYPE_CHECKING:
    from ..shard_source import ShardSource

# ``streams=0``: as many streams as the dataset's shards allow (:func:`auto_streams`), the
# default. Each stream's window is ``shuffle_window // streams`` pieces (at least one), so one
# rank reading every stream holds about max(shuffle_window, streams) shards, bounded whatever
# the dataset's size: any world size dividing the streams reads 1/W of the shards.
AUTO_STREAMS = 0
DEFAULT_STREAMS = AUTO_STREAMS
# The automatic count: a power of two (so every power-of-two world size up to it divides it),
# at most 64, and at most one stream per SHARDS_PER_STREAM shards: a stream then spans many
# shards, so the two it may share with its neighbours at its ends cost a few percent of a
# rank's reads, and one rank alone holds at most ~1/8 of a small dataset's shards.
MAX_AUTO_STREAMS = 64
SHARDS_PER_STREAM = 16
# ... and few enough that one rank reading every stream (W = 1, about 1.5 x streams shards
# held at once) holds at most this many bytes of shards: with 64 MiB shards 8 streams, with
# 8 MiB shards or smaller 64. A run of more ranks than the streams passes ``streams=`` itself.
AUTO_STREAMS_HELD_BYTES = 1 << 30
HELD_SHARDS_PER_STREAM = 1.5


def auto_streams(num_shards: int, shard_bytes: float = 0.0) -> int:
    """The streams ``streams=0`` takes for a dataset of ``num_shards`` shards (or blocks) of
    ``shard_bytes`` each on average (uncompressed; 0: unknown, no byte bound): the largest
    power of two ``<= min(64, num_shards // 16, AUTO_STREAMS_HELD_BYTES // (1.5 x
    shard_bytes))``, at least 1 (one stream: the window shuffle over all shards). A function
    of the dataset only, never of the world size."""
    most = min(MAX_AUTO_STREAMS, int(num_shards) // SHARDS_PER_STREAM)
    if shard_bytes > 0:
        most = min(most, int(AUTO_STREAMS_HELD_BYTES // (HELD_SHARDS_PER_STREAM * shard_bytes)))
    return 1 << (most.bit_length() - 1) if most >= 1 else 1


def dataset_auto_streams(dataset: ShardSource) -> int:
    """:func:`auto_streams` of a source: its shard count and mean uncompressed shard bytes
    (``shards.raw_bytes``: MDS shard files, Parquet row groups)."""
    shards = len(dataset.shard_offsets) - 1
    raw = np.asarray(dataset.shards.raw_bytes, dtype=np.float64)
    return auto_streams(shards, float(raw.mean()) if len(raw) else 0.0)


def stream_window(window: int, streams: int) -> int:
    """Pieces of shards in each stream's shuffle window: ``window // streams``, at least 1, so
    the windows a rank reading every stream holds together are ``window`` shards (``streams
    <= window``) or ``streams`` pieces (more streams), never ``streams x window``."""
    return int(window) if streams <= 1 else max(1, int(window) // int(streams))


def stream_lengths(total: int, streams: int, batch_size: int) -> np.ndarray:
    """Samples in each stream: ``batch_size`` for every global batch ``g`` with
    ``g % streams == s``, less the short last batch's missing samples in its stream."""
    batches = -(-total // batch_size)
    s = np.arange(streams, dtype=np.int64)
    counts = np.where(s < batches, (batches - 1 - s) // streams + 1, 0)
    lengths = counts * batch_size
    if batches:
        lengths[(batches - 1) % streams] -= batches * batch_size - total
    return lengths


def layout_slots(streams: int) -> np.ndarray:
    """The stream at each slot of the shard layout: bit-reversed numbers when ``streams``
    is a power of two (so one rank's streams, ``s = r mod W`` for ``W`` a power of two,
    sit side by side and share no shard with another rank but at its two ends), else
    ``0, 1, ...``."""
    if streams & (streams - 1):
        return np.arange(streams, dtype=np.int64)
    bits = streams.bit_length() - 1
    slots = np.arange(streams, dtype=np.int64)
    rev = np.zeros(streams, dtype=np.int64)
    for b in range(bits):
        rev |= ((slots >> b) & 1) << (bits - 1 - b)
    return rev


@lru_cache(maxsize=16)
def _pieces_cached(
    sizes: bytes, bases: bytes | None, fingerprint: str, seed: int, streams: int, batch_size: int
) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    shard_sizes = np.frombuffer(sizes, dtype=np.int64)
    starts = np.frombuffer(bases, dtype=np.int64) if bases is not None else None
    return stream_pieces(shard_sizes, fingerprint, seed, streams, batch_size, starts)


def stream_pieces(
    shard_sizes: np.ndarray,
    fingerprint: str,
    seed: int,
    streams: int,
    batch_size: int,
    bases: np.ndarray | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Per stream: its pieces of shards as (sizes, first ids), fixed for every epoch: the
    shards cut at the streams' lengths (:func:`stream_lengths`, :func:`cut_pieces`)."""
    total = int(np.asarray(shard_sizes, dtype=np.int64).sum())
    lengths = stream_lengths(total, streams, batch_size)
    return cut_pieces(shard_sizes, fingerprint, seed, lengths, bases)


def cut_pieces(
    shard_sizes: np.ndarray,
    fingerprint: str,
    seed: int,
    lengths: np.ndarray,
    bases: np.ndarray | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Shards cut into ``len(lengths)`` streams of ``lengths[s]`` samples (summing to the
    shards' total): per stream its pieces as (sizes, first ids).

    The shards are laid out in one permutation keyed by (fingerprint, seed) only, and the
    layout is cut at the streams' lengths in slot order (:func:`layout_slots`): a shard is
    whole in one stream, or split between the two streams whose boundary falls in it.
    ``bases``: each shard's first id (default: the shards back to back from 0).
    """
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    streams = len(lengths)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if int(lengths.sum()) != int(offsets[-1]):
        raise SpecError(f"streams of {int(lengths.sum())} samples cut from {offsets[-1]}")
    starts = offsets[:-1] if bases is None else np.asarray(bases, dtype=np.int64)
    perm = _rng(f"streams:{fingerprint}", seed, 0).permutation(len(sizes)).astype(np.int64)
    laid = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes[perm], out=laid[1:])
    slots = layout_slots(streams)
    cuts = np.zeros(streams + 1, dtype=np.int64)
    np.cumsum(lengths[slots], out=cuts[1:])
    out: list[tuple[np.ndarray, np.ndarray]] = [(np.empty(0, np.int64),) * 2] * streams
    for t, s in enumerate(slots.tolist()):
        a, z = int(cuts[t]), int(cuts[t + 1])
        if z <= a:
            continue
        k = np.arange(np.searchsorted(laid, a, "right") - 1, np.searchsorted(laid, z, "left"))
        lo = np.maximum(laid[k], a)
        hi = np.minimum(laid[k + 1], z)
        keep = hi > lo
        out[s] = ((hi - lo)[keep], (starts[perm[k]] + (lo - laid[k]))[keep])
    return tuple(out)


def check_streamed(streams: int, batch_size: int, window: int, what: str) -> None:
    """Refuse settings no streamed order (``what``) can be drawn with, naming the setting."""
    if streams < 1:
        raise SpecError(f"streams must be >= 1, got {streams}")
    if batch_size < 1:
        raise SpecError(f"{what} needs a batch size >= 1, got {batch_size}")
    if window < 1:
        raise SpecError(f"shuffle_window must be >= 1 shard, got {window}")


class RoundRobinOrder:
    """An epoch's order over ``streams`` (P) streams of batches: global batch ``g`` is batch
    ``g // P`` of stream ``g % P`` (each stream ``B`` samples a batch). Subclasses give
    each stream's own order (:meth:`stream`, anything with ``take``) and what each holds
    (:meth:`held`); a plain dataset's :class:`StreamedOrder`, a mixture's
    :class:`~spark_dl_core.order.mixture_streams.StreamedMixtureOrder`."""

    total: int
    streams: int
    batch_size: int

    def stream(self, s: int) -> Any:
        raise NotImplementedError

    def held(self, streams: list[int]) -> dict[str, Any]:
        """What ``streams`` hold of the data: ``data_share`` (their share of the samples
        the order's shards hold), and more where the order can say it."""
        raise NotImplementedError

    def __len__(self) -> int:
        return self.total

    def take(self, start: int, stop: int, dense: bool = False) -> np.ndarray:
        """Ids at positions ``start:stop``: each global batch's part from its stream. The
        batches one stream serves in the range are consecutive in that stream's order (all
        but its last are whole), so each stream is asked once, for one run of positions,
        and the batches are cut from those runs."""
        if stop <= start:
            return np.empty(0, dtype=np.int64)
        size, p = self.batch_size, self.streams
        first, last = start // size, (stop - 1) // size
        runs: dict[int, tuple[np.ndarray, int]] = {}
        for g in range(first, min(last, first + p - 1) + 1):  # each stream's first batch
            end = g + ((last - g) // p) * p  # its last batch in the range
            lo = (g // p) * size + max(start, g * size) - g * size
            hi = (end // p) * size + min(stop, end * size + size) - end * size
            runs[g % p] = (self._stream_take(g % p, lo, hi, dense), lo)
        parts = []
        for g in range(first, last + 1):
            ids, lo = runs[g % p]
            at = g * size
            base = (g // p) * size - lo
            parts.append(ids[base + max(start, at) - at : base + min(stop, at + size) - at])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def take_run(self, g: int, count: int, dense: bool = False) -> np.ndarray:
        """Ids of global batches ``g, g + P, ..., g + (count - 1) P``: consecutive batches
        of stream ``g % P``, one take of it (a reader decoding one stream's batches at once
        gathers from that stream's few shards; see ``EpochPlan.stream_period``)."""
        size, p = self.batch_size, self.streams
        last = g + (count - 1) * p
        lo, hi = (g // p) * size, (last // p) * size + min(size, self.total - last * size)
        return self._stream_take(g % p, lo, hi, dense)

    def _stream_take(self, s: int, lo: int, hi: int, dense: bool) -> np.ndarray:
        """Stream ``s``'s ids at its positions ``lo:hi``."""
        return np.asarray(self.stream(s).take(lo, hi, dense))

    def dense_for(self, world_size: int) -> bool:
        """Whether a rank of ``world_size`` reads enough of each of its streams that
        computing a stream window's whole order at once pays (see ``GlobalOrder.ids``)."""
        return world_size // math.gcd(world_size, self.streams) <= DENSE_WORLD


class StreamedOrder(RoundRobinOrder):
    """The lazy order of one epoch over ``streams`` fixed streams (see the module's text).

    Holds the streams' pieces (O(shards) in all) and, once read, each stream's
    :class:`GlobalOrder`; ``take`` maps a position range batch by batch to its stream.
    """

    def __init__(
        self,
        shard_sizes: np.ndarray,
        fingerprint: str,
        seed: int,
        epoch: int,
        window: int,
        streams: int,
        batch_size: int,
        *,
        bases: np.ndarray | None = None,
    ) -> None:
        check_streamed(streams, batch_size, window, "a streamed order")
        sizes = np.ascontiguousarray(shard_sizes, dtype=np.int64)
        self.total = int(sizes.sum())
        self.streams, self.batch_size = int(streams), int(batch_size)
        self.fingerprint, self.seed, self.epoch, self.window = fingerprint, seed, epoch, window
        raw_bases = None if bases is None else np.ascontiguousarray(bases, np.int64).tobytes()
        self.pieces = _pieces_cached(
            sizes.tobytes(), raw_bases, fingerprint, int(seed), self.streams, self.batch_size
        )
        self._orders: dict[int, GlobalOrder] = {}

    def stream(self, s: int) -> GlobalOrder:
        """Stream ``s``'s order this epoch (its own key, so streams shuffle apart), in
        windows of :func:`stream_window` pieces."""
        order = self._orders.get(s)
        if order is None:
            sizes, bases = self.pieces[s]
            order = GlobalOrder(
                sizes,
                f"{self.fingerprint}:stream{s}/{self.streams}",
                self.seed,
                self.epoch,
                True,
                stream_window(self.window, self.streams),
                bases=bases,
            )
            self._orders[s] = order
        return order

    def ids(self, positions: np.ndarray) -> np.ndarray:
        """Ids at arbitrary ``positions`` (each in ``0..total-1``)."""
        pos = np.asarray(positions, dtype=np.int64)
        out = np.empty_like(pos)
        g = pos // self.batch_size
        s = g % self.streams
        inside = (g // self.streams) * self.batch_size + pos % self.batch_size
        for stream in np.unique(s).tolist():
            here = s == stream
            out[here] = self.stream(stream).ids(inside[here])
        return out

    def held(self, streams: list[int]) -> dict[str, Any]:
        got = sum(int(self.pieces[s][0].sum()) for s in streams)
        return {"data_share": got / max(1, self.total)}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_orders"] = {}  # each process builds the streams it reads
        return state

    @property
    def nbytes(self) -> int:
        """Memory held: the streams' pieces and the orders built, O(shards)."""
        pieces = sum(a.nbytes + b.nbytes for a, b in self.pieces)
        return pieces + sum(o.nbytes for o in self._orders.values())


def rank_streams(streams: int, rank: int, world_size: int) -> list[int]:
    """The streams rank ``rank`` of ``world_size`` reads batches of: ``s = rank (mod
    gcd(world_size, streams))``, ``streams / world_size`` of them when ``world_size``
    divides ``streams``, more (a larger share of the data) when it does not."""
    step = math.gcd(world_size, streams)
    return list(range(rank % step, streams, step))


def locality_report(order: Any, rank: int, world_size: int) -> dict[str, Any]:
    """How local a rank's reads are under ``order``: the streams it reads, the share of the
    data they hold (a mixture's: of its sources' samples, and per source), and the ideal
    share (``1 / world_size``). A world size that does not divide the streams reads a share
    ``1 / gcd(world_size, streams)``; an order without streams (unshuffled, ``streams=1``)
    needs every shard on every rank."""
    if not isinstance(order, RoundRobinOrder):
        return {"streams": 1, "streams_read": 1, "data_share": 1.0, "ideal_share": 1 / world_size}
    mine = rank_streams(order.streams, rank, world_size)
    return {
        "streams": order.streams,
        "streams_read": len(mine),
        **order.held(mine),
        "ideal_share": 1 / world_size,
    }
