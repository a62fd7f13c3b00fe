"""TensorFlow loading: a ``tf.data.Dataset`` of whole decoded batches.

The batches come from the same plan as every other loader (:mod:`spark_dl_core.order`),
through ``tf.data.Dataset.from_generator`` with an explicit ``output_signature``:

- fixed-width columns (scalars, fixed-shape ndarrays) → dense ``tf.TensorSpec`` with batch
  dimension ``None``;
- ``str`` / ``bytes`` columns → ``tf.string``;
- variable-shape ``ndarray`` columns → ``tf.RaggedTensorSpec``;
- images decode to arrays only with ``images="numpy"`` and a fixed size; otherwise bytes.

Checkpointing: tf.data cannot snapshot a Python generator, so the position is explicit.
Save :func:`tf_state` (the global number of samples consumed: ``steps x world_size x
batch_size`` after ``steps`` synchronous steps) and pass it back as ``resume=`` — at any
world size — or, at the same world size, pass the rank-local ``start_batch``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .order import EpochPlan, LoaderState, resolve_window
from .reader import DEFAULT_PREFETCH_BYTES, BatchReader

if TYPE_CHECKING:
    from .dataset import Dataset


def _column_spec(dataset: Dataset, name: str, sample: np.ndarray) -> tuple[Any, str]:
    """The TypeSpec for one column and how to convert it ("dense", "string", "ragged")."""
    import tensorflow as tf

    encoding = dataset.encoding(name)
    if sample.dtype.kind in "biufc" and encoding.size is not None:
        return tf.TensorSpec((None, *sample.shape[1:]), tf.as_dtype(sample.dtype)), "dense"
    if encoding.name in ("str", "bytes") or sample.dtype.kind in "SU":
        return tf.TensorSpec((None,), tf.string), "string"
    if encoding.name.startswith("ndarray"):
        value = np.asarray(sample[0])
        spec = tf.RaggedTensorSpec(
            shape=(None, *([None] * value.ndim)),
            dtype=tf.as_dtype(value.dtype),
            ragged_rank=max(1, value.ndim),
        )
        return spec, "ragged"
    raise TypeError(
        f"column {name!r} ({encoding.name}) has no TensorFlow form; leave it out with columns="
    )


def _ragged(values: np.ndarray, ndim: int) -> Any:
    """Batch of variable-shape arrays → RaggedTensor ragged in every dimension."""
    import tensorflow as tf

    items = [np.asarray(v) for v in values]
    lengths: list[list[int]] = [[] for _ in range(max(1, ndim))]

    def walk(a: np.ndarray, depth: int) -> None:
        lengths[depth].append(len(a))
        if depth + 1 < len(lengths):
            for sub in a:
                walk(sub, depth + 1)

    for a in items:
        walk(a if a.ndim else a.reshape(1), 0)
    flat = (
        np.concatenate([a.reshape(-1) for a in items]) if items else np.empty(0, dtype=np.float32)
    )
    return tf.RaggedTensor.from_nested_row_lengths(
        flat, [np.asarray(x, dtype=np.int64) for x in lengths]
    )


def tf_state(
    dataset: Dataset,
    *,
    seed: int,
    epoch: int,
    consumed: int,
    shuffle: bool,
    batch_size: int,
    drop_last: bool = False,
    shuffle_window: int | None = None,
) -> dict[str, Any]:
    """A checkpointable position for :func:`make_tf_dataset` (``resume=``), same format as
    ``TorchLoader.state_dict()``."""
    return LoaderState(
        fingerprint=dataset.fingerprint,
        seed=seed,
        epoch=epoch,
        shuffle=shuffle,
        shuffle_window=resolve_window(shuffle_window),
        batch_size=batch_size,
        drop_last=drop_last,
        consumed=int(min(consumed, len(dataset))),
    ).to_dict()


def make_tf_dataset(
    dataset: Dataset,
    batch_size: int,
    shuffle: bool = False,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    epoch: int = 0,
    columns: list[str] | None = None,
    drop_last: bool = False,
    shuffle_window: int | None = None,
    start_batch: int = 0,
    resume: dict[str, Any] | None = None,
    images: str = "bytes",
    verify_hashes: bool | None = None,
    prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
    as_tuple: tuple[list[str], list[str]] | tuple[str, str] | None = None,
) -> Any:
    """A ``tf.data.Dataset`` of this rank's batches (dicts of tensors), prefetched.

    ``as_tuple=("x", "y")`` yields ``(features, labels)`` pairs for ``model.fit``.
    ``resume`` (a state from :func:`tf_state` or ``TorchLoader.state_dict()``) continues
    after the samples it records as consumed; it must match dataset, seed and shuffle.
    """
    import tensorflow as tf

    window = resolve_window(shuffle_window)
    consumed = 0
    if resume is not None:
        state = LoaderState.from_dict(resume)
        state.check(dataset, seed=seed, shuffle=shuffle, shuffle_window=window)
        epoch, consumed = state.epoch, state.consumed
    plan = EpochPlan.build(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        epoch=epoch,
        rank=rank,
        world_size=world_size,
        drop_last=drop_last,
        shuffle_window=window,
        consumed=consumed,
    )
    names = list(columns) if columns is not None else list(dataset.layout.names)
    probe = dataset.read(np.zeros(min(1, len(dataset)), dtype=np.int64), names, cast(Any, images))
    kinds: dict[str, str] = {}
    signature: dict[str, Any] = {}
    ndims: dict[str, int] = {}
    for name in names:
        sample = probe[name] if len(dataset) else np.empty(0)
        signature[name], kinds[name] = _column_spec(dataset, name, sample)
        if kinds[name] == "ragged":
            ndims[name] = max(1, np.asarray(sample[0]).ndim)
    read: dict[str, Any] = {"columns": names, "images": images, "verify_hashes": verify_hashes}

    def generate() -> Iterator[dict[str, Any]]:
        for batch in BatchReader(
            dataset, plan.batches[start_batch:], prefetch_bytes=prefetch_bytes, **read
        ):
            out: dict[str, Any] = {}
            for name, value in batch.items():
                kind = kinds[name]
                if kind == "ragged":
                    out[name] = _ragged(value, ndims[name])
                elif kind == "string":
                    out[name] = np.asarray(
                        [v.encode() if isinstance(v, str) else bytes(v) for v in value],
                        dtype=object,
                    )
                else:
                    out[name] = value
            yield out

    tfds = tf.data.Dataset.from_generator(generate, output_signature=signature)
    if as_tuple is not None:
        x, y = as_tuple

        def split(b: dict[str, Any]) -> tuple[Any, Any]:
            fx = b[x] if isinstance(x, str) else {k: b[k] for k in x}
            fy = b[y] if isinstance(y, str) else {k: b[k] for k in y}
            return fx, fy

        tfds = tfds.map(split)
    expected = len(plan) - start_batch
    tfds = tfds.apply(tf.data.experimental.assert_cardinality(max(0, expected)))
    return tfds.prefetch(tf.data.AUTOTUNE)
