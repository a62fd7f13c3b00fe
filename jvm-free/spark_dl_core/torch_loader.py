"""PyTorch loading: an iterable of dicts of tensors, sharded over ranks and workers, resumable.

Internally a ``torch.utils.data.IterableDataset`` whose workers each decode *whole batches*
(``DataLoader(batch_size=None)``), so no per-sample Python objects cross process
boundaries. Which batch each rank and worker makes, and what a saved state means, is
defined in :mod:`spark_dl_core.order`.
"""

from __future__ import annotations

import functools
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .errors import SpecError
from .format.buffers import Jagged
from .frameworks import register_framework
from .images import ImageList
from .loader_settings import (
    PAD_MASK,
    TORCH_ONLY,
    LoaderSettings,
    check_pad_mask,
    reader_extras,
    settings_from,
)
from .order import EpochPlan, LoaderState
from .reader import BatchReader, EncodedImages, ReadOps
from .telemetry import PassStats, Spans

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
    """numpy → torch without copies where possible.

    Dense numeric columns become tensors; token sequences (:class:`Jagged`) become
    ``torch.nested`` jagged tensors over one values and one offsets buffer (no copy);
    str/bytes/json columns stay numpy object arrays. The form of each column is fixed by
    the dataset (``Dataset.forms``), never by which samples a batch holds.
    """
    out: dict[str, Any] = {}
    for name, value in batch.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
            out[name] = _as_tensor(value)
        elif isinstance(value, ImageList):  # images of several sizes: views of one tensor
            out[name] = ImageTensors(_as_tensor(value.flat), value.shapes)
        elif isinstance(value, Jagged):
            values = torch.from_numpy(_writable(np.ascontiguousarray(value.values)))
            out[name] = JaggedTensors(values, value.offsets.astype(np.int64, copy=False))
        else:
            out[name] = value
    return out


