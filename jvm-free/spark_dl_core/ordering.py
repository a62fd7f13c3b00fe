"""The order of samples in an epoch, and each rank's share of it.

The global order is a pure function of (dataset fingerprint, seed, epoch, shuffle settings):
no dependence on world size or worker count, so a run can change either and resume.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .dataset import Batch, Dataset


def _rng(fingerprint: str, seed: int, epoch: int) -> np.random.Generator:
    key = hashlib.sha256(f"{fingerprint}:{seed}:{epoch}".encode()).digest()
    return np.random.default_rng(np.frombuffer(key, dtype=np.uint32))


def global_order(
    shard_sizes: np.ndarray, fingerprint: str, seed: int, epoch: int, shuffle: bool, window: int
) -> np.ndarray:
    """Every sample index once: shards shuffled, then samples shuffled within windows of
    ``window`` consecutive shards (in the shuffled shard order)."""
    offsets = np.concatenate([[0], np.cumsum(shard_sizes)]).astype(np.int64)
    total = int(offsets[-1])
    if not shuffle:
        return np.arange(total, dtype=np.int64)
    rng = _rng(fingerprint, seed, epoch)
    shards = rng.permutation(len(shard_sizes))
    pieces = []
    for start in range(0, len(shards), max(1, window)):
        group = shards[start : start + window]
        members = (
            np.concatenate([np.arange(offsets[s], offsets[s + 1], dtype=np.int64) for s in group])
            if len(group)
            else np.empty(0, dtype=np.int64)
        )
        pieces.append(members[rng.permutation(len(members))])
    return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)


@dataclass
class EpochPlan:
    """This rank's batches of one epoch, as arrays of global sample indices."""

    order: np.ndarray
    batch_size: int
    drop_last: bool

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
    ) -> EpochPlan:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        sizes = np.array([s.samples for s in dataset.shards], dtype=np.int64)
        order = global_order(sizes, dataset.fingerprint, seed, epoch, shuffle, shuffle_window or 4)
        # Deal whole batches round-robin: batch b of the global sequence goes to rank b % W.
        n_batches = len(order) // batch_size if drop_last else -(-len(order) // batch_size)
        mine = [
            order[b * batch_size : (b + 1) * batch_size] for b in range(rank, n_batches, world_size)
        ]
        return cls(
            np.concatenate(mine) if mine else np.empty(0, dtype=np.int64), batch_size, drop_last
        )

    def __len__(self) -> int:
        return -(-len(self.order) // self.batch_size)

    def batches(
        self, dataset: Dataset, *, start: int = 0, max_loaded: int = 8, **read: Any
    ) -> Iterator[Batch]:
        loaded: dict[int, Any] = {}
        for b in range(start, len(self)):
            index = self.order[b * self.batch_size : (b + 1) * self.batch_size]
            yield dataset.read(index, loaded=loaded, **read)
            while len(loaded) > max_loaded:
                loaded.pop(next(iter(loaded)))
