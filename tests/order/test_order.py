"""Global order, partitioning, elastic resume arithmetic, the batch reader, shuffle quality."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, SpecError, open_dataset, write_mds
from spark_dl_core.loaders.reader import BatchReader
from spark_dl_core.order import (
    ORDER_VERSION,
    EpochPlan,
    GlobalOrder,
    LoaderState,
    auto_streams,
    global_order,
    shuffle_quality,
    window_permute,
)

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
        with reader.cond:
            peak = max(peak, len(reader.loaded))
            assert reader._ahead_bytes() <= 3 * shard_bytes  # read ahead within the budget
    # in use: the window (two while a batch straddles two windows), plus three read ahead
    assert peak <= 2 * 2 + 3 < ds.num_shards
    assert reader.held == 0 and not reader.loaded  # every shard released after its last use


def test_iter_batches_resume_from_state(fixed_ds: str) -> None:
    ds = open_dataset(fixed_ds)
    full = np.concatenate([b["label"] for b in ds.iter_batches(100, shuffle=True, seed=2)])
    loader_state = LoaderState(ds.fingerprint, 2, 0, True, 4, 100, False, 700).to_dict()
    tail = np.concatenate(
        [b["label"] for b in ds.iter_batches(100, shuffle=True, seed=2, state=loader_state)]
    )
    assert np.array_equal(tail, full[700:])
    with pytest.warns(DeprecationWarning):  # the old spellings still work, with a warning
        skip = np.concatenate(
            [b["label"] for b in ds.iter_batches(100, shuffle=True, seed=2, start_batch=3)]
        )
    assert np.array_equal(skip, full[300:])
    with pytest.raises(SpecError, match="did you mean 'drop_last'"):
        list(ds.iter_batches(100, drop_lst=True))


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


# --------------------------------------------------------------------------- lazy order


def _reference_order(sizes: np.ndarray, fp: str, seed: int, epoch: int, window: int) -> np.ndarray:
    """The slow way: materialize every window's members and permute them whole."""
    lazy = GlobalOrder(sizes, fp, seed, epoch, True, window)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    pieces = []
    for w, start in enumerate(range(0, len(sizes), window)):
        group = lazy.perm[start : start + window]
        members = np.concatenate(
            [np.arange(offsets[s], offsets[s + 1], dtype=np.int64) for s in group]
        )
        key = lazy_key(lazy, w)
        perm = window_permute(
            np.arange(len(members)), np.full(len(members), len(members)), np.full(len(members), key)
        )
        assert sorted(perm.tolist()) == list(range(len(members)))  # a bijection of the window
        pieces.append(members[perm])
    return np.concatenate(pieces)


def lazy_key(order: GlobalOrder, w: int) -> np.uint64:
    from spark_dl_core.order.dataset_order import _GOLDEN, _mix

    return _mix(np.uint64(order.base_key) ^ (np.array([w], np.uint64) * _GOLDEN + _GOLDEN))[0]


