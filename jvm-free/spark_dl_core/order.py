"""The order of samples in an epoch, each rank's and worker's share of it, and resume state.

Three rules make runs reproducible and elastic:

1. The *global order* of an epoch is a pure function of (dataset fingerprint, seed, epoch,
   shuffle, shuffle window); it never looks at world size or worker count.
2. The remaining order (after ``consumed`` samples) is cut into *global batches* of
   ``batch_size``; global batch ``g`` goes to rank ``g % world_size``. Within a rank, its
   ``j``-th batch goes to DataLoader worker ``j % num_workers``, which is exactly the order
   in which ``torch.utils.data.DataLoader`` hands worker outputs back, so a rank's batch
   sequence does not depend on the number of workers either.
3. Resume state is "how many samples of the global order are consumed". Data-parallel
   training steps all ranks together, so after ``k`` steps on each of ``W`` ranks the first
   ``k * W`` global batches are consumed, whatever ``W`` was; a restart at any other world
   size deals the rest afresh: none seen twice, none lost.

Shuffling is two-level (as in Mosaic Streaming's block shuffles): shards are permuted, then
samples are permuted within *windows* of ``shuffle_window`` consecutive shards of that
permutation. A reader only ever needs the shards of one window (plus prefetch) in memory:
memory ~ ``shuffle_window x shard size`` per reader, while shuffle quality grows with the
window (:func:`shuffle_quality` measures it).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import SpecError

if TYPE_CHECKING:
    from .dataset import Dataset

DEFAULT_WINDOW = 4


def _rng(fingerprint: str, seed: int, epoch: int) -> np.random.Generator:
    key = hashlib.sha256(f"spark-dl:{fingerprint}:{seed}:{epoch}".encode()).digest()
    return np.random.Generator(np.random.PCG64(np.frombuffer(key, dtype=np.uint32)))


def global_order(
    shard_sizes: np.ndarray,
    fingerprint: str,
    seed: int,
    epoch: int,
    shuffle: bool,
    window: int = DEFAULT_WINDOW,
) -> np.ndarray:
    """Every sample index once: shards permuted, then samples permuted within windows of
    ``window`` consecutive shards of that permutation. Pure function of its arguments."""
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    total = int(offsets[-1])
    if not shuffle:
        return np.arange(total, dtype=np.int64)
    if window < 1:
        raise SpecError(f"shuffle_window must be >= 1 shard, got {window}")
    rng = _rng(fingerprint, seed, epoch)
    shards = rng.permutation(len(sizes))
    pieces = []
    for start in range(0, len(shards), window):
        group = shards[start : start + window]
        members = np.concatenate(
            [np.arange(offsets[s], offsets[s + 1], dtype=np.int64) for s in group]
        )
        pieces.append(members[rng.permutation(len(members))])
    return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class LoaderState:
    """Where an epoch stands, independent of world size: enough to resume exactly.

    ``consumed`` counts samples of the global order already delivered (all ranks together).
    """

    fingerprint: str
    seed: int
    epoch: int
    shuffle: bool
    shuffle_window: int
    batch_size: int
    drop_last: bool
    consumed: int
    version: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> LoaderState:
        missing = {f for f in cls.__dataclass_fields__ if f != "version"} - set(state)
        if missing:
            raise SpecError(f"loader state lacks {sorted(missing)}; was it made by spark-dl?")
        return cls(**{k: state[k] for k in cls.__dataclass_fields__ if k in state})

    def check(self, dataset: Dataset, **settings: Any) -> None:
        """Raise if this state belongs to another dataset or other order settings."""
        if self.fingerprint != dataset.fingerprint:
            raise SpecError(
                f"loader state is for dataset {self.fingerprint[:16]}…, but {dataset.path} has "
                f"fingerprint {dataset.fingerprint[:16]}…: resuming would mix up samples"
            )
        for name, value in settings.items():
            if getattr(self, name) != value:
                raise SpecError(
                    f"loader state was saved with {name}={getattr(self, name)!r}, the loader "
                    f"has {name}={value!r}; pass the same value to resume exactly"
                )
        if not 0 <= self.consumed <= len(dataset):
            raise SpecError(f"loader state consumed={self.consumed} is outside 0..{len(dataset)}")


def resolve_window(window: int | None) -> int:
    return DEFAULT_WINDOW if window is None else int(window)


@dataclass
class EpochPlan:
    """One rank's batches of one epoch (from ``consumed`` on), as global sample indices.

    ``batches[j]`` is the rank-local batch ``j``. With ``drop_last`` the incomplete final
    global batch is dropped and the tail is cut to a whole number of rounds, so every rank
    gets the same number of steps (DDP needs that); without it, ranks differ by at most one
    batch and the last batch may be short (no padding, no repeated samples).
    """

    batches: list[np.ndarray]
    batch_size: int
    consumed: int
    world_size: int
    total: int

    @classmethod
    def build(
        cls,
        dataset: Dataset,
        *,
        batch_size: int,
        shuffle: bool,
        seed: int,
        epoch: int,
        rank: int,
        world_size: int,
        drop_last: bool,
        shuffle_window: int | None,
        consumed: int = 0,
    ) -> EpochPlan:
        if batch_size < 1:
            raise SpecError(f"batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise SpecError(f"rank {rank} is not in 0..{world_size - 1}")
        sizes = np.array([s.samples for s in dataset.shards], dtype=np.int64)
        order = global_order(
            sizes, dataset.fingerprint, seed, epoch, shuffle, resolve_window(shuffle_window)
        )
        return cls.from_order(order, batch_size, rank, world_size, drop_last, consumed)

    @classmethod
    def from_order(
        cls,
        order: np.ndarray,
        batch_size: int,
        rank: int,
        world_size: int,
        drop_last: bool,
        consumed: int = 0,
    ) -> EpochPlan:
        rest = order[min(consumed, len(order)) :]
        if drop_last:
            n_batches = len(rest) // batch_size
            n_batches -= n_batches % world_size
        else:
            n_batches = -(-len(rest) // batch_size)
        batches = [
            rest[g * batch_size : (g + 1) * batch_size] for g in range(rank, n_batches, world_size)
        ]
        return cls(batches, batch_size, consumed, world_size, len(order))

    def __len__(self) -> int:
        return len(self.batches)

    def consumed_after(self, steps: int) -> int:
        """Global samples consumed once every rank has taken ``steps`` batches of this plan."""
        return min(self.total, self.consumed + steps * self.world_size * self.batch_size)


# --------------------------------------------------------------------------- quality


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
