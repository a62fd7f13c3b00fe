"""PyTorch loading of packed token rows: ``to_torch(pack=...)`` (see :mod:`..packing`).

The same iteration, epoch and state semantics as :class:`~.loader.TorchLoader`
(``len``, ``set_epoch``, a pass run to its end moves on to the next epoch, ``state_dict``
is the live position), with the position counted in global packed rows, so a resumed
loader continues inside a document. Batches are dicts: ``input_ids``, ``labels``,
``position_ids`` (int64 ``[B, seq_len]``), ``cu_seqlens`` (int32) and ``max_seqlen`` (int).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ...errors import SpecError
from ...order import epoch_position, plan_position
from ..frameworks import register_framework
from ..packed_rows import widened
from ..packing import (
    AnyPackedPlan,
    packed_plan,
    packed_source,
    packed_state,
    resume_position,
)
from ..settings import TORCH_ONLY, LoaderSettings, check_epoch, settings_from
from ..telemetry import PassStats, node_cache_share
from . import resolve_rank, to_device
from .agreement import check_ranks_agree, order_record
from .shared import _PassControl

if TYPE_CHECKING:
    from ...shard_source import ShardSource


class _Workers(IterableDataset):
    """What each DataLoader worker runs: its round-robin share of the rank's batches (the
    order DataLoader hands them back in). Holds settings only: each worker packs anew, for
    the pass :class:`_PassControl` names when DataLoader (re)creates its iterator, so
    workers that persist across passes serve each pass's rows."""

    def __init__(
        self,
        dataset: ShardSource,
        settings: LoaderSettings,
        control: _PassControl,
        rank: int,
        world_size: int,
    ):
        self.dataset, self.control = dataset, control
        self.settings = settings.replace(multiprocessing_context=None)  # sent to workers
        self.rank, self.world_size = rank, world_size

    def __iter__(self) -> Iterator[tuple[dict[str, Any], int]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        generation, epoch, rows = self.control.read()
        if generation % 2 == 0:  # between passes
            return iter(())
        plan = packed_plan(
            self.dataset,
            self.settings,
            epoch=epoch,
            rows=rows,
            rank=self.rank,
            world_size=self.world_size,
        )
        return self._run(plan, worker, workers, generation)

    def _run(
        self, plan: AnyPackedPlan, worker: int, workers: int, generation: int
    ) -> Iterator[tuple[Any, int]]:
        """Batches in their compact form (numpy, one pickled message each, widened by the
        main process: see :class:`~..packed_rows.PackedBatch`)."""
        for batch, real in plan.batches(worker, workers, compact=True):
            if not self.control.live(generation):
                return  # the consumer left mid-epoch: this pass is over
            yield batch, real


def _tensors(batch: dict[str, Any], pin: bool = False) -> dict[str, Any]:
    """The batch's arrays as tensors (in page-locked memory with ``pin``, for a
    non-blocking copy to the device)."""
    out = {k: torch.from_numpy(v) if hasattr(v, "dtype") else v for k, v in batch.items()}
    if pin:
        out = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
    return out


def _identity(item: Any) -> Any:
    return item


class PackedTorchLoader:
    """A resumable, rank- and worker-sharded loader of packed token rows."""

    def __init__(
        self, dataset: ShardSource, settings: LoaderSettings | None = None, **kwargs: Any
    ) -> None:
        settings = settings_from(settings, kwargs)
        settings.only("PyTorch", TORCH_ONLY)
        # token schedule boundaries placed once here, not in every worker
        self.dataset, self.settings = packed_source(dataset, settings), settings
        self.batch_size = settings.batch_size
        self.num_workers = settings.num_workers
        self.rank, self.world_size = resolve_rank(settings.rank, settings.world_size)
        self.device = None if settings.device is None else str(settings.device)
        if self.device is not None and self.device != "cpu" and not torch.cuda.is_available():
            raise SpecError(
                f"loader setting device={self.device!r}, but torch sees no CUDA device; "
                "leave device unset to keep packed batches on the CPU"
            )
        self._live: _Pass | None = None
        self._done: _Pass | None = None  # the latest pass, once it has finished
        self._stats: PassStats | None = None
        self._fill = (0, 0)  # real tokens, all tokens of the latest pass
        self._pool: _Pool | None = None  # persistent DataLoader workers, once started
        self._agreed = False  # the ranks' orders compared (on the first pass)
        self._set_position(settings.epoch, 0)

    def _plan(self, epoch: int, rows: int) -> AnyPackedPlan:
        return packed_plan(
            self.dataset,
            self.settings,
            epoch=epoch,
            rows=rows,
            rank=self.rank,
            world_size=self.world_size,
        )

    def _set_position(self, epoch: int, rows: int, done: _Pass | None = None) -> None:
        """Move the saved position (the end of an epoch is the next epoch's start; inside
        it, even with no batch left for this rank, it stays). ``done``: the pass that
        finished, which :meth:`state_dict` still reports."""
        epoch, rows, plan = plan_position(self._plan, epoch, rows)
        self.epoch, self._rows, self._plan_for = epoch, rows, plan
        self._live, self._done = None, done

    def _pool_for_pass(self) -> _Pool:
        """The DataLoader a pass iterates: the persistent one (started on the first pass),
        or one for this pass alone (``persistent_workers=False``, or an earlier iterator
        still open holds the persistent one)."""
        pool = self._pool
        if pool is not None and not pool.busy:
            pool.busy = True
            return pool
        persistent = self.settings.persistent_workers and pool is None
        control = _PassControl()
        source = _Workers(self.dataset, self.settings, control, self.rank, self.world_size)
        loader = DataLoader(
            source,
            batch_size=None,
            num_workers=self.num_workers,
            collate_fn=_identity,
            pin_memory=False,  # workers send numpy; the main process pins the widened batch
            multiprocessing_context=self.settings.multiprocessing_context,
            prefetch_factor=self.settings.prefetch_factor,
            persistent_workers=persistent,
        )
        fresh = _Pool(loader, control)
        if persistent:
            self._pool = fresh
        return fresh

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` afresh, unless it is already the saved position's epoch."""
        epoch = check_epoch(epoch)
        if epoch != self.epoch:
            self._set_position(epoch, 0)
        elif self._done is not None and self._done.epoch != self.epoch:
            self._done = None  # the trainer has moved on from the finished pass's epoch

    def __len__(self) -> int:
        """Batches this rank yields in the next pass: counted from the tokens each shard's
        metadata records (``concat``), else by reading every shard's document lengths once
        per epoch (``stats()["token_counts"]`` says which)."""
        return len(self._plan_for)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if not self._agreed:  # before any read: ranks of another order must not start
            record = order_record(self.dataset, self.settings, self.epoch, self._rows)
            check_ranks_agree(record, self.rank, self.world_size, self.dataset.shown)
            self._agreed = True
        plan = self._plan_for
        live = _Pass(plan, self.epoch)
        self._live = live
        stats = self._stats = PassStats(self.epoch)
        stats.locality = plan.locality()  # with a remote source's node share (warned once)
        share = node_cache_share(self.dataset, stats.locality)
        if share is not None:
            stats.locality.update(share)
        pool: _Pool | None = None
        if self.num_workers == 0:
            items: Any = plan.batches()
        else:
            pool = self._pool_for_pass()
            pool.control.start(self.epoch, self._rows)  # before its workers read it
            try:
                items = iter(pool.loader)
            except BaseException:
                pool.control.end()
                pool.busy = False
                raise
        pin = bool(self.settings.pin_memory) and torch.cuda.is_available()
        real_total = slots = 0
        resumed = time.perf_counter()
        try:
            for item, real in items:
                batch = to_device(_tensors(widened(item), pin), self.device, pin)
                rows = int(batch["input_ids"].shape[0])
                live.steps += 1
                real_total += real
                slots += batch["input_ids"].numel()
                self._fill = (real_total, slots)
                now = time.perf_counter()
                stats.delivered(rows, now - resumed, now)
                yield batch
                resumed = time.perf_counter()
        finally:
            stats.finished = time.perf_counter()
            if pool is not None:
                pool.control.end()  # workers of this pass stop
                pool.busy = False
            del items
        if self._live is live:  # the pass ran to its end: the next epoch from its start
            self._set_position(live.epoch + 1, 0, live)

    def stats(self) -> dict[str, Any]:
        """The latest pass: rows (as samples) and batches, rows/s, time to first batch,
        data-starved %, plus ``tokens`` (real tokens delivered) and ``fill`` (real tokens
        over all token slots: 1.0 but for padding) and ``token_counts``: ``"recorded"`` when
        the epoch's rows are counted from the shards' recorded tokens (no shard read to know
        ``len`` or to skip to a resumed row), ``"read"`` when from their document lengths;
        ``locality``: the streams this rank's rows are cut from and their share of the
        tokens and shards beside ``1 / world_size`` (one run of rows: every shard), and,
        in-process, ``shards_touched`` (distinct shards read this pass)."""
        base = (self._stats or PassStats(self.epoch)).as_dict()
        real, slots = self._fill
        shown = self._live if self._live is not None else self._done
        plan = shown.plan if shown is not None else self._plan_for
        counts = "recorded" if plan.packing.tokens_known else "read"
        locality = dict(base.get("locality") or plan.locality())
        if self.num_workers == 0 and self._stats is not None:
            locality["shards_touched"] = len(plan.touched)
        return base | {
            "tokens": real,
            "fill": real / slots if slots else 0.0,
            "token_counts": counts,
            "locality": locality,
        }

    def state_dict(self) -> dict[str, Any]:
        """The live global position in packed rows: resumable at any world size and
        worker count (a document half delivered continues where it was cut)."""
        live = self._live if self._live is not None else self._done
        if live is not None and live.steps:
            rows = live.plan.rows_after(live.steps)
            epoch, rows = epoch_position(live.epoch, rows, live.plan.total)
        else:
            epoch, rows = self.epoch, self._rows
        return packed_state(self.dataset, self.settings, epoch, rows)

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Make ``state`` the saved position; raises if it is for another dataset, order
        or pack settings (the batch size and ``drop_last`` may change). ``strict=False``:
        as :meth:`TorchLoader.load_state_dict`."""
        dataset, epoch, rows, settings = resume_position(self.dataset, self.settings, state, strict)
        if dataset is not self.dataset or settings != self.settings:
            # carried on, or the state's streams: workers must read the new order
            self.dataset, self.settings, self._pool = dataset, settings, None
        self._set_position(epoch, rows)

    def __repr__(self) -> str:
        pack = self.settings.pack
        return (
            f"<PackedTorchLoader {self.dataset.path!r} batch_size={self.batch_size} "
            f"seq_len={pack.seq_len} mode={pack.mode} epoch={self.epoch} "
            f"rank={self.rank}/{self.world_size} workers={self.num_workers}>"
        )


class _Pool:
    """A DataLoader over :class:`_Workers` and its pass control, kept across passes when its
    workers persist."""

    def __init__(self, loader: DataLoader, control: _PassControl) -> None:
        self.loader, self.control = loader, control
        self.busy = True  # a pass is iterating it


class _Pass:
    __slots__ = ("epoch", "plan", "steps")

    def __init__(self, plan: AnyPackedPlan, epoch: int) -> None:
        self.plan, self.epoch, self.steps = plan, epoch, 0


register_framework("torch_packed", PackedTorchLoader)
