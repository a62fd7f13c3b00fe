"""Driving a run across a version change the way the carry-on tests do: a state saved after
some batches on every rank, the rest of the carried epoch per rank, and the global batches
those ranks' batches make (global batch g goes to rank g % world)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

KW: dict[str, Any] = {"batch_size": 8, "shuffle": True, "seed": 5, "even_batches": False}


def flat(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


def saved(
    open_ds: Callable[[], Any], steps: int, world: int, **extra: Any
) -> tuple[dict[str, Any], list[int]]:
    """The state after ``steps`` batches on each of ``world`` ranks of the dataset
    ``open_ds()`` opens (the same on every rank), and the ids served."""
    seen: list[int] = []
    states = []
    for rank in range(world):
        loader = open_ds().to_torch(rank=rank, world_size=world, **KW, **extra)
        it = iter(loader)
        for _ in range(steps):
            seen += flat([next(it)])
        states.append(loader.state_dict())
    assert all(s == states[0] for s in states)
    return states[0], seen


def carried(
    open_ds: Callable[[], Any], state: dict[str, Any], world: int, **extra: Any
) -> list[list[list[int]]]:
    """Each rank's batches of the rest of the carried epoch over ``open_ds()``."""
    out = []
    for rank in range(world):
        loader = open_ds().to_torch(rank=rank, world_size=world, **KW, **extra)
        loader.load_state_dict(state, strict=False)
        out.append([flat([b]) for b in loader])
    return out


def global_batches(per_rank: list[list[list[int]]]) -> list[list[int]]:
    """Global batches from ranks' batches (global batch g went to rank g % world)."""
    world = len(per_rank)
    return [per_rank[g % world][g // world] for g in range(sum(len(r) for r in per_rank))]
