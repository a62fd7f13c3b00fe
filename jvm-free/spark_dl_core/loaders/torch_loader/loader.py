"""The PyTorch loader: each DataLoader worker decodes its round-robin share of a rank's
batches as whole groups (:class:`_Batches`), and :class:`TorchLoader` holds the settings,
the saved position and the passes."""

from __future__ import annotations

import dataclasses
import functools
import os
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ...errors import SpecError, optional_import
from ...ops.read import ReadOps
from ...order import (
    EpochPlan,
    epoch_position,
    epoch_start,
    plan_position,
)
from ..position import adopted, resumed, saved_state
from ..reader import BatchReader, ShardOf
from ..settings import (
    PAD_MASK,
    TORCH_ONLY,
    LoaderSettings,
    check_epoch,
    check_pad_mask,
    reader_extras,
    settings_from,
)
from ..telemetry import PassStats, Spans
from .agreement import check_ranks_agree, order_record
from .shared import _in_slab, _Leases, _PassControl, _shared_bytes, _SlabItem, _Slabs
from .tensors import JaggedTensors, _warm_nested, take_rows, to_device, to_tensors
from .units import GroupedBatches, StreamUnits, stream_units

if TYPE_CHECKING:
    from ...shard_source import ShardSource


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


def check_device(device: str | None, transforms: Any, dataset: ShardSource) -> str | None:
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
    pipelines = ReadOps(dataset, transforms, None).pipelines.values()
    on_device = [p for p in pipelines if p.on_device]
    if not on_device:
        return None
    missing = [why for p in on_device if (why := p.device_missing(device))]
    if missing:
        warnings.warn(
            f"device={device!r}: {missing[0]}, so decoding runs on the CPU in the DataLoader "
            "workers and batches then move to the device",
            stacklevel=3,
        )
        return None
    return device


