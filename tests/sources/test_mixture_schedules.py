"""Mixture schedules: weights that change at run positions, with exact per-stage counts, no
repeat before a source is exhausted, the same batches on any world size, exact resume across
a boundary, a fingerprint and a spec that carry the schedule, and bad schedules refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, MixtureError, Source, mix, open_mixture, write_mds

BASE = {"web": 0, "code": 100_000, "math": 200_000}
SIZES = {"web": 1000, "code": 300, "math": 50}
EPOCH = 400
BOUNDARY = 600  # inside the second epoch (epoch 1), at its position 200
SCHEDULE = [(0, {"web": 2, "code": 1}), (BOUNDARY, {"web": 1, "code": 1, "math": 1})]


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("sched")
    out = {}
    for name, n in SIZES.items():
        ids = np.arange(BASE[name], BASE[name] + n, dtype=np.int64)
        table = pa.table({"id": ids, "x": (ids % 7).astype(np.float32)})
        write_mds(table, str(root / name), DatasetSpec(shard_size="1KiB"))
        out[name] = str(root / name)
    return out


def _mixture(paths: dict[str, str], schedule: Any = SCHEDULE, **kwargs: Any) -> Any:
    sources = [Source(paths[k], name=k) for k in ("web", "code", "math")]
    kwargs.setdefault("epoch_size", EPOCH)
    return mix(sources, schedule=schedule, **kwargs)


def _run(m: Any, epochs: int, **kwargs: Any) -> np.ndarray:
    """Ids the run delivers over ``epochs`` epochs, in order."""
    kwargs = {"batch_size": 32, "shuffle": True, "seed": 3, **kwargs}
    return np.concatenate(
        [b["id"] for e in range(epochs) for b in m.iter_batches(epoch=e, **kwargs)]
    )


def _source_of(ids: np.ndarray) -> np.ndarray:
    return (ids >= 100_000).astype(int) + (ids >= 200_000).astype(int)


def test_per_stage_counts_follow_the_rounding_rules(paths: dict[str, str]) -> None:
    m = _mixture(paths)
    ids = _run(m, 3)
    assert len(ids) == 3 * EPOCH
    src = _source_of(ids)
    # stage 0 (2:1) over [0, 400) and [400, 600): 400 -> 266.7/133.3, 200 -> 133.3/66.7
    assert np.bincount(src[:400], minlength=3).tolist() == [267, 133, 0]
    assert np.bincount(src[400:600], minlength=3).tolist() == [133, 67, 0]
    # stage 1 (1:1:1) over [600, 800) and [800, 1200): 66.7 each, 133.3 each
    assert np.bincount(src[600:800], minlength=3).tolist() == [67, 67, 66]
    assert np.bincount(src[800:], minlength=3).tolist() == [134, 133, 133]
    assert [m.epoch_source_counts(e) for e in range(3)] == [
        [267, 133, 0],
        [200, 134, 66],
        [134, 133, 133],
    ]
    assert m.counts == [267, 133, 0] and len(m) == EPOCH


def test_no_sample_repeats_before_its_source_is_exhausted(paths: dict[str, str]) -> None:
    ids = _run(_mixture(paths), 5)
    # at each part's end the delivered samples of a source are its stream's first ones, so
    # each sample was drawn floor or ceil(delivered / size) times
    for end in (400, BOUNDARY, 800, 1200, 1600, 2000):
        for s, name in enumerate(("web", "code", "math")):
            got = ids[:end][_source_of(ids[:end]) == s] - BASE[name]
            counts = np.bincount(got, minlength=SIZES[name])
            assert counts.max() - counts.min() <= 1, (end, name)
    before, after = (ids[a:b][_source_of(ids[a:b]) == 1] for a, b in ((0, BOUNDARY), (600, 800)))
    assert len(before) == 200 and len(after) == 67  # code's first pass goes on after the stage
    assert len(set(before.tolist()) | set(after.tolist())) == 267  # changed: nothing drawn twice


def test_same_batches_on_world_sizes_1_2_3(paths: dict[str, str]) -> None:
    m = _mixture(paths)
    settings = {"batch_size": 40, "shuffle": True, "seed": 2, "epoch": 1, "even_batches": False}
    whole = [b["id"] for b in m.iter_batches(**settings)]
    for world in (2, 3):
        per_rank = [
            [b["id"] for b in m.iter_batches(rank=r, world_size=world, **settings)]
            for r in range(world)
        ]
        for step in range(-(-len(whole) // world)):
            union = [per_rank[r][step] for r in range(world) if step < len(per_rank[r])]
            want = whole[step * world : (step + 1) * world]
            assert np.array_equal(np.concatenate(union), np.concatenate(want))


@pytest.mark.parametrize(
    ("batch_size", "steps", "where"),
    [(20, 3, "mid-stage"), (20, 10, "at the boundary"), (33, 6, "just before it")],
)
def test_resume_across_the_boundary_at_another_world_size(
    paths: dict[str, str], batch_size: int, steps: int, where: str
) -> None:
    pytest.importorskip("torch")
    m = _mixture(paths)
    settings = {"shuffle": True, "seed": 5, "epoch": 1}
    whole = np.concatenate([b["id"] for b in m.iter_batches(batch_size=20, **settings)])
    loader = m.to_torch(batch_size=batch_size, **settings)
    it = iter(loader)
    seen = [next(it)["id"].numpy() for _ in range(steps)]
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    assert state["consumed"] == steps * batch_size, where
    rest = []
    for r in range(3):
        resumed = m.to_torch(batch_size=16, rank=r, world_size=3, even_batches=False, **settings)
        resumed.load_state_dict(state)
        rest.append([b["id"].numpy() for b in resumed])
    dealt = [rest[g % 3][g // 3] for g in range(sum(len(r) for r in rest))]
    assert np.array_equal(np.concatenate(seen + dealt), whole), where


@pytest.mark.parametrize("batching", ["stratified", "per_source"])
def test_stratified_and_per_source_schedules_keep_counts_and_the_batch_grid(
    paths: dict[str, str], batching: str
) -> None:
    m = _mixture(paths, batching=batching)
    ids = _run(m, 3)  # batches of 32: the boundary (epoch 1's 200) is 8 into batch 6
    src = _source_of(ids)
    assert np.bincount(src[:400], minlength=3).tolist() == [267, 133, 0]
    assert np.bincount(src[400:600], minlength=3).tolist() == [133, 67, 0]
    assert np.bincount(src[600:800], minlength=3).tolist() == [67, 67, 66]
    assert np.bincount(src[800:], minlength=3).tolist() == [134, 133, 133]
    web = ids[src == 0]
    assert len(set(web.tolist())) == len(web) == 601  # web is not exhausted yet: no repeat
    batches = [_source_of(b["id"]) for b in m.iter_batches(batch_size=32, shuffle=True, epoch=1)]
    assert [len(b) for b in batches] == [32] * 12 + [16]
    if batching == "per_source":
        # part 1 [0, 200) at 133:67: 6 whole batches, 8 left; part 2 [200, 400) at 67:67:66:
        # a 24-sample first batch from the remainders (one whole batch turned into them), 5
        # whole batches, 16 left. Only batch 6 (8 + 24) and the last may mix sources.
        mixed = [k for k, b in enumerate(batches) if len(set(b.tolist())) > 1]
        assert set(mixed) <= {6, 12} and 6 in mixed
    else:
        # a batch inside a part holds each source's share of it within one sample
        for k, b in enumerate(batches):
            if k != 6 and k < 12:
                share = [133, 67, 0] if k < 6 else [67, 67, 66]
                got = np.bincount(b, minlength=3)
                assert np.all(np.abs(got - np.array(share) * 32 / 200) <= 1), k


@pytest.mark.parametrize("batching", ["stratified", "per_source"])
def test_stratified_and_per_source_schedules_resume_at_another_world_size(
    paths: dict[str, str], batching: str
) -> None:
    pytest.importorskip("torch")
    m = _mixture(paths, batching=batching)
    settings = {"batch_size": 24, "shuffle": True, "seed": 5, "epoch": 1}
    whole = [b["id"] for b in m.iter_batches(**settings)]
    per_rank = [
        [b["id"] for b in m.iter_batches(rank=r, world_size=3, even_batches=False, **settings)]
        for r in range(3)
    ]
    dealt = [per_rank[g % 3][g // 3] for g in range(len(whole))]
    assert all(np.array_equal(a, b) for a, b in zip(dealt, whole))
    loader = m.to_torch(rank=1, world_size=2, **settings)
    it = iter(loader)
    _ = [next(it) for _ in range(4)]  # 8 global batches: 192, the boundary inside batch 8
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    assert state["consumed"] == 192
    rest = []
    for r in range(3):
        resumed = m.to_torch(rank=r, world_size=3, even_batches=False, **settings)
        resumed.load_state_dict(state)
        rest.append([b["id"].numpy() for b in resumed])
    after = [rest[g % 3][g // 3] for g in range(sum(len(r) for r in rest))]
    assert np.array_equal(np.concatenate(after), np.concatenate(whole[8:]))


def test_fingerprint_and_spec_carry_the_schedule(paths: dict[str, str], tmp_path: Path) -> None:
    m = _mixture(paths)
    later = _mixture(paths, schedule=[SCHEDULE[0], (BOUNDARY + 1, SCHEDULE[1][1])])
    assert m.fingerprint != later.fingerprint
    assert m.fingerprint == _mixture(paths).fingerprint
    fixed = _mixture(paths, schedule=None, epoch_size=None)
    plain = mix([Source(paths[k], name=k) for k in ("web", "code", "math")])
    assert fixed.fingerprint == plain.fingerprint  # no schedule: today's fingerprint
    plain.save(str(tmp_path / "plain.json"))
    assert "schedule" not in json.loads((tmp_path / "plain.json").read_text())  # as before
    m.save(str(tmp_path / "m.json"))
    again = open_mixture(str(tmp_path / "m.json"))
    assert again.fingerprint == m.fingerprint
    assert np.array_equal(_run(again, 2), _run(m, 2))


@pytest.mark.parametrize(
    ("schedule", "kwargs", "message"),
    [
        ([(5, {"web": 1})], {}, r"stage 0 \(start=5\): the first stage must start at 0"),
        ([(0, {"web": 1}), (0, {"code": 1})], {}, r"stage 1 \(start=0\): boundaries must"),
        ([(0, {"web": 1}), (9, {"x": 1}), (8, {"web": 1})], {}, r"stage 1 .*'x' is not in"),
        ([(0, {"web": 1}), (9, {"math": 0})], {}, r"stage 1 .*'math' weight=0.0 must be pos"),
        ([(0, {"web": -1.0})], {}, r"stage 0 .*'web' weight=-1.0 must be positive"),
        ([(0, {"web": "lots"})], {}, r"stage 0 .*'web' weight='lots' is not a number"),
        ([(0, {"web": 1})], {"epoch_size": None}, r"schedule: needs epoch_size"),
        ([], {}, r"schedule=\[\]"),
        ([("soon", {"web": 1})], {}, r"schedule stage 0 start='soon'"),
        ([(0, {"web": 1}, 5)], {}, r"schedule= stage 0: \(0, .* is not a stage; a stage is a"),
        ([0], {}, r"stage 0: 0 is not a stage; a stage is a pair \(start, \{name: weight\}\)"),
        ([{"weights": {"web": 1}}], {}, r"stage 0: \{'weights'.*or a dict \{'start': start"),
    ],
)
def test_bad_schedules_are_refused_naming_the_stage(
    paths: dict[str, str], schedule: Any, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(MixtureError, match=message):
        _mixture(paths, schedule=schedule, **kwargs)


def test_a_source_weight_beside_a_schedule_is_refused(paths: dict[str, str]) -> None:
    with pytest.raises(MixtureError, match=r"source 0 \(web\) has proportion="):
        mix(
            [Source(paths["web"], name="web", proportion=1.0), Source(paths["code"], name="code")],
            epoch_size=100,
            schedule=[(0, {"web": 1, "code": 1})],
        )


def test_hand_written_spec_with_a_bad_schedule_is_refused(paths: dict[str, str]) -> None:
    spec = {
        "sources": [{"path": paths["web"], "name": "web"}, {"path": paths["code"], "name": "code"}],
        "epoch_size": 100,
        "schedule": [{"start": 0, "weights": {"web": 1}}, {"start": 50, "weights": {"cod": 1}}],
    }
    with pytest.raises(MixtureError, match=r"stage 1 \(start=50\): source 'cod' is not in"):
        open_mixture(spec)
    spec["schedule"][1]["weights"] = {"code": 1}  # type: ignore[index]
    assert open_mixture(spec).epoch_source_counts(0) == [50, 50]


def test_cli_inspect_shows_the_schedule_and_the_epoch_counts(
    paths: dict[str, str], tmp_path: Path
) -> None:
    import contextlib
    import io

    from spark_dl.cli import main

    saved = tmp_path / "staged.json"
    _mixture(paths).save(str(saved))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["inspect", str(saved), "--epoch", "1", "--json"]) == 0
    info = json.loads(out.getvalue())
    assert [s["per_epoch"] for s in info["sources"]] == [200, 134, 66]
    assert info["sources"][1]["passes"] == [133 / 300, 267 / 300]
    assert info["schedule"][1] == {"start": BOUNDARY, "weights": {"web": 1, "code": 1, "math": 1}}
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert main(["inspect", str(saved)]) == 0
    # stage 0 over [0, 600): epoch 0 (267, 133) and [400, 600) (133, 67)
    assert "stage 0 from sample 0: web 2, code 1; samples web 400, code 200 until sample 600" in (
        text.getvalue()
    )
    assert "stage 1 from sample 600: web 1, code 1, math 1; samples web 134, code 133, " in (
        text.getvalue()
    )
    assert info["stages"][0]["counts"] == {"web": 400, "code": 200}
