"""Ranks agree on a loader's order before its first batch.

Every rank computes the global order on its own, from (fingerprint, seed, epoch, settings).
Ranks that differ in any of these (a rank that opened another table version, passed another
seed or ``streams=``, or restored another checkpoint) each read a share of a *different*
order: some samples come twice, others never, and nothing fails. So on the first pass of a
loader spanning the whole ``torch.distributed`` world, each rank posts what its order depends
on to the process group's key-value store and compares every rank's; a difference raises
:class:`~spark_dl_core.errors.RanksDisagreeError` naming each differing setting and the
ranks' values.

The store is read with a timeout, never a collective: a rank that starts its loader more
than ``SPARK_DL_RANKS_TIMEOUT_S`` seconds (default 60) after the first (a rank joining late,
or a loader only some ranks iterate) is not waited for. The ranks that did post are
compared, and a :class:`RanksNotComparedWarning` names the missing ranks; every rank still
reads its own share of its own order, which is correct when the settings agree.
"""

from __future__ import annotations

import json
import os
import warnings
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from ...errors import RanksDisagreeError, RanksNotComparedWarning
from ...order import resolve_streams

if TYPE_CHECKING:
    from ...shard_source import ShardSource
    from ..settings import LoaderSettings

_PREFIX = "spark_dl/loader-order"
# per process: first passes of world-spanning loaders so far (ranks make loaders alike)
_passes = 0


def order_record(
    dataset: ShardSource, settings: LoaderSettings, epoch: int, position: int
) -> dict[str, Any]:
    """What a rank's order and share depend on: the dataset's fingerprint, the order's
    settings (streams resolved), the packing, and the position it starts from (samples, or
    packed rows)."""
    return {
        "fingerprint": dataset.fingerprint,
        "seed": settings.seed,
        "shuffle": settings.shuffle,
        "shuffle_window": settings.shuffle_window,
        "batch_size": settings.batch_size,
        "streams": resolve_streams(dataset, settings.shuffle, settings.streams),
        "drop_last": settings.drop_last,
        "even_batches": settings.even_batches,
        "pack": None if settings.pack is None else settings.pack.model_dump(mode="json"),
        "epoch": epoch,
        "position": position,
    }


def timeout_s() -> float:
    return float(os.environ.get("SPARK_DL_RANKS_TIMEOUT_S", "60"))


def _store(rank: int, world_size: int) -> Any | None:
    """The default process group's store when the loader spans that whole group."""
    dist = torch.distributed
    if world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
        return None
    if dist.get_world_size() != world_size or dist.get_rank() != rank:
        return None  # a loader over its own rank / world: no group to compare with
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def check_ranks_agree(record: dict[str, Any], rank: int, world_size: int, shown: str) -> None:
    """Post this rank's ``record`` (what its order depends on, JSON-able) and compare it
    with every other rank's; raises :class:`RanksDisagreeError` on any difference."""
    store = _store(rank, world_size)
    if store is None:
        return
    global _passes
    _passes += 1
    prefix = f"{_PREFIX}/{_passes}"
    store.set(f"{prefix}/{rank}", json.dumps(record, sort_keys=True))
    posted = {rank: record}
    wait = timedelta(seconds=timeout_s())
    for other in range(world_size):
        if other == rank:
            continue
        key = f"{prefix}/{other}"
        try:
            store.wait([key], wait)
        except Exception:  # the store's timeout error (its type differs by torch version)
            wait = timedelta(milliseconds=1)  # the others have had their time too
            continue
        posted[other] = json.loads(store.get(key))
    _compare(posted, shown)
    missing = sorted(set(range(world_size)) - set(posted))
    if missing:
        warnings.warn(
            f"{shown}: rank(s) {missing} did not start this loader within {timeout_s():g} s "
            f"of rank {rank} (SPARK_DL_RANKS_TIMEOUT_S), so their order settings were not "
            "compared with this rank's; each rank reads its share of its own order",
            RanksNotComparedWarning,
            stacklevel=3,
        )


def _compare(posted: dict[int, dict[str, Any]], shown: str) -> None:
    names = sorted({name for record in posted.values() for name in record})
    same = {n: {json.dumps(r.get(n), sort_keys=True) for r in posted.values()} for n in names}
    differ = [n for n in names if len(same[n]) > 1]
    if not differ:
        return
    parts = []
    for name in differ:
        values = ", ".join(f"rank {r}: {posted[r].get(name)!r}" for r in sorted(posted))
        parts.append(f"{name} ({values})")
    raise RanksDisagreeError(
        f"{shown}: the ranks would read different orders, so samples would repeat or be "
        f"skipped across ranks: they differ in {'; '.join(parts)}. Give every rank the same "
        "dataset version, loader settings and saved state"
    )
