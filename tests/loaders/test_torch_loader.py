"""TorchLoader: exactly-once over ranks x workers, determinism, exact (elastic) resume, DDP."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from ddp_helpers import run_two_ranks

torch = pytest.importorskip("torch")

from spark_dl_core import DatasetSpec, SpecError, open_dataset, write_mds  # noqa: E402

N = 2000


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("torch") / "ds"
    table = pa.table(
        {
            "id": pa.array(np.arange(N, dtype=np.int64)),
            "x": pa.array(list(np.arange(N * 4, dtype=np.float32).reshape(N, 4))),
            "name": pa.array([f"s{i}" for i in range(N)]),
        }
    )
    write_mds(table, str(path), DatasetSpec(shard_size="8KiB", compression="zstd"))
    return str(path)


def _ids(loader) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(i) for b in loader for i in b["id"].tolist()]


def test_batches_are_tensors(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    assert ds.num_shards > 8
    batch = next(iter(ds.to_torch(batch_size=64, shuffle=True)))
    assert isinstance(batch["id"], torch.Tensor) and batch["id"].shape == (64,)
    assert batch["x"].shape == (64, 4) and batch["x"].dtype == torch.float32
    assert torch.equal(batch["x"][:, 0], batch["id"].float() * 4)
    assert list(batch["name"]) == [f"s{i}" for i in batch["id"].tolist()]


@pytest.mark.parametrize("world_size,workers", [(1, 0), (3, 2), (2, 3)])
@pytest.mark.parametrize("even", [True, False])
def test_every_sample_once_across_ranks_and_workers(
    ds_path: str, world_size: int, workers: int, even: bool
) -> None:
    ds = open_dataset(ds_path)
    seen: list[int] = []
    repeats: list[int] = []
    counts = []
    for rank in range(world_size):
        loader = ds.to_torch(
            batch_size=64,
            shuffle=True,
            seed=3,
            rank=rank,
            world_size=world_size,
            num_workers=workers,
            columns=["id"],
            even_batches=even,
            pad_mask=True,
        )
        got = list(loader)
        assert len(got) == len(loader)
        counts.append(len(got))
        for b in got:
            assert b["pad_mask"].dtype == torch.bool and len(b["pad_mask"]) == len(b["id"])
            seen += b["id"][~b["pad_mask"]].tolist()
            repeats += b["id"][b["pad_mask"]].tolist()
        assert loader.stats()["repeated_samples"] == int(sum(b["pad_mask"].sum() for b in got))
    assert sorted(seen) == list(range(N))  # every sample once, besides the marked repeats
    # Elastic: the concatenation by global batch does not depend on world size / workers.
    single = _ids(ds.to_torch(batch_size=64, shuffle=True, seed=3, columns=["id"]))
    assert sorted(single) == list(range(N)) and single != list(range(N))
    if even:  # equal steps; the fewer than world_size repeats are the epoch's first samples
        assert len(set(counts)) == 1 and len(repeats) < world_size
        assert sorted(repeats) == sorted(single[: len(repeats)])
    else:
        assert max(counts) - min(counts) <= 1 and not repeats


def test_rank_sequence_independent_of_workers(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    kw = dict(batch_size=50, shuffle=True, seed=1, rank=1, world_size=2, columns=["id"])
    assert _ids(ds.to_torch(num_workers=0, **kw)) == _ids(ds.to_torch(num_workers=2, **kw))


def test_drop_last_gives_equal_steps(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    lens = [
        len(list(ds.to_torch(batch_size=64, rank=r, world_size=3, drop_last=True)))
        for r in range(3)
    ]
    assert len(set(lens)) == 1 and lens[0] == (N // 64) // 3


def test_epochs_and_seeds_differ(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    loader = ds.to_torch(batch_size=100, shuffle=True, seed=5, columns=["id"])
    first = _ids(loader)
    assert _ids(ds.to_torch(batch_size=100, shuffle=True, seed=5, columns=["id"])) == first
    loader.set_epoch(1)
    second = _ids(loader)
    assert second != first and sorted(second) == sorted(first)
    assert _ids(ds.to_torch(batch_size=100, shuffle=True, seed=6, columns=["id"])) != first


def test_iteration_semantics_are_dataloader_like(ds_path: str) -> None:
    """Each iter() is a pass from the saved position; a full pass moves on to the next epoch;
    a peek does not make the next loop skip a batch (issue: len 0 yet a full repeat)."""
    ds = open_dataset(ds_path)
    kw = dict(batch_size=100, shuffle=True, seed=5, columns=["id"])
    epoch1 = _ids(ds.to_torch(epoch=1, **kw))
    loader = ds.to_torch(**kw)
    assert len(loader) == N // 100
    peek = next(iter(loader))["id"].tolist()
    assert loader.state_dict()["consumed"] == 100  # the live position of the peeking pass
    first = _ids(loader)
    assert first[:100] == peek and len(first) == N  # the loop did not skip the peeked batch
    assert len(loader) == N // 100 and loader.epoch == 1  # a full pass: next epoch's start
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["consumed"] == 0
    loader.set_epoch(1)  # the usual loop calls it: the epoch is already current, no-op
    assert _ids(loader) == epoch1
    # Leaving a pass early keeps the saved position; moving it there is deliberate.
    loader = ds.to_torch(**kw)
    it = iter(loader)
    head = [i for _ in range(3) for i in next(it)["id"].tolist()]
    assert _ids(loader)[:300] == head
    it = iter(loader)  # the full pass above moved the loader to epoch 1
    head = [i for _ in range(3) for i in next(it)["id"].tolist()]
    loader.load_state_dict(loader.state_dict())
    assert len(loader) == N // 100 and loader.remaining == N // 100 - 3  # len: the epoch's
    assert head + _ids(loader) == epoch1


_SCRIPT = """
import json, sys
from spark_dl_core import open_dataset
ds = open_dataset(sys.argv[1])
loader = ds.to_torch(batch_size=64, shuffle=True, seed=11, epoch=2, num_workers=1)
print(json.dumps([b["id"].tolist() for b in loader]))
"""


def test_same_seed_same_batches_across_processes(ds_path: str) -> None:
    runs = [
        subprocess.run(
            [sys.executable, "-c", _SCRIPT, ds_path], capture_output=True, text=True, check=True
        ).stdout
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and len(json.loads(runs[0])) == -(-N // 64)


@pytest.mark.parametrize("new_world", [1, 2, 4])
def test_resume_at_other_world_size(ds_path: str, new_world: int) -> None:
    ds = open_dataset(ds_path)
    kw = dict(batch_size=32, shuffle=True, seed=9, columns=["id"])
    # Two ranks train 7 steps each, then rank 0 saves the state.
    loaders = [ds.to_torch(rank=r, world_size=2, num_workers=r, **kw) for r in range(2)]
    seen: list[int] = []
    for loader in loaders:
        it = iter(loader)
        for _ in range(7):
            seen += next(it)["id"].tolist()
    state = json.loads(json.dumps(loaders[0].state_dict()))  # survives serialization
    assert state["consumed"] == 7 * 2 * 32
    for r in range(new_world):
        fresh = ds.to_torch(rank=r, world_size=new_world, **kw)
        fresh.load_state_dict(state)
        seen += _ids(fresh)
    assert sorted(seen) == list(range(N))


def test_resume_continues_same_order_single_process(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    kw = dict(batch_size=40, shuffle=True, seed=2, columns=["id"], num_workers=2)
    full = _ids(ds.to_torch(**kw))
    loader = ds.to_torch(**kw)
    it = iter(loader)
    head = [i for _ in range(5) for i in next(it)["id"].tolist()]
    state = loader.state_dict()
    del it
    again = ds.to_torch(**kw)
    again.load_state_dict(state)
    assert head + _ids(again) == full
    loader_finished = ds.to_torch(**kw)
    _ids(loader_finished)
    done = ds.to_torch(**kw)
    done.load_state_dict(loader_finished.state_dict())
    assert done.epoch == 1 and _ids(done) == _ids(ds.to_torch(epoch=1, **kw))  # next epoch


def test_state_validation(ds_path: str, tmp_path: Path) -> None:
    ds = open_dataset(ds_path)
    state = ds.to_torch(batch_size=10, shuffle=True, seed=1).state_dict()
    with pytest.raises(SpecError, match="seed"):
        ds.to_torch(batch_size=10, shuffle=True, seed=2).load_state_dict(state)
    other = tmp_path / "other"
    write_mds(pa.table({"id": pa.array(np.arange(10, dtype=np.int64))}), str(other), DatasetSpec())
    with pytest.raises(SpecError, match="fingerprint"):
        open_dataset(str(other)).to_torch(batch_size=10, shuffle=True, seed=1).load_state_dict(
            state
        )
    with pytest.raises(SpecError, match="lacks"):
        ds.to_torch(batch_size=10).load_state_dict({"epoch": 1})


def test_rank_from_env(ds_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    loader = open_dataset(ds_path).to_torch(batch_size=10)
    assert (loader.rank, loader.world_size) == (1, 4)


_WORK = """
def work(rank, path):
    from spark_dl_core import open_dataset
    loader = open_dataset(path).to_torch(batch_size=64, shuffle=True, seed=4, columns=["id"])
    assert (loader.rank, loader.world_size) == (rank, 2)
    return [i for b in loader for i in b["id"].tolist()]
