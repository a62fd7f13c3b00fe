"""A loader's position, saved and resumed the same way by every loader: torch and tf, plain
and packed. The state is :class:`~spark_dl_core.order.LoaderState` (a position in the global
order, independent of world size); this module fills it from a loader's settings and reads
it back against them."""

from __future__ import annotations

from typing import Any

from ..order import LoaderState, position_record
from ..order.choice import resolve_streams
from ..order.locality import AUTO_STREAMS
from ..order.state import packed_position
from ..shard_source import ShardSource
from .settings import LoaderSettings


def saved_state(
    dataset: ShardSource,
    settings: LoaderSettings,
    epoch: int,
    consumed: int,
    *,
    pack: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The state of a position ``consumed`` samples into ``epoch`` (a ``state_dict()``).

    ``pack``: a packed loader's position in rows (``consumed`` is then 0, and the order's
    streams are the packed order's own); the source records a packed position only at the
    start of an epoch, where a changed source can still carry it on."""
    packed_mid_epoch = packed_position(pack) != 0
    streams = resolve_streams(dataset, settings.shuffle, settings.streams)
    fields: dict[str, Any] = {"pack": pack} if pack is not None else {"streams": streams}
    return LoaderState(
        fingerprint=dataset.fingerprint,
        seed=settings.seed,
        epoch=epoch,
        shuffle=settings.shuffle,
        shuffle_window=settings.shuffle_window,
        batch_size=settings.batch_size,
        drop_last=settings.drop_last,
        consumed=consumed,
        source=None if packed_mid_epoch else position_record(dataset, epoch, consumed),
        **fields,
    ).to_dict()


def resumed(
    dataset: ShardSource,
    settings: LoaderSettings,
    state: dict[str, Any],
    strict: bool = True,
    *,
    pack: Any = None,
) -> tuple[LoaderState, ShardSource, int, int]:
    """``state`` checked against ``dataset`` and ``settings`` (``strict=False``: a state of
    another version of the dataset carries on if the dataset can honour it): the state read,
    the dataset to read (itself, or the variant continuing the run), epoch and consumed.
    ``pack``: a packed loader's pack key (its batch size and streams are its own)."""
    loaded = LoaderState.from_dict(state)
    compared: dict[str, Any] = (
        {"pack": pack}
        if pack is not None
        else {"batch_size": settings.batch_size, "streams": settings.streams}
    )
    dataset, epoch, consumed = loaded.resume(
        dataset,
        strict,
        seed=settings.seed,
        shuffle=settings.shuffle,
        shuffle_window=settings.shuffle_window,
        **compared,
    )
    return loaded, dataset, epoch, consumed


def adopted(settings: LoaderSettings, loaded: LoaderState, dataset: ShardSource) -> LoaderSettings:
    """``settings`` reading on in the order of the state ``loaded`` they resumed over
    ``dataset``: a loader with automatic streams (``streams=0``, the default) takes the
    streams the state was saved with where they are not the dataset's automatic number (a
    state of order version 2, or of another setting, resumes in its own order), for the
    rest of that epoch and the epochs after it."""
    if settings.streams != AUTO_STREAMS or loaded.pack is not None:
        return settings
    if loaded.streams == resolve_streams(dataset, settings.shuffle, AUTO_STREAMS):
        return settings
    return settings.replace(streams=loaded.streams)
