"""A run carried on (``load_state_dict(state, strict=False)``) across data files that an
OPTIMIZE or a copy-on-write DELETE / UPDATE rewrote, on real deltalake tables: without row
tracking the carry says what it drops (a ``RowsDroppedWarning`` naming the files, and
``stats()["carry"]``); with row tracking (tests/sources/row_tracking.py writes the commits as
delta-spark does) it follows each row by its row id: every still-live row of the old epoch
once, no deleted row, nothing twice. Torch, tf and ``iter_batches`` agree on the position
after any carry, and ``set_epoch`` of the carried epoch reads what is left of it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

deltalake = pytest.importorskip("deltalake")
pytest.importorskip("torch")
from carry_helpers import KW, flat, global_batches, saved  # noqa: E402
from deltalake import DeltaTable, write_deltalake  # noqa: E402

from spark_dl_core import open_dataset  # noqa: E402
from spark_dl_core.errors import RowsDroppedWarning  # noqa: E402
from spark_dl_core.tables.delta.table import open_delta  # noqa: E402
from tests.sources.row_tracking import (  # noqa: E402
    enable_row_tracking,
    live_adds,
    rewrite,
    where,
)

FILES, ROWS = 4, 500
DELETED = [3, 4, 700, 1999]
UPDATED = [10, 11, 1500]


def _rows(a: int, b: int) -> pa.Table:
    return pa.table({"id": pa.array(range(a, b), pa.int64()), "x": pa.array([0.5] * (b - a))})


def _four_files(table: str) -> None:
    for k in range(FILES):
        write_deltalake(table, _rows(k * ROWS, (k + 1) * ROWS), mode="append")


def _carry(open_new: Any, state: dict[str, Any], world: int = 1) -> tuple[list[Any], list[Any]]:
    """Each rank's loader carried on, and the RowsDroppedWarnings the carry gave."""
    loaders = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rank in range(world):
            loader = open_new().to_torch(rank=rank, world_size=world, **KW)
            loader.load_state_dict(state, strict=False)
            loaders.append(loader)
    return loaders, [w.message for w in caught if w.category is RowsDroppedWarning]


def _fresh_epoch(open_new: Any, epoch: int) -> list[int]:
    fresh = open_new().to_torch(**KW)
    fresh.set_epoch(epoch)
    return flat(fresh)


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> str:
    """v0..v3: four files of 500 rows (M = 3); v4: OPTIMIZE into one file (N = 4)."""
    table = str(tmp_path_factory.mktemp("rewrites") / "compacted")
    _four_files(table)
    DeltaTable(table).optimize.compact()
    return table


def test_rewrite_without_row_tracking_warns_and_counts(compacted: str) -> None:
    """Every unserved row of M is in a file OPTIMIZE rewrote: the carry drops them from the
    epoch and says so, naming the four files and the count, in a warning and in stats()."""
    state, seen = saved(lambda: open_delta(compacted, version=3), 2, 1)
    (loader,), said = _carry(lambda: open_delta(compacted, version=4), state)
    assert len(said) == 1
    left = FILES * ROWS - len(seen)
    assert said[0].rows == left == 1984 and said[0].epoch == 0
    m_files = sorted(p for p in live_adds_of(compacted, 3))
    assert sorted(said[0].files) == m_files and all(f in str(said[0]) for f in m_files)
    report = loader.stats()["carry"]
    assert report["dropped"] == left and report["left"] == left and report["carried"] == 0
    assert report["dropped_files"] == m_files and report["row_ids"] is False
    # the epoch's end was said: the next pass is version N's epoch 1
    assert loader.epoch == 1 and flat(loader) == _fresh_epoch(lambda: open_delta(compacted), 1)


def live_adds_of(table: str, version: int) -> list[str]:
    return [Path(u).name for u in open_delta(table, version=version).files]


