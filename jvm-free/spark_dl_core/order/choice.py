"""Which order a source's loader settings give, and the orders kept per source.

:mod:`.dataset_order` defines the windowed order and :mod:`.locality` the streamed one;
this module chooses between them (or a source's own order) for a dataset and its settings
(``streams=0``: :func:`resolve_streams`), keeps the last two per dataset so a loader and
its resumed or re-planned passes share one, and starts the next epoch's first windows.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from .dataset_order import DEFAULT_WINDOW, GlobalOrder, _Order
from .locality import StreamedOrder, auto_streams, dataset_auto_streams

if TYPE_CHECKING:
    from ..shard_source import ShardSource


def _prepare_next_epoch(dataset: weakref.ref[Any], key: tuple[Any, ...]) -> None:
    """Make the next epoch's order (same dataset and settings) and start its first
    windows on a thread: the pass now ending is in its last window."""
    source = dataset()
    _, seed, epoch, shuffle, window, batch_size, streams = key
    if source is None or not shuffle:
        return
    order = _order_of(source, seed, epoch + 1, shuffle, window, batch_size, streams)
    prepare = getattr(order, "prepare", None)
    if prepare is not None:
        prepare()


_ORDERS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], _Order]] = weakref.WeakKeyDictionary()


def resolve_streams(dataset: ShardSource, shuffle: bool, streams: int) -> int:
    """The number of streams a loader setting ``streams`` means for ``dataset``: itself,
    unless 0 (automatic): then ``auto_streams`` of its shard count and shard bytes for a
    shuffled plain source, the source's own ``auto_streams()`` for one whose own order
    takes streams (a mixture), else 1 (no streams: unshuffled, or a source that orders
    itself without them)."""
    if int(streams) != 0:
        return int(streams)
    if not shuffle:
        return 1
    if dataset.orders_itself:
        return int(dataset.auto_streams()) if dataset.streams_own_order else 1
    return dataset_auto_streams(dataset)


def streamed(dataset: ShardSource, shuffle: bool, streams: int) -> bool:
    """Whether ``dataset``'s order with these settings is drawn from streams
    (:mod:`~spark_dl_core.order.locality`, :mod:`~spark_dl_core.order.mixture_streams`): a
    shuffled plain source or mixture with ``streams > 1`` (0: automatic, see
    :func:`resolve_streams`); its order then depends on the batch size."""
    return (
        bool(shuffle)
        and (not dataset.orders_itself or dataset.streams_own_order)
        and resolve_streams(dataset, shuffle, streams) > 1
    )


def _order_of(
    dataset: ShardSource,
    seed: int,
    epoch: int,
    shuffle: bool,
    window: int,
    batch_size: int = 0,
    streams: int = 1,
) -> _Order:
    """The dataset's global order for these settings; the last two are kept per dataset, so
    a loader and its resumed or re-planned passes share one O(shards) order. A source that
    ``orders_itself`` (a mixture, a run carried on) makes its own, which may depend on the
    batch size, and on the streams where ``streams_own_order`` (a mixture); a shuffled plain
    source with ``streams > 1`` is read from streams of its shards (``streams=0``: as many as
    :func:`resolve_streams` gives)."""
    own = dataset.orders_itself
    streams = resolve_streams(dataset, shuffle, streams)
    by_streams = streamed(dataset, shuffle, streams)
    if not by_streams:
        streams = 1
        if not (own and dataset.order_uses_batch_size):
            batch_size = 0
    key = (
        dataset.fingerprint,
        int(seed),
        int(epoch),
        bool(shuffle),
        int(window),
        int(batch_size),
        int(streams),
    )
    kept = _ORDERS.setdefault(dataset, {})
    order = kept.get(key)
    if order is None:
        if own and by_streams:
            order = dataset.make_order(
                int(seed), int(epoch), bool(shuffle), int(window), int(batch_size), int(streams)
            )
        elif own:
            order = dataset.make_order(
                int(seed), int(epoch), bool(shuffle), int(window), batch_size
            )
        elif by_streams:
            order = StreamedOrder(
                np.diff(dataset.shard_offsets),
                dataset.fingerprint,
                int(seed),
                int(epoch),
                int(window),
                int(streams),
                int(batch_size),
            )
        else:
            order = GlobalOrder(
                np.diff(dataset.shard_offsets), dataset.fingerprint, seed, epoch, shuffle, window
            )
        while len(kept) >= 2:
            kept.pop(next(iter(kept)))
        kept[key] = order
        then = getattr(order, "then", None)
        if then is not None:  # the next epoch's first windows start during this one's last
            then(partial(_prepare_next_epoch, weakref.ref(dataset), key))
    return order


def global_order(
    shard_sizes: np.ndarray,
    fingerprint: str,
    seed: int,
    epoch: int,
    shuffle: bool,
    window: int = DEFAULT_WINDOW,
    *,
    streams: int = 1,
    batch_size: int = 0,
) -> np.ndarray:
    """Every sample index once, materialized: for small datasets, tests and quality figures.
    ``streams > 1`` (with ``batch_size``): the streamed order a loader with those settings
    reads (:mod:`~spark_dl_core.order.locality`); ``streams=0``: the automatic count for
    this many shards (their bytes unknown: no byte bound), as a loader's default.

    Loaders never call this; they ask :class:`GlobalOrder` for the positions they need.
    """
    if streams == 0:
        streams = auto_streams(len(shard_sizes))
    if shuffle and streams > 1:
        streamed_order = StreamedOrder(
            np.asarray(shard_sizes), fingerprint, seed, epoch, window, streams, batch_size
        )
        return streamed_order.take(0, streamed_order.total, dense=True)
    order = GlobalOrder(shard_sizes, fingerprint, seed, epoch, shuffle, window)
    return order.take(0, order.total)
