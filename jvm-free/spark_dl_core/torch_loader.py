"""PyTorch loading: an iterable of dicts of tensors, sharded over ranks and workers, resumable.

Internally a ``torch.utils.data.IterableDataset`` whose workers each decode *whole batches*
(``DataLoader(batch_size=None)``), so no per-sample Python objects cross process
boundaries. Which batch each rank and worker makes, and what a saved state means, is
defined in :mod:`spark_dl_core.ordering`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .ordering import (
    DEFAULT_PREFETCH_BYTES,
    BatchReader,
    EpochPlan,
    LoaderState,
    resolve_window,
)

if TYPE_CHECKING:
    from .dataset import Batch, Dataset


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values, else torch.distributed when initialized, else env RANK/WORLD_SIZE."""
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        found = dist.get_rank(), dist.get_world_size()
    else:
        found = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    return (found[0] if rank is None else int(rank)), (
        found[1] if world_size is None else int(world_size)
    )


def to_tensors(batch: Batch) -> dict[str, Any]:
    """numpy → torch without copies where possible; object/str columns stay numpy arrays."""
    out: dict[str, Any] = {}
    for name, value in batch.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
            if not value.flags.writeable:
                value = value.copy()  # torch wants writable memory (e.g. memory-mapped shards)
            out[name] = torch.from_numpy(value)
        else:
            out[name] = value
    return out


class _Batches(IterableDataset):
    """What each DataLoader worker runs: its round-robin share of this rank's batches.

    With workers, ``group`` consecutive batches travel as one item (decoded as one large
    batch, one shared-memory tensor per column): per-item IPC costs dominate otherwise.
    The main process splits the group back into batches (views, no copies).
    """

    def __init__(self, dataset: Dataset, plan: EpochPlan, read: dict[str, Any], group: int):
        self.dataset, self.plan, self.read, self.group = dataset, plan, read, group

    def __iter__(self) -> Iterator[tuple[list[int], dict[str, Any]]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        n, group = len(self.plan), self.group
        starts = range(worker * group, n, workers * group)
        groups = [list(range(g, min(g + group, n))) for g in starts]
        merged = [np.concatenate([self.plan.batches[j] for j in g]) for g in groups]
        reader = BatchReader(self.dataset, merged, **self.read)
        for g, batch in zip(groups, reader):
            yield [len(self.plan.batches[j]) for j in g], to_tensors(batch)


def _split(sizes: list[int], batch: dict[str, Any]) -> Iterator[dict[str, Any]]:
    at = 0
    for size in sizes:
        yield {k: v[at : at + size] for k, v in batch.items()}
        at += size


class TorchLoader:
    """A resumable, rank- and worker-sharded PyTorch loader over an MDS dataset.

    Iterate it like a DataLoader; each item is a dict of tensors (numeric columns) or numpy
    object arrays (strings, bytes, variable-shape arrays). Call :meth:`set_epoch` before each
    epoch for a new shuffle. :meth:`state_dict` records the global position (samples of the
    global order consumed by all ranks, assuming every rank took the same number of steps,
    as data-parallel training does) so :meth:`load_state_dict` resumes exactly, in a fresh
    process and at another world size.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        num_workers: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        columns: list[str] | None = None,
        shuffle_window: int | None = None,
        epoch: int = 0,
        images: str = "bytes",
        verify_hashes: bool = False,
        prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
        prefetch_factor: int | None = 2,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        multiprocessing_context: Any = None,
        group: int | None = None,
    ) -> None:
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.shuffle_window = resolve_window(shuffle_window)
        self.num_workers = int(num_workers)
        # Batches per worker item: ~8 MiB of fixed-width rows, at least one batch.
        row = dataset.layout.row_size or 0
        self.group = int(group or max(1, min(16, (8 << 20) // max(1, row * batch_size))))
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.read = {
            "columns": columns,
            "images": images,
            "verify_hashes": verify_hashes,
            "prefetch_bytes": prefetch_bytes,
        }
        self.loader_kwargs: dict[str, Any] = {
            "pin_memory": pin_memory,
            "multiprocessing_context": multiprocessing_context,
        }
        if self.num_workers > 0:
            self.loader_kwargs["prefetch_factor"] = prefetch_factor
            self.loader_kwargs["persistent_workers"] = False
        del persistent_workers  # each epoch has its own plan; workers are rebuilt per epoch
        self.epoch = int(epoch)
        self._consumed = 0  # global samples consumed before the current pass started
        self._steps = 0  # batches this rank has yielded in the current pass
        self._finished = False  # a pass ran to the end: iterating again repeats the epoch
        self._plan_for = self._build_plan()  # validates arguments eagerly

    # -- order

    def _build_plan(self) -> EpochPlan:
        return EpochPlan.build(
            self.dataset,
            batch_size=self.batch_size,
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=self.epoch,
            rank=self.rank,
            world_size=self.world_size,
            drop_last=self.drop_last,
            shuffle_window=self.shuffle_window,
            consumed=self._consumed,
        )

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's shuffle; a different epoch than the current starts it afresh."""
        if int(epoch) != self.epoch:
            self.epoch, self._consumed, self._steps = int(epoch), 0, 0
            self._finished = False
            self._plan_for = self._build_plan()

    def __len__(self) -> int:
        """Batches this rank yields in the (rest of the) current epoch."""
        return len(self._plan_for)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._steps:  # a pass was interrupted: continue after what was delivered
            self._consumed = self._plan_for.consumed_after(self._steps)
            self._steps = 0
            self._plan_for = self._build_plan()
        elif self._finished:
            self._consumed = 0  # iterating again after a full pass repeats the epoch
            self._plan_for = self._build_plan()
        self._finished = False
        plan = self._plan_for
        group = 1 if self.num_workers == 0 else self.group
        source = _Batches(self.dataset, plan, self.read, group)
        if self.num_workers == 0:
            items: Any = source
        else:
            items = DataLoader(
                source, batch_size=None, num_workers=self.num_workers, **self.loader_kwargs
            )
        for sizes, merged in items:
            for batch in _split(sizes, merged) if len(sizes) > 1 else [merged]:
                self._steps += 1
                yield batch
        self._consumed, self._steps, self._finished = plan.total, 0, True
        self._plan_for = self._build_plan()

    # -- state

    def state_dict(self) -> dict[str, Any]:
        """The global position: resumable at any world size and worker count."""
        consumed = self._plan_for.consumed_after(self._steps) if self._steps else self._consumed
        return LoaderState(
            fingerprint=self.dataset.fingerprint,
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            shuffle_window=self.shuffle_window,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            consumed=consumed,
        ).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after ``state``; raises if it is for another dataset or order.

        The batch size and ``drop_last`` may change: the position is counted in samples.
        """
        loaded = LoaderState.from_dict(state)
        loaded.check(
            self.dataset,
            seed=self.seed,
            shuffle=self.shuffle,
            shuffle_window=self.shuffle_window,
        )
        self.epoch, self._consumed, self._steps = loaded.epoch, loaded.consumed, 0
        self._finished = False
        self._plan_for = self._build_plan()

    def __repr__(self) -> str:
        return (
            f"<TorchLoader {self.dataset.path!r} batch_size={self.batch_size} "
            f"shuffle={self.shuffle} seed={self.seed} epoch={self.epoch} "
            f"rank={self.rank}/{self.world_size} workers={self.num_workers}>"
        )
