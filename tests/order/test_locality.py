"""The streamed (locality-aware) order: batches from fixed streams of shards, so a rank of a
world size dividing the streams reads only its own shards, while the order, each step's rows
and resume positions stay independent of the world size."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, open_dataset, write_mds
from spark_dl_core.errors import SpecError
from spark_dl_core.order import (
    EpochPlan,
    GlobalOrder,
    LoaderState,
    StreamedOrder,
    auto_streams,
    global_order,
    locality_report,
    shuffle_quality,
    step_spread,
    stream_window,
)
from spark_dl_core.order.locality import stream_lengths, stream_pieces

SIZES = np.array([700, 1000, 13, 1000, 999, 1000, 420, 1000] * 8 + [1, 2000], dtype=np.int64)
TOTAL = int(SIZES.sum())
OFFSETS = np.concatenate([[0], np.cumsum(SIZES)])


def _shards(ids: np.ndarray) -> set[int]:
    return set((np.searchsorted(OFFSETS, ids, side="right") - 1).tolist())


def _reference(streams: int, batch: int, seed: int, epoch: int, window: int = 4) -> np.ndarray:
    """The definition, step by step: stream ``s``'s own order is a GlobalOrder over its
    pieces in windows of ``window // P`` pieces (at least 1); global batch ``g`` is batch
    ``g // P`` of stream ``g % P``."""
    pieces = stream_pieces(SIZES, "fp", seed, streams, batch)
    per = max(1, window // streams)
    own = [
        GlobalOrder(sizes, f"fp:stream{s}/{streams}", seed, epoch, True, per, bases=bases)
        for s, (sizes, bases) in enumerate(pieces)
    ]
    whole = [o.take(0, o.total) for o in own]
    out = []
    for g in range(-(-TOTAL // batch)):
        s, j = g % streams, g // streams
        out.append(whole[s][j * batch : (j + 1) * batch])
    return np.concatenate(out)


@pytest.mark.parametrize(("streams", "batch"), [(64, 32), (8, 100), (6, 7), (64, 5000)])
def test_streamed_order_is_the_interleave_of_its_streams(streams: int, batch: int) -> None:
    got = global_order(SIZES, "fp", 3, 1, True, 4, streams=streams, batch_size=batch)
    assert np.array_equal(got, _reference(streams, batch, 3, 1))
    assert np.array_equal(np.sort(got), np.arange(TOTAL))  # every sample once
    lengths = stream_lengths(TOTAL, streams, batch)
    assert lengths.sum() == TOTAL and lengths.max() - lengths.min() <= batch  # balanced
    order = StreamedOrder(SIZES, "fp", 3, 1, 4, streams, batch)
    positions = np.random.default_rng(0).integers(0, TOTAL, 999)
    assert np.array_equal(order.ids(positions), got[positions])


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8, 12])
def test_each_step_is_the_same_rows_at_every_world_size(world: int) -> None:
    """Rank ``r`` takes global batches ``r, r + W, ...``: step ``k``'s rows are batches
    ``kW .. kW + W - 1`` of the one-rank order, whatever ``W``."""
    batch = 40
    order = StreamedOrder(SIZES, "fp", 5, 0, 4, 64, batch)
    one = list(EpochPlan(order, batch, 0, 1, False))
    plans = [list(EpochPlan(order, batch, r, world, False)) for r in range(world)]
    for k in range(len(plans[0])):
        step = [p[k] for p in plans if k < len(p)]
        want = one[k * world : k * world + len(step)]
        assert all(np.array_equal(a, b) for a, b in zip(step, want))


@pytest.mark.parametrize("world", [2, 4, 8, 16])
def test_ranks_read_disjoint_stable_shards_when_the_world_divides_the_streams(world: int) -> None:
    """Each rank reads about 1/W of the shards, the same ones every epoch; only the W - 1
    shards at the boundaries between ranks' streams are read by two ranks."""
    batch = 64
    per_epoch = []
    for epoch in (0, 1, 2):
        order = StreamedOrder(SIZES, "fp", 5, epoch, 4, 64, batch)
        per_epoch.append(
            [
                _shards(np.concatenate(list(EpochPlan(order, batch, r, world, False))))
                for r in range(world)
            ]
        )
    assert per_epoch[0] == per_epoch[1] == per_epoch[2]
    touched = sum(len(s) for s in per_epoch[0])
    assert touched <= len(SIZES) + world - 1
    report = locality_report(StreamedOrder(SIZES, "fp", 5, 0, 4, 64, batch), 0, world)
    assert report["streams_read"] == 64 // world
    assert report["data_share"] == pytest.approx(1 / world, abs=64 * batch / TOTAL)


def test_a_world_not_dividing_the_streams_is_correct_with_less_locality() -> None:
    """W = 3 with 64 streams: every sample once per epoch, and each rank reads every
    stream (gcd 1), which the locality report says."""
    batch = 64
    order = StreamedOrder(SIZES, "fp", 5, 0, 4, 64, batch)
    got = [np.concatenate(list(EpochPlan(order, batch, r, 3, False))) for r in range(3)]
    assert np.array_equal(np.sort(np.concatenate(got)), np.arange(TOTAL))
    report = locality_report(order, 1, 3)
    assert report["streams_read"] == 64 and report["data_share"] == 1.0
    six = locality_report(order, 5, 6)  # gcd(6, 64) = 2: half the data
    assert six["streams_read"] == 32 and six["data_share"] == pytest.approx(0.5, abs=0.01)


def test_streamed_order_is_pure_and_keyed() -> None:
    a = global_order(SIZES, "fp", 1, 0, True, 4, streams=64, batch_size=50)
    assert np.array_equal(a, global_order(SIZES, "fp", 1, 0, True, 4, streams=64, batch_size=50))
    for other in (("fq", 1, 0), ("fp", 2, 0), ("fp", 1, 1)):
        fp, seed, epoch = other
        b = global_order(SIZES, fp, seed, epoch, True, 4, streams=64, batch_size=50)
        assert not np.array_equal(a, b)
    # one stream is the order of version 2, exactly
    assert np.array_equal(
        global_order(SIZES, "fp", 1, 0, True, 4, streams=1, batch_size=50),
        GlobalOrder(SIZES, "fp", 1, 0, True, 4).take(0, TOTAL),
    )


def test_shuffle_quality_of_the_streamed_order() -> None:
    """Stated figures (docs/loading.md): the streamed order hides the source order as well
    as the windowed one (correlation ~0, almost no source neighbours); a batch comes from
    one stream's window, ``shuffle_window // streams`` pieces (at least 1), so with more
    streams than the window it is mostly one shard (the memory bound's price), and a
    window of ``4 x streams`` gives it four again; a step over W ranks spreads over W
    streams, so more shards than the windowed order's one window."""
    sizes = np.full(256, 1000, dtype=np.int64)
    windowed = global_order(sizes, "fp", 0, 0, True, 4)
    streamed = global_order(sizes, "fp", 0, 0, True, 4, streams=64, batch_size=256)
    qw, qs = shuffle_quality(windowed, sizes), shuffle_quality(streamed, sizes)
    assert abs(qs["position_correlation"]) < 0.02 and qs["adjacent_neighbours"] < 0.005
    assert qw["same_shard_adjacent"] < 0.3 and qs["same_shard_adjacent"] > 0.98
    one, eight = step_spread(streamed, sizes, 256, 1), step_spread(streamed, sizes, 256, 8)
    assert one["shards_per_batch"] < 1.5 and eight["shards_per_step"] >= 7 * one["shards_per_batch"]
    assert step_spread(windowed, sizes, 256, 8)["shards_per_step"] < 8
    wide = global_order(sizes, "fp", 0, 0, True, 4 * 64, streams=64, batch_size=256)
    assert shuffle_quality(wide, sizes)["same_shard_adjacent"] < 0.45
    assert step_spread(wide, sizes, 256, 1)["shards_per_batch"] >= 3


def test_automatic_streams_depend_on_the_dataset_only() -> None:
    """``streams=0`` (the default): the largest power of two up to 64 leaving each stream
    16 shards; one stream (the windowed order) below 32 shards."""
    assert [auto_streams(n) for n in (0, 1, 31, 32, 63, 64, 100, 1023, 1024, 10**6)] == [
        1,
        1,
        1,
        2,
        2,
        4,
        4,
        32,
        64,
        64,
    ]
    assert [stream_window(4, p) for p in (1, 2, 4, 8, 64)] == [4, 2, 1, 1, 1]
    mib = 1 << 20  # shard bytes bound them: 1.5 x streams shards within 1 GiB
    assert [auto_streams(4096, b * mib) for b in (1, 8, 16, 64, 256, 1024)] == [64, 64, 32, 8, 2, 1]
    assert auto_streams(100, mib) == 4 and auto_streams(4096, 0) == 64
    auto = global_order(SIZES, "fp", 3, 1, True, 4, streams=0, batch_size=40)
    assert auto_streams(len(SIZES)) == 4
    assert np.array_equal(auto, _reference(4, 40, 3, 1))


def test_peak_shards_held_are_bounded_by_the_streams() -> None:
    """One rank reading every stream holds each stream's window: about max(window, streams)
    shards (a piece's end and the next piece's start overlap in a batch), whatever the
    dataset's size, where version 3's streams held streams x window."""

    def held(sizes: np.ndarray, streams: int, window: int, batch: int) -> int:
        order = global_order(sizes, "fp", 0, 0, True, window, streams=streams, batch_size=batch)
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        shard = np.searchsorted(offsets, order, side="right") - 1
        g = np.arange(len(order)) // batch
        first = np.full(len(sizes), len(order))
        last = np.zeros(len(sizes), dtype=np.int64)
        np.minimum.at(first, shard, g)
        np.maximum.at(last, shard, g)
        live = np.zeros(int(g[-1]) + 2, dtype=np.int64)
        np.add.at(live, first, 1)
        np.add.at(live, last + 1, -1)
        return int(np.cumsum(live).max())

    for shards in (1024, 4096):
        sizes = np.full(shards, 500, dtype=np.int64)
        assert held(sizes, 1, 4, 128) <= 8
        assert held(sizes, 64, 4, 128) <= 2 * 64
        assert held(sizes, 0, 4, 128) <= 2 * 64


def test_elastic_resume_across_world_sizes_with_streams(tmp_path: object) -> None:
    """A position saved after k steps at W=4 resumes at W=2 with exactly the rest; the
    batch size is part of the streamed order, so another one is refused by name."""
    path = f"{tmp_path}/ds"
    write_mds(
        pa.table({"id": np.arange(5000, dtype=np.int64)}), path, DatasetSpec(shard_size="4KiB")
    )
    ds = open_dataset(path)
    assert ds.num_shards >= 8
    full = np.concatenate([b["id"] for b in ds.iter_batches(50, shuffle=True, seed=4, streams=64)])
    assert np.array_equal(np.sort(full), np.arange(5000))
    steps = 7
    state = LoaderState(
        ds.fingerprint, 4, 0, True, 4, 50, False, steps * 4 * 50, streams=64
    ).to_dict()
    rest = [
        np.concatenate(
            [
                b["id"]
                for b in ds.iter_batches(
                    50,
                    shuffle=True,
                    seed=4,
                    rank=r,
                    world_size=2,
                    state=state,
                    even_batches=False,
                    streams=64,
                )
            ]
        )
        for r in range(2)
    ]
    assert np.array_equal(np.sort(np.concatenate(rest)), np.sort(full[steps * 200 :]))
    first_step = np.concatenate([rest[0][:50], rest[1][:50]])
    assert np.array_equal(first_step, full[steps * 200 : steps * 200 + 100])
    with pytest.raises(SpecError, match="batch_size=50"):
        list(ds.iter_batches(64, shuffle=True, seed=4, streams=64, state=state))
    with pytest.raises(SpecError, match=r"streams=64.*streams=8"):
        list(ds.iter_batches(50, shuffle=True, seed=4, streams=8, state=state))
