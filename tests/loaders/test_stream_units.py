"""In-process reads of a streamed order decoded a stream at a time: a unit is one stream's
consecutive batches (gathered from its one or two shards), and the batches come out in the
rank's order, the same as decoding runs of consecutive batches, at every world size, with
``drop_last``, a padded last round, a resumed position and a mixture."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

torch = pytest.importorskip("torch")

from spark_dl_core import DatasetSpec, Source, mix, open_dataset, write_mds  # noqa: E402
from spark_dl_core.loaders.torch_loader import loader as torch_loader  # noqa: E402
from spark_dl_core.loaders.torch_loader import units as units_module  # noqa: E402
from spark_dl_core.order import EpochPlan  # noqa: E402
from spark_dl_core.order.locality import StreamedOrder  # noqa: E402

N = 3000


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> str:
    where = tmp_path_factory.mktemp("units") / "ds"
    ids = np.arange(N, dtype=np.int64)
    table = pa.table({"id": ids, "x": pa.array(list(np.stack([ids, -ids], 1).astype(np.float32)))})
    write_mds(table, str(where), DatasetSpec(shard_size="2KiB"))
    return str(where)


def _batches(source: Any, **kw: Any) -> list[np.ndarray]:
    return [b["id"].numpy().copy() for b in source.to_torch(num_workers=0, **kw)]


def _by_ranges(source: Any, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> list[np.ndarray]:
    """The same loader decoding runs of consecutive batches (no stream units)."""
    with monkeypatch.context() as patch:
        patch.setattr(torch_loader, "stream_units", lambda plan, group: None)
        return _batches(source, **kw)


def _units_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the stream units decoded from here on (one entry per unit)."""
    read: list[int] = []
    original = units_module.StreamUnits.__getitem__

    def counted(self: Any, u: int) -> np.ndarray:
        read.append(u)
        return original(self, u)

    monkeypatch.setattr(units_module.StreamUnits, "__getitem__", counted)
    return read


@pytest.mark.parametrize(
    "rank,world,extra,units",
    [
        (0, 1, {}, True),
        (1, 2, {}, True),
        (3, 4, {"drop_last": True}, False),  # 4 streams over 4 ranks: one each, no runs to group
        (1, 2, {"even_batches": True}, True),  # a padded last round: its batch a unit alone
        (2, 3, {}, False),  # 3 does not divide 4: read as runs of consecutive batches
        (0, 1, {"streams": 1}, False),
    ],
)
def test_a_stream_at_a_time_gives_the_rank_the_same_batches(
    path: str,
    monkeypatch: pytest.MonkeyPatch,
    rank: int,
    world: int,
    extra: dict[str, Any],
    units: bool,
) -> None:
    ds = open_dataset(path)
    assert ds.num_shards >= 32
    kw = {"batch_size": 50, "shuffle": True, "seed": 5, "streams": 4, "group": 4, **extra}
    kw.update(rank=rank, world_size=world)
    want = _by_ranges(ds, monkeypatch, **kw)
    read = _units_read(monkeypatch)
    got = _batches(ds, **kw)
    assert bool(read) == units
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_every_sample_once_over_ranks_read_a_stream_at_a_time(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = open_dataset(path)
    read = _units_read(monkeypatch)
    kw = {"batch_size": 64, "shuffle": True, "seed": 1, "streams": 8, "group": 8}
    seen = np.concatenate([b for r in range(2) for b in _batches(ds, rank=r, world_size=2, **kw)])
    assert read and sorted(seen.tolist()) == list(range(N))


def test_a_resumed_position_reads_on_a_stream_at_a_time(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped after 7 batches (inside a unit), the state resumes with the next batch."""
    ds = open_dataset(path)
    kw = {"batch_size": 40, "shuffle": True, "seed": 2, "streams": 4, "group": 4}
    whole = _by_ranges(ds, monkeypatch, **kw)
    read = _units_read(monkeypatch)
    first = ds.to_torch(num_workers=0, **kw)
    taken = []
    for batch in first:
        taken.append(batch["id"].numpy().copy())
        if len(taken) == 7:
            break
    state = first.state_dict()
    second = ds.to_torch(num_workers=0, **kw)
    second.load_state_dict(state)
    rest = [b["id"].numpy().copy() for b in second]
    assert read
    assert len(taken) + len(rest) == len(whole)
    for a, b in zip(taken + rest, whole):
        np.testing.assert_array_equal(a, b)


def test_a_streamed_mixture_reads_a_stream_at_a_time(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = []
    for i, n in enumerate((1800, 900)):
        ids = np.arange(i * 10_000, i * 10_000 + n, dtype=np.int64)
        write_mds(pa.table({"id": ids}), str(tmp_path / f"s{i}"), DatasetSpec(shard_size="1KiB"))
        paths.append(str(tmp_path / f"s{i}"))
    mixture = mix([Source(p, proportion=1.0) for p in paths])
    kw = {"batch_size": 30, "shuffle": True, "seed": 3, "streams": 4, "group": 4}
    want = _by_ranges(mixture, monkeypatch, **kw)
    read = _units_read(monkeypatch)
    got = _batches(mixture, **kw)
    assert read and len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("seed", range(40))
def test_stream_units_hold_every_batch_once_and_few_at_a_time(seed: int) -> None:
    """Units are one stream's runs (batches ``k, k + Q, ...``, ids one take equal to the
    batches'), cover the plan's batches once, start with batch 0 alone (a fast first batch)
    and, decoded in order, never hold more than a block of batches waiting for their turn."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 120, int(rng.integers(4, 40)))
    streams = int(rng.choice([2, 4, 8]))
    batch = int(rng.integers(1, 30))
    world = int(rng.choice([w for w in (1, 2, 4) if streams % w == 0 and streams // w > 1]))
    order = StreamedOrder(sizes, "fp", seed, 0, 2, streams, batch)
    consumed = int(rng.integers(0, order.total // batch + 1)) * batch
    plan = EpochPlan(order, batch, int(rng.integers(0, world)), world, False, consumed, True)
    group = int(rng.integers(2, 70))
    units = units_module.stream_units(plan, group)
    if not len(plan):
        return
    assert units is not None
    assert units.per_unit == group  # a unit is a whole group: smaller ones decode slower
    period = plan.stream_period()
    served: list[int] = []
    held, turn, most = set(), 0, 0
    for u in range(len(units)):
        ks = units.batches_of(u)
        if u == 0:
            assert list(ks) == [0]
        if len(ks) > 1:
            assert ks.step == period
        want = np.concatenate([plan[k] for k in ks])
        np.testing.assert_array_equal(units[u], want)
        assert units.batch_len(u) == len(want)
        served += list(ks)
        held |= set(ks)
        most = max(most, len(held))
        while turn in held:
            held.discard(turn)
            turn += 1
    assert sorted(served) == list(range(len(plan))) and not held
    assert most <= units.per_unit * period
