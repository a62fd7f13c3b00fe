"""even_batches: over several ranks every rank takes the same number of steps (DDP must not
hang at an epoch's end), by repeating the epoch's first samples; pad_mask marks them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from ddp_helpers import run_two_ranks

from spark_dl_core import DatasetSpec, SpecError, open_dataset, write_mds
from spark_dl_core.loaders.settings import LoaderSettings
from spark_dl_core.order import EpochPlan, GlobalOrder

N = 1003  # uneven: 11 global batches of 100 over 2 ranks, 101 over 3


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("even") / "ds"
    table = pa.table(
        {
            "id": pa.array(np.arange(N, dtype=np.int64)),
            "x": pa.array(list(np.arange(N * 2, dtype=np.float32).reshape(N, 2))),
        }
    )
    write_mds(table, str(path), DatasetSpec(shard_size="4KiB"))
    return str(path)


def _plans(order: GlobalOrder, batch: int, world: int, consumed: int = 0) -> list[EpochPlan]:
    return [EpochPlan(order, batch, r, world, False, consumed, True) for r in range(world)]


def _delivered(plans: list[EpochPlan]) -> tuple[list[int], list[int]]:
    """(ids delivered once, ids repeated) over the ranks' plans."""
    once: list[int] = []
    repeated: list[int] = []
    for plan in plans:
        for k in range(len(plan)):
            ids, pad = plan[k], plan.pad_mask(k)
            assert len(ids) == len(pad) == plan.batch_len(k)
            once += ids[~pad].tolist()
            repeated += ids[pad].tolist()
    return once, repeated


def test_the_reported_run_takes_equal_steps_on_every_rank() -> None:
    """10,007 rows, batch 100, 3 ranks: 34, 34, 33 steps before; 34 each now."""
    sizes = np.full(77, 130)
    sizes[-1] = 10_007 - 76 * 130
    order = GlobalOrder(sizes, "fp", 4, 0, True)
    plans = _plans(order, 100, 3)
    assert [len(p) for p in plans] == [34, 34, 34]
    once, repeated = _delivered(plans)
    assert sorted(once) == list(range(10_007))
    first = order.take(0, len(repeated))  # repeats: the epoch's first samples, in order
    assert sorted(repeated) == sorted(first.tolist()) and 0 < len(repeated) < 3
    # The last round splits what is left evenly: no tiny or empty batch on one rank.
    assert {p.batch_len(33) for p in plans} == {36}
    assert sum(p.repeats for p in plans) == len(repeated)
    # Without it: exactly once, unequal steps (what evaluation wants).
    plain = [EpochPlan(order, 100, r, 3, False, 0, False) for r in range(3)]
    assert [len(p) for p in plain] == [34, 34, 33] and not any(p.repeats for p in plain)


@pytest.mark.parametrize("total", [1, 2, 5, 99, 1003])
@pytest.mark.parametrize("world", [2, 3, 8])
def test_any_size_any_world_equal_steps(total: int, world: int) -> None:
    order = GlobalOrder(np.array([total]), "fp", 0, 0, True)
    for batch in (1, 7, 100):
        plans = _plans(order, batch, world)
        assert len({len(p) for p in plans}) == 1
        once, repeated = _delivered(plans)
        assert sorted(once) == list(range(total))
        # Fewer than world_size repeats, wrapping around a tiny epoch's order.
        assert len(repeated) < world
        want = [int(order.take(i % total, i % total + 1)[0]) for i in range(len(repeated))]
        assert sorted(repeated) == sorted(want)


def test_resume_keeps_the_padding_and_elastic_restart_pads_the_rest() -> None:
    order = GlobalOrder(np.array([400, 300, 303]), "fp", 1, 2, True, 2)
    full = _plans(order, 50, 3)
    for steps in (1, 4, len(full[0]) - 1):
        consumed = full[0].consumed_after(steps)
        again = _plans(order, 50, 3, consumed)  # same world size: the very same batches
        for a, b in zip(full, again):
            assert len(b) == len(a) - steps
            assert all(np.array_equal(a[steps + k], b[k]) for k in range(len(b)))
            assert all(np.array_equal(a.pad_mask(steps + k), b.pad_mask(k)) for k in range(len(b)))
    consumed = full[0].consumed_after(3)
    for world in (1, 2, 4):  # another world size: the rest once, equal steps
        rest = _plans(order, 50, world, consumed)
        assert len({len(p) for p in rest}) == 1
        once, repeated = _delivered(rest)
        assert sorted(once) == sorted(order.take(consumed, order.total).tolist())
        assert len(repeated) < world
    # A finished epoch has nothing left (and the state after it counts the real samples).
    assert full[0].consumed_after(len(full[0])) == order.total


def test_drop_last_and_one_rank_are_unchanged() -> None:
    order = GlobalOrder(np.array([1003]), "fp", 0, 0, True)
    for even in (True, False):
        dropped = [EpochPlan(order, 100, r, 3, True, 0, even) for r in range(3)]
        assert [len(p) for p in dropped] == [3, 3, 3] and not any(p.repeats for p in dropped)
        one = EpochPlan(order, 100, 0, 1, False, 0, even)
        assert len(one) == 11 and one.batch_len(10) == 3 and not one.repeats