def test_torch_tf_and_iter_batches_agree_after_the_carry(compacted: str) -> None:
    """Nothing of the carried epoch left: torch, tf and iter_batches all read version N's
    epoch 1 next, the same batches, and save the same position."""
    tf = pytest.importorskip("tensorflow")
    state, _ = saved(lambda: open_delta(compacted, version=3), 2, 1)
    expected = _fresh_epoch(lambda: open_delta(compacted, version=4), 1)
    (loader,), _ = _carry(lambda: open_delta(compacted, version=4), state)
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["consumed"] == 0
    assert flat(loader) == expected
    snap = open_delta(compacted, version=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RowsDroppedWarning)
        batches = snap.iter_batches(state=state, strict=False, **KW)
        assert flat(batches) == expected
        tfds = snap.to_tf(state=state, strict=False, **KW)
    got = [int(i) for b in tfds.take(-1) for i in np.asarray(b["id"])]
    assert got == expected and tfds.state_dict(0)["epoch"] == 1
    del tf


def test_set_epoch_of_the_carried_epoch_reads_what_is_left(compacted: str) -> None:
    """A trainer resuming in epoch 0 calls set_epoch(0): an empty pass (nothing of epoch 0
    is left), then set_epoch(1) reads epoch 1, as a fresh loader does; no IndexError, no
    old-version position read again."""
    state, _ = saved(lambda: open_delta(compacted, version=3), 2, 1)
    (loader,), _ = _carry(lambda: open_delta(compacted, version=4), state)
    loader.set_epoch(0)
    assert loader.epoch == 0 and len(loader) == 2 and loader.remaining == 0
    assert flat(loader) == [] and loader.epoch == 1
    loader.set_epoch(1)
    assert flat(loader) == _fresh_epoch(lambda: open_delta(compacted, version=4), 1)


def test_set_epoch_again_restarts_the_carried_epoch_at_the_switch(tmp_path: Path) -> None:
    """Some of the carried epoch left: set_epoch(0) after it was read reads that rest again
    (an epoch asked for afresh), never the old version's positions before the switch."""
    table = str(tmp_path / "appended")
    _four_files(table)
    write_deltalake(table, _rows(5000, 5100), mode="append")  # N = 4
    state, seen = saved(lambda: open_delta(table, version=3), 2, 1)
    (loader,), said = _carry(lambda: open_delta(table, version=4), state)
    rest = flat(loader)
    assert not said and sorted(rest) == sorted(set(range(2000)) - set(seen))
    assert loader.epoch == 1
    loader.set_epoch(0)
    assert flat(loader) == rest and loader.epoch == 1


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int, int]:
    """A row-tracked table: four files (M), then an OPTIMIZE into one file, a copy-on-write
    DELETE of ``DELETED``, a copy-on-write UPDATE of ``UPDATED`` (x = 9.0): N."""
    table = str(tmp_path_factory.mktemp("tracked") / "t")
    _four_files(table)
    m = enable_row_tracking(table)
    rewrite(table, "OPTIMIZE")
    rewrite(table, "DELETE", keep=where("id", DELETED))

    def set_x(rows: pa.Table) -> pa.Table:
        hit = pc.is_in(rows.column("id"), pa.array(UPDATED))
        x = pc.if_else(hit, pa.scalar(9.0), rows.column("x"))
        return rows.set_column(rows.column_names.index("x"), "x", x)

    n = rewrite(table, "UPDATE", update=set_x)
    assert len(live_adds(table)) == 1
    return table, m, n


