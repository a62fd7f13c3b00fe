"""TensorFlow loading of packed token rows: ``to_tf(pack=...)`` (see :mod:`..packing`).

The same batches as ``to_torch(pack=...)`` for the same settings, as a ``tf.data.Dataset``
of dicts: ``input_ids``, ``labels``, ``position_ids`` (``tf.int64`` ``[B, seq_len]``),
``cu_seqlens`` (``tf.int32``) and ``max_seqlen`` (a ``tf.int32`` scalar). As for
``to_tf`` without packing, each pass is the next epoch, and ``tfds.state_dict(steps)`` gives
the position after ``steps`` batches of the current pass (the same state a torch loader
saves: either resumes the other).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ...order import epoch_position, plan_position
from ..frameworks import register_framework
from ..packing import AnyPackedPlan, packed_plan, packed_state, resume_position
from ..settings import TF_ONLY, LoaderSettings, check_steps, settings_from
from ..telemetry import PassStats

if TYPE_CHECKING:
    from ...shard_source import ShardSource


def make_packed_tf_dataset(
    dataset: ShardSource,
    settings: LoaderSettings | None = None,
    *,
    state: dict[str, Any] | None = None,
    strict: bool = True,
    **kwargs: Any,
) -> Any:
    """A ``tf.data.Dataset`` of this rank's packed batches, prefetched (``strict``: as
    :func:`~spark_dl_core.loaders.packing.resume_position`)."""
    import tensorflow as tf

    settings = settings_from(settings, kwargs)
    settings.only("TensorFlow", TF_ONLY - {"as_tuple"})
    rank = 0 if settings.rank is None else settings.rank
    world = 1 if settings.world_size is None else settings.world_size
    dataset, epoch, rows, settings = resume_position(dataset, settings, state, strict)

    def plan_for(epoch: int, rows: int) -> AnyPackedPlan:
        return packed_plan(dataset, settings, epoch=epoch, rows=rows, rank=rank, world_size=world)

    # a finished epoch starts the next; inside one, an empty first pass keeps this rank in it
    epoch, rows, first = plan_position(plan_for, epoch, rows)
    seq_len = settings.pack.seq_len
    signature = {
        "input_ids": tf.TensorSpec((None, seq_len), tf.int64),
        "labels": tf.TensorSpec((None, seq_len), tf.int64),
        "position_ids": tf.TensorSpec((None, seq_len), tf.int64),
        "cu_seqlens": tf.TensorSpec((None,), tf.int32),
        "max_seqlen": tf.TensorSpec((), tf.int32),
    }
    lock = threading.Lock()
    passes: dict[str, Any] = {
        "started": 0,
        "current": (first, epoch),
        "stats": None,
        "fill": (0, 0),
    }

    def generate() -> Iterator[dict[str, Any]]:
        with lock:
            k = passes["started"]
            passes["started"] = k + 1
            plan = first if k == 0 else plan_for(epoch + k, 0)
            passes["current"] = (plan, epoch + k)
            stats = passes["stats"] = PassStats(epoch + k)
        real_total = slots = 0
        for batch, real in plan.batches():
            real_total += real
            slots += batch["input_ids"].size
            passes["fill"] = (real_total, slots)
            stats.delivered(len(batch["input_ids"]), 0.0, time.perf_counter())
            yield batch
        stats.finished = time.perf_counter()

    tfds = tf.data.Dataset.from_generator(generate, output_signature=signature)
    tfds = tfds.prefetch(tf.data.AUTOTUNE)

    def state_dict(steps: int) -> dict[str, Any]:
        """The position after ``steps`` batches of the latest pass, on every rank."""
        plan, pass_epoch = passes["current"]
        steps = check_steps(steps, len(plan))
        at_epoch, rows = epoch_position(pass_epoch, plan.rows_after(steps), plan.total)
        return packed_state(dataset, settings, at_epoch, rows)

    def stats() -> dict[str, Any]:
        """The latest pass as produced for tf.data, with ``tokens``, ``fill``,
        ``token_counts`` and ``locality`` (as the torch loader's)."""
        current = passes["stats"] or PassStats(passes["current"][1])
        real, slots = passes["fill"]
        plan = passes["current"][0]
        return current.as_dict() | {
            "data_starved_pct": None,
            "tokens": real,
            "fill": real / slots if slots else 0.0,
            "token_counts": "recorded" if plan.packing.tokens_known else "read",
            "locality": plan.locality() | {"shards_touched": len(plan.touched)},
        }

    tfds.state_dict = state_dict
    tfds.stats = stats
    tfds.loader_settings = settings
    return tfds


register_framework("tf_packed", make_packed_tf_dataset)
