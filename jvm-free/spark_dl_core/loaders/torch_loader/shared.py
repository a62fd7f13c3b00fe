"""Shared memory between DataLoader workers and the main process: which pass the workers
serve (:class:`_PassControl`), segments images are decoded into and lent out
(:class:`_Leases`), and the ring of reusable output slabs that fixed-width batches are
decoded into (:class:`_Slabs`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .tensors import ImageTensors, JaggedTensors


def _shared_bytes(shape: tuple[int, ...]) -> np.ndarray:
    """A uint8 array in shared memory (a worker's decoded images): sending its tensor to
    the main process passes a file descriptor instead of copying the pixels again.

    Allocated in shared memory from the start: ``Tensor.share_memory_()`` would allocate
    private memory, then a shared segment, and copy one into the other (a fifth of a
    decode-only worker's time in a profile)."""
    nbytes = int(np.prod(shape, dtype=np.int64))
    return _bytes_over(torch.UntypedStorage._new_shared(nbytes), shape)


def _bytes_over(storage: torch.UntypedStorage, shape: tuple[int, ...]) -> np.ndarray:
    """A C-contiguous uint8 array of ``shape`` at the start of ``storage``."""
    strides = np.cumprod([1, *shape[:0:-1]])[::-1].tolist() if shape else []
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, shape, strides).numpy()


class _PassControl:
    """The pass persistent DataLoader workers serve: (generation, epoch, consumed) in shared
    memory, written by the main process before each pass starts.

    Persistent workers keep the dataset object copied when they started, so a new pass's
    position reaches them here: each worker reads it when DataLoader re-creates its
    iterator (at a pass's start) and builds that pass's plan itself. The generation is odd
    while a pass runs and even between passes; a worker whose generation is no longer the
    current one belongs to a pass that ended (perhaps early) and stops at once.
    """

    def __init__(self) -> None:
        self.tensor = torch.zeros(3, dtype=torch.int64).share_memory_()

    def start(self, epoch: int, consumed: int) -> None:
        """Main process, before a pass's workers begin: its position and a new generation."""
        values = self.tensor.numpy()
        values[1], values[2] = epoch, consumed
        values[0] += 1 if values[0] % 2 == 0 else 2

    def end(self) -> None:
        """Main process, when a pass ends (fully or early): its workers stop."""
        self.tensor.numpy()[0] += 1

    def read(self) -> tuple[int, int, int]:
        """Worker side: (generation, epoch, consumed) of the current pass."""
        generation, epoch, consumed = (int(v) for v in self.tensor.numpy())
        return generation, epoch, consumed

    def live(self, generation: int) -> bool:
        """Whether the pass of ``generation`` is still running."""
        return generation % 2 == 1 and int(self.tensor.numpy()[0]) == generation


class _Leases:
    """Reusable shared-memory buffers that DataLoader workers decode images into, lent to
    the main process and taken back once no tensor over one is left there.

    A fresh shared-memory segment per batch costs its pages: allocating, zeroing and
    mapping a batch of full-size pixels took about a third as long as decoding them
    (measured in one process: 530 images/s into fresh segments, 820 into reused ones).
    Each worker keeps up to ``slots`` segments; ``state[worker, slot]`` is 1 once the worker
    lends segment ``slot`` and 2 once the main process receives it (it may then hold tensors
    over it). The main process watches the storages of each item it receives (torch's weak
    storage references, which every view shares) and sets the item's slots back to 0 once
    all of them are freed. Items of a pass that ended early that never reached the main
    process stay at 1: a persistent worker takes them back when its next pass starts. A
    batch the user keeps keeps its segment: the worker takes another, or a fresh one when
    all are lent, so reuse never changes a tensor the user still holds.
    """

    def __init__(self, workers: int, slots: int) -> None:
        self.__setstate__(
            {"slots": slots, "state": torch.zeros((workers, slots), dtype=torch.uint8)}
        )
        self.state.share_memory_()

    def __getstate__(self) -> dict[str, Any]:  # spawn: each process starts with no pool
        return {"slots": self.slots, "state": self.state}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.slots: int = state["slots"]
        self.state: torch.Tensor = state["state"]
        self._pool: list[torch.UntypedStorage | None] = [None] * self.slots  # this worker's
        self._lent: list[int] = []  # slots the item being decoded took (worker side)
        self._watched: list[tuple[list[Any], int, list[int]]] = []  # main side

    # -- worker side

    def alloc(self, worker: int, shape: tuple[int, ...]) -> np.ndarray:
        """A uint8 array of ``shape`` in a free segment of ``worker`` (else a fresh one)."""
        nbytes = int(np.prod(shape, dtype=np.int64))
        state = self.state[worker].numpy()
        free = [i for i in range(self.slots) if state[i] == 0]
        if not free:
            return _shared_bytes(shape)
        fits = [i for i in free if (self._pool[i] or _EMPTY).nbytes() >= nbytes]
        if fits:
            slot = min(fits, key=lambda i: (self._pool[i] or _EMPTY).nbytes())
        else:  # grow the smallest free segment, with headroom for the next batch's sizes
            slot = min(free, key=lambda i: (self._pool[i] or _EMPTY).nbytes())
            size = -(-(nbytes + nbytes // 4) // _SEGMENT_ROUND) * _SEGMENT_ROUND
            self._pool[slot] = None  # free the old segment before the new one
            self._pool[slot] = torch.UntypedStorage._new_shared(size)
        state[slot] = 1
        self._lent.append(slot)
        storage = self._pool[slot]
        assert storage is not None
        return _bytes_over(storage, shape)

    def reclaim(self, worker: int) -> None:
        """At a worker's pass start: segments lent to items the main process never received
        (a pass that ended early; DataLoader dropped them) are free again."""
        state = self.state[worker].numpy()
        state[state == 1] = 0

    def take_lent(self) -> list[int]:
        """The slots the item just decoded holds (sent along with it)."""
        lent, self._lent = self._lent, []
        return lent

    # -- main side

    def watch(self, worker: int, slots: list[int], item: Any) -> None:
        """Hand ``slots`` back to ``worker`` once every storage of ``item`` is freed."""
        self.release_freed()
        if slots:
            self.state.numpy()[worker, slots] = 2
            refs = [StorageWeakRef(t.untyped_storage()) for t in _tensors_of(item)]
            self._watched.append((refs, worker, slots))

    def release_freed(self) -> None:
        state = self.state.numpy()
        kept = []
        for refs, worker, slots in self._watched:
            if all(ref.expired() for ref in refs):
                state[worker, slots] = 0
            else:
                kept.append((refs, worker, slots))
        self._watched = kept


_EMPTY = torch.UntypedStorage(0)
_SEGMENT_ROUND = 1 << 20


def _tensors_of(item: Any) -> Iterator[torch.Tensor]:
    """The tensors of a worker item (a batch dict), those inside carriers included."""
    values = item.values() if isinstance(item, dict) else [item]
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, ImageTensors):
            yield value.flat
        elif isinstance(value, JaggedTensors):
            yield value.values


class _Slabs:
    """Reusable shared-memory output buffers for DataLoader workers, with free counts.

    Sending a fresh tensor from a worker costs a shared-memory segment, a copy into it and a
    file-descriptor hand-over per item; on a small machine that per-item cost outweighs the
    decoding the worker saved. Instead each worker gets a ring of ``depth`` slabs, allocated
    once (before the workers start, so fork inherits and spawn passes them once), decodes
    fixed-width batches straight into the next slab and sends only (slab, offsets, dtypes).
    The main process copies the batch out (one memcpy: the user may keep batches as long as
    they like) and releases the slab through a per-worker semaphore. Workers wait for a free
    slab, so at most ``depth`` items per worker are in flight; a worker waiting for a slab
    stops when its pass ends (the consumer went away mid-epoch).
    """

    def __init__(self, workers: int, depth: int, nbytes: int, context: Any) -> None:
        self.depth = depth
        # Made in shared memory at once: ``share_memory_()`` would first allocate private
        # memory and copy all of it (every page touched twice before the first pass).
        storage = torch.UntypedStorage._new_shared(workers * depth * nbytes)
        shape = (workers, depth, nbytes)
        self.tensor = torch.empty(0, dtype=torch.uint8).set_(
            storage, 0, shape, (depth * nbytes, nbytes, 1)
        )
        self.free = [context.Semaphore(depth) for _ in range(workers)]

    def acquire(self, worker: int, live: Callable[[], bool]) -> bool:
        """Wait for worker's next slab; False if its pass ended meanwhile."""
        while not self.free[worker].acquire(timeout=0.05):
            if not live():
                return False
        return True

    def reset(self, worker: int) -> None:
        """At a worker's pass start: every slab free again. Items of an earlier pass that
        the main process never took (a pass that ended early) will never release theirs."""
        free = self.free[worker]
        while free.acquire(block=False):
            pass
        for _ in range(self.depth):
            free.release()


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
    if not value.flags.c_contiguous:
        return None
    # bounds by address (np.shares_memory solves an overlap problem: ~0.1 ms a call)
    offset = value.__array_interface__["data"][0] - slab.__array_interface__["data"][0]
    return offset if offset >= 0 and offset + value.nbytes <= slab.nbytes else None
