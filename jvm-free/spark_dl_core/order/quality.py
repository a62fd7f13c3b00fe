"""How well an order is shuffled: figures that compare orders, not part of any order."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    pass


def shuffle_quality(order: np.ndarray, shard_sizes: np.ndarray | None = None) -> dict[str, float]:
    """How well ``order`` (a permutation of 0..n-1) hides the source order.

    - ``position_correlation``: Pearson correlation of output position and source index
      (1.0 unshuffled, ~0 for a uniform shuffle).
    - ``adjacent_neighbours``: fraction of consecutive outputs that were source neighbours
      (|a - b| == 1): 1.0 unshuffled, ~2/n for a uniform shuffle.
    - ``mean_step``: mean |source distance| of consecutive outputs over n / 3 (its value
      for a uniform shuffle), so 1.0 means "as spread as uniform".
    - ``same_shard_adjacent`` (with ``shard_sizes``): fraction of consecutive outputs from
      the same shard: ~1/window for a windowed shuffle, ~1/num_shards for a uniform one.
      This is the figure the window trades against memory.
    """
    order = np.asarray(order, dtype=np.int64)
    n = len(order)
    if n < 3:
        return {"position_correlation": 1.0, "adjacent_neighbours": 1.0, "mean_step": 0.0}
    position = np.arange(n, dtype=np.float64)
    corr = float(np.corrcoef(position, order.astype(np.float64))[0, 1])
    steps = np.abs(np.diff(order))
    out = {
        "position_correlation": corr,
        "adjacent_neighbours": float(np.mean(steps == 1)),
        "mean_step": float(steps.mean() / (n / 3)),
    }
    if shard_sizes is not None:
        offsets = np.concatenate([[0], np.cumsum(shard_sizes)])
        shard = np.searchsorted(offsets, order, side="right") - 1
        out["same_shard_adjacent"] = float(np.mean(shard[1:] == shard[:-1]))
    return out


def step_spread(
    order: np.ndarray, shard_sizes: np.ndarray, batch_size: int, world_size: int
) -> dict[str, float]:
    """How many shards one batch's and one training step's rows come from (means).

    A step is global batches ``kW .. kW + W - 1`` (``W`` = ``world_size``). The windowed
    order draws a step from one window of shards whatever ``W``; a streamed order draws its
    ``W`` batches from ``W`` streams, each from one window of that stream's shards, so a step
    spreads over more shards as ``W`` grows.
    """
    order = np.asarray(order, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(shard_sizes)])
    shard = np.searchsorted(offsets, order, side="right") - 1

    def mean_distinct(size: int) -> float:
        whole = len(shard) // size
        if not whole:
            return float(len(np.unique(shard)))
        rows = np.sort(shard[: whole * size].reshape(whole, size), axis=1)
        return float(np.mean(1 + np.count_nonzero(np.diff(rows, axis=1), axis=1)))

    return {
        "shards_per_batch": mean_distinct(batch_size),
        "shards_per_step": mean_distinct(batch_size * world_size),
    }
