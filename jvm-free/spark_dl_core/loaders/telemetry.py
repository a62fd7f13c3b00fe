"""Loader telemetry: where an epoch's time goes, cheaply enough to be always on.

A :class:`PassStats` per pass counts what the training loop received and how long it
waited for it (the "data-starved" share of wall time), and collects, per worker, the
seconds spent reading, decompressing, decoding and transforming. Readers accumulate into
a :class:`WorkerTimes` dict (a few ``perf_counter`` calls per shard and per batch); with
DataLoader workers each item carries its worker's cumulative times. With ``trace_path``
the same spans are kept and written as Chrome-trace JSON (``chrome://tracing``, Perfetto).
"""

from __future__ import annotations

import json
import os
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import CacheTooSmallWarning
from ..mixture.dataset import Mixture

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..order import EpochPlan
    from ..shard_source import ShardSource

STAGES = ("read", "decompress", "decode", "transform")


def new_times() -> dict[str, float]:
    return dict.fromkeys(STAGES, 0.0)


class Spans:
    """Chrome-trace complete events ("ph": "X") of one process, in microseconds."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def add(self, name: str, start: float, end: float, tid: str, **args: Any) -> None:
        self.events.append(
            {
                "name": name,
                "ph": "X",
                "ts": start * 1e6,
                "dur": (end - start) * 1e6,
                "pid": os.getpid(),
                "tid": tid,
                **({"args": args} if args else {}),
            }
        )

    def take(self) -> list[dict[str, Any]]:
        out, self.events = self.events, []
        return out


class SourceTally:
    """A mixture's per-source samples delivered in one pass, counted only when stats are
    asked for: the ids of the batches delivered since the last count (from the pass's
    plan) mapped to their sources and added on, so the batch path does nothing and each
    batch is counted once. A plain dataset reports nothing."""

    CHUNK = 1024  # batches looked up at once (bounds the memory of a late first call)

    def __init__(self, dataset: ShardSource, plan: EpochPlan, epoch: int) -> None:
        self.dataset, self.plan, self.epoch = dataset, plan, epoch
        self.counted = 0
        self.counts: np.ndarray | None = None

    def report(self, steps: int) -> dict[str, Any]:
        count, report = self.dataset.count_sources, self.dataset.source_report
        steps = min(steps, len(self.plan))
        for k in range(self.counted, steps, self.CHUNK):
            got = count(self.plan.joined(range(k, min(k + self.CHUNK, steps))))
            if got is None:
                return {}
            self.counts = got if self.counts is None else self.counts + got
        self.counted = max(self.counted, steps)
        if self.counts is None:
            got = count(np.empty(0, dtype=np.int64))
            if got is None:
                return {}
            self.counts = got
        consumed = self.plan.consumed_after(steps)
        epoch = self.epoch
        if consumed and consumed >= self.plan.total:  # the epoch's end: the next one's start
            epoch, consumed = epoch + 1, 0
        return dict(report(self.counts, epoch, consumed))


class PassStats:
    """What one pass (one ``iter(loader)``) delivered and where its time went."""

    def __init__(self, epoch: int, trace: bool = False) -> None:
        self.epoch = epoch
        self.started = time.perf_counter()
        self.first_batch_s: float | None = None
        self.samples = 0
        self.batches = 0
        self.repeated = 0  # padding samples among ``samples`` (even_batches)
        self.waited_s = 0.0
        self.finished: float | None = None
        self.workers: dict[str, dict[str, float]] = {}
        self.spans = Spans() if trace else None
        self.worker_events: list[dict[str, Any]] = []
        self.tally: SourceTally | None = None
        # How local this rank's reads are (``EpochPlan.locality``), for the pass's plan.
        self.locality: dict[str, Any] | None = None
        # A run carried on to another version: what became of its epoch's rows left then.
        self.carry: Callable[[], dict[str, Any] | None] | None = None

    def follow(self, dataset: ShardSource, plan: EpochPlan) -> PassStats:
        """Report a mixture's per-source counts and stage for this pass's ``plan``, and how
        local its reads are (with, for a remote source, its node's share of an epoch beside
        the node cache's limit: :func:`node_cache_share`)."""
        self.tally = SourceTally(dataset, plan, self.epoch)
        self.locality = plan.locality()
        share = node_cache_share(dataset, self.locality)
        if share is not None:
            self.locality.update(share)
        self.carry = dataset.carry_report
        return self

    def delivered(self, samples: int, waited: float, now: float) -> None:
        if self.first_batch_s is None:
            self.first_batch_s = now - self.started
        self.samples += samples
        self.batches += 1
        self.waited_s += waited

    def as_dict(self) -> dict[str, Any]:
        end = self.finished if self.finished is not None else time.perf_counter()
        wall = max(end - self.started, 1e-9)
        carried = self.carry() if self.carry is not None else None
        return {
            "epoch": self.epoch,
            "samples": self.samples,
            "repeated_samples": self.repeated,
            "batches": self.batches,
            "wall_s": wall,
            "samples_per_s": self.samples / wall,
            "time_to_first_batch_s": self.first_batch_s,
            "data_starved_pct": 100.0 * self.waited_s / wall,
            "workers": {k: dict(v) for k, v in sorted(self.workers.items())},
            **self._downloads(),
            **self._shards(),
            **({"locality": dict(self.locality)} if self.locality is not None else {}),
            **(self.tally.report(self.batches) if self.tally is not None else {}),
            **({"carry": carried} if carried is not None else {}),
        }

    def _downloads(self) -> dict[str, float]:
        """Remote datasets: bytes downloaded, their rate while downloads ran (summed over
        worker processes) and the seconds loads waited for the network."""
        times = [t for t in self.workers.values() if "download_bytes" in t]
        if not times:
            return {}
        got = sum(t["download_bytes"] for t in times)
        busy = max(t["download_s"] for t in times)
        return {
            "download_bytes": got,
            # shard bytes read through the node cache that no download brought in this pass
            "cache_hit_bytes": max(0.0, sum(t.get("fetched_bytes", 0.0) for t in times) - got),
            "download_bytes_per_s": got / busy if busy > 0 else 0.0,
            "network_wait_s": sum(t["network_wait_s"] for t in times),
        }

    def _shards(self) -> dict[str, int]:
        """Distinct shards each reader loaded this pass, summed over its workers (with
        DataLoader workers a shard two of them read counts twice)."""
        touched = [t["shards_touched"] for t in self.workers.values() if "shards_touched" in t]
        return {"shards_touched": int(sum(touched))} if touched else {}

    def postfix(self) -> str:
        d = self.as_dict()
        return f"{d['samples_per_s']:,.0f} samples/s, starved {d['data_starved_pct']:.0f}%"

    def write_trace(self, path: str | os.PathLike[str]) -> None:
        events = (self.spans.events if self.spans else []) + self.worker_events
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)


