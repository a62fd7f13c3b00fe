"""One frozen model of loader settings, shared by torch, tf and numpy iteration.

Every loader (``Dataset.iter_batches``, ``to_torch``, ``to_tf``) is built from a
:class:`LoaderSettings`: the same names, defaults and checks everywhere. A setting a
framework cannot honour is refused when the loader is built, never silently dropped.
"""

from __future__ import annotations

import difflib
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import PackError, SpecError
from ..meta import column_names
from ..order import DEFAULT_STREAMS, DEFAULT_WINDOW, EpochPlan
from .reader import DEFAULT_PREFETCH_BYTES, BatchReader

if TYPE_CHECKING:
    from ..shard_source import ShardSource

# Samples per batch when a loading call names none: iter_batches, sample_order, to_torch and
# to_tf alike.
DEFAULT_BATCH_SIZE = 256
_IMAGES = ("bytes", "pil", "numpy")
_DEVICES = (None, "cpu", "cuda")


class PackSpec(BaseModel):
    """How to pack a token column: ``column``, ``seq_len`` (tokens per row), ``mode``
    (``"concat"`` or ``"bin"``), ``pad_id`` (None: the column's tokenizer eos id when the
    dataset's ``tokenize`` op recorded one, else 0) and ``window`` (``bin``: documents per
    best-fit window)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    column: str
    seq_len: int = Field(ge=1)
    mode: Literal["concat", "bin"] = "concat"
    pad_id: int | None = Field(default=None, ge=0)
    window: int = Field(default=1024, ge=1)


def parse_pack(value: Any) -> PackSpec | None:
    """A :class:`PackSpec` from a spec, a dict or None; bad fields raise :class:`PackError`
    naming the field."""
    if value is None or isinstance(value, PackSpec):
        return value
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if not isinstance(value, dict):
        raise PackError(
            f"pack must be a dict or a PackSpec, got {type(value).__name__}", field="pack"
        )
    try:
        return PackSpec.model_validate(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "pack"
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        raise PackError(
            f"pack setting {where}={value.get(where, '?')!r}: {message}", field=where
        ) from None


@dataclass(frozen=True)
class LoaderSettings:
    """How to load one rank's share of an epoch: order, reading and framework settings.

    Order (fix the global order and this rank's share): ``batch_size``, ``shuffle``,
    ``seed``, ``epoch``, ``rank``, ``world_size`` (None: from torch.distributed or the
    ``RANK``/``WORLD_SIZE`` environment), ``drop_last``, ``shuffle_window`` (shards per
    shuffle window), ``streams`` (a shuffled order's fixed streams of shards, global batch
    ``g`` from stream ``g % streams``: a rank of a world size dividing it reads only its
    streams' shards; 0, the default: as many as the dataset's shards allow, up to 64; 1: no
    streams, the order before version 3), ``even_batches`` (over
    several ranks, every rank the same number of batches, by repeating the epoch's first
    samples; ``pad_mask=True`` marks the repeats in a bool ``pad_mask`` column). Reading:
    ``columns``, ``images``, ``verify_hashes``, ``prefetch_bytes``, ``transforms``
    (read-time transform specs), ``device``, ``download_threads`` (remote datasets:
    concurrent range GETs per process; None: ``SPARK_DL_DOWNLOAD_THREADS``, else 8).
    PyTorch only: ``num_workers``, ``prefetch_factor``, ``pin_memory``,
    ``persistent_workers`` (default True: DataLoader workers start once per loader and serve
    every pass; False starts them per pass), ``multiprocessing_context``,
    ``group``, ``progress``. TensorFlow only: ``as_tuple``. Telemetry: ``trace_path``.
    Packing: ``pack`` (a dict or :class:`~spark_dl_core.loaders.settings.PackSpec`): batches of
    fixed-length token rows instead of samples (see :mod:`spark_dl_core.loaders.packing`).
    """

    batch_size: int = DEFAULT_BATCH_SIZE
    shuffle: bool = False
    seed: int = 0
    epoch: int = 0
    rank: int | None = None
    world_size: int | None = None
    drop_last: bool = False
    shuffle_window: int = DEFAULT_WINDOW
    streams: int = DEFAULT_STREAMS
    even_batches: bool = True
    pad_mask: bool = False
    columns: tuple[str, ...] | None = None
    images: str = "bytes"
    verify_hashes: bool | None = None
    prefetch_bytes: int = DEFAULT_PREFETCH_BYTES
    transforms: tuple[Any, ...] = ()
    device: str | None = None
    download_threads: int | None = None
    num_workers: int = 0
    prefetch_factor: int | None = 2
    pin_memory: bool = False
    persistent_workers: bool = True
    multiprocessing_context: Any = field(default=None, compare=False)
    group: int | None = None
    progress: bool = False
    as_tuple: tuple[Any, Any] | None = None
    trace_path: str | None = None
    pack: Any = None

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise SpecError(f"loader setting {name}={getattr(self, name)!r}: {what}")

        for name in ("batch_size", "seed", "epoch", "shuffle_window", "streams", "num_workers"):
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool), name, "not an int")
        for name in (
            "shuffle",
            "drop_last",
            "even_batches",
            "pad_mask",
            "pin_memory",
            "persistent_workers",
            "progress",
        ):
            need(isinstance(getattr(self, name), bool), name, "not a bool")
        need(
            self.verify_hashes is None or isinstance(self.verify_hashes, bool),
            "verify_hashes",
            "must be None (each shard once per process), True or False",
        )
        need(self.batch_size >= 1, "batch_size", "must be >= 1")
        need(self.epoch >= 0, "epoch", "must be >= 0")
        need(self.shuffle_window >= 1, "shuffle_window", "must be >= 1 shard")
        need(
            self.streams >= 0,
            "streams",
            "must be >= 0 (0: automatic from the dataset's shards; 1: one stream, no locality)",
        )
        need(self.num_workers >= 0, "num_workers", "must be >= 0")
        need(self.prefetch_bytes >= 0, "prefetch_bytes", "must be >= 0")
        need(self.group is None or self.group >= 1, "group", "must be >= 1")
        need(
            self.download_threads is None
            or (type(self.download_threads) is int and self.download_threads >= 1),
            "download_threads",
            "must be None or an int >= 1",
        )
        need(self.images in _IMAGES, "images", f"must be one of {_IMAGES}")
        need(self.device in _DEVICES, "device", f"must be one of {_DEVICES}")
        if self.as_tuple is not None:
            object.__setattr__(self, "as_tuple", _as_tuple(self.as_tuple))
        if self.world_size is not None:
            need(self.world_size >= 1, "world_size", "must be >= 1")
        if self.rank is not None:
            need(
                self.rank >= 0 and (self.world_size is None or self.rank < self.world_size),
                "rank",
                f"must be in 0..{(self.world_size or 1) - 1}",
            )
        names = column_names(self.columns, "loader setting columns")
        need(
            names is None or len(names) > 0,
            "columns",
            "names no column, so every batch would be empty; leave it out for all columns",
        )
        object.__setattr__(self, "columns", None if names is None else tuple(names))
        if self.pack is not None:
            object.__setattr__(self, "pack", parse_pack(self.pack))
            for name in ("columns", "transforms"):
                if getattr(self, name):
                    raise PackError(
                        f"loader setting {name}={getattr(self, name)!r}: a packed loader "
                        "yields input_ids, labels, position_ids, cu_seqlens and max_seqlen "
                        "from the pack column; leave it out",
                        field=name,
                    )
        if self.transforms:
            for t in self.transforms:
                need(
                    isinstance(t, Mapping) or hasattr(t, "model_dump"),
                    "transforms",
                    "each transform must be a transform spec or a dict",
                )

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> LoaderSettings:
        """Settings from keywords; an unknown keyword is refused naming the closest one."""
        known = {f.name for f in fields(cls)}
        for name in kwargs:
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise SpecError(f"unknown loader setting {name!r}{hint}")
        if kwargs.get("shuffle_window") is None:
            kwargs.pop("shuffle_window", None)
        if kwargs.get("transforms") is not None:
            kwargs["transforms"] = tuple(kwargs["transforms"])
        else:
            kwargs.pop("transforms", None)
        if isinstance(kwargs.get("as_tuple"), list):
            kwargs["as_tuple"] = tuple(kwargs["as_tuple"])
        if kwargs.get("prefetch_bytes") is None:
            kwargs.pop("prefetch_bytes", None)
        return cls(**kwargs)

    def epoch_plan(
        self, dataset: ShardSource, epoch: int, consumed: int, rank: int, world_size: int
    ) -> EpochPlan:
        """This rank's plan of ``epoch`` from ``consumed`` samples on: the one place a
        loader's settings become an order (torch, tf and ``iter_batches`` all ask here)."""
        return EpochPlan.build(
            dataset,
            batch_size=self.batch_size,
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=epoch,
            rank=rank,
            world_size=world_size,
            drop_last=self.drop_last,
            shuffle_window=self.shuffle_window,
            consumed=consumed,
            even_batches=self.even_batches,
            streams=self.streams,
        )

    def replace(self, **changes: Any) -> LoaderSettings:
        return replace(self, **changes)

    def only(self, framework: str, used: frozenset[str]) -> None:
        """Refuse settings ``framework`` does not use when they differ from the default."""
        for f in fields(self):
            if f.name in used or f.name in _COMMON:
                continue
            if getattr(self, f.name) != f.default:
                why = _WHY_NOT.get(f.name, "")
                raise SpecError(
                    f"loader setting {f.name}={getattr(self, f.name)!r} has no meaning for "
                    f"{framework}{why}; leave it out"
                )

    @property
    def column_list(self) -> list[str] | None:
        return list(self.columns) if self.columns is not None else None


_COMMON = frozenset(
    {
        "batch_size",
        "shuffle",
        "seed",
        "epoch",
        "rank",
        "world_size",
        "drop_last",
        "shuffle_window",
        "streams",
        "even_batches",
        "pad_mask",
        "columns",
        "images",
        "verify_hashes",
        "prefetch_bytes",
        "transforms",
        "pack",
        "download_threads",
    }
)
TORCH_ONLY = frozenset(
    {
        "device",
        "num_workers",
        "prefetch_factor",
        "pin_memory",
        "persistent_workers",
        "multiprocessing_context",
        "group",
        "progress",
        "trace_path",
    }
)
TF_ONLY = frozenset({"as_tuple", "trace_path"})
# Why a setting is refused where it is not used, when that is not obvious.
_WHY_NOT = {
    "device": " (batches are decoded on the host and handed out as they are; with "
    "TensorFlow, tf.device or a distribution strategy places them)",
}
_AS_TUPLE = (
    "must be a pair (features, labels), each a column name or a non-empty list of "
    "column names, e.g. ('image', 'label') or (['image', 'size'], 'label')"
)


def _as_tuple(value: Any) -> tuple[Any, Any]:
    """``as_tuple`` as a pair of a name or a tuple of names each, or a SpecError now (tf
    would otherwise fail inside its traced split function, naming nothing)."""
    parts: list[Any] = []
    if isinstance(value, tuple | list) and len(value) == 2:
        for part in value:
            if isinstance(part, str) and part:
                parts.append(part)
            elif (
                isinstance(part, tuple | list)
                and part
                and all(isinstance(n, str) and n for n in part)
            ):
                parts.append(tuple(part))
    if len(parts) != 2:
        raise SpecError(f"loader setting as_tuple={value!r}: {_AS_TUPLE}")
    return parts[0], parts[1]


def check_as_tuple(settings: LoaderSettings, names: Any) -> None:
    """Every name in ``as_tuple`` must be a column the batches have."""
    if settings.as_tuple is None:
        return
    have = list(names)
    for part in settings.as_tuple:
        for name in (part,) if isinstance(part, str) else part:
            if name not in have:
                close = difflib.get_close_matches(name, have, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise SpecError(
                    f"loader setting as_tuple={settings.as_tuple!r} names {name!r}, which "
                    f"the batches do not have (they have {have}){hint}"
                )


def check_epoch(epoch: Any) -> int:
    """``set_epoch``'s argument as an int >= 0, as the ``epoch`` setting is checked."""
    try:
        value = operator.index(epoch)
    except TypeError:
        value = -1
    if isinstance(epoch, bool) or value < 0:
        raise SpecError(f"set_epoch(epoch={epoch!r}): the epoch must be an int >= 0")
    return value


def check_steps(steps: Any, batches: int) -> int:
    """``state_dict(steps)``'s argument: batches taken of a pass of ``batches`` batches."""
    try:
        value = operator.index(steps)
    except TypeError:
        value = -1
    if isinstance(steps, bool) or not 0 <= value <= batches:
        raise SpecError(
            f"state_dict(steps={steps!r}): steps are the batches taken of the current pass, "
            f"an int from 0 to {batches} (its length)"
        )
    return value


def batch_size_of(batch_size: int | None, settings: LoaderSettings | None, call: str) -> int:
    """The batch size of a loading call given ``batch_size`` and/or ``settings``: a batch
    size that disagrees with ``settings.batch_size`` is refused, not silently dropped."""
    if settings is None:
        return DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    if batch_size is not None and batch_size != settings.batch_size:
        raise SpecError(
            f"{call}(batch_size={batch_size}, settings=...) disagrees with the settings' "
            f"batch_size={settings.batch_size}: give the batch size once"
        )
    return settings.batch_size


def settings_from(settings: LoaderSettings | None, kwargs: dict[str, Any]) -> LoaderSettings:
    """Either a settings object or keywords (or a settings object plus overrides)."""
    if settings is None:
        return LoaderSettings.from_kwargs(**kwargs)
    if not isinstance(settings, LoaderSettings):
        raise SpecError(f"expected LoaderSettings, got {type(settings).__name__}")
    if kwargs:
        base = {f.name: getattr(settings, f.name) for f in fields(settings)}
        return LoaderSettings.from_kwargs(**{**base, **kwargs})
    return settings


PAD_MASK = "pad_mask"


def check_pad_mask(settings: LoaderSettings, names: Any) -> None:
    """``pad_mask=True`` adds a ``pad_mask`` column: refuse it if the batches have one."""
    chosen = settings.columns if settings.columns is not None else list(names)
    if settings.pad_mask and PAD_MASK in chosen:
        raise SpecError(
            f"loader setting pad_mask=True adds a column {PAD_MASK!r}, but the dataset "
            f"already has a column {PAD_MASK!r}; rename it or leave pad_mask off"
        )


def reader_extras(settings: LoaderSettings) -> dict[str, Any]:
    """Reader keywords for read-time ``transforms`` / ``device``, where the reader has them."""
    import inspect

    accepted = inspect.signature(BatchReader.__init__).parameters
    extras: dict[str, Any] = {}
    for name in ("transforms", "device", "download_threads"):
        value = getattr(settings, name)
        if value in (None, ()):
            continue
        if name not in accepted:
            raise SpecError(f"loader setting {name}={value!r} is not supported by this reader")
        extras[name] = list(value) if name == "transforms" else value
    return extras
