"""PyTorch loading: an iterable of dicts of tensors, sharded over ranks and workers, resumable.

Internally a ``torch.utils.data.IterableDataset`` whose workers each decode *whole batches*
(``DataLoader(batch_size=None)``), so no per-sample Python objects cross process
boundaries. Which batch each rank and worker makes, and what a saved state means, is
defined in :mod:`spark_dl_core.order`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .order import EpochPlan, LoaderState, resolve_window
from .reader import DEFAULT_PREFETCH_BYTES, BatchReader

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


class _Slabs:
    """Reusable shared-memory output buffers for DataLoader workers, with free counts.

    Sending a fresh tensor from a worker costs a shared-memory segment, a copy into it and a
    file-descriptor hand-over per item; on a small machine that per-item cost outweighs the
    decoding the worker saved. Instead each worker gets a ring of ``depth`` slabs, allocated
    once (before the workers start, so fork inherits and spawn passes them once), decodes
    fixed-width batches straight into the next slab and sends only (slab, offsets, dtypes).
    The main process copies the batch out (one memcpy: the user may keep batches as long as
    they like) and releases the slab through a per-worker semaphore. Workers wait for a free
    slab, so at most ``depth`` items per worker are in flight; ``stop`` ends waiting workers
    when the consumer goes away mid-epoch.
    """

    def __init__(self, workers: int, depth: int, nbytes: int, context: Any) -> None:
        self.depth = depth
        self.tensor = torch.empty((workers, depth, nbytes), dtype=torch.uint8).share_memory_()
        self.free = [context.Semaphore(depth) for _ in range(workers)]
        self.stop = context.Event()

    def acquire(self, worker: int) -> bool:
        """Wait for worker's next slab; False if the consumer stopped meanwhile."""
        while not self.free[worker].acquire(timeout=0.05):
            if self.stop.is_set():
                return False
        return True


class _SlabItem:
    """What a worker sends for a slab-decoded group: where each column lies in which slab."""

    __slots__ = ("columns", "others", "slab", "worker")

    def __init__(
        self,
        worker: int,
        slab: int,
        columns: dict[str, tuple[int, str, tuple[int, ...]]],
        others: dict[str, Any],
    ) -> None:
        self.worker, self.slab, self.columns, self.others = worker, slab, columns, others

    def take(self, slabs: _Slabs, pin: bool) -> dict[str, Any]:
        """Copy the columns out of the slab, then hand the slab back to its worker."""
        try:
            raw = slabs.tensor[self.worker, self.slab].numpy()
            out: dict[str, Any] = {}
            for name, (offset, dtype, shape) in self.columns.items():
                dt = np.dtype(dtype)
                size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
                view = raw[offset : offset + size].view(dt).reshape(shape)
                tensor = torch.from_numpy(view.copy())
                out[name] = tensor.pin_memory() if pin else tensor
        finally:
            slabs.free[self.worker].release()
        out.update(self.others)
        return out


def _in_slab(value: Any, slab: np.ndarray) -> int | None:
    """Byte offset of a C-contiguous numeric array inside ``slab``, else None."""
    if not (isinstance(value, np.ndarray) and value.dtype.kind in "biufc"):
        return None
    if not value.flags.c_contiguous or not np.shares_memory(value, slab):
        return None
    offset = value.__array_interface__["data"][0] - slab.__array_interface__["data"][0]
    return offset if offset >= 0 and offset + value.nbytes <= slab.nbytes else None


def _identity(item: Any) -> Any:
    """DataLoader ``collate_fn`` for ``batch_size=None``: workers already made tensors."""
    return item