# sources already warned of a cache smaller than their node's share (once per process)
_WARNED_SMALL: weakref.WeakSet[Any] = weakref.WeakSet()


def node_cache_share(dataset: ShardSource, locality: dict[str, Any]) -> dict[str, float] | None:
    """A remote source: the stored bytes this node's ranks read an epoch (this rank's share
    times the ranks on the node, ``LOCAL_WORLD_SIZE``, at most the whole source) and the
    node cache's byte limit; warns once (:class:`~spark_dl_core.errors.CacheTooSmallWarning`)
    where the cache cannot hold that share, since each epoch then downloads it again. A
    mixture's remote sources are summed by the cache they share, each at its own share of
    the epoch (``locality["sources"]``). None where no source is remote."""
    ranks_here = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if isinstance(dataset, Mixture):
        sources: list[Any] = dataset.sources
        shares = [
            float(s["data_share"]) for s in locality.get("sources") or [locality] * len(sources)
        ]
        groups = dataset.by_store()
    else:
        sources, shares, groups = [dataset], [float(locality["data_share"])], [[0]]
    caches = []  # [node share, limit] of each node cache the remote sources read through
    for group in groups:
        downloads = sources[group[0]].download_stats()
        if not downloads or "cache_limit_bytes" not in downloads:
            continue
        stored = [float(np.sum(sources[i].shards.stored_bytes)) for i in group]
        node = sum(min(b, b * shares[i] * ranks_here) for b, i in zip(stored, group))
        caches.append((node, float(downloads["cache_limit_bytes"])))
    if not caches:
        return None
    if dataset not in _WARNED_SMALL and any(n > lim - lim / 8 for n, lim in caches):
        _WARNED_SMALL.add(dataset)  # above the cache's evict mark
        node, limit = max(caches, key=lambda c: c[0] - c[1])
        gib = 1 << 30
        message = (
            f"{dataset.shown}: this node's ranks read about {node / gib:.2f} GiB of it an "
            f"epoch ({ranks_here} rank(s) here, each {locality['data_share']:.0%} of the "
            f"source), more than its node cache keeps ({limit / gib:.2f} GiB, less an "
            "eighth of room): each epoch downloads it again. Raise SPARK_DL_CACHE_BYTES (or "
            "the cache's limit_bytes), or read on more nodes"
        )
        warning = CacheTooSmallWarning(message, node_bytes=int(node), limit_bytes=int(limit))
        warnings.warn(warning, stacklevel=4)
    return {
        "node_share_bytes": sum(n for n, _ in caches),
        "cache_limit_bytes": sum(lim for _, lim in caches),
    }
