"""TensorFlow loading: a ``tf.data.Dataset`` of whole decoded batches.

The batches come from the same plan as every other loader (:mod:`spark_dl_core.order`),
through ``tf.data.Dataset.from_generator`` with an explicit ``output_signature``:

- fixed-width columns (scalars, fixed-shape ndarrays) → dense ``tf.TensorSpec`` with batch
  dimension ``None``;
- ``str`` / ``bytes`` columns → ``tf.string``;
- variable-shape ``ndarray`` columns → ``tf.RaggedTensorSpec``;
- images decode to arrays only with ``images="numpy"`` and a fixed size; otherwise bytes;
- images and clips decoded by read ops: dense when the ops give one size (a crop or an exact
  resize), else ``tf.RaggedTensorSpec`` ragged in every dimension below the batch.

Each pass over the dataset (each Keras epoch) is the next epoch of the order.
Checkpointing: tf.data cannot snapshot a Python generator and prefetches ahead, so the
position is explicit: ``tfds.state_dict(steps)`` after ``steps`` synchronous steps of the
current pass (the same state as ``TorchLoader.state_dict()``); pass it back as ``state=``,
at any world size.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import SpecError
from ...format.buffers import Jagged
from ...order import (
    DEFAULT_STREAMS,
    EpochPlan,
    LoaderState,
    epoch_position,
    epoch_total,
    plan_position,
    position_record,
    resolve_window,
)
from ..frameworks import register_framework
from ..position import adopted, resumed, saved_state
from ..reader import BatchReader
from ..settings import (
    PAD_MASK,
    TF_ONLY,
    LoaderSettings,
    check_as_tuple,
    check_pad_mask,
    check_steps,
    reader_extras,
    settings_from,
)
from ..telemetry import PassStats

if TYPE_CHECKING:
    from ...shard_source import ShardSource


def _column_spec(
    dataset: ShardSource,
    name: str,
    sample: Any,
    transformed: bool = False,
    varies: bool = False,
    stored: str | None = None,
) -> tuple[Any, str]:
    """The TypeSpec for one column and how to convert it ("dense", "string", "jagged",
    "ragged"). Follows the column's form (``Dataset.forms``), not the probed batch:
    token sequences are ``RaggedTensor`` from row splits, equal-shape arrays dense.
    ``varies``: a decoded column whose ops give no one size (images or clips not cropped
    or resized to an exact size) is ragged in every dimension below the batch.
    ``stored``: the stored column the output column ``name`` holds (``name`` itself, or a
    read-time rename's old name); None for one an op made: its probed batch says its form."""
    import tensorflow as tf

    if varies:
        value = np.asarray(_samples(sample)[0])
        spec = tf.RaggedTensorSpec(
            shape=(None, *([None] * value.ndim)),
            dtype=tf.as_dtype(value.dtype),
            ragged_rank=max(1, value.ndim),
        )
        return spec, "ragged"
    if isinstance(sample, Jagged):
        spec = tf.RaggedTensorSpec(
            shape=(None, None), dtype=tf.as_dtype(sample.values.dtype), ragged_rank=1
        )
        return spec, "jagged"
    encoding = dataset.encoding(stored) if stored is not None else None
    kind = encoding.name if encoding is not None else _probed_kind(sample)
    form = dataset.forms.get(stored, ("", None))[0] if stored is not None else ""
    dense = encoding is None or encoding.size is not None or form == "dense" or transformed
    if sample.dtype.kind in "biufc" and dense:
        return tf.TensorSpec((None, *sample.shape[1:]), tf.as_dtype(sample.dtype)), "dense"
    # the stored encoding's facts; a column an op makes has only the probe's kind
    strings = encoding.strings if encoding is not None else kind in ("str", "bytes")
    arrays = encoding.ndarray if encoding is not None else kind == "ndarray"
    if strings or sample.dtype.kind in "SU":
        return tf.TensorSpec((None,), tf.string), "string"
    if arrays:
        value = np.asarray(sample[0])
        spec = tf.RaggedTensorSpec(
            shape=(None, *([None] * value.ndim)),
            dtype=tf.as_dtype(value.dtype),
            ragged_rank=max(1, value.ndim),
        )
        return spec, "ragged"
    raise TypeError(f"column {name!r} ({kind}) has no TensorFlow form; leave it out with columns=")


def _probed_kind(sample: Any) -> str:
    """An encoding-like name for a column no stored encoding describes, from its batch."""
    first = sample[0] if len(sample) else None
    if isinstance(first, (str, bytes)):
        return "str"
    return "ndarray" if isinstance(first, np.ndarray) else str(sample.dtype)


def _samples(values: Any) -> Any:
    """A batch as its samples: decoded image lists and jagged batches as object arrays,
    dense batches as they are (iterating gives one sample each)."""
    return values.to_objects() if hasattr(values, "to_objects") else values


def _ragged(values: Any, ndim: int) -> Any:
    """A batch of arrays of rank ``ndim`` and any shapes → a RaggedTensor ragged in every
    dimension below the batch. A sample of lower rank gets leading axes of length 1: a
    scalar, or a mono clip of a ragged audio batch (torch's ``[B, T*]`` leaves its channel
    axis out; tf's signature has one rank for every batch: ``[B, 1, T*]``)."""
    import tensorflow as tf

    items = [np.asarray(v) for v in _samples(values)]
    items = [a.reshape((1,) * (ndim - a.ndim) + a.shape) for a in items]
    # a dense sample's row lengths at depth d: shape[d], once per row above it
    lengths = [
        np.concatenate(
            [np.full(int(np.prod(a.shape[:depth])), a.shape[depth], np.int64) for a in items]
        )
        if items
        else np.zeros(0, np.int64)
        for depth in range(ndim)
    ]
    flat = (
        np.concatenate([a.reshape(-1) for a in items]) if items else np.empty(0, dtype=np.float32)
    )
    return tf.RaggedTensor.from_nested_row_lengths(flat, lengths)


def tf_state(
    dataset: ShardSource,
    *,
    seed: int,
    epoch: int,
    consumed: int,
    shuffle: bool,
    batch_size: int,
    drop_last: bool = False,
    shuffle_window: int | None = None,
    streams: int = DEFAULT_STREAMS,
) -> dict[str, Any]:
    """Deprecated spelling: a loader state (as ``state_dict()`` returns) for a position.

    Prefer ``tfds.state_dict(steps)`` / ``to_tf(..., state=...)``.
    """
    return LoaderState(
        fingerprint=dataset.fingerprint,
        seed=seed,
        epoch=epoch,
        shuffle=shuffle,
        shuffle_window=resolve_window(shuffle_window),
        batch_size=batch_size,
        drop_last=drop_last,
        consumed=int(min(consumed, len(dataset))),
        streams=streams,
        source=position_record(dataset, epoch, int(min(consumed, len(dataset)))),
    ).to_dict()


def make_tf_dataset(
    dataset: ShardSource,
    settings: LoaderSettings | None = None,
    *,
    state: dict[str, Any] | None = None,
    resume: dict[str, Any] | None = None,
    start_batch: int = 0,
    input_context: Any = None,
    strict: bool = True,
    **kwargs: Any,
) -> Any:
    """A ``tf.data.Dataset`` of this rank's batches (dicts of tensors), prefetched.

    Each pass over the returned dataset (each Keras epoch) is the next epoch of the order:
    the first pass is the rest of the start position's epoch (``epoch``, or the epoch of
    ``state``), pass ``i`` is epoch ``start + i`` from its beginning, so ``model.fit(...,
    epochs=3)`` sees three differently shuffled epochs, reproducibly.

    ``state`` (from ``state_dict()`` of a torch loader or of a tf dataset made here) continues
    after the samples it records as consumed; it must match dataset, seed and shuffle.
    The returned dataset has ``state_dict(steps)``: the position after ``steps`` batches of
    the current pass (tf.data prefetches ahead, so the steps taken are the caller's to tell).
    ``resume=`` and ``start_batch=`` are deprecated spellings of ``state=``.

    ``input_context`` (a ``tf.distribute.InputContext``, as
    ``strategy.distribute_datasets_from_function`` passes it) sets ``rank`` / ``world_size``
    to its input pipeline; with ``even_batches`` (the default) every pipeline, so every
    replica, takes the same number of steps per epoch.
    """
    import tensorflow as tf

    settings = settings_from(settings, kwargs)
    settings.only("TensorFlow", TF_ONLY)
    if input_context is not None:
        settings = _with_input_context(settings, input_context)
    check_pad_mask(settings, dataset.layout.names)
    rank = 0 if settings.rank is None else settings.rank
    world_size = 1 if settings.world_size is None else settings.world_size
    if resume is not None or start_batch:
        warnings.warn(
            "to_tf(resume=, start_batch=) is deprecated: pass state= (a state_dict())",
            DeprecationWarning,
            stacklevel=3,
        )
        state = resume if resume is not None else state
    epoch, consumed = settings.epoch, 0
    if state is not None:
        loaded, dataset, epoch, consumed = resumed(dataset, settings, state, strict)
        settings = adopted(settings, loaded, dataset)

    def plan_for(epoch: int, consumed: int) -> EpochPlan:
        return settings.epoch_plan(dataset, epoch, consumed, rank, world_size)

    skipped = start_batch * world_size * settings.batch_size
    consumed = min(epoch_total(dataset, epoch), consumed + skipped)
    # a finished epoch starts the next; inside one, an empty first pass keeps this rank in it
    epoch, consumed, first = plan_position(plan_for, epoch, consumed)
    chosen = settings.column_list
    names = chosen if chosen is not None else [*dataset.layout.names, *dataset.derived]
    read: dict[str, Any] = {
        "columns": names,
        "images": settings.images,
        "verify_hashes": settings.verify_hashes,
        "prefetch_bytes": settings.prefetch_bytes,
        "seed": settings.seed,
        "jagged": True,
        **reader_extras(settings),
    }
    # Checks the transforms against the columns and gives each column's form.
    one = [np.zeros(min(1, len(dataset)), dtype=np.int64)]
    probe_reader = BatchReader(dataset, one, epoch=epoch, **read)
    probe = next(iter(probe_reader)) if len(dataset) else {}
    transformed = probe_reader.ops.transformed
    # Decoded images / clips with no one size (torch gets lists or jagged tensors): ragged.
    varies = {
        name for name, pipeline in probe_reader.ops.pipelines.items() if not pipeline.fixed_size
    }
    kinds: dict[str, str] = {}
    signature: dict[str, Any] = {}
    ndims: dict[str, int] = {}
    for name in probe or names:
        sample = probe[name] if len(dataset) else np.empty(0)
        stored = probe_reader.ops.source_of(name)
        decoded = {name, stored}  # a decoded column, perhaps renamed after its decode
        signature[name], kinds[name] = _column_spec(
            dataset,
            name,
            sample,
            bool(decoded & transformed),
            bool(decoded & varies) and len(dataset) > 0,
            stored,
        )
        if kinds[name] == "ragged":
            ndims[name] = max(1, np.asarray(_samples(sample)[0]).ndim)
    if settings.pad_mask:
        signature[PAD_MASK] = tf.TensorSpec((None,), tf.bool)
    check_as_tuple(settings, signature)
    passes = _Passes(first, epoch, plan_for)

    def generate() -> Iterator[dict[str, Any]]:
        plan = passes.next_plan()
        stats = passes.stats = PassStats(passes.current[1]).follow(dataset, plan)
        reader = BatchReader(dataset, plan, epoch=passes.current[1], **read)
        stats.workers["tf.data"] = reader.times  # updated in place as the reader works
        for k, batch in enumerate(reader):
            now = time.perf_counter()
            stats.delivered(len(next(iter(batch.values()))) if batch else 0, 0.0, now)
            if k == len(plan) - 1:
                stats.repeated = plan.repeats
            out: dict[str, Any] = {}
            for name, value in batch.items():
                kind = kinds[name]
                if kind == "jagged":
                    out[name] = tf.RaggedTensor.from_row_splits(
                        value.values[value.offsets[0] : value.offsets[-1]],
                        value.offsets - value.offsets[0],
                        validate=False,
                    )
                elif kind == "ragged":
                    out[name] = _ragged(value, ndims[name])
                elif kind == "string":
                    out[name] = np.asarray(
                        [v.encode() if isinstance(v, str) else bytes(v) for v in value],
                        dtype=object,
                    )
                else:
                    out[name] = value
            if settings.pad_mask:
                out[PAD_MASK] = plan.pad_mask(k)
            yield out
        stats.finished = time.perf_counter()

    tfds = tf.data.Dataset.from_generator(generate, output_signature=signature)
    if settings.as_tuple is not None:
        x, y = settings.as_tuple

        def split(b: dict[str, Any]) -> tuple[Any, Any]:
            fx = b[x] if isinstance(x, str) else {k: b[k] for k in x}
            fy = b[y] if isinstance(y, str) else {k: b[k] for k in y}
            return fx, fy

        tfds = tfds.map(split)
    if len(first) == len(plan_for(epoch + 1, 0)):  # every pass has the same length
        tfds = tfds.apply(tf.data.experimental.assert_cardinality(len(first)))
    tfds = tfds.prefetch(tf.data.AUTOTUNE)

    def state_dict(steps: int) -> dict[str, Any]:
        """The position after ``steps`` batches of the latest pass, on every rank."""
        plan, pass_epoch = passes.current
        steps = check_steps(steps, len(plan))
        at_epoch, consumed = epoch_position(pass_epoch, plan.consumed_after(steps), plan.total)
        return saved_state(dataset, settings, at_epoch, consumed)

    def stats() -> dict[str, Any]:
        """The latest pass as produced for tf.data: samples and batches, samples/s, time
        to first batch and per-stage seconds. ``data_starved_pct`` is None: tf.data
        prefetches on its own threads, so the training loop's waits are not visible here
        (the TensorFlow profiler shows them)."""
        current = passes.stats or PassStats(passes.current[1])
        return current.as_dict() | {"data_starved_pct": None}

    tfds.state_dict = state_dict
    tfds.stats = stats
    tfds.loader_settings = settings
    return tfds


def _with_input_context(settings: LoaderSettings, context: Any) -> LoaderSettings:
    """Settings with ``rank`` / ``world_size`` of a ``tf.distribute.InputContext``."""
    try:
        rank, world = int(context.input_pipeline_id), int(context.num_input_pipelines)
    except (AttributeError, TypeError, ValueError):
        raise SpecError(
            f"input_context={context!r} is not a tf.distribute.InputContext (it needs "
            "input_pipeline_id and num_input_pipelines)"
        ) from None
    for name, value in (("rank", rank), ("world_size", world)):
        given = getattr(settings, name)
        if given is not None and given != value:
            raise SpecError(
                f"loader setting {name}={given} disagrees with input_context's {value}; "
                f"leave {name} out to take it from the input context"
            )
    return settings.replace(rank=rank, world_size=world)


class _Passes:
    """Which plan each pass over the tf dataset reads: the first from the start position,
    then epoch after epoch from their beginnings."""

    def __init__(
        self, first: EpochPlan, epoch: int, plan_for: Callable[[int, int], EpochPlan]
    ) -> None:
        self.lock = threading.Lock()
        self.first, self.epoch, self.plan_for = first, epoch, plan_for
        self.started = 0
        self.current = (first, epoch)
        self.stats: PassStats | None = None

    def next_plan(self) -> EpochPlan:
        with self.lock:
            k = self.started
            self.started += 1
            plan = self.first if k == 0 else self.plan_for(self.epoch + k, 0)
            self.current = (plan, self.epoch + k)
            return plan


register_framework("tf", make_tf_dataset)