def _mean_sample_bytes(dataset: ShardSource) -> int:
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
    group back into batches (views of one copy, no per-batch copies). In-process the plan
    is given; in workers it is the current pass's (:class:`_PassPlans`), so workers that
    persist across passes serve each pass's plan.
    """

    def __init__(
        self,
        dataset: ShardSource,
        plan: EpochPlan | _PassPlans,
        read: dict[str, Any],
        group: int,
        slabs: _Slabs | None = None,
        trace: bool = False,
        leases: _Leases | None = None,
    ):
        self.dataset, self.plan, self.read, self.group = dataset, plan, read, group
        self.slabs, self.trace, self.leases = slabs, trace, leases

    def __iter__(self) -> Iterator[_Item]:
        """Called when DataLoader (re)creates a worker's iterator, i.e. as a pass starts: the
        pass's plan is read now, not at the first batch."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if isinstance(self.plan, EpochPlan):
            return self._run(self.plan, self.read["epoch"], _always, worker, workers)
        generation, epoch, plan = self.plan.current(self.dataset)
        if info is not None:  # earlier passes' items the main process never took
            if self.slabs is not None:
                self.slabs.reset(worker)
            if self.leases is not None:
                self.leases.reclaim(worker)
        if plan is None:
            return iter(())
        live = functools.partial(self.plan.control.live, generation)
        return self._run(plan, epoch, live, worker, workers)

    def _run(
        self, plan: EpochPlan, epoch: int, live: Callable[[], bool], worker: int, workers: int
    ) -> Iterator[_Item]:
        in_worker = get_worker_info() is not None
        if workers > 1:  # each worker reads every other group: the order of its spans only
            plan = dataclasses.replace(plan, readers=workers)
        # Groups k = 0, 1, ... of 1, 2, 4, ... up to ``group`` batches go to worker k % workers
        # (the order DataLoader returns them in): small first groups, fast first batches.
        units = stream_units(plan, self.group) if not in_worker and workers == 1 else None
        merged = GroupedBatches(plan, self.group, worker, workers)  # lazy index arrays
        reader = BatchReader(self.dataset, units or merged, **{**self.read, "epoch": epoch})
        if workers > 1:
            # Workers share each row group's conversion through the row-group cache (one
            # converts, the others read its file). Rows first only from row groups decoded
            # before they forked (_decode_first_items): decoding the first window in
            # every worker cost 1.5-2x the CPU before the first batches with 2 workers.
            reader.rows_decoded_only = True
        leases = self.leases if in_worker else None
        if leases is not None:
            reader.ops.alloc = functools.partial(leases.alloc, worker)
        elif in_worker:
            reader.ops.alloc = _shared_bytes
        name = f"worker {worker}" if in_worker else "main"
        if self.trace:
            reader.spans = Spans()

        def tag() -> tuple[str, dict[str, float], list[dict[str, Any]]]:
            """This worker's cumulative stage times (and new trace spans) for telemetry."""
            return name, dict(reader.times), reader.spans.take() if reader.spans else []

        slabs = self.slabs if in_worker else None
        used: list[int] = []  # slab of the batch being decoded (-1: none)
        if slabs is not None:
            ring = slabs.tensor[worker].numpy()

            def out_for(j: int, nbytes: int) -> np.ndarray | None:
                if nbytes > ring.shape[1] or not slabs.acquire(worker, live):
                    used[:] = [-1]
                    return None
                used[:] = [j % slabs.depth]
                return ring[used[-1]]

            reader.out_for = out_for
        if units is not None:  # in-process, a stream at a time: batches put back in order
            yield from self._in_order(plan, units, reader, live, tag)
            return
        for g, batch in zip(merged.ranges(), reader):
            if not live():
                return  # the consumer left mid-epoch: this pass is over
            sizes = [plan.batch_len(j) for j in g]
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
            else:
                lent = leases.take_lent() if leases is not None else []
                yield sizes, to_tensors(batch), tag(), (worker, lent)

    @staticmethod
    def _in_order(
        plan: EpochPlan,
        units: StreamUnits,
        reader: BatchReader,
        live: Callable[[], bool],
        tag: Callable[[], tuple[str, dict[str, float], list[dict[str, Any]]]],
    ) -> Iterator[_Item]:
        """Stream units' batches, each yielded as soon as every batch before it was: a
        unit's batches are views of its one decode, held (with those of the block's other
        units) until their turn."""
        held: dict[int, tuple[int, Any]] = {}
        turn = 0
        for u, batch in enumerate(reader):
            if not live():
                return  # the consumer left mid-epoch: this pass is over
            ks = units.batches_of(u)
            sizes = [plan.batch_len(k) for k in ks]
            tensors = to_tensors(batch)
            parts = _split(sizes, tensors) if len(sizes) > 1 else [tensors]
            held.update(zip(ks, zip(sizes, parts)))
            name, times, events = tag()  # once a decode: its trace spans go out once
            while turn in held:
                size, part = held.pop(turn)
                turn += 1
                yield [size], part, (name, times, events), (0, [])
                events = []


_Item = tuple[list[int], Any, tuple[str, Any, Any], tuple[int, list[int]]]


def _always() -> bool:
    return True


class _PassPlans:
    """Worker side of the pass position: the plan of the pass :class:`_PassControl` names,
    built from the loader's settings (plans are pure functions of them)."""

    def __init__(
        self, control: _PassControl, settings: LoaderSettings, rank: int, world_size: int
    ) -> None:
        self.control, self.rank, self.world_size = control, rank, world_size
        self.settings = settings.replace(multiprocessing_context=None)  # sent to workers

    def current(self, dataset: ShardSource) -> tuple[int, int, EpochPlan | None]:
        """(generation, epoch, plan) of the running pass; no plan between passes."""
        generation, epoch, consumed = self.control.read()
        if generation % 2 == 0:
            return generation, epoch, None
        plan = self.settings.epoch_plan(dataset, epoch, consumed, self.rank, self.world_size)
        return generation, epoch, plan