@pytest.mark.parametrize("world", [1, 2])
def test_row_tracking_follows_rows_across_rewrites(
    tracked: tuple[str, int, int], world: int
) -> None:
    """Every row of M's epoch not served and not deleted is served once, in M's order, with
    its values at N (updated rows updated); no warning; the same global batches at 1 and 2
    ranks; then N's own epochs."""
    table, m, n = tracked
    state, seen = saved(lambda: open_delta(table, version=m), 4 // world, world)
    loaders, said = _carry(lambda: open_delta(table, version=n), state, world)
    per_rank = [[b for b in loader] for loader in loaders]
    served = [int(i) for r in per_rank for b in r for i in b["id"]]
    expected = set(range(FILES * ROWS)) - set(seen) - set(DELETED)
    assert not said and len(served) == len(set(served)) and set(served) == expected
    xs = {int(i): float(x) for r in per_rank for b in r for i, x in zip(b["id"], b["x"])}
    assert all(xs[i] == 9.0 for i in UPDATED if i in xs) and set(UPDATED) & set(xs)
    whole_m = flat(open_delta(table, version=m).to_torch(**KW))
    in_order = global_batches([[flat([b]) for b in r] for r in per_rank])
    assert [i for b in in_order for i in b] == [i for i in whole_m[len(seen) :] if i in expected]
    report = loaders[0].stats()["carry"]
    assert report["row_ids"] and report["dropped"] == 0 and report["followed"] == len(expected)
    assert report["deleted"] == len(set(DELETED) - set(seen))
    rest = flat(loaders[0]) if world == 1 else None
    if rest is not None:
        assert rest == _fresh_epoch(lambda: open_delta(table, version=n), 1)


def test_row_tracking_in_a_followed_export(tracked: tuple[str, int, int], tmp_path: Path) -> None:
    """The same rule for a dataset following the table (open_dataset(path, version=M))."""
    table, m, n = tracked
    out = str(tmp_path / "followed")
    spec = {"shard_size": 4096}
    open_delta(table, version=m).write_mds(out, spec, mode="update")
    open_delta(table, version=n).write_mds(out, spec, mode="update")
    state, seen = saved(lambda: open_dataset(out, version=m), 2, 1)
    (loader,), said = _carry(lambda: open_dataset(out), state)
    served = flat(loader)
    expected = set(range(FILES * ROWS)) - set(seen) - set(DELETED)
    assert not said and len(served) == len(set(served)) and set(served) == expected
    assert loader.stats()["carry"]["followed"] == len(expected)


def test_followed_export_without_row_tracking_warns(compacted: str, tmp_path: Path) -> None:
    out = str(tmp_path / "followed")
    spec = {"shard_size": 4096}
    open_delta(compacted, version=3).write_mds(out, spec, mode="update")
    open_delta(compacted, version=4).write_mds(out, spec, mode="update")
    state, seen = saved(lambda: open_dataset(out, version=3), 2, 1)
    (loader,), said = _carry(lambda: open_dataset(out), state)
    assert len(said) == 1 and said[0].rows == FILES * ROWS - len(seen)
    assert len(said[0].files) == FILES
    assert loader.stats()["carry"]["dropped"] == said[0].rows and loader.epoch == 1


def test_row_tracking_with_a_file_missing_its_row_ids_is_refused(tmp_path: Path) -> None:
    """Row tracking on, but an OPTIMIZE's new file written without a baseRowId (a writer
    that broke the rowTracking feature): its rows have no stable ids, so the carry fails
    naming the table, the version carried to, the commit, the file and the feature, where
    dropping would lose rows silently and value matching could repeat them. A rewrite made
    before row tracking was enabled is not refused (its rows are dropped and said)."""
    from spark_dl_core.tables.delta.row_ids import RowIdsMissingError

    table = str(tmp_path / "broken")
    _four_files(table)
    m = enable_row_tracking(table)
    n = rewrite(table, "OPTIMIZE")
    commit = Path(table, "_delta_log", f"{n:020}.json")
    lines = [json.loads(line) for line in commit.read_text().splitlines()]
    for action in lines:
        action.get("add", {}).pop("baseRowId", None)
    commit.write_text("\n".join(json.dumps(a) for a in lines) + "\n")
    (added,) = [a["add"]["path"] for a in lines if "add" in a]
    state, _ = saved(lambda: open_delta(table, version=m), 2, 1)
    with pytest.raises(RowIdsMissingError) as got:
        _carry(lambda: open_delta(table, version=n), state)  # load_state_dict raises
    text = str(got.value)
    assert table in text and f"version {n}" in text and "rowTracking" in text
    assert added in text and "baseRowId" in text

    before = str(tmp_path / "before")  # rewritten while untracked, tracking enabled after
    _four_files(before)
    DeltaTable(before).optimize.compact()
    late = enable_row_tracking(before)
    state, seen = saved(lambda: open_delta(before, version=3), 2, 1)
    _, said = _carry(lambda: open_delta(before, version=late), state)
    assert len(said) == 1 and said[0].rows == FILES * ROWS - len(seen)