def nested_jagged(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """A ``torch.nested`` jagged tensor over ``values`` split at ``offsets`` (no copy).

    The public ``nested_tensor_from_jagged`` also records an autograd view relation, which
    costs about 0.1 ms: at 16 documents a batch that is most of a batch's budget, and a
    loader's batches never need it. Where this torch's jagged class is as expected the
    tensor is made directly (:func:`_jagged_maker`); else the public function.
    """
    return _jagged_maker()(values, offsets)


@functools.cache
def _jagged_maker() -> Any:
    """The fastest way this torch offers to make a jagged tensor that behaves exactly like
    the public function's: torch's jagged wrapper made from its parts (about 20 µs less
    than the class's constructor, which re-checks its inputs and multiplies symbolic
    sizes), else the class, else the public function. Each candidate is checked against the
    public function on a probe; the first that matches is used."""
    public = torch.nested.nested_tensor_from_jagged
    try:
        from torch._C import DispatchKey, DispatchKeySet
        from torch.nested._internal.nested_tensor import NestedTensor, get_tensor_symint
    except ImportError:  # another torch: the public function
        return public
    keys = DispatchKeySet(DispatchKey.NestedTensor).add(DispatchKey.AutogradNestedTensor)

    def direct(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        if values.dim() != 1:
            return NestedTensor(values, offsets)
        ragged = get_tensor_symint(offsets, coeff=1)
        size, strides = (offsets.shape[0] - 1, ragged), (ragged, 1)
        out = torch.Tensor._make_wrapper_subclass(
            NestedTensor,
            size,
            strides,
            0,
            torch.contiguous_format,
            values.dtype,
            torch.jagged,
            values.device,
            False,
            False,
            "sizes",
            False,
            True,
            keys,
            storage_size=values.untyped_storage().size(),
        )
        out._ragged_idx, out._size, out._strides = 1, size, strides
        NestedTensor.__init__(out, values, offsets)
        return out

    for candidate in (direct, NestedTensor):
        try:
            if _same_jagged(candidate, public):
                return candidate
        except Exception:  # a candidate this torch cannot run: try the next
            continue
    return public


def _same_jagged(make: Any, public: Any) -> bool:
    """Whether ``make`` gives what the public function gives, on 1-D and 2-D values."""
    for values in (torch.arange(6, dtype=torch.int32), torch.arange(12.0).reshape(6, 2)):
        offsets = torch.tensor([0, 2, 2, 6])
        ours, ref = make(values, offsets), public(values, offsets.clone())
        if type(ours) is not type(ref) or ours.layout != ref.layout or ours.dim() != ref.dim():
            return False
        if ours.dtype != ref.dtype or ours.requires_grad or ours.is_contiguous() is not True:
            return False
        if ours.values().data_ptr() != values.data_ptr() or ours.offsets() is not offsets:
            return False
        if ours._ragged_idx != ref._ragged_idx or ours.shape[0] != ref.shape[0]:
            return False
        if len(ours.stride()) != len(ref.stride()) or ours.stride()[1:] != ref.stride()[1:]:
            return False
        pairs = zip((ours + 1).unbind(), (ref + 1).unbind())
        if not all(torch.equal(a, b) for a, b in pairs):
            return False
        if not torch.equal(ours.to_padded_tensor(-1), ref.to_padded_tensor(-1)):
            return False
    return True


class JaggedTensors:
    """A token-sequence column between decode and delivery: one values tensor and numpy
    offsets. It crosses process boundaries as a plain tensor, splits into batches by
    slicing, and becomes a ``torch.nested`` jagged tensor once, when delivered."""

    __slots__ = ("offsets", "ready", "values")

    def __init__(
        self, values: torch.Tensor, offsets: np.ndarray, ready: torch.Tensor | None = None
    ) -> None:
        self.values, self.offsets = values, offsets
        self.ready = ready  # the offsets as a tensor from 0, when already made

    def split(self, sizes: list[int]) -> list[JaggedTensors]:
        """Consecutive batches of ``sizes`` rows, their offsets made in one step (one
        tensor, a view per batch) rather than per batch."""
        bounds = np.cumsum([0, *sizes])
        counts = np.asarray(sizes) + 1
        block = np.repeat(np.arange(len(sizes)), counts)
        rows = np.arange(int(counts.sum())) - block  # each batch's rows, its end row too
        firsts = self.offsets[bounds[:-1]]
        ready = torch.from_numpy(self.offsets[rows] - firsts[block])
        out = []
        for k in range(len(sizes)):
            lo, hi = int(bounds[k]), int(bounds[k + 1])
            values = self.values[int(self.offsets[lo]) : int(self.offsets[hi])]
            out.append(JaggedTensors(values, self.offsets[lo : hi + 1], ready[lo + k : hi + k + 1]))
        return out

    def nested(self) -> torch.Tensor:
        if self.ready is not None:
            return nested_jagged(self.values, self.ready)
        first = int(self.offsets[0])
        values = self.values[first : int(self.offsets[-1])] if first else self.values
        offsets = self.offsets - first if first else self.offsets
        return nested_jagged(values, torch.from_numpy(offsets))


class ImageTensors:
    """Images of several sizes crossing from a worker as one tensor; :meth:`images` gives
    the list of ``[H, W, C]`` tensors (views) the user sees."""

    __slots__ = ("flat", "shapes")

    def __init__(self, flat: torch.Tensor, shapes: np.ndarray) -> None:
        self.flat, self.shapes = flat, shapes

    def rows(self, start: int, stop: int) -> ImageTensors:
        sizes = np.prod(self.shapes, axis=1)
        lo, hi = int(sizes[:start].sum()), int(sizes[:stop].sum())
        return ImageTensors(self.flat[lo:hi], self.shapes[start:stop])

    def images(self) -> list[torch.Tensor]:
        sizes = np.prod(self.shapes, axis=1).tolist()
        parts = torch.split(self.flat, sizes) if sizes else []
        return [p.view(*shape) for p, shape in zip(parts, self.shapes.tolist())]


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


class _Leases:
    """Reusable shared-memory buffers that DataLoader workers decode images into, lent to
    the main process and taken back once no tensor over one is left there.

    A fresh shared-memory segment per batch costs its pages: allocating, zeroing and
    mapping a batch of full-size pixels took about a third as long as decoding them
    (measured in one process: 530 images/s into fresh segments, 820 into reused ones).
    Each worker keeps up to ``slots`` segments; ``state[worker, slot]`` is 1 while the main
    process may hold tensors over segment ``slot``. The main process watches the storages
    of each item it receives (torch's weak storage references, which every view shares)
    and sets the item's slots back to 0 once all of them are freed. A batch the user keeps
    keeps its segment: the worker takes another, or a fresh one when all are lent, so
    reuse never changes a tensor the user still holds.
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

    def take_lent(self) -> list[int]:
        """The slots the item just decoded holds (sent along with it)."""
        lent, self._lent = self._lent, []
        return lent

    # -- main side

    def watch(self, worker: int, slots: list[int], item: Any) -> None:
        """Hand ``slots`` back to ``worker`` once every storage of ``item`` is freed."""
        self.release_freed()
        if slots:
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


def _as_tensor(value: np.ndarray) -> torch.Tensor:
    """The shared-memory tensor a :func:`_shared_bytes` array is, else a tensor over it."""
    base = value.base
    if (
        isinstance(base, torch.Tensor)
        and base.is_shared()
        and base.data_ptr() == value.ctypes.data
        and tuple(base.shape) == value.shape
    ):
        return base
    return torch.from_numpy(_writable(value))


def _writable(value: np.ndarray) -> np.ndarray:
    # torch wants writable memory (e.g. memory-mapped shards)
    return value if value.flags.writeable else value.copy()


def _warm_nested() -> None:
    """The first jagged tensor of a process imports torch.distributed.tensor (seconds):
    do it when the loader is built, not in the first batch (workers inherit it on fork)."""
    nested_jagged(torch.zeros(1), torch.tensor([0, 1]))


def take_rows(value: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of one column of a worker item (views where possible)."""
    if isinstance(value, (EncodedImages, ImageTensors)):
        return value.rows(start, stop)
    return value[start:stop]


def to_device(batch: dict[str, Any], device: str | None, non_blocking: bool = False) -> Any:
    """Finish a batch in the main process: decode shipped images on ``device`` in one
    batched call per column, and move tensors there."""
    if device is None:
        for name, value in batch.items():
            if isinstance(value, JaggedTensors):
                batch[name] = value.nested()
            elif isinstance(value, ImageTensors):
                batch[name] = value.images()
        return batch
    out: dict[str, Any] = {}
    for name, value in batch.items():
        if isinstance(value, JaggedTensors):
            out[name] = value.nested().to(device, non_blocking=non_blocking)
        elif isinstance(value, ImageTensors):
            out[name] = [image.to(device, non_blocking=non_blocking) for image in value.images()]
        elif isinstance(value, EncodedImages):
            out[name] = value.to_device(device)
        elif isinstance(value, torch.Tensor):
            out[name] = value.to(device, non_blocking=non_blocking)
        else:
            out[name] = value
    return out


def check_device(device: str | None, transforms: Any, dataset: Dataset) -> str | None:
    """Where image decoding runs: ``device`` when it can, else None (DataLoader workers).

    ``device="cuda"`` without CUDA is an error; with CUDA but no GPU JPEG decoder
    (torchvision) images decode in the workers and batches move to the GPU (a warning says
    so).
    """
    if device is None or str(device) == "cpu":
        return None
    device = str(device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecError(
            f"device={device!r}, but torch sees no CUDA device (torch {torch.__version__}); "
            "leave device unset to decode on the CPU in the DataLoader workers"
        )
    if not ReadOps(dataset, transforms, None).pipelines:
        return None
    from .images import gpu_decoder_available

    if not gpu_decoder_available():
        warnings.warn(
            f"device={device!r}: torchvision's decode_jpeg is not importable, so images "
            "decode on the CPU in the DataLoader workers and batches then move to the GPU",
            stacklevel=3,
        )
        return None
    return device


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


def _mean_sample_bytes(dataset: Dataset) -> int:
    """Average stored (uncompressed) bytes of one sample: the row size of variable data."""
    samples = max(1, len(dataset))
    return max(1, int(dataset.shards.raw_bytes.sum()) // samples)


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
        trace: bool = False,
        leases: _Leases | None = None,
    ):
        self.dataset, self.plan, self.read, self.group = dataset, plan, read, group
        self.slabs, self.trace, self.leases = slabs, trace, leases

    def __iter__(
        self,
    ) -> Iterator[tuple[list[int], Any, tuple[str, Any, Any], tuple[int, list[int]]]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        # Groups k = 0, 1, ... of 1, 2, 4, ... up to ``group`` batches go to worker k % workers
        # (the order DataLoader returns them in): small first groups, fast first batches.
        merged = _Grouped(self.plan, self.group, worker, workers)  # lazy index arrays
        reader = BatchReader(self.dataset, merged, **self.read)
        leases = self.leases if info is not None else None
        if leases is not None:
            reader.ops.alloc = functools.partial(leases.alloc, worker)
        elif info is not None:
            reader.ops.alloc = _shared_bytes
        name = f"worker {worker}" if info is not None else "main"
        if self.trace:
            reader.spans = Spans()

        def tag() -> tuple[str, dict[str, float], list[dict[str, Any]]]:
            """This worker's cumulative stage times (and new trace spans) for telemetry."""
            return name, dict(reader.times), reader.spans.take() if reader.spans else []

        slabs = self.slabs if info is not None else None
        used: list[int] = []  # slab of the batch being decoded (-1: none)
        if slabs is not None:
            ring = slabs.tensor[worker].numpy()

            def out_for(j: int, nbytes: int) -> np.ndarray | None:
                if nbytes > ring.shape[1] or not slabs.acquire(worker):
                    used[:] = [-1]
                    return None
                used[:] = [j % slabs.depth]
                return ring[used[-1]]

            reader.out_for = out_for
        for g, batch in zip(merged.ranges(), reader):
            sizes = [self.plan.batch_len(j) for j in g]
            if slabs is not None and used and used[-1] >= 0:
                k = used[-1]
                columns, others = {}, {}
                for column, value in batch.items():
                    offset = _in_slab(value, ring[k])
                    if offset is None:
                        others[column] = value
                    else:
                        columns[column] = (offset, value.dtype.str, tuple(value.shape))
                yield sizes, _SlabItem(worker, k, columns, to_tensors(others)), tag(), (worker, [])
            elif slabs is not None and slabs.stop.is_set():
                return  # the consumer left mid-epoch
            else:
                lent = leases.take_lent() if leases is not None else []
                yield sizes, to_tensors(batch), tag(), (worker, lent)


class _Grouped(Sequence[np.ndarray]):
    """One worker's groups of plan batches, each as one index array, computed when asked.

    Global group ``k`` holds ``min(group, 2**k)`` consecutive batches; worker ``w`` of ``W``
    takes groups ``w, w + W, ...``. Arithmetic only: nothing per batch is held.
    """

    def __init__(self, plan: EpochPlan, group: int, worker: int, workers: int) -> None:
        self.plan, self.worker, self.workers = plan, worker, workers
        n = len(plan)
        self.starts = [0]  # starts of the doubling head's groups (sizes 1, 2, 4, ... < group)
        while (1 << (len(self.starts) - 1)) < group:
            self.starts.append(self.starts[-1] + (1 << (len(self.starts) - 1)))
        self.head, self.group, self.n = len(self.starts) - 1, group, n
        if n <= self.starts[-1]:
            self.n_groups = sum(1 for a in self.starts[:-1] if a < n)
        else:
            self.n_groups = self.head + -(-(n - self.starts[-1]) // group)

    def span(self, k: int) -> range:
        """Batches of global group ``k``."""
        if k < self.head:
            return range(self.starts[k], min(self.n, self.starts[k + 1]))
        a = self.starts[-1] + (k - self.head) * self.group
        return range(a, min(self.n, a + self.group))

    def __len__(self) -> int:
        return max(0, -(-(self.n_groups - self.worker) // self.workers))

    def ranges(self) -> Iterator[range]:
        for i in range(len(self)):
            yield self.span(self.worker + i * self.workers)

    def __getitem__(self, i: int) -> np.ndarray:  # type: ignore[override]
        return self.plan.joined(self.span(self.worker + i * self.workers))


def _split(sizes: list[int], batch: dict[str, Any]) -> Iterator[dict[str, Any]]:
    split = {k: v.split(sizes) for k, v in batch.items() if isinstance(v, JaggedTensors)}
    at = 0
    for i, size in enumerate(sizes):
        yield {
            k: split[k][i] if k in split else take_rows(v, at, at + size) for k, v in batch.items()
        }
        at += size


class TorchLoader:
    """A resumable, rank- and worker-sharded PyTorch loader over an MDS dataset.

    Built from a :class:`~spark_dl_core.loader_settings.LoaderSettings` (or its keywords).
    Iterate it like a DataLoader; each item is a dict of tensors (numeric columns) or numpy
    object arrays (strings, bytes, variable-shape arrays).

    Iteration semantics (DataLoader-like, and what trainers rely on): the loader has a
    *saved position* (epoch, samples of the global order consumed). Each ``iter(loader)`` is
    a pass from the saved position. ``len(loader)`` is the saved epoch's length in batches for
    this rank, before and after :meth:`load_state_dict` (trainers count their own progress
    against it); :attr:`remaining` is the next pass's length. A pass that has delivered its
    last batch is finished, whether or not the iterator is then exhausted (trainers stop
    after ``len()`` batches): the saved position moves to the start of the next epoch (so
    ``for epoch ...: for b in loader`` needs no ``set_epoch``, and ``set_epoch(epoch)`` with
    the epoch already current is a no-op). ``loader.sampler.set_epoch`` is the same hook,
    where trainers look for it. A pass left early (``break``, peeking with
    ``next(iter(loader))``, or an ``iter()`` never advanced) does not move the saved
    position: the next ``iter()`` starts from it again. :meth:`state_dict` reports the live
    position (after the batches the latest pass delivered); moving the saved position there
    is deliberate: ``loader.load_state_dict(loader.state_dict())``.

    :meth:`state_dict` counts samples of the global order consumed by all ranks, assuming
    every rank took the same number of steps (data-parallel training), so
    :meth:`load_state_dict` resumes exactly, in a fresh process and at another world size.

    With ``num_workers > 0`` each DataLoader worker decodes ``group`` batches per item; for
    all-fixed-width datasets straight into reusable shared-memory slabs (:class:`_Slabs`),
    so the main process only copies each batch out once. ``progress=True`` shows a tqdm bar
    over this rank's batches of the epoch (needs the ``progress`` extra).
    """

    def __init__(
        self, dataset: Dataset, settings: LoaderSettings | None = None, **kwargs: Any
    ) -> None:
        settings = settings_from(settings, kwargs)
        settings.only("PyTorch", TORCH_ONLY)
        check_pad_mask(settings, dataset.layout.names)
        self.settings = settings
        self.dataset = dataset
        self.batch_size = settings.batch_size
        self.shuffle, self.seed, self.drop_last = (
            settings.shuffle,
            settings.seed,
            settings.drop_last,
        )
        self.shuffle_window = settings.shuffle_window
        self.num_workers = settings.num_workers
        # Batches decoded together, then split into views. Each decode has a fixed cost
        # (planning, a gather call per shard, Python): workers send a group as one item
        # (~8 MiB of rows: IPC costs per item). In-process, row gathers (fixed width, equal
        # length arrays) are fastest at ~1 MiB a group (it stays in cache); other variable
        # columns (16 token documents a batch) need up to 64 batches to amortize a decode.
        row = dataset.layout.row_size or _mean_sample_bytes(dataset)
        batch_bytes = max(1, row * self.batch_size)
        self.group = int(settings.group or max(1, min(16, (8 << 20) // batch_bytes)))
        rows = BatchReader(dataset, [], columns=settings.column_list).out_widths is not None
        local = min(16, (1 << 20) // batch_bytes) if rows else min(64, (8 << 20) // batch_bytes)
        self.local_group = int(settings.group or max(1, local))
        self.rank, self.world_size = resolve_rank(settings.rank, settings.world_size)
        self.read: dict[str, Any] = {
            "columns": settings.column_list,
            "images": settings.images,
            "verify_hashes": settings.verify_hashes,
            "prefetch_bytes": settings.prefetch_bytes,
        }
        self.read.update(reader_extras(settings))
        # Read-time ops are checked against the columns now, before any data is read.
        ops = ReadOps(dataset, self.read.get("transforms"), settings.column_list)
        self.device = None if settings.device is None else str(settings.device)
        self.read["device"] = check_device(self.device, self.read.get("transforms"), dataset)
        # Images decoded in the workers go into reusable shared memory (_Leases).
        self._worker_images = bool(ops.pipelines) and self.read["device"] is None
        if ops.pipelines and settings.group is None:
            self.group = self.local_group = 1  # a decoded image batch is already large
        if any(kind == "jagged" for kind, _ in dataset.forms.values()):
            _warm_nested()
        self.loader_kwargs: dict[str, Any] = {
            "pin_memory": settings.pin_memory,
            "multiprocessing_context": settings.multiprocessing_context,
        }
        if self.num_workers > 0:
            self.loader_kwargs["prefetch_factor"] = settings.prefetch_factor
        self.progress = settings.progress
        self._live: _Pass | None = None  # the latest pass (iterator) and what it delivered
        self._stats: PassStats | None = None
        self.sampler = EpochHook(self)  # where trainers call set_epoch (as on a sampler)
        self._set_position(settings.epoch, 0)  # validates the order settings eagerly

    # -- order

    def _build_plan(self, epoch: int, consumed: int) -> EpochPlan:
        return EpochPlan.build(
            self.dataset,
            batch_size=self.batch_size,
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=epoch,
            rank=self.rank,
            world_size=self.world_size,
            drop_last=self.drop_last,
            shuffle_window=self.shuffle_window,
            consumed=consumed,
            even_batches=self.settings.even_batches,
        )

    def _set_position(self, epoch: int, consumed: int) -> None:
        """Move the saved position; a position with nothing left is the next epoch's start."""
        plan = self._build_plan(epoch, consumed)
        if consumed and not len(plan):
            epoch, consumed = epoch + 1, 0
            plan = self._build_plan(epoch, 0)
        self.epoch, self._consumed, self._plan_for = epoch, consumed, plan
        self._epoch_len = len(plan if not consumed else self._build_plan(epoch, 0))
        self._live = None

    def sample_order(self) -> EpochPlan:
        """This rank's remaining batches of global sample indices (what the next pass reads)."""
        return self._plan_for

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

    def _leases(self) -> _Leases | None:
        """Reusable decode buffers for the workers, if this loader decodes images there."""
        if not self._worker_images:
            return None
        depth = (self.loader_kwargs.get("prefetch_factor") or 2) + 3
        return _Leases(self.num_workers, depth)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` afresh, unless it is already the saved position's epoch."""
        if int(epoch) != self.epoch:
            self._set_position(int(epoch), 0)

    def __len__(self) -> int:
        """Batches of the saved epoch for this rank, as ``DataLoader``'s ``len``: the same
        after :meth:`load_state_dict` (the next pass then yields :attr:`remaining`)."""
        return self._epoch_len

    @property
    def remaining(self) -> int:
        """Batches this rank yields in the next pass (the rest of the saved epoch)."""
        return len(self._plan_for)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        plan = self._plan_for
        live = _Pass(plan, self.epoch)
        self._live = live
        trace_path = self.settings.trace_path
        stats = self._stats = PassStats(self.epoch, trace=trace_path is not None)
        group = self.local_group if self.num_workers == 0 else self.group
        slabs = self._slabs(group) if self.num_workers > 0 else None
        leases = self._leases() if self.num_workers > 0 and slabs is None else None
        read = {**self.read, "seed": self.seed, "epoch": self.epoch, "jagged": True}
        source = _Batches(self.dataset, plan, read, group, slabs, trace_path is not None, leases)
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
        shown = 0.0
        resumed = time.perf_counter()  # the training loop waits for data from here on
        try:
            for sizes, item, (worker, times, events), (worker_id, lent) in items:
                merged = item.take(slabs, pin) if isinstance(item, _SlabItem) and slabs else item
                if leases is not None:
                    leases.watch(worker_id, lent, merged)
                stats.workers[worker] = times
                if events:
                    stats.worker_events.extend(events)
                for size, batch in zip(
                    sizes, _split(sizes, merged) if len(sizes) > 1 else [merged]
                ):
                    if self.settings.pad_mask:
                        batch[PAD_MASK] = torch.from_numpy(plan.pad_mask(live.steps))
                    batch = to_device(batch, self.device, pin)
                    if live.steps == len(plan) - 1:
                        stats.repeated = plan.repeats
                        if self._live is live:  # its last batch: the pass is finished, even
                            self._set_position(live.epoch, plan.total)  # if left unexhausted
                    live.steps += 1
                    now = time.perf_counter()
                    stats.delivered(size, now - resumed, now)
                    if bar is not None:
                        bar.update(1)
                        if now - shown > 0.5:
                            bar.set_postfix_str(stats.postfix(), refresh=False)
                            shown = now
                    yield batch
                    resumed = time.perf_counter()
        finally:
            stats.finished = time.perf_counter()
            if slabs is not None:
                slabs.stop.set()  # wake workers waiting for a slab, then shut them down
            if bar is not None:
                bar.set_postfix_str(stats.postfix(), refresh=False)
                bar.close()
            if trace_path is not None:
                stats.write_trace(trace_path)
            del items
        if self._live is live:  # the pass ran to its end: the saved position moves on
            self._set_position(live.epoch, plan.total)

    # -- telemetry

    def stats(self) -> dict[str, Any]:
        """The latest pass (current epoch): samples and batches delivered, samples/s, time
        to first batch, data-starved % (share of wall time the training loop waited for a
        batch), and per worker the seconds spent reading, decompressing, decoding and
        transforming (cumulative within the pass)."""
        if self._stats is None:
            return PassStats(self.epoch).as_dict() | {"samples_per_s": 0.0, "wall_s": 0.0}
        return self._stats.as_dict()

    # -- state

    def state_dict(self) -> dict[str, Any]:
        """The live global position: resumable at any world size and worker count."""
        live = self._live
        if live is not None and live.steps:
            epoch, consumed = live.epoch, live.plan.consumed_after(live.steps)
        else:
            epoch, consumed = self.epoch, self._consumed
        return LoaderState(
            fingerprint=self.dataset.fingerprint,
            seed=self.seed,
            epoch=epoch,
            shuffle=self.shuffle,
            shuffle_window=self.shuffle_window,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            consumed=consumed,
        ).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make ``state`` the saved position; raises if it is for another dataset or order.

        The batch size and ``drop_last`` may change: the position is counted in samples.
        """
        loaded = LoaderState.from_dict(state)
        loaded.check(
            self.dataset,
            seed=self.seed,
            shuffle=self.shuffle,
            shuffle_window=self.shuffle_window,
            batch_size=self.batch_size,
        )
        self._set_position(loaded.epoch, loaded.consumed)

    def __repr__(self) -> str:
        return (
            f"<TorchLoader {self.dataset.path!r} batch_size={self.batch_size} "
            f"shuffle={self.shuffle} seed={self.seed} epoch={self.epoch} "
            f"rank={self.rank}/{self.world_size} workers={self.num_workers}>"
        )


class EpochHook:
    """``loader.sampler``: the ``set_epoch`` hook trainers call on a loader's sampler before
    each epoch (PyTorch Lightning does, as for a ``DistributedSampler``)."""

    def __init__(self, loader: TorchLoader) -> None:
        self.loader = loader

    @property
    def epoch(self) -> int:
        return self.loader.epoch

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)


class _Pass:
    """One iteration over the loader: its plan and how many batches it has delivered."""

    __slots__ = ("epoch", "plan", "steps")

    def __init__(self, plan: EpochPlan, epoch: int) -> None:
        self.plan, self.epoch, self.steps = plan, epoch, 0


register_framework("torch", TorchLoader)
