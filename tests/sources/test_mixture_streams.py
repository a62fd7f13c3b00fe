"""Mixtures and schedules read from streams (order version 5): each source's shards cut into
the same streams, so a rank of a world size dividing them reads only its share of every
source, while the order, each step's rows, the per-source counts and resume stay what they
are at any world size; ``streams=1`` is the unstreamed order of version 4."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, MixtureError, Source, SpecError, mix, write_mds
from spark_dl_core.order import (
    LoaderState,
    MixtureOrder,
    StreamedMixtureOrder,
    resolve_streams,
    source_cut,
    split_counts,
)

BASE = {"web": 0, "code": 100_000, "math": 200_000}
SIZES = {"web": 4000, "code": 2000, "math": 600}


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mixstreams")
    out = {}
    for name, n in SIZES.items():
        ids = np.arange(BASE[name], BASE[name] + n, dtype=np.int64)
        table = pa.table({"id": ids, "x": (ids % 7).astype(np.float32)})
        write_mds(table, str(root / name), DatasetSpec(shard_size="1KiB"))  # 77, 39, 12 shards
        out[name] = str(root / name)
    return out


def _mixture(paths: dict[str, str], weights: dict[str, float] | None = None, **kw: Any) -> Any:
    """Weights default to the sources' sizes: each sample once per epoch."""
    weights = weights or {k: float(n) for k, n in SIZES.items()}
    return mix([Source(paths[k], proportion=w, name=k) for k, w in weights.items()], **kw)


def _ids(m: Any, **kw: Any) -> np.ndarray:
    got = [b["id"] for b in m.iter_batches(**kw)]
    return np.concatenate(got) if got else np.empty(0, np.int64)


def _source(ids: np.ndarray) -> np.ndarray:
    return (ids >= 100_000).astype(int) + (ids >= 200_000).astype(int)


def _shards_of(m: Any, ids: np.ndarray) -> list[set[int]]:
    """Per source, the shards (as the source numbers them) the ids lie in."""
    shard = np.searchsorted(m.shard_offsets, m_ids(m, ids), side="right") - 1
    src = np.searchsorted(m.shard_base, shard, side="right") - 1
    return [set((shard[src == i] - m.shard_base[i]).tolist()) for i in range(len(m.sources))]


def m_ids(m: Any, ids: np.ndarray) -> np.ndarray:
    """The mixture's sample ids of the rows' ``id`` column (sources back to back)."""
    src = _source(ids)
    return m.sample_base[src] + ids - np.array(list(BASE.values()))[src]


@pytest.mark.parametrize("batching", ["random", "stratified", "per_source"])
def test_every_sample_once_and_exact_counts(paths: dict[str, str], batching: str) -> None:
    m = _mixture(paths, batching=batching)
    assert m.auto_streams() == 8 and resolve_streams(m, True, 0) == 8
    for epoch in range(2):
        ids = _ids(m, batch_size=32, shuffle=True, seed=3, epoch=epoch)  # streams=0: 8
        assert np.array_equal(np.sort(ids), np.sort(np.concatenate([*_all(m)])))
    weighted = _mixture(paths, {"web": 0.5, "code": 0.3, "math": 0.2}, epoch_size=5000)
    run = []
    for epoch in range(2):  # math (600) read 1000 times an epoch, web and code subsets
        ids = _ids(weighted, batch_size=50, shuffle=True, seed=1, epoch=epoch, streams=4)
        assert np.bincount(_source(ids)).tolist() == [2500, 1500, 1000]
        math = np.unique(ids[_source(ids) == 2], return_counts=True)[1]
        assert len(math) == 600  # all of it, 1000 of 600
        assert math.max() <= 2 if epoch == 0 else 3  # a pass and 400 of the next; 3 passes
        run.append(ids)
    first = [np.unique(run[0][_source(run[0]) == s], return_counts=True)[1] for s in (0, 1)]
    assert first[0].max() == 1 and first[1].max() == 1  # a subset: no repeat before a pass ends
    both = np.concatenate(run)
    for s, n in ((0, 4000), (1, 2000)):  # two epochs: 5000 of 4000, 3000 of 2000
        got = np.unique(both[_source(both) == s], return_counts=True)[1]
        assert len(got) == n and set(got.tolist()) <= {1, 2}


def _all(m: Any) -> list[np.ndarray]:
    return [np.arange(BASE[k], BASE[k] + n) for k, n in SIZES.items()]


