"""Global order, partitioning, elastic resume arithmetic, the batch reader, shuffle quality."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, SpecError, open_dataset, write_mds
from spark_dl_core.order import EpochPlan, global_order, shuffle_quality
from spark_dl_core.reader import BatchReader

SIZES = np.array([100] * 50 + [37], dtype=np.int64)
TOTAL = int(SIZES.sum())


def test_global_order_is_a_pure_permutation() -> None:
    a = global_order(SIZES, "fp", 1, 0, True, 4)
    assert sorted(a.tolist()) == list(range(TOTAL))
    assert np.array_equal(a, global_order(SIZES, "fp", 1, 0, True, 4))
    for other in [("fp2", 1, 0), ("fp", 2, 0), ("fp", 1, 1)]:
        assert not np.array_equal(a, global_order(SIZES, *other, True, 4))
    assert np.array_equal(global_order(SIZES, "fp", 1, 0, False, 4), np.arange(TOTAL))
    with pytest.raises(SpecError):
        global_order(SIZES, "fp", 1, 0, True, 0)


def test_window_bounds_shards_in_flight() -> None:
    offsets = np.concatenate([[0], np.cumsum(SIZES)])
    order = global_order(SIZES, "fp", 0, 0, True, 4)
    shard = np.searchsorted(offsets, order, side="right") - 1
    # Each block of samples from one window touches at most 4 shards.
    at = 0
    while at < TOTAL:
        group = set(shard[at : at + 400].tolist())
        window = len(group)
        assert window <= 8  # two windows at most, straddling a boundary
        at += 400


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("drop_last", [False, True])
def test_partition_exactly_once_and_balanced(world: int, drop_last: bool) -> None:
    order = global_order(SIZES, "fp", 0, 0, True, 4)
    plans = [EpochPlan.from_order(order, 64, r, world, drop_last) for r in range(world)]
    got = np.concatenate([b for p in plans for b in p.batches])
    assert len(set(got.tolist())) == len(got)
    if not drop_last:
        assert sorted(got.tolist()) == list(range(TOTAL))
    lens = [len(p) for p in plans]
    assert max(lens) - min(lens) <= (0 if drop_last else 1)


@pytest.mark.parametrize("before,after", [(2, 1), (2, 4), (3, 2), (1, 3)])
def test_elastic_resume_arithmetic(before: int, after: int) -> None:
    order = global_order(SIZES, "fp", 0, 3, True, 4)
    plans = [EpochPlan.from_order(order, 50, r, before, False) for r in range(before)]
    steps = 9
    seen = [i for p in plans for b in p.batches[:steps] for i in b.tolist()]
    consumed = plans[0].consumed_after(steps)
    assert consumed == steps * before * 50
    rest = [EpochPlan.from_order(order, 50, r, after, False, consumed) for r in range(after)]
    seen += [i for p in rest for b in p.batches for i in b.tolist()]
    assert sorted(seen) == list(range(TOTAL))


@pytest.fixture(scope="module")
def fixed_ds(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("ord") / "ds"
    n = 5000
    table = pa.table(
        {
            "v": pa.array(
                list(np.arange(n * 3, dtype=np.float32).reshape(n, 3)),
                type=pa.list_(pa.float32(), 3),
            ),
            "label": pa.array(np.arange(n, dtype=np.int64)),
        }
    )
    write_mds(table, str(path), DatasetSpec(shard_size="8KiB", compression="zstd"))
    return str(path)


def test_fast_path_equals_generic_read(fixed_ds: str) -> None:
    ds = open_dataset(fixed_ds)
    assert ds.layout.row_size is not None and ds.num_shards > 10
    plan = EpochPlan.build(
        ds,
        batch_size=128,
        shuffle=True,
        seed=1,
        epoch=0,
        rank=0,
        world_size=1,
        drop_last=False,
        shuffle_window=3,
    )
    for j, batch in enumerate(BatchReader(ds, plan.batches, prefetch_bytes=1)):
        ref = ds.read(plan.batches[j])
        assert np.array_equal(batch["label"], ref["label"])
        assert np.array_equal(batch["v"], ref["v"]) and batch["v"].shape[1:] == (3,)
    only = next(iter(BatchReader(ds, plan.batches[:1], columns=["label"])))
    assert list(only) == ["label"]


def test_prefetch_respects_budget(fixed_ds: str) -> None:
    ds = open_dataset(fixed_ds)
    plan = EpochPlan.build(
        ds,
        batch_size=100,
        shuffle=True,
        seed=1,
        epoch=0,
        rank=0,
        world_size=1,
        drop_last=False,
        shuffle_window=2,
    )
    shard_bytes = max(s.raw_data.bytes for s in ds.shards)
    reader = BatchReader(ds, plan.batches, prefetch_bytes=3 * shard_bytes)
    peak = 0
    for _ in reader:
        peak = max(peak, len(reader.loaded))
    assert peak <= 4  # window (2) + budgeted prefetch; never the whole dataset
    assert ds.num_shards > 3 * peak
    assert reader.held >= 0


def test_iter_batches_consumed_and_start(fixed_ds: str) -> None:
    ds = open_dataset(fixed_ds)
    full = np.concatenate([b["label"] for b in ds.iter_batches(100, shuffle=True, seed=2)])
    tail = np.concatenate(
        [b["label"] for b in ds.iter_batches(100, shuffle=True, seed=2, consumed=700)]
    )
    assert np.array_equal(tail, full[700:])
    skip = np.concatenate(
        [b["label"] for b in ds.iter_batches(100, shuffle=True, seed=2, start_batch=3)]
    )
    assert np.array_equal(skip, full[300:])


def test_shuffle_quality_improves_with_window() -> None:
    sizes = np.full(200, 500, dtype=np.int64)
    plain = shuffle_quality(np.arange(int(sizes.sum())))
    assert plain["position_correlation"] == pytest.approx(1.0)
    assert plain["adjacent_neighbours"] == pytest.approx(1.0)
    results = {
        w: shuffle_quality(global_order(sizes, "fp", 0, 0, True, w), sizes) for w in (1, 4, 16)
    }
    for q in results.values():
        assert abs(q["position_correlation"]) < 0.2
    assert results[1]["adjacent_neighbours"] < 0.01
    assert results[16]["mean_step"] >= results[1]["mean_step"]
    for w, q in results.items():  # the window is what decides local mixing
        assert q["same_shard_adjacent"] == pytest.approx(1 / w, rel=0.1)
    uniform = shuffle_quality(np.random.default_rng(0).permutation(int(sizes.sum())), sizes)
    assert uniform["mean_step"] == pytest.approx(1.0, abs=0.02)
    assert uniform["same_shard_adjacent"] < 0.01
