"""Reading a dataset in an epoch's order: what ``Dataset.iter_batches``, ``sample_order``,
``to_arrow``, ``to_torch`` and ``to_tf`` do.

:class:`~spark_dl_core.sources.dataset.Dataset` is the room of files, shards and decoded samples; it
knows nothing of orders, readers, loader settings or frameworks. Its loading methods hand
over to the functions here, which the package face (``spark_dl_core/__init__.py``) hands to
the dataset room (``sources.dataset.install``), so imports run one way: this room imports
the dataset, the order, the reader, the settings and the framework registry, and none of
them imports it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from ..meta import column_names
from ..ops.arrow import arrow_schema, batch_to_arrow
from ..order import DEFAULT_STREAMS, EpochPlan
from ..sources.dataset import Batch, Dataset
from .frameworks import adapter
from .packing import iter_packed
from .position import adopted, resumed
from .reader import BatchReader
from .settings import (
    PAD_MASK,
    LoaderSettings,
    batch_size_of,
    check_pad_mask,
    reader_extras,
    settings_from,
)


def iter_batches(
    ds: Dataset,
    batch_size: int | None = None,
    *,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    rank: int = 0,
    world_size: int = 1,
    settings: LoaderSettings | None = None,
    state: dict[str, Any] | None = None,
    start_batch: int = 0,
    consumed: int = 0,
    strict: bool = True,
    **kwargs: Any,
) -> Iterator[Batch]:
    """Batches (dicts of numpy arrays) of this rank's share of one epoch.

    The global order depends only on (fingerprint, seed, epoch, shuffle settings); see
    :mod:`spark_dl_core.order`. Other settings (``columns``, ``drop_last``, ``images``,
    ``verify_hashes``, ``shuffle_window``, ``prefetch_bytes``...) are those of
    :class:`~spark_dl_core.loaders.settings.LoaderSettings`. ``state`` (a loader's
    ``state_dict()``) continues after the samples it records as consumed (elastic
    resume); ``consumed=`` / ``start_batch=`` are deprecated spellings of it. ``strict=False``
    lets a changed mixture carry on from another one's state (docs/mixtures.md).
    Shards are loaded ahead by a thread within ``prefetch_bytes`` of decompressed data.
    ``transforms`` are read-time ops (image pipeline, normalize…), after the spec's own.
    """
    batch_size = batch_size_of(batch_size, settings, "iter_batches")
    if settings is None:
        kwargs = dict(
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            epoch=epoch,
            rank=rank,
            world_size=world_size,
            **kwargs,
        )
    chosen = settings_from(settings, kwargs)
    chosen.only("numpy iteration", frozenset())
    if chosen.pack is not None:  # packed token rows (spark_dl_core.loaders.packing)
        return iter_packed(ds, chosen, state, strict)
    check_pad_mask(chosen, ds.layout.names)
    epoch = chosen.epoch
    if state is not None:
        loaded, carried, epoch, consumed = resumed(ds, chosen, state, strict)
        chosen = adopted(chosen, loaded, carried)
        ds = carried  # type: ignore[assignment]  # a dataset's carried-on variant is one
    elif consumed or start_batch:
        warnings.warn(
            "iter_batches(consumed=, start_batch=) is deprecated: pass state= "
            "(a loader's state_dict())",
            DeprecationWarning,
            stacklevel=3,
        )
    plan = sample_order(ds, settings=chosen.replace(epoch=epoch), consumed=consumed)
    # Built now, not at the first batch: columns and read-time ops are checked here.
    batches = plan[start_batch:]
    reader = BatchReader(
        ds,
        batches,
        columns=chosen.column_list,
        images=chosen.images,
        verify_hashes=chosen.verify_hashes,
        prefetch_bytes=chosen.prefetch_bytes,
        seed=chosen.seed,
        epoch=epoch,
        **reader_extras(chosen),
    )
    if not chosen.pad_mask:
        return iter(reader)

    def masked() -> Iterator[Batch]:
        for k, batch in enumerate(reader):
            batch[PAD_MASK] = plan.pad_mask(start_batch + k)
            yield batch

    return masked()


def sample_order(
    ds: Dataset,
    batch_size: int | None = None,
    *,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    rank: int = 0,
    world_size: int = 1,
    drop_last: bool = False,
    shuffle_window: int | None = None,
    consumed: int = 0,
    settings: LoaderSettings | None = None,
    even_batches: bool = True,
    streams: int = DEFAULT_STREAMS,
) -> EpochPlan:
    """One rank's batches of global sample indices for an epoch, lazily: the very order
    every loader reads. ``len(order)`` batches; ``order[k]`` is an int64 array, computed
    when asked (O(shards) memory, no shard read), so any batch of any epoch can be asked.
    ``even_batches`` (over several ranks) pads every rank to the same number of batches
    (``order.pad_mask(k)`` marks the repeats), as the loaders do by default.
    """
    batch_size = batch_size_of(batch_size, settings, "sample_order")
    if settings is not None:
        rank = 0 if settings.rank is None else settings.rank
        world_size = 1 if settings.world_size is None else settings.world_size
        return settings.epoch_plan(ds, settings.epoch, consumed, rank, world_size)
    return EpochPlan.build(
        ds,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        epoch=epoch,
        rank=rank,
        world_size=world_size,
        drop_last=drop_last,
        shuffle_window=shuffle_window,
        consumed=consumed,
        even_batches=even_batches,
        streams=streams,
    )


def to_arrow(ds: Dataset, columns: list[str] | None = None, *, batch_size: int = 65536) -> pa.Table:
    """The whole dataset (or some columns) as an Arrow table with the recorded types."""
    columns = column_names(columns)
    plan = EpochPlan.build(
        ds,
        batch_size=batch_size,
        shuffle=False,
        seed=0,
        epoch=0,
        rank=0,
        world_size=1,
        drop_last=False,
        shuffle_window=None,
    )
    # Read-time transforms run once, in Arrow (batch_to_arrow), as for spark.read.
    reader = BatchReader(
        ds, plan.batches, columns=_stored_for(ds, columns), jagged=True, spec_ops=False
    )
    batches = [batch_to_arrow(ds, b, columns) for b in reader]
    if not batches:
        return arrow_schema(ds, columns).empty_table()
    return pa.Table.from_batches(batches)


def _stored_for(ds: Dataset, columns: list[str] | None) -> list[str] | None:
    """Stored columns needed to produce ``columns`` (values plus their null masks)."""
    if columns is None:
        return None
    masks = {p.name: p.null_mask for p in ds.plans or [] if p.null_mask}
    return [c for name in columns for c in ([name, masks[name]] if name in masks else [name])]


def to_framework(
    framework: str,
    ds: Dataset,
    batch_size: int | None,
    *,
    settings: LoaderSettings | None = None,
    state: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """A ``framework`` (``torch`` / ``tf``) loader over ``ds``, from the registered adapter
    (``*_packed`` when ``pack=`` is set). tf takes ``state=`` and its resume keywords at
    build; torch resumes through ``load_state_dict``."""
    extra: dict[str, Any] = {}
    if framework == "tf":
        extra = {
            k: kwargs.pop(k)
            for k in ("resume", "start_batch", "input_context", "strict")
            if k in kwargs
        }
        extra["state"] = state
    elif state is not None:
        kwargs["state"] = state  # refused by the settings, naming the setting
    batch_size = batch_size_of(batch_size, settings, f"to_{framework}")
    if settings is None:
        kwargs["batch_size"] = batch_size
    chosen = settings_from(settings, kwargs)
    name = framework if chosen.pack is None else f"{framework}_packed"
    return adapter(name)(ds, chosen, **extra)
