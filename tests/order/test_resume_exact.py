"""Resume is exact across ranks (DESIGN.md contract 3): several ranks simulated in one process
(``rank=``, ``world_size=``), every sample each delivers counted before and after a
``state_dict()`` / ``load_state_dict()`` (or ``to_tf(state=)``), for a dataset and a mixture,
with and without ``even_batches``, at another world size, and with ``drop_last`` and a larger
batch size on resume. A rank with nothing left of the epoch used to be planned from the next
epoch's start (samples twice), and a trainer's ``set_epoch(current)`` then restarted the epoch.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, Source, mix, open_dataset, write_mds
from spark_dl_core.sources.dataset import Dataset

N = 1003  # uneven for every batch size and world size below
KW: dict[str, Any] = dict(shuffle=True, seed=7, columns=["id"], pad_mask=True)


def _write(path: Path, start: int, n: int) -> str:
    table = pa.table({"id": pa.array(np.arange(start, start + n, dtype=np.int64))})
    write_mds(table, str(path), DatasetSpec(shard_size="2KiB"))
    return str(path)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Dataset]:
    root = tmp_path_factory.mktemp("resume")
    a = _write(root / "a", 0, 700)
    b = _write(root / "b", 700, N - 700)
    single = open_dataset(_write(root / "all", 0, N))
    # every sample of both sources once per epoch: ids 0..N-1, as for the single dataset
    mixture = mix([Source(a, repeat=1), Source(b, repeat=1)], columns=["id"])
    return {"dataset": single, "mixture": mixture}


def _real(batch: dict[str, Any]) -> list[int]:
    """The batch's ids that are not padding (repeats under even_batches)."""
    ids, pad = (np.asarray(batch[k]) for k in ("id", "pad_mask"))
    return ids[~pad].tolist()


def _torch_start(ds: Dataset, world: int, steps: int, kw: dict[str, Any]) -> tuple[list, list]:
    """Every rank takes ``steps`` batches: (ids delivered, each rank's state after them)."""
    seen, states = [], []
    for r in range(world):
        loader = ds.to_torch(rank=r, world_size=world, **kw)
        it = iter(loader)
        for _ in range(steps):
            seen += _real({k: v.numpy() for k, v in next(it).items()})
        states.append(json.loads(json.dumps(loader.state_dict())))
    return seen, states


def _torch_resume(ds: Dataset, world: int, state: dict, kw: dict[str, Any]) -> tuple[list, list]:
    """Fresh loaders on every rank resume ``state`` as a trainer does (``set_epoch`` with the
    epoch in progress), finish it, then run the next epoch: (rest ids, next epoch's ids)."""
    rest, after = [], []
    for r in range(world):
        loader = ds.to_torch(rank=r, world_size=world, **kw)
        loader.load_state_dict(state)
        loader.set_epoch(state["epoch"])
        rest += [i for b in loader for i in _real({k: v.numpy() for k, v in b.items()})]
        loader.set_epoch(state["epoch"] + 1)
        after += [i for b in loader for i in _real({k: v.numpy() for k, v in b.items()})]
    return rest, after


def _tf_start(ds: Dataset, world: int, steps: int, kw: dict[str, Any]) -> tuple[list, list]:
    seen, states = [], []
    for r in range(world):
        tfds = ds.to_tf(rank=r, world_size=world, **kw)
        for k, batch in enumerate(tfds):
            if k == steps:
                break
            seen += _real({n: v.numpy() for n, v in batch.items()})
        states.append(json.loads(json.dumps(tfds.state_dict(steps))))
    return seen, states


def _tf_resume(ds: Dataset, world: int, state: dict, kw: dict[str, Any]) -> tuple[list, list]:
    """The first pass of ``to_tf(state=)`` is the rest of the epoch, the second the next."""
    rest, after = [], []
    for r in range(world):
        tfds = ds.to_tf(rank=r, world_size=world, state=state, **kw)
        for out in (rest, after):
            out += [i for b in tfds for i in _real({n: v.numpy() for n, v in b.items()})]
    return rest, after


RUNNERS = {"torch": (_torch_start, _torch_resume), "tf": (_tf_start, _tf_resume)}
# (world before, steps before, world after): each leaves some rank of the resumed world
# with nothing of the epoch (even_batches=False) or with only the padded last round.
WORLDS = [(2, 5, 2), (1, 8, 4), (3, 3, 2)]


def _epoch_ids(ds: Dataset, epoch: int, batch: int, streams: int = 1) -> list[int]:
    """The epoch's global order, as one rank reads it at batch size ``batch`` (an order of
    several streams draws each batch from its stream, so it depends on the batch size)."""
    order = ds.sample_order(batch_size=batch, shuffle=True, seed=7, epoch=epoch, streams=streams)
    return np.concatenate(list(order)).tolist()


