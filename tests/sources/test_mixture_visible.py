"""A mixture's progress is visible: ``loader.stats()`` gives each source's samples this rank
was delivered in the pass and the schedule's current stage (counted from the plan when asked),
and the dataset card shows the schedule and a loader's per-source counts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, Source, mix, open_dataset, write_mds

BASE = {"web": 0, "code": 100_000, "math": 200_000}
SIZES = {"web": 1000, "code": 300, "math": 50}
EPOCH = 400
SCHEDULE = [(0, {"web": 2, "code": 1}), (600, {"web": 1, "code": 1, "math": 1})]


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("visible")
    out = {}
    for name, n in SIZES.items():
        ids = np.arange(BASE[name], BASE[name] + n, dtype=np.int64)
        table = pa.table({"id": ids, "x": (ids % 7).astype(np.float32)})
        write_mds(table, str(root / name), DatasetSpec(shard_size="1KiB"))
        out[name] = str(root / name)
    return out


def _mixture(paths: dict[str, str], **kwargs: Any) -> Any:
    sources = [Source(paths[k], name=k) for k in ("web", "code", "math")]
    return mix(sources, epoch_size=EPOCH, schedule=SCHEDULE, **kwargs)


def _by_source(ids: np.ndarray) -> dict[str, int]:
    src = (ids >= 100_000).astype(int) + (ids >= 200_000).astype(int)
    return dict(zip(("web", "code", "math"), np.bincount(src, minlength=3).tolist()))


@pytest.mark.parametrize("rank,world", [(0, 1), (1, 2)])
def test_torch_stats_count_each_source_and_the_stage(
    paths: dict[str, str], rank: int, world: int
) -> None:
    pytest.importorskip("torch")
    m = _mixture(paths)
    loader = m.to_torch(batch_size=25, shuffle=True, seed=5, epoch=1, rank=rank, world_size=world)
    assert loader.stats()["stage"] == 0 and loader.stats()["sources"] == dict.fromkeys(
        ("web", "code", "math"), 0
    )
    it = iter(loader)
    got: list[np.ndarray] = []
    # the boundary (run position 600) is epoch 1's position 200: 8 global batches of 25
    for steps in (1, 3, 8 // world, 12 // world):
        while len(got) < steps:
            got.append(next(it)["id"].numpy())
        stats = loader.stats()
        assert stats["sources"] == _by_source(np.concatenate(got))
        stage = 0 if steps * world * 25 < 200 else 1
        assert stats["stage"] == stage and stats["stage_start"] == SCHEDULE[stage][0]
    tally = loader._stats.tally
    assert tally is not None and tally.counted == len(got)  # counted up to here, once
    rest = [b["id"].numpy() for b in it]
    stats = loader.stats()
    assert stats["sources"] == _by_source(np.concatenate(got + rest))
    assert stats["stage"] == 1  # the next epoch's start: still stage 1


def test_a_plain_dataset_and_an_unscheduled_mixture(paths: dict[str, str]) -> None:
    pytest.importorskip("torch")
    plain = open_dataset(paths["web"]).to_torch(batch_size=100)
    _ = list(plain)
    assert "sources" not in plain.stats() and "stage" not in plain.stats()
    fixed = mix([Source(paths["web"], name="web"), Source(paths["code"], name="code")])
    loader = fixed.to_torch(batch_size=100, shuffle=True)
    ids = np.concatenate([b["id"].numpy() for b in loader])
    stats = loader.stats()
    assert (
        stats["sources"]
        == {"web": 1000, "code": 300}
        == {k: v for k, v in _by_source(ids).items() if k != "math"}
    )
    assert "stage" not in stats


def test_tf_stats_count_each_source_and_the_stage(paths: dict[str, str]) -> None:
    pytest.importorskip("tensorflow")
    m = _mixture(paths)
    tfds = m.to_tf(batch_size=50, shuffle=True, seed=5, epoch=1)
    ids = np.concatenate([b["id"].numpy() for b in tfds])
    stats = tfds.stats()
    assert stats["sources"] == _by_source(ids) and stats["stage"] == 1


def test_card_shows_the_schedule_with_per_stage_counts(paths: dict[str, str]) -> None:
    from spark_dl_core.card import card_html

    page = card_html(_mixture(paths), rows=32, thumbs=0)
    assert "<h3>Schedule</h3>" in page
    # stage 0 over run positions [0, 600): epoch 0 at 2:1 (267, 133) and [400, 600) (133, 67)
    assert '<tr data-stage="0"><td>0</td><td>0</td><td>600</td><td>web 2, code 1</td>' in page
    assert "web 400, code 200</td>" in page
    assert "web 134, code 133, math 133" in page  # the last stage: per epoch
    assert "Delivered this pass" not in page
    plain = card_html(mix([Source(paths["web"]), Source(paths["code"])]), rows=32, thumbs=0)
    assert "<h3>Schedule</h3>" not in plain


def test_card_shows_a_loaders_delivered_counts_and_stage(paths: dict[str, str]) -> None:
    pytest.importorskip("torch")
    from spark_dl_core.card import card_html

    m = _mixture(paths)
    loader = m.to_torch(batch_size=50, shuffle=True, seed=5, epoch=1)
    it = iter(loader)
    ids = np.concatenate([next(it)["id"].numpy() for _ in range(5)])  # 250: past 200
    page = card_html(m, rows=32, thumbs=0, stats=loader.stats())
    it.close()
    want = _by_source(ids)
    for name, count in want.items():
        assert f'<tr data-source="{name}"><td>{name}</td><td>{count:,}</td>' in page
    assert "epoch 1, stage 1 (from sample 600)" in page
    assert '<tr data-stage="1" class="current"><td>1 ◀ now</td>' in page