def test_stratified_batches_keep_their_shares(paths: dict[str, str]) -> None:
    m = _mixture(paths, batching="stratified")
    for b in m.iter_batches(batch_size=66, shuffle=True, seed=2, streams=8):
        got = np.bincount(_source(b["id"]), minlength=3)
        want = np.array([40, 20, 6]) * len(b["id"]) / 66
        assert np.abs(got - want).max() <= 2


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_read_only_their_share_of_every_source(paths: dict[str, str], world: int) -> None:
    """Rank r of W (W divides the streams) touches about 1/W of each source's shards (the
    shards on the boundaries between ranks at most twice), the same ones every epoch; the
    ranks' step-k batches are the 1-rank order's batches kW..kW+W-1."""
    m = _mixture(paths, batching="stratified")
    kw = {"batch_size": 40, "shuffle": True, "seed": 5, "streams": 8, "even_batches": False}
    counts = [m.sources[i].num_shards for i in range(3)]
    for epoch in range(2):
        whole = list(m.iter_batches(epoch=epoch, **kw))
        ranks = [
            list(m.iter_batches(epoch=epoch, rank=r, world_size=world, **kw)) for r in range(world)
        ]
        for k in range(len(ranks[0])):
            step = [ranks[r][k]["id"] for r in range(world) if k < len(ranks[r])]
            want = [b["id"] for b in whole[k * world : (k + 1) * world]]
            assert all(np.array_equal(a, b) for a, b in zip(step, want))
        touched = [_shards_of(m, np.concatenate([b["id"] for b in batches])) for batches in ranks]
        for r in range(world):
            for i, n in enumerate(counts):
                assert len(touched[r][i]) <= n / world + 2, (r, i, len(touched[r][i]), n)
        if epoch == 0:
            first = touched
        assert touched == first  # the same shards every epoch
        for i, n in enumerate(counts):  # together every shard, each by one rank but borders
            assert set().union(*(t[i] for t in touched)) == set(range(n))
            assert sum(len(t[i]) for t in touched) <= n + 2 * (world - 1)
    plan = m.sample_order(rank=0, world_size=world, **kw)
    report = plan.locality()
    assert report["streams"] == 8 and report["streams_read"] == 8 // world
    assert abs(report["data_share"] - 1 / world) < 0.02
    assert [s["shards_read"] for s in report["sources"]] == [len(touched[0][i]) for i in range(3)]


def test_loader_stats_report_shards_per_source(paths: dict[str, str]) -> None:
    m = _mixture(paths)
    kw = {"shuffle": True, "seed": 1, "streams": 8, "even_batches": False}  # no padding
    loader = m.to_torch(batch_size=40, rank=1, world_size=4, **kw)
    ids = np.concatenate([b["id"].numpy() for b in loader])
    locality = loader.stats()["locality"]
    assert locality["streams_read"] == 2 and locality["shards"] == 77 + 39 + 12
    touched = _shards_of(m, ids)
    assert locality["shards_read"] == sum(len(t) for t in touched) < (77 + 39 + 12) / 4 + 6
    assert loader.stats()["shards_touched"] == locality["shards_read"]


@pytest.mark.parametrize("batching", ["random", "per_source"])
def test_resume_mid_epoch_at_another_world_size(paths: dict[str, str], batching: str) -> None:
    m = _mixture(paths, {"web": 0.6, "code": 0.3, "math": 0.1}, epoch_size=3000, batching=batching)
    kw = {"batch_size": 30, "shuffle": True, "seed": 7, "epoch": 1, "even_batches": False}
    full = _ids(m, streams=4, **kw)
    loader = m.to_torch(rank=0, world_size=4, streams=4, **kw)
    for steps, _ in enumerate(loader, 1):
        if steps == 6:
            break
    state = loader.state_dict()
    assert state["streams"] == 4 and state["consumed"] == 6 * 4 * 30
    rest = [_ids(m, rank=r, world_size=2, state=state, **kw) for r in range(2)]
    assert np.array_equal(np.sort(np.concatenate(rest)), np.sort(full[720:]))
    assert np.array_equal(np.concatenate([rest[0][:30], rest[1][:30]]), full[720:780])
    with pytest.raises(SpecError, match=r"streams=4.*streams=2"):
        _ids(m, streams=2, state=state, **kw)
    carried = _mixture(paths, {"web": 0.5, "code": 0.5}, epoch_size=3000, batching=batching)
    with pytest.raises(MixtureError, match="streams=4"):  # a changed mixture: refused by name
        other = carried.to_torch(**kw)
        other.load_state_dict(state, strict=False)
        list(other)