@pytest.mark.parametrize("framework", ["torch", "tf"])
@pytest.mark.parametrize("source", ["dataset", "mixture"])
@pytest.mark.parametrize("even", [False, True])
@pytest.mark.parametrize(("before", "steps", "after"), WORLDS)
def test_every_sample_once_across_ranks(
    sources: dict[str, Dataset],
    framework: str,
    source: str,
    even: bool,
    before: int,
    steps: int,
    after: int,
) -> None:
    if framework == "tf":
        pytest.importorskip("tensorflow")
    else:
        pytest.importorskip("torch")
    ds = sources[source]
    kw = {**KW, "batch_size": 110 if before == 3 else 100, "even_batches": even}
    start, resume = RUNNERS[framework]
    seen, states = start(ds, before, steps, kw)
    # every rank took the same steps: every rank reports the same position
    assert all(s == states[0] for s in states)
    assert states[0]["epoch"] == 0 and states[0]["consumed"] == len(seen)
    rest, next_epoch = resume(ds, after, states[0], kw)
    counts = Counter(seen + rest)
    assert sorted(counts) == list(range(N)) and set(counts.values()) == {1}
    assert sorted(rest) == sorted(_epoch_ids(ds, 0, kw["batch_size"])[len(seen) :])
    # then the next epoch, whole, on every rank (a rank with an empty rest moved on too)
    assert sorted(next_epoch) == list(range(N))


@pytest.mark.parametrize("framework", ["torch", "tf"])
@pytest.mark.parametrize(("batch", "world"), [(150, 2), (500, 1)])
def test_drop_last_and_a_larger_batch_continue_the_epoch(
    sources: dict[str, Dataset], framework: str, batch: int, world: int
) -> None:
    """6 steps of 100 on one rank, then drop_last with a larger batch: the same epoch goes
    on with the 403 samples left, less those that fill no last round; it never restarts.
    Only an order that does not depend on the batch size allows that: ``streams=1``."""
    if framework == "tf":
        pytest.importorskip("tensorflow")
    else:
        pytest.importorskip("torch")
    ds = sources["dataset"]
    start, resume = RUNNERS[framework]
    seen, (state, *_) = start(ds, 1, 6, {**KW, "batch_size": 100, "streams": 1})
    kw = {**KW, "batch_size": batch, "drop_last": True, "streams": 1}
    rest, next_epoch = resume(ds, world, state, kw)
    order = _epoch_ids(ds, 0, batch, streams=1)
    kept = (N - 600) // (batch * world) * batch * world  # whole rounds of the larger batch
    assert sorted(rest) == sorted(order[600 : 600 + kept])
    assert not set(rest) & set(seen)
    epoch_one = _epoch_ids(ds, 1, batch, streams=1)
    assert sorted(next_epoch) == sorted(epoch_one[: N // (batch * world) * batch * world])


def test_a_state_saved_at_a_drop_last_epoch_end_starts_the_next_epoch(
    sources: dict[str, Dataset],
) -> None:
    """The last step of a drop_last epoch leaves a tail no batch takes: the epoch is over
    (the state says so), so a resumed loader starts the next epoch, not an empty pass."""
    pytest.importorskip("torch")
    ds = sources["dataset"]
    kw = {**KW, "batch_size": 100, "drop_last": True}
    loader = ds.to_torch(**kw)
    assert len(list(loader)) == 10
    state = loader.state_dict()
    assert (state["epoch"], state["consumed"]) == (1, 0)
    fresh = ds.to_torch(**kw)
    fresh.load_state_dict({**state, "epoch": 0, "consumed": 1000})  # saved by a tf pass
    assert fresh.epoch == 1 and fresh.remaining == 10


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    """Documents of unique tokens (so every packed row is told apart), some longer than a row."""
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 60, size=300)
    starts = np.cumsum(lengths) - lengths + 1
    docs = [list(range(s, s + k)) for s, k in zip(starts.tolist(), lengths.tolist())]
    path = str(tmp_path_factory.mktemp("tokens") / "ds")
    write_mds(pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))}), path)
    return open_dataset(path)


PACK = {"column": "tokens", "seq_len": 32}


def _rows(batches: Any) -> list[tuple[int, ...]]:
    return [tuple(np.asarray(row).tolist()) for b in batches for row in b["input_ids"]]


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_packed_rows_once_when_a_rank_has_nothing_left(tokens: Dataset, framework: str) -> None:
    """One rank stops two batches short of the epoch's end; four ranks resume without
    even_batches: two of them have no batch left, and must not replay the next epoch."""
    pytest.importorskip("tensorflow" if framework == "tf" else "torch")
    kw: dict[str, Any] = dict(batch_size=4, shuffle=True, seed=3, pack=PACK, even_batches=False)
    if framework == "tf":
        epochs = [_rows(tokens.to_tf(epoch=e, **kw)) for e in (0, 1)]
        head = tokens.to_tf(**kw)
        steps = -(-len(epochs[0]) // 4) - 2
        seen = _rows(b for _, b in zip(range(steps), head))
        state = head.state_dict(steps)
        rest, after = [], []
        for r in range(4):
            tfds = tokens.to_tf(rank=r, world_size=4, state=state, **kw)
            rest += _rows(tfds)
            after += _rows(tfds)
    else:
        epochs = [_rows(tokens.to_torch(epoch=e, **kw)) for e in (0, 1)]
        loader = tokens.to_torch(**kw)
        steps = len(loader) - 2
        it = iter(loader)
        seen = _rows(next(it) for _ in range(steps))
        state = loader.state_dict()
        rest, after = [], []
        for r in range(4):
            resumed = tokens.to_torch(rank=r, world_size=4, **kw)
            resumed.load_state_dict(state)
            resumed.set_epoch(0)
            rest += _rows(resumed)
            resumed.set_epoch(1)
            after += _rows(resumed)
    assert Counter(seen + rest) == Counter(epochs[0]) and len(rest) < 8
    assert Counter(after) == Counter(epochs[1])