def test_settings_are_checked_by_name(ds_path: str) -> None:
    assert LoaderSettings().even_batches is True and LoaderSettings().pad_mask is False
    ds = open_dataset(ds_path)
    with pytest.raises(SpecError, match="even_batches"):
        ds.to_torch(batch_size=10, even_batches="yes")
    with pytest.raises(SpecError, match="pad_mask"):
        ds.to_torch(batch_size=10, pad_mask=1)
    with pytest.raises(SpecError, match="even_batches"):
        ds.to_tf(batch_size=10, even_batches=None)


def test_a_pad_mask_column_in_the_data_is_refused(tmp_path: Path) -> None:
    table = pa.table({"pad_mask": pa.array(np.zeros(4, dtype=np.int64))})
    write_mds(table, str(tmp_path / "d"), DatasetSpec())
    ds = open_dataset(str(tmp_path / "d"))
    with pytest.raises(SpecError, match="pad_mask"):
        ds.to_torch(batch_size=2, pad_mask=True)
    assert len(list(ds.to_torch(batch_size=2))) == 2


def test_torch_loader_pads_resumes_and_counts(ds_path: str) -> None:
    torch = pytest.importorskip("torch")
    ds = open_dataset(ds_path)
    kw = dict(batch_size=100, shuffle=True, seed=4, columns=["id"], pad_mask=True)
    loaders = [ds.to_torch(rank=r, world_size=2, num_workers=r, **kw) for r in range(2)]
    assert [len(loader) for loader in loaders] == [6, 6]
    epoch = [list(loader) for loader in loaders]
    masks = torch.cat([b["pad_mask"] for run in epoch for b in run])
    ids = torch.cat([b["id"] for run in epoch for b in run])
    assert sorted(ids[~masks].tolist()) == list(range(N)) and int(masks.sum()) == 1
    stats = [loader.stats() for loader in loaders]
    assert [s["batches"] for s in stats] == [6, 6]
    assert sum(s["samples"] for s in stats) == N + 1
    assert sum(s["repeated_samples"] for s in stats) == 1
    # Resume after 5 steps on each rank: the same last batches, padding included.
    fresh = [ds.to_torch(rank=r, world_size=2, **kw) for r in range(2)]
    for loader in fresh:
        it = iter(loader)
        for _ in range(5):
            next(it)
    state = json.loads(json.dumps(fresh[1].state_dict()))
    for r in range(2):
        resumed = ds.to_torch(rank=r, world_size=2, **kw)
        resumed.load_state_dict(state)
        (last,) = list(resumed)
        assert torch.equal(last["id"], epoch[r][5]["id"])
        assert torch.equal(last["pad_mask"], epoch[r][5]["pad_mask"])
    # even_batches=False: today's exactly-once delivery, 6 and 5 steps.
    plain = [ds.to_torch(rank=r, world_size=2, even_batches=False, **kw) for r in range(2)]
    assert [len(list(loader)) for loader in plain] == [6, 5]


def test_numpy_and_tf_pad_the_same_way(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    kw = dict(batch_size=100, shuffle=True, seed=4, columns=["id"], pad_mask=True)
    for r in range(3):
        order = ds.sample_order(batch_size=100, shuffle=True, seed=4, rank=r, world_size=3)
        batches = list(ds.iter_batches(rank=r, world_size=3, **kw))
        assert len(batches) == len(order) == 4
        for k, b in enumerate(batches):
            assert np.array_equal(b["id"], order[k]) and b["pad_mask"].dtype == bool
            assert np.array_equal(b["pad_mask"], order.pad_mask(k))
    tf = pytest.importorskip("tensorflow")
    steps = []
    seen: list[int] = []
    for r in range(3):  # what strategy.distribute_datasets_from_function passes
        context = tf.distribute.InputContext(3, r, 3)
        tfds = ds.to_tf(input_context=context, **kw)
        batches = list(tfds)
        assert int(tfds.cardinality()) == len(batches)
        steps.append(len(batches))
        for b in batches:
            seen += b["id"].numpy()[~b["pad_mask"].numpy()].tolist()
    assert steps == [4, 4, 4] and sorted(seen) == list(range(N))
    with pytest.raises(SpecError, match="world_size"):
        ds.to_tf(input_context=tf.distribute.InputContext(3, 0, 3), world_size=2, **kw)


_WORK = """
def work(rank, path):
    torch.manual_seed(0)
    from spark_dl_core import open_dataset
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = open_dataset(path).to_torch(batch_size=100, shuffle=True, seed=4)  # defaults
    steps = []
    for epoch in range(2):
        n = 0
        for batch in loader:
            loss = model(batch["x"] / 1e4).pow(2).mean()  # scaled: weights stay finite
            opt.zero_grad()
            loss.backward()  # an all-reduce every rank must join
            opt.step()
            n += 1
        steps.append(n)
    return {"steps": steps, "weights": model.module.weight.detach().flatten().tolist()}
"""


@pytest.mark.slow
def test_ddp_trains_two_epochs_over_an_uneven_dataset(ds_path: str, tmp_path: Path) -> None:
    """Before even_batches, rank 0 took a 6th step whose gradient all-reduce rank 1 never
    joined: the run hung until the timeout."""
    pytest.importorskip("torch")
    ranks = run_two_ranks(_WORK, ds_path, tmp_path, timeout=90)
    assert ranks[0]["steps"] == ranks[1]["steps"] == [6, 6]
    weights = ranks[0]["weights"]
    assert all(math.isfinite(w) for w in weights)  # NaN would compare equal through json
    assert weights == ranks[1]["weights"]  # every step was synchronized