def test_one_stream_is_the_unstreamed_order(paths: dict[str, str]) -> None:
    """``streams=1`` reads the order of version 4 (its pinned digests hold in
    test_mixtures); a version 4 state of a mixture resumes there, whatever streams it
    recorded, with the default ``streams=0``."""
    m = _mixture(
        paths, {"web": 0.5, "code": 0.3, "math": 0.2}, epoch_size=2000, batching="stratified"
    )
    order = m.make_order(4, 2, True, 4, 25)
    assert isinstance(order, MixtureOrder)
    one = _ids(m, batch_size=25, shuffle=True, seed=4, epoch=2, streams=1)
    assert np.array_equal(m_ids(m, one), order.take(0, order.total))
    streamed = m.make_order(4, 2, True, 4, 25, streams=4)
    assert isinstance(streamed, StreamedMixtureOrder)
    assert not np.array_equal(streamed.take(0, streamed.total), order.take(0, order.total))
    v4 = LoaderState(m.fingerprint, 4, 2, True, 4, 25, False, 500, version=4, streams=8)
    record = m.position_record(2, 500)
    old = {**v4.to_dict(), "source": record}
    assert LoaderState.from_dict(old).streams == 1
    tail = _ids(m, batch_size=25, shuffle=True, seed=4, epoch=2, state=old)
    assert np.array_equal(tail, one[500:])


def test_schedules_read_from_streams(paths: dict[str, str]) -> None:
    """A schedule's stages keep their exact counts per epoch part, with every rank reading
    only its streams' shards of each source."""
    sources = [Source(paths[k], name=k) for k in SIZES]
    schedule = [(0, {"web": 0.8, "code": 0.2}), (2500, {"web": 0.2, "code": 0.3, "math": 0.5})]
    m = mix(sources, schedule=schedule, epoch_size=2000, batching="stratified")
    kw = {"batch_size": 20, "shuffle": True, "seed": 9, "streams": 4, "even_batches": False}
    for epoch in range(3):
        ids = _ids(m, epoch=epoch, **kw)
        parts = m.epoch_parts(epoch)
        for part in parts:
            got = np.bincount(_source(ids[part.offset : part.offset + part.length]), minlength=3)
            assert got.tolist() == list(part.counts)
        ranks = [_ids(m, epoch=epoch, rank=r, world_size=4, **kw) for r in range(4)]
        assert np.array_equal(np.sort(np.concatenate(ranks)), np.sort(ids))
        touched = [_shards_of(m, r) for r in ranks]
        for i in range(2):  # web and code are read every epoch
            n = m.sources[i].num_shards
            assert max(len(t[i]) for t in touched) <= n / 4 + 2


def test_counts_split_exactly() -> None:
    """The controlled rounding: rows sum to the counts, columns to the stream lengths, each
    cell within two of its share; the cut equals the counts when counts are the sizes."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        counts = rng.integers(0, 500, size=int(rng.integers(1, 6))).tolist()
        total = sum(counts)
        if not total:
            continue
        streams = int(rng.integers(1, 9))
        lengths = np.diff(
            np.sort(np.concatenate([[0, total], rng.integers(0, total + 1, streams - 1)]))
        )
        got = split_counts(counts, lengths)
        assert (got >= 0).all() and got.sum(axis=1).tolist() == counts
        assert got.sum(axis=0).tolist() == lengths.tolist()
        share = np.outer(counts, lengths) / total
        assert np.abs(got - share).max() < 2 + 1e-9
        batch = int(rng.integers(1, 50))
        assert np.array_equal(
            source_cut(counts, total, streams, batch),
            split_counts(
                counts, np.diff(np.concatenate([[0], np.cumsum(_lengths(total, streams, batch))]))
            ),
        )


def _lengths(total: int, streams: int, batch: int) -> np.ndarray:
    from spark_dl_core.order.locality import stream_lengths

    return stream_lengths(total, streams, batch)


def test_a_world_not_dividing_the_streams_is_exact_with_less_locality(
    paths: dict[str, str],
) -> None:
    """W=3 with 8 streams: every rank reads every stream (gcd 1), and the order is still the
    1-rank one, step by step; W=6 reads gcd(6, 8) = 2: half the streams, half the data."""
    m = _mixture(paths, batching="stratified")
    kw = {"batch_size": 40, "shuffle": True, "seed": 5, "streams": 8, "even_batches": False}
    whole = list(m.sample_order(**kw))
    for world, read in ((3, 8), (6, 4)):
        plans = [m.sample_order(rank=r, world_size=world, **kw) for r in range(world)]
        for g, batch in enumerate(whole):
            assert np.array_equal(plans[g % world][g // world], batch)
        report = plans[0].locality()
        assert report["streams_read"] == read
        assert abs(report["data_share"] - read / 8) < 0.02