class _Workers:
    """A DataLoader over :class:`_Batches` and what its workers share with the main process
    (pass control, slabs, leases), kept across passes when its workers persist."""

    def __init__(
        self,
        loader: DataLoader,
        control: _PassControl,
        slabs: _Slabs | None,
        leases: _Leases | None,
        before_fork: Callable[[int, int], None],
        after_fork: Callable[[], None],
    ) -> None:
        self.loader, self.control, self.slabs, self.leases = loader, control, slabs, leases
        # Around the workers' start: what they inherit is made ready, and let go of once
        # they have forked (or failed to).
        self.before_fork, self.after_fork = before_fork, after_fork
        self.forked = False  # persistent workers started: later passes fork none
        self.busy = False  # a pass is iterating it
        # A pass started before anyone asked for it (the loader's first, begun when the
        # loader was made): (epoch, consumed, DataLoader iterator).
        self.ahead: tuple[int, int, Iterator[Any]] | None = None

    def start(self, epoch: int, consumed: int) -> Iterator[Any]:
        """The DataLoader iterator of a pass from (epoch, consumed): the one started ahead
        when it is for this position, else a new pass (one started ahead for another
        position, e.g. before a ``load_state_dict``, is ended first: its workers stop)."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            if ahead[:2] == (epoch, consumed):
                return ahead[2]
            self.control.end()
        self.control.start(epoch, consumed)  # before its workers read it
        if self.forked:
            return iter(self.loader)
        try:
            self.before_fork(epoch, consumed)
            items = iter(self.loader)  # its workers fork here (the first pass, if persistent)
        finally:  # what was decoded for them goes, whether they started or not
            self.after_fork()
        self.forked = bool(self.loader.persistent_workers)
        return items


def _decode_first_items(
    dataset: ShardSource,
    epoch_plan: Callable[[int, int, int, int], EpochPlan],
    group: int,
    workers: int,
    context: Any,
    rank: int,
    world_size: int,
    epoch: int,
    consumed: int,
) -> None:
    """Decode the shards of each worker's first item once, in the main process, before the
    workers fork: they inherit the decode and take those batches' rows from it (a table
    read in place with empty caches; ``dataset.decode_ahead``). Each worker decoding the
    first window for itself cost 1.5-2x the CPU before the first batches. Not where workers
    start by spawn or forkserver (they would not inherit it)."""
    if workers < 2 or not dataset.serves_rows or not _forks(context):
        return
    plan = epoch_plan(epoch, consumed, rank, world_size)
    first = GroupedBatches(plan, group, 0, workers)
    groups = min(workers, first.n_groups)
    if not groups:
        return
    index = np.asarray(plan.joined(range(first.span(groups - 1).stop)), dtype=np.int64)
    shards = np.unique(ShardOf(np.asarray(dataset.shard_offsets, dtype=np.int64))(index))
    dataset.decode_ahead(shards.tolist())


def _forks(context: Any) -> bool:
    """Whether DataLoader workers of this multiprocessing context start by fork (None:
    the default start method, the first of ``get_all_start_methods``)."""
    if context is None or isinstance(context, str):
        method = context or torch.multiprocessing.get_start_method(allow_none=True)
        return (method or torch.multiprocessing.get_all_start_methods()[0]) == "fork"
    return bool(context.get_start_method() == "fork")


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

    Built from a :class:`~spark_dl_core.loaders.settings.LoaderSettings` (or its keywords).
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
        self, dataset: ShardSource, settings: LoaderSettings | None = None, **kwargs: Any
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
        self._done: _Pass | None = None  # the latest pass, once it has finished
        self._stats: PassStats | None = None
        self._pool: _Workers | None = None  # persistent DataLoader workers, once started
        self._agreed = False  # the ranks' orders compared (on the first pass)
        self.sampler = EpochHook(self)  # where trainers call set_epoch (as on a sampler)
        self._set_position(settings.epoch, 0)  # validates the order settings eagerly
        self._start_ahead()

    # -- order

    def _build_plan(self, epoch: int, consumed: int) -> EpochPlan:
        return self.settings.epoch_plan(self.dataset, epoch, consumed, self.rank, self.world_size)

    def _set_position(
        self, epoch: int, consumed: int, done: _Pass | None = None, settle: bool = True
    ) -> None:
        """Move the saved position (the end of an epoch is the next epoch's start; inside
        it, even with no batch left for this rank, it stays). ``done``: the pass that
        finished, which :meth:`state_dict` still reports. ``settle=False``: the epoch is
        the one asked for (:meth:`set_epoch`), read even when nothing is left of it."""
        if settle:
            epoch, consumed, plan = plan_position(self._build_plan, epoch, consumed)
        else:
            plan = self._build_plan(epoch, consumed)
        self.epoch, self._consumed, self._plan_for = epoch, consumed, plan
        self._epoch_len = len(plan if not consumed else self._build_plan(epoch, 0))
        self._live, self._done = None, done

    def sample_order(self) -> EpochPlan:
        """This rank's remaining batches of global sample indices (what the next pass reads)."""
        return self._plan_for

    def _bar(self, total: int) -> Any:
        """A tqdm bar over this rank's batches of the epoch (``progress=True``)."""
        tqdm = optional_import("tqdm.auto", "progress=True").tqdm
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

    def _read_for_pass(self) -> dict[str, Any]:
        return {**self.read, "seed": self.seed, "epoch": self.epoch, "jagged": True}

    def _start_ahead(self) -> None:
        """Start the persistent workers now, on the first pass from the saved position: a
        fresh process's first pass then does not wait for the workers to start, plan and
        read their first shards (that overlaps whatever runs before the first ``iter``; a
        position moved meanwhile just restarts the pass). Local datasets only (a pass not
        taken would download for nothing); any failure here is left to the first pass."""
        if not (self.num_workers > 0 and self.settings.persistent_workers):
            return
        if self.dataset.download_stats() is not None:
            return
        try:
            pool = self._workers_for_pass(self._read_for_pass())
            pool.ahead = (self.epoch, self._consumed, pool.start(self.epoch, self._consumed))
        except Exception:
            self._pool = None  # the first pass starts them, and says what went wrong
            return
        pool.busy = False

    def _workers_for_pass(self, read: dict[str, Any]) -> _Workers:
        """The DataLoader a pass iterates: the loader's persistent one (started on the first
        pass), or one for this pass alone when ``persistent_workers=False`` or an earlier
        pass still holds the persistent one (an iterator left open: its workers are busy)."""
        pool = self._pool
        if pool is not None and not pool.busy:
            pool.busy = True
            return pool
        persistent = self.settings.persistent_workers and pool is None
        slabs = self._slabs(self.group)
        leases = self._leases() if slabs is None else None
        control = _PassControl()
        plans = _PassPlans(control, self.settings, self.rank, self.world_size)
        trace = self.settings.trace_path is not None
        source = _Batches(self.dataset, plans, read, self.group, slabs, trace, leases)
        # The workers' torch seed comes from the loader's own generator: starting them
        # (maybe when the loader is made) draws nothing from the global RNG a model's
        # initialization uses. No output depends on it (read-time ops seed themselves).
        generator = torch.Generator().manual_seed(self.seed) if persistent else None
        loader = DataLoader(
            source,
            batch_size=None,
            num_workers=self.num_workers,
            collate_fn=_identity,
            persistent_workers=persistent,
            generator=generator,
            **self.loader_kwargs,
        )
        # Not a method of this loader: the workers must not keep it alive (a cycle would
        # outlive ``del loader``, and its workers with it, until a garbage collection).
        before_fork = functools.partial(
            _decode_first_items,
            self.dataset,
            functools.partial(self.settings.epoch_plan, self.dataset),
            self.group,
            self.num_workers,
            self.loader_kwargs["multiprocessing_context"],
            self.rank,
            self.world_size,
        )
        fresh = _Workers(loader, control, slabs, leases, before_fork, self.dataset.forget_decoded)
        fresh.busy = True
        if persistent:
            self._pool = fresh
        return fresh

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` afresh, unless it is already the saved position's epoch.
        A run carried on to another version restarts its carried epoch at the switch (what
        is left of it, maybe nothing: an empty pass, then the next epoch)."""
        epoch = check_epoch(epoch)
        if epoch != self.epoch:
            self._set_position(epoch, epoch_start(self.dataset, epoch), settle=False)
        elif self._done is not None and self._done.epoch != self.epoch:
            self._done = None  # the trainer has moved on from the finished pass's epoch

    def __len__(self) -> int:
        """Batches of the saved epoch for this rank, as ``DataLoader``'s ``len``: the same
        after :meth:`load_state_dict` (the next pass then yields :attr:`remaining`)."""
        return self._epoch_len

    @property
    def remaining(self) -> int:
        """Batches this rank yields in the next pass (the rest of the saved epoch)."""
        return len(self._plan_for)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if not self._agreed:  # before any read: ranks of another order must not start
            record = order_record(self.dataset, self.settings, self.epoch, self._consumed)
            check_ranks_agree(record, self.rank, self.world_size, self.dataset.shown)
            self._agreed = True
        plan = self._plan_for
        live = _Pass(plan, self.epoch)
        self._live = live
        trace_path = self.settings.trace_path
        tracing = trace_path is not None
        stats = self._stats = PassStats(self.epoch, trace=tracing).follow(self.dataset, plan)
        read = self._read_for_pass()
        pool: _Workers | None = None
        slabs: _Slabs | None = None
        leases: _Leases | None = None
        if self.num_workers == 0:
            batches = _Batches(self.dataset, plan, read, self.local_group, trace=tracing)
            items: Any = iter(batches)
        else:
            pool = self._workers_for_pass(read)
            slabs, leases = pool.slabs, pool.leases
            try:
                items = pool.start(self.epoch, self._consumed)
            except BaseException:
                pool.control.end()
                pool.busy = False
                raise
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
                            self._set_position(live.epoch, plan.total, live)  # if unexhausted
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
            if pool is not None:
                pool.control.end()  # workers of this pass stop (those waiting for a slab too)
                pool.busy = False
            if bar is not None:
                bar.set_postfix_str(stats.postfix(), refresh=False)
                bar.close()
            if trace_path is not None:
                stats.write_trace(trace_path)
            del items
        if self._live is live:  # the pass ran to its end: the saved position moves on
            self._set_position(live.epoch, plan.total, live)

    # -- telemetry

    def stats(self) -> dict[str, Any]:
        """The latest pass (current epoch): samples and batches delivered, samples/s, time
        to first batch, data-starved % (share of wall time the training loop waited for a
        batch), and per worker the seconds spent reading, decompressing, decoding and
        transforming (cumulative within the pass). Over a mixture also ``sources`` (each
        source's samples this rank was delivered in the pass) and, with a schedule,
        ``stage`` and ``stage_start`` (the run's stage now): counted when asked."""
        if self._stats is None:
            empty = PassStats(self.epoch).follow(self.dataset, self._plan_for)
            return empty.as_dict() | {"samples_per_s": 0.0, "wall_s": 0.0}
        return self._stats.as_dict()

    # -- state

    def state_dict(self) -> dict[str, Any]:
        """The live global position: resumable at any world size and worker count.

        After ``k`` batches of a pass it is the position once every rank has taken ``k``
        (a finished pass included): a rank that ran out one batch before the others
        (``even_batches=False``) reports the epoch those others are still finishing.
        """
        live = self._live if self._live is not None else self._done
        if live is not None and live.steps:
            consumed = live.plan.consumed_after(live.steps)
            epoch, consumed = epoch_position(live.epoch, consumed, live.plan.total)
        else:
            epoch, consumed = self.epoch, self._consumed
        return saved_state(self.dataset, self.settings, epoch, consumed)

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Make ``state`` the saved position; raises if it is for another dataset or order.

        ``drop_last`` may change: the position is counted in samples; so may the batch
        size with ``streams=1`` (a streamed order depends on it). With ``streams=0`` (the
        default) the loader reads on with the streams the state was saved with.
        ``strict=False``: a state of another version of the dataset (a mixture whose weights,
        sources or schedule changed) carries the run on if the dataset can honour it
        (docs/mixtures.md), else it raises naming why.
        """
        loaded, dataset, epoch, consumed = resumed(self.dataset, self.settings, state, strict)
        settings = adopted(self.settings, loaded, dataset)
        if settings != self.settings:  # the state's streams: workers must read its order
            self.settings, self._pool = settings, None
        if dataset is not self.dataset:  # carried on: workers must read the new order
            self.dataset, self._pool = dataset, None
        self._set_position(epoch, consumed)

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
        # A weak reference: a cycle would keep a dropped loader, and its persistent
        # workers, alive until the garbage collector runs.
        self._loader = weakref.ref(loader)

    @property
    def loader(self) -> TorchLoader:
        loader = self._loader()
        if loader is None:
            raise ReferenceError("the loader of this sampler hook was deleted")
        return loader

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