"""


def test_torch_distributed_gloo_two_ranks(ds_path: str, tmp_path: Path) -> None:
    per_rank = run_two_ranks(_WORK, ds_path, tmp_path)
    assert sorted(per_rank[0] + per_rank[1]) == list(range(N))
    assert not set(per_rank[0]) & set(per_rank[1])


# --------------------------------------------------------------------------- fixed-width slabs


@pytest.fixture(scope="module")
def fixed_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """All columns fixed-width: workers decode into reusable shared-memory slabs."""
    path = tmp_path_factory.mktemp("fixed") / "ds"
    table = pa.table(
        {
            "id": pa.array(np.arange(N, dtype=np.int64)),
            "x": pa.array(list(np.arange(N * 3, dtype=np.float32).reshape(N, 3))),
            "u": pa.array((np.arange(N) % 200).astype(np.uint8)),
        }
    )
    write_mds(table, str(path), DatasetSpec(shard_size="8KiB"))
    return str(path)


@pytest.mark.parametrize("context", [None, "spawn"])
def test_slab_workers_match_in_process(fixed_path: str, context: str | None) -> None:
    ds = open_dataset(fixed_path)
    kw = dict(batch_size=37, shuffle=True, seed=5, group=3)
    held = list(ds.to_torch(num_workers=2, multiprocessing_context=context, **kw))
    # Batches stay valid after the slab they came through is reused (kept, then compared).
    want = list(ds.to_torch(num_workers=0, **kw))
    assert len(held) == len(want) and len(held) > 3 * 2 * 3  # slabs reused several times
    for got, ref in zip(held, want):
        assert set(got) == {"id", "x", "u"}
        for name in ref:
            assert isinstance(got[name], torch.Tensor) and torch.equal(got[name], ref[name])
        assert torch.equal(got["x"][:, 0], got["id"].float() * 3)
        assert torch.equal(got["u"].long(), got["id"] % 200)
    assert sorted(i for b in held for i in b["id"].tolist()) == list(range(N))


def test_slab_workers_resume_and_early_stop(fixed_path: str) -> None:
    import time

    ds = open_dataset(fixed_path)
    kw = dict(batch_size=16, shuffle=True, seed=8, num_workers=2, group=2, columns=["id"])
    full = _ids(ds.to_torch(**kw))
    loader = ds.to_torch(**kw)
    head: list[int] = []
    start = time.perf_counter()
    for step, batch in enumerate(loader):  # leave mid-epoch: workers wait on slabs
        head += batch["id"].tolist()
        if step == 20:
            break
    state = loader.state_dict()
    rest = ds.to_torch(**kw)
    rest.load_state_dict(state)
    assert head + _ids(rest) == full
    assert time.perf_counter() - start < 30  # no hang waiting for stopped workers


def test_progress_bar_counts_batches(fixed_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    ds = open_dataset(fixed_path)
    loader = ds.to_torch(batch_size=100, progress=True, columns=["id"])
    assert not ds.to_torch(batch_size=100).progress  # off by default
    assert len(_ids(loader)) == N
    err = capsys.readouterr().err
    assert "epoch 0" in err and f"{N // 100}/{N // 100}" in err


def test_stats_and_trace(fixed_path: str, tmp_path: Path) -> None:
    ds = open_dataset(fixed_path)
    trace = tmp_path / "trace.json"
    loader = ds.to_torch(batch_size=100, num_workers=2, trace_path=str(trace), group=2)
    assert loader.stats()["samples"] == 0
    got = 0
    for batch in loader:
        got += len(batch["id"])
        time.sleep(0.002)  # the training step: the loop is not waiting for data meanwhile
    stats = loader.stats()
    assert stats["epoch"] == 0 and stats["samples"] == got == N
    assert stats["batches"] == N // 100 and stats["samples_per_s"] > 0
    assert 0 < stats["time_to_first_batch_s"] < stats["wall_s"]
    assert 0 <= stats["data_starved_pct"] < 100
    assert set(stats["workers"]) == {"worker 0", "worker 1"}
    for times in stats["workers"].values():
        # seconds per stage, and the distinct shards the worker loaded
        assert set(times) == {"read", "decompress", "decode", "transform", "shards_touched"}
        assert times["read"] > 0 and times["decode"] > 0 and times["shards_touched"] >= 1
    assert stats["shards_touched"] == sum(t["shards_touched"] for t in stats["workers"].values())
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["name"] for e in events} >= {"load shard", "decode"}
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in events)
    inproc = ds.to_torch(batch_size=100)
    list(inproc)
    assert set(inproc.stats()["workers"]) == {"main"}


def test_progress_bar_shows_rate_and_starved(
    fixed_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    loader = open_dataset(fixed_path).to_torch(batch_size=100, progress=True, columns=["id"])
    list(loader)
    err = capsys.readouterr().err
    assert "samples/s" in err and "starved" in err


@pytest.mark.parametrize("workers", [0, 1])
def test_nested_bytes_are_bytes(tmp_path: Path, workers: int) -> None:
    blob = bytes(range(256))
    table = pa.table(
        {
            "lb": pa.array([[blob], []], pa.list_(pa.binary())),
            "mb": pa.array([[("k", blob)], []], pa.map_(pa.string(), pa.binary())),
        }
    )
    write_mds(table, str(tmp_path))
    (batch,) = open_dataset(tmp_path).to_torch(batch_size=2, num_workers=workers)
    assert list(batch["lb"]) == [[blob], []] and list(batch["mb"]) == [{"k": blob}, {}]


@pytest.mark.parametrize("workers", [0, 1])
def test_booleans_are_torch_bool_and_maps_dicts(tmp_path: Path, workers: int) -> None:
    table = pa.table(
        {
            "flag": [True, False, True],
            "flags": pa.array([[True, False]] * 3, pa.list_(pa.bool_(), 2)),
            "ragged": pa.array([[True], [], [False, True]]),
            "m": pa.array([[(1, "a")], [], [(2, "b")]], pa.map_(pa.int32(), pa.string())),
        }
    )
    write_mds(table, str(tmp_path))
    (batch,) = open_dataset(tmp_path).to_torch(batch_size=3, num_workers=workers)
    assert batch["flag"].dtype == torch.bool
    assert batch["flag"].tolist() == [True, False, True]
    assert batch["flags"].dtype == torch.bool and batch["flags"].shape == (3, 2)
    assert batch["ragged"].dtype == torch.bool
    assert list(batch["m"]) == [{1: "a"}, {}, {2: "b"}]


@pytest.mark.parametrize("epoch", [-1, "2", 1.0, None, True])
def test_set_epoch_is_checked_as_the_epoch_setting_is(ds_path: str, epoch: object) -> None:
    """set_epoch(-1) and set_epoch("2") were accepted (the constructor refuses epoch=-1)."""
    loader = open_dataset(ds_path).to_torch(batch_size=500)
    with pytest.raises(SpecError, match=r"set_epoch\(epoch=.*an int >= 0"):
        loader.set_epoch(epoch)
    with pytest.raises(SpecError, match=r"set_epoch\(epoch="):
        loader.sampler.set_epoch(epoch)
    loader.set_epoch(np.int64(2))
    assert loader.epoch == 2