def _reference_batches(
    order: np.ndarray,
    batch: int,
    rank: int,
    world: int,
    drop_last: bool,
    consumed: int,
    even: bool = False,
) -> list[np.ndarray]:
    rest = order[consumed:]
    if even and world > 1 and not drop_last and len(rest):
        # Full rounds as usual; the last round's samples split evenly over the ranks, the
        # missing ones repeating the epoch's order from its start (cyclically).
        full = (-(-len(rest) // (world * batch)) - 1) * world
        left = rest[full * batch :]
        each = -(-len(left) // world)
        padded = np.concatenate([left, np.resize(order, each * world - len(left))])
        head = [rest[g * batch : (g + 1) * batch] for g in range(rank, full, world)]
        return [*head, padded[rank * each : (rank + 1) * each]]
    n = len(rest) // batch if drop_last else -(-len(rest) // batch)
    if drop_last:
        n -= n % world
    return [rest[g * batch : (g + 1) * batch] for g in range(rank, n, world)]


def test_lazy_order_equals_materialized_reference() -> None:
    rng = np.random.default_rng(0)
    sizes = rng.integers(0, 400, size=500).astype(np.int64)  # uneven, some empty shards
    sizes[:3] = 0
    total = int(sizes.sum())
    assert total > 90_000
    ref = _reference_order(sizes, "fp", 3, 1, 4)
    assert np.array_equal(global_order(sizes, "fp", 3, 1, True, 4), ref)
    assert sorted(ref.tolist()) == list(range(total))
    for world, batch, drop_last, consumed, even in [
        (1, 256, False, 0, True),
        (3, 100, False, 7_000, False),
        (3, 100, False, 7_000, True),
        (4, 64, True, 0, True),
        (7, 1000, True, 12_345, False),
        (64, 33, False, 50_000, False),
        (64, 33, False, 50_000, True),
    ]:
        for rank in sorted({0, world // 2, world - 1}):
            order = GlobalOrder(sizes, "fp", 3, 1, True, 4)
            lazy = EpochPlan(order, batch, rank, world, drop_last, consumed, even)
            want = _reference_batches(ref, batch, rank, world, drop_last, consumed, even)
            assert len(lazy) == len(want)
            for k in [0, 1, len(want) // 2, len(want) - 1]:
                if 0 <= k < len(want):
                    assert np.array_equal(lazy[k], want[k])
                    assert lazy.batch_len(k) == len(want[k])
            if world == 3:  # every batch, and lazy slices
                assert all(np.array_equal(a, b) for a, b in zip(lazy, want))
                assert np.array_equal(lazy[2:][1], want[3])


@pytest.mark.parametrize("workers", [0, 2])
def test_loaders_read_the_lazy_order(fixed_ds: str, workers: int) -> None:
    torch = pytest.importorskip("torch")
    ds = open_dataset(fixed_ds)
    sizes = np.diff(ds.shard_offsets)
    # the default order (one stream) derived from its windows; test_locality derives the
    # order of several streams from each stream's own order
    ref = _reference_order(sizes, ds.fingerprint, 5, 2, 4)
    labels = np.arange(len(ds))  # label == global sample id in this dataset
    for world in (1, 3):
        for rank in range(world):
            loader = ds.to_torch(
                batch_size=64,
                shuffle=True,
                seed=5,
                epoch=2,
                rank=rank,
                world_size=world,
                num_workers=workers,
                columns=["label"],
            )
            got = [b["label"] for b in loader]
            want = _reference_batches(ref, 64, rank, world, False, 0, even=True)
            assert len(got) == len(want)
            assert all(torch.equal(g, torch.from_numpy(labels[w])) for g, w in zip(got, want))
    order = ds.sample_order(batch_size=64, shuffle=True, seed=5, epoch=2, rank=1, world_size=3)
    assert np.array_equal(order[4], _reference_batches(ref, 64, 1, 3, False, 0)[4])
    last = len(order) - 1
    assert np.array_equal(order[last], _reference_batches(ref, 64, 1, 3, False, 0, True)[last])


def test_plan_memory_does_not_grow_with_samples() -> None:
    import tracemalloc

    def plan_bytes(per_shard: int) -> tuple[int, int]:
        sizes = np.full(2_000, per_shard, dtype=np.int64)
        tracemalloc.start()
        order = GlobalOrder(sizes, "fp", 0, 0, True, 4)
        plan = EpochPlan(order, 256, 3, 64, False, consumed=int(0.9 * order.total))
        first = plan[0]
        last = plan[len(plan) - 1]
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert len(first) == 256 and 0 < len(last) <= 256
        return peak, order.nbytes

    small, held_small = plan_bytes(100)  # 2e5 samples
    large, held_large = plan_bytes(1_000_000)  # 2e9 samples
    assert held_small == held_large  # O(shards): the same arrays whatever the sample count
    assert large < small * 1.5 + (64 << 10)
    assert large < 2 << 20


def test_state_of_another_order_version_is_refused(fixed_ds: str) -> None:
    ds = open_dataset(fixed_ds)
    state = LoaderState(ds.fingerprint, 2, 0, True, 4, 100, False, 700).to_dict()
    assert state["version"] == ORDER_VERSION == 5
    old = {**state, "version": 1}
    with pytest.raises(SpecError, match="order version 1"):
        list(ds.iter_batches(100, shuffle=True, seed=2, state=old))
    legacy = {k: v for k, v in state.items() if k != "version"}  # saved before versions
    with pytest.raises(SpecError, match="order version 1"):
        LoaderState.from_dict(legacy)


def test_a_version_2_state_resumes_only_with_one_stream(fixed_ds: str) -> None:
    """Order version 2 had no streams: its order is version 3's with ``streams=1`` (the
    default), so its state resumes there exactly, and a loader with streams is refused
    naming the setting."""
    ds = open_dataset(fixed_ds)
    v3 = LoaderState(ds.fingerprint, 2, 0, True, 4, 100, False, 700).to_dict()
    v2 = {k: v for k, v in v3.items() if k != "streams"} | {"version": 2}
    with pytest.raises(SpecError, match=r"streams=1 .*before order version 3.*pass streams=1"):
        list(ds.iter_batches(100, shuffle=True, seed=2, streams=64, state=v2))
    full = np.concatenate([b["label"] for b in ds.iter_batches(100, shuffle=True, seed=2)])
    tail = np.concatenate(
        [b["label"] for b in ds.iter_batches(100, shuffle=True, seed=2, state=v2)]
    )
    assert np.array_equal(tail, full[700:])
    assert np.array_equal(full, global_order(ds.shards.samples, ds.fingerprint, 2, 0, True, 4))


def test_a_version_3_state_resumes_in_its_own_order(tmp_path: object) -> None:
    """Version 3's streams each shuffled windows of the whole ``shuffle_window``: its order
    with window ``w`` and ``P`` streams is version 4's with window ``w * P``, so its state
    resumes exactly there (and says so when the loader's window differs); with one stream
    it is the windowed order, which the default loader resumes (taking its streams)."""
    path = f"{tmp_path}/ds"
    write_mds(
        pa.table({"id": np.arange(6000, dtype=np.int64)}), path, DatasetSpec(shard_size="2KiB")
    )
    ds = open_dataset(path)
    assert ds.num_shards >= 32  # automatic streams > 1
    kw = {"shuffle": True, "seed": 3}
    v3_order = global_order(
        ds.shards.samples, ds.fingerprint, 3, 0, True, 4 * 8, streams=8, batch_size=50
    )
    v3 = {
        **LoaderState(ds.fingerprint, 3, 0, True, 4, 50, False, 1000, streams=8).to_dict(),
        "version": 3,
    }
    with pytest.raises(SpecError, match=r"shuffle_window=32 .*pass shuffle_window=32"):
        list(ds.iter_batches(50, streams=8, state=v3, **kw))
    rest = np.concatenate([b["id"] for b in ds.iter_batches(50, shuffle_window=32, state=v3, **kw)])
    assert np.array_equal(rest, v3_order[1000:])
    one = {**v3, "streams": 1, "shuffle_window": 4}
    windowed = global_order(ds.shards.samples, ds.fingerprint, 3, 0, True, 4)
    rest = np.concatenate([b["id"] for b in ds.iter_batches(50, state=one, **kw)])
    assert np.array_equal(rest, windowed[1000:])


def test_the_default_streams_are_the_datasets_and_a_state_keeps_its_own(tmp_path: object) -> None:
    """``streams=0`` (the default) resolves to ``auto_streams`` of the shard count; a state
    records the number, and a default loader resuming a state of another number reads on in
    that state's order, for the rest of the epoch and the next."""
    torch = pytest.importorskip("torch")
    path = f"{tmp_path}/ds"
    write_mds(
        pa.table({"id": np.arange(6000, dtype=np.int64)}), path, DatasetSpec(shard_size="2KiB")
    )
    ds = open_dataset(path)
    auto = auto_streams(ds.num_shards)
    assert auto >= 2
    sizes = ds.shards.samples
    default = np.concatenate([b["id"] for b in ds.iter_batches(50, shuffle=True, seed=1)])
    want = global_order(sizes, ds.fingerprint, 1, 0, True, 4, streams=auto, batch_size=50)
    assert np.array_equal(default, want)
    loader = ds.to_torch(batch_size=50, shuffle=True, seed=1, columns=["id"])
    it = iter(loader)
    for _ in range(3):
        next(it)
    assert loader.state_dict()["streams"] == auto
    del it
    other = LoaderState(ds.fingerprint, 1, 0, True, 4, 50, False, 150, streams=1).to_dict()
    loader = ds.to_torch(batch_size=50, shuffle=True, seed=1, columns=["id"])
    loader.load_state_dict(other)
    got = torch.cat([b["id"] for b in loader]).numpy()
    assert np.array_equal(got, global_order(sizes, ds.fingerprint, 1, 0, True, 4)[150:])
    assert loader.state_dict()["streams"] == 1
    nxt = torch.cat([b["id"] for b in loader]).numpy()  # epoch 1, still one stream
    assert np.array_equal(nxt, global_order(sizes, ds.fingerprint, 1, 1, True, 4))


def test_the_default_streams_are_bounded_by_the_shards_bytes(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large shards take fewer automatic streams, so one rank reading every stream holds a
    bounded number of bytes: the same dataset under a budget of 3 shards' bytes resolves to 2
    streams (1.5 shards held per stream), its loaders read that order, and unshuffled or
    explicit settings are untouched."""
    from spark_dl_core.order import locality, resolve_streams

    path = f"{tmp_path}/ds"
    write_mds(
        pa.table({"id": np.arange(6000, dtype=np.int64)}), path, DatasetSpec(shard_size="2KiB")
    )
    ds = open_dataset(path)
    unbounded = resolve_streams(ds, True, 0)
    assert unbounded == auto_streams(ds.num_shards) >= 2
    mean = float(np.mean(ds.shards.raw_bytes))
    monkeypatch.setattr(locality, "AUTO_STREAMS_HELD_BYTES", 3 * mean + 1)
    assert resolve_streams(ds, True, 0) == 2
    assert resolve_streams(ds, False, 0) == 1 and resolve_streams(ds, True, 8) == 8
    got = np.concatenate([b["id"] for b in ds.iter_batches(50, shuffle=True, seed=1)])
    want = global_order(ds.shards.samples, ds.fingerprint, 1, 0, True, 4, streams=2, batch_size=50)
    assert np.array_equal(got, want)
    monkeypatch.setattr(locality, "AUTO_STREAMS_HELD_BYTES", mean)  # not even one stream's
    assert resolve_streams(ds, True, 0) == 1


def test_window_permute_is_a_bijection_for_every_size() -> None:
    for n in [1, 2, 3, 5, 64, 65, 1000, 4097]:
        got = window_permute(np.arange(n), np.full(n, n), np.full(n, 12345, dtype=np.uint64))
        assert sorted(got.tolist()) == list(range(n))


def test_dense_takes_equal_the_per_position_bijection() -> None:
    """A dense reader's takes (slices of cached window orders) give exactly the ids the
    per-position Feistel evaluation gives, across windows, with empty shards and bases."""
    rng = np.random.default_rng(4)
    for case in range(20):
        sizes = rng.integers(0, 90, int(rng.integers(1, 12)))
        sizes[0] += 1
        bases = None if case % 2 else rng.permutation(10_000)[: len(sizes)] * 100
        order = GlobalOrder(sizes, f"fp{case}", 3, case, True, int(rng.integers(1, 5)), bases=bases)
        every = order.ids(np.arange(order.total))  # sparse path
        assert np.array_equal(order.take(0, order.total, dense=True), every)
        for _ in range(10):
            a, b = sorted(rng.integers(0, order.total + 1, 2).tolist())
            assert np.array_equal(order.take(a, b, dense=True), every[a:b])
            picks = rng.integers(0, order.total, 17)
            assert np.array_equal(order.ids(picks, dense=True), every[picks])
        taken = order.take(0, min(5, order.total), dense=True)
        taken[:] = -1  # a caller may write into what it took: the cache stays intact
        assert np.array_equal(order.take(0, order.total, dense=True), every)


def test_a_windows_first_positions_skip_its_whole_order() -> None:
    """The head of a window is evaluated per position (the same ids as the window's whole
    order), so a loader's first batches do not wait for an O(window samples) permutation."""
    sizes = np.full(8, 50_000, dtype=np.int64)
    order = GlobalOrder(sizes, "fp", 3, 0, True, 4)
    head = order.take(0, 2048, dense=True)
    assert not order.__dict__.get("_dense")
    whole = GlobalOrder(sizes, "fp", 3, 0, True, 4).take(0, 400_000, dense=True)
    assert np.array_equal(head, whole[:2048])
    assert np.array_equal(order.take(2048, 100_000, dense=True), whole[2048:100_000])
    assert 0 in order.__dict__["_dense"]  # past the head: computed once, then sliced
    assert np.array_equal(order.take(200_000, 201_000, dense=True), whole[200_000:201_000])


def test_first_torch_batch_computes_no_whole_window(tmp_path: object) -> None:
    """The loader's first batch needs only its own positions: sizing the reader's lookahead
    must not ask a later group's ids (that computed a whole window before batch 0), and
    no window is computed ahead on the order's thread while the first shards load."""
    pytest.importorskip("torch")
    from spark_dl_core.order.choice import _ORDERS

    path = f"{tmp_path}/ds"
    ids = np.arange(160_000, dtype=np.int64)
    write_mds(pa.table({"id": ids}), path, DatasetSpec(shard_size="160KiB"))
    ds = open_dataset(path)
    assert ds.num_shards >= 8
    # one stream: the order is one GlobalOrder, whose windows this test watches
    first = next(iter(ds.to_torch(batch_size=256, shuffle=True, seed=1, streams=1)))
    (order,) = _ORDERS[ds].values()
    assert not order.__dict__.get("_dense") and "_ahead" not in order.__dict__
    expected = global_order(ds.shards.samples, ds.fingerprint, 1, 0, True, 4)[:256]
    assert first["id"].tolist() == expected.tolist()


def test_windows_computed_ahead_on_the_thread_give_the_same_order() -> None:
    """A dense pass in chunks (windows computed ahead on the order's thread while earlier
    ones are read, chunks across window boundaries) gives the ids the per-position
    evaluation gives, for every position."""
    from spark_dl_core.order.dataset_order import GlobalOrder, _shuffle

    sizes = np.array([1000, 700, 1300, 999, 5, 2048, 1500, 1000, 333, 1200])
    dense = GlobalOrder(sizes, "fp", 9, 2, True, window=2)
    sparse = GlobalOrder(sizes, "fp", 9, 2, True, window=2)
    got = np.concatenate(
        [dense.take(a, min(a + 397, len(dense)), True) for a in range(0, len(dense), 397)]
    )
    np.testing.assert_array_equal(got, sparse.ids(np.arange(len(sparse))))
    assert np.array_equal(np.sort(got), np.arange(len(got)))
    if _shuffle is not None:
        # the last window was computed ahead: windows this small are kept two ahead, two a
        # job, so its job computed the two last windows
        last = len(dense.window_bounds) - 2
        assert dense.__dict__["_ahead"][0] == (last - 1, last)
        # windows of 2**15 positions or more: one ahead, one a job
        big = GlobalOrder(np.full(5, 1 << 15), "fp", 9, 2, True, window=1)
        for a in range(0, len(big), 5000):
            big.take(a, min(a + 5000, len(big)), True)
        assert big.__dict__["_ahead"][0] == (len(big.window_bounds) - 2,)


def _ahead_or_done(order: object, window: int) -> bool:
    """Whether ``window`` of a GlobalOrder is computed or being computed on its thread."""
    state = order.__dict__
    ahead = state.get("_ahead")
    return window in state.get("_dense", {}) or (ahead is not None and window in ahead[0])


def test_next_epochs_first_window_starts_during_the_last_window(tmp_path: object) -> None:
    """A pass's last window starts the next epoch's order and its first window on a thread,
    so the next pass does not begin with a whole-window permutation; its ids are the same."""
    from spark_dl_core.order import global_order
    from spark_dl_core.order.choice import _ORDERS
    from spark_dl_core.order.dataset_order import _shuffle

    path = f"{tmp_path}/ds"
    write_mds(
        pa.table({"id": np.arange(60_000, dtype=np.int64)}), path, DatasetSpec(shard_size="40KiB")
    )
    ds = open_dataset(path)
    assert ds.num_shards >= 8
    # one stream: the order is one GlobalOrder, whose windows this test watches
    loader = ds.to_torch(batch_size=1000, shuffle=True, seed=3, streams=1)
    first = np.concatenate([b["id"].numpy() for b in loader])
    kept = _ORDERS[ds]
    following = [o for key, o in kept.items() if key[2] == 1]
    assert len(following) == 1
    if _shuffle is not None:
        assert _ahead_or_done(following[0], 0)
    second = np.concatenate([b["id"].numpy() for b in loader])
    for epoch, got in enumerate((first, second)):
        want = global_order(ds.shards.samples, ds.fingerprint, 3, epoch, True, 4)
        np.testing.assert_array_equal(got, want)


def test_a_schedules_next_part_starts_during_the_parts_last_window(tmp_path: object) -> None:
    """A scheduled mixture's parts: part k's last window starts part k+1's first windows on
    a thread; read in chunks across part boundaries the ids equal per-position evaluation."""
    from spark_dl_core import Source, mix
    from spark_dl_core.order.dataset_order import _shuffle

    for name, start in (("a", 0), ("b", 10**6)):
        ids = np.arange(start, start + 30_000, dtype=np.int64)
        write_mds(pa.table({"id": ids}), f"{tmp_path}/{name}", DatasetSpec(shard_size="24KiB"))
    sources = [Source(f"{tmp_path}/{n}", name=n) for n in ("a", "b")]
    stages = [(0, {"a": 3.0, "b": 1.0}), (20_000, {"a": 1.0, "b": 1.0})]
    mixed = mix(sources, epoch_size=40_000, schedule=stages)
    order = mixed.make_order(5, 0, True, 2, 0)
    sparse = mixed.make_order(5, 0, True, 2, 0)
    assert len(order.orders) == 2
    boundary = int(order.offsets[1])
    chunks = [(a, min(a + 777, boundary)) for a in range(0, boundary, 777)]
    got = [order.take(a, z, True) for a, z in chunks]  # part 0, up to its last position
    last = order.orders[0].mixed
    assert _ahead_or_done(last, len(last.window_bounds) - 2)
    if _shuffle is not None:
        assert _ahead_or_done(order.orders[1].mixed, 0)
    got += [
        order.take(a, min(a + 777, order.total), True) for a in range(boundary, order.total, 777)
    ]
    want = sparse.take(0, sparse.total, False)
    np.testing.assert_array_equal(np.concatenate(got), want)