class _Batches(IterableDataset):
    """What each DataLoader worker runs: its round-robin share of this rank's batches.

    With workers, ``group`` consecutive batches travel as one item (decoded as one large
    batch): per-item IPC costs dominate otherwise. Fixed-width columns are decoded into the
    worker's shared-memory slabs (:class:`_Slabs`) when given. The main process splits the
    group back into batches (views of one copy, no per-batch copies).
    """

    def __init__(
        self,
        dataset: Dataset,
        plan: EpochPlan,
        read: dict[str, Any],
        group: int,
        slabs: _Slabs | None = None,
    ):
        self.dataset, self.plan, self.read, self.group = dataset, plan, read, group
        self.slabs = slabs

    def __iter__(self) -> Iterator[tuple[list[int], Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        n, group = len(self.plan), self.group
        # Groups k = 0, 1, ... of 1, 2, 4, ... up to ``group`` batches go to worker k % workers
        # (the order DataLoader returns them in): small first groups, fast first batches.
        bounds: list[tuple[int, int]] = []
        at = 0
        while at < n:
            size = min(group, 1 << len(bounds))
            bounds.append((at, min(n, at + size)))
            at += size
        groups = [list(range(a, b)) for a, b in bounds[worker::workers]]
        # Index arrays live for the whole pass: no copy for single-batch groups.
        merged = [
            self.plan.batches[g[0]]
            if len(g) == 1
            else np.concatenate([self.plan.batches[j] for j in g])
            for g in groups
        ]
        reader = BatchReader(self.dataset, merged, **self.read)
        slabs = self.slabs if info is not None else None
        used: list[int] = []  # slab of the batch being decoded (-1: none)
        if slabs is not None:
            ring = slabs.tensor[worker].numpy()

            def out_for(j: int, nbytes: int) -> np.ndarray | None:
                if nbytes > ring.shape[1] or not slabs.acquire(worker):
                    used.append(-1)
                    return None
                used.append(j % slabs.depth)
                return ring[used[-1]]

            reader.out_for = out_for
        for g, batch in zip(groups, reader):
            sizes = [len(self.plan.batches[j]) for j in g]
            if slabs is not None and used and used[-1] >= 0:
                k = used[-1]
                columns, others = {}, {}
                for name, value in batch.items():
                    offset = _in_slab(value, ring[k])
                    if offset is None:
                        others[name] = value
                    else:
                        columns[name] = (offset, value.dtype.str, tuple(value.shape))
                yield sizes, _SlabItem(worker, k, columns, to_tensors(others))
            elif slabs is not None and slabs.stop.is_set():
                return  # the consumer left mid-epoch
            else:
                yield sizes, to_tensors(batch)


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

    With ``num_workers > 0`` each DataLoader worker decodes ``group`` batches per item; for
    all-fixed-width datasets straight into reusable shared-memory slabs (:class:`_Slabs`),
    so the main process only copies each batch out once. ``progress=True`` shows a tqdm bar
    over this rank's batches of the epoch (needs the ``progress`` extra).
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
        verify_hashes: bool | None = None,
        prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
        prefetch_factor: int | None = 2,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        multiprocessing_context: Any = None,
        group: int | None = None,
        progress: bool = False,
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
        self.read: dict[str, Any] = {
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
        self.progress = bool(progress)
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

    def _bar(self, total: int) -> Any:
        """A tqdm bar over this rank's batches of the epoch (``progress=True``)."""
        try:
            from tqdm.auto import tqdm
        except ImportError:  # pragma: no cover - tqdm is the "progress" extra
            raise ImportError(
                "progress=True needs tqdm: pip install 'spark-dl-core[progress]'"
            ) from None
        desc = f"epoch {self.epoch}" + (f" rank {self.rank}" if self.world_size > 1 else "")
        return tqdm(total=total, desc=desc, unit="batch")

    def _slabs(self, group: int) -> _Slabs | None:
        """Shared-memory slabs for the workers, if this dataset decodes fixed-width."""
        probe = BatchReader(self.dataset, [], columns=self.read["columns"])
        nbytes = probe.fixed_bytes(group * self.batch_size)
        if not nbytes:
            return None
        context = self.loader_kwargs["multiprocessing_context"]
        if context is None or isinstance(context, str):
            context = torch.multiprocessing.get_context(context)
        depth = (self.loader_kwargs.get("prefetch_factor") or 2) + 2
        return _Slabs(self.num_workers, depth, nbytes, context)

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
        slabs = self._slabs(group) if self.num_workers > 0 else None
        source = _Batches(self.dataset, plan, self.read, group, slabs)
        if self.num_workers == 0:
            items: Any = iter(source)
        else:
            items = iter(
                DataLoader(
                    source,
                    batch_size=None,
                    num_workers=self.num_workers,
                    collate_fn=_identity,
                    **self.loader_kwargs,
                )
            )
        pin = bool(self.loader_kwargs["pin_memory"]) and torch.cuda.is_available()
        bar = self._bar(len(plan)) if self.progress else None
        try:
            for sizes, item in items:
                merged = item.take(slabs, pin) if isinstance(item, _SlabItem) and slabs else item
                for batch in _split(sizes, merged) if len(sizes) > 1 else [merged]:
                    self._steps += 1
                    if bar is not None:
                        bar.update(1)
                    yield batch
        finally:
            if slabs is not None:
                slabs.stop.set()  # wake workers waiting for a slab, then shut them down
            if bar is not None:
                bar.close()
            del items
        self._consumed, self._steps, self._finished = plan.total, 0, True
        # Nothing is left of this epoch: an empty plan, without recomputing the order.
        self._plan_for = EpochPlan([], self.batch_size, plan.total, self.world_size, plan.total)

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
