"""The checks a packed loader cut from streams passes over any source (an MDS dataset, a
table read in place): every token once in runs of whole documents, a step's batches equal
to the one-rank loader's at every world size, and a mid-epoch position resumed exactly at
another world size. ``open_loader(**settings)`` opens a fresh torch loader over the source,
as a rank of a run does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

OpenLoader = Callable[..., Any]


# The streamed packing every test of it uses: 4 streams of 32-token rows, batches of 4.
L = 32
PACK = {"column": "tokens", "seq_len": L, "pad_id": 0}
SETTINGS = {"batch_size": 4, "shuffle": True, "seed": 5, "streams": 4, "pack": PACK}


def token_ids(batches: list[dict[str, Any]]) -> np.ndarray:
    return np.concatenate([np.asarray(b["input_ids"]).reshape(-1) for b in batches])


def check_whole_documents(batches: list[dict[str, Any]], docs: list[np.ndarray], L: int) -> None:
    """Every token of ``docs`` (consecutive ids, a gap between documents, id 0 padding)
    served once; each segment one document's run, labelled and positioned from its start."""
    ids = token_ids(batches)
    assert np.array_equal(np.sort(ids[ids > 0]), np.sort(np.concatenate(docs)))
    firsts = np.sort(np.array([d[0] for d in docs if len(d)]))
    for b in batches:
        tok, pos = b["input_ids"].reshape(-1), b["position_ids"].reshape(-1)
        labels, cu = b["labels"].reshape(-1), b["cu_seqlens"]
        assert cu[0] == 0 and cu[-1] == tok.size and cu.dtype == np.int32
        assert b["max_seqlen"] == int(np.diff(cu).max())
        for a, z in zip(cu[:-1].tolist(), cu[1:].tolist()):
            seg = tok[a:z]
            assert labels[a] == -100
            if seg[0] == 0:  # padding: to its row's end, masked
                assert (seg == 0).all() and (labels[a:z] == -100).all() and z % L == 0
                continue
            assert np.array_equal(np.diff(seg), np.ones(len(seg) - 1))  # one document's run
            first = firsts[np.searchsorted(firsts, seg[0], side="right") - 1]
            assert np.array_equal(pos[a:z], seg - first)  # counted from the document's start
            assert np.array_equal(labels[a + 1 : z], seg[1:])


def check_rank_batches(
    open_loader: OpenLoader, one: list[dict[str, Any]], world: int, settings: dict[str, Any]
) -> list[dict[str, Any]]:
    """Rank ``r`` of ``world`` serves the one-rank batches ``kW + r``; each rank's
    ``stats()["locality"]`` (for the caller's bounds on what it read)."""
    localities = []
    for rank in range(world):
        ranked = {"rank": rank, "world_size": world, "even_batches": False}
        loader = open_loader(**(settings | ranked))
        mine = [b["input_ids"].numpy() for b in loader]
        assert len(mine) == len(one[rank::world])
        for k, batch in enumerate(mine):
            assert np.array_equal(batch, one[k * world + rank]["input_ids"])
        localities.append(loader.stats()["locality"])
    return localities


def check_resume_at_four_ranks(
    open_loader: OpenLoader, one: list[dict[str, Any]], steps: int, settings: dict[str, Any]
) -> None:
    """A position after ``steps`` steps of 2 ranks (``2 * steps`` global batches) resumed on
    4 ranks serves the one-rank batches from there on, dealt in whole rounds."""
    loader = open_loader(**(settings | {"rank": 0, "world_size": 2}))
    it = iter(loader)
    for _ in range(steps):
        next(it)
    state = loader.state_dict()
    done = 2 * steps
    assert state["pack"]["version"] == 2 and state["pack"]["batches"] == done
    rest = []
    for rank in range(4):
        other = open_loader(**(settings | {"rank": rank, "world_size": 4}))
        other.load_state_dict(state)
        rest.append([b["input_ids"].numpy() for b in other])
    for g in range(done, len(one)):
        step, rank = divmod(g - done, 4)
        assert np.array_equal(rest[rank][step], one[g]["input_ids"]), g
    left = len(one) - done  # dealt in whole rounds (even_batches: the last one filled)
    assert sum(len(r) for r in rest) == -(-left // 4) * 4
