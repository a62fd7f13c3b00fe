"""A run over version M of a Delta table carried on to version N:
``load_state_dict(state, strict=False)`` on real deltalake tables (an append, a deletion
vector, an OPTIMIZE, a vacuum), at 1 and 2 ranks, torch loader and ``iter_batches``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

deltalake = pytest.importorskip("deltalake")
pytest.importorskip("torch")
from carry_helpers import KW, carried, flat, global_batches, saved  # noqa: E402
from delta_helpers import add_deletion_vector  # noqa: E402
from deltalake import DeltaTable, write_deltalake  # noqa: E402

from spark_dl_core import SpecError  # noqa: E402
from spark_dl_core.errors import RowsDroppedWarning  # noqa: E402
from spark_dl_core.order import LoaderState  # noqa: E402
from spark_dl_core.tables.delta.carry import VersionCarryError  # noqa: E402
from spark_dl_core.tables.delta.snapshot import DeltaSnapshotError  # noqa: E402
from spark_dl_core.tables.delta.table import open_delta  # noqa: E402


def _ids(a: int, b: int) -> pa.Table:
    return pa.table({"id": pa.array(range(a, b), pa.int64()), "x": pa.array([0.5] * (b - a))})


def _live(table: str, version: int) -> set[int]:
    return set(open_delta(table, version=version).to_arrow()["id"].to_pylist())


@pytest.fixture(scope="module")
def changing(tmp_path_factory: pytest.TempPathFactory) -> str:
    """v0 0..60, v1 +60..100 (M), v2 a deletion vector on v1's file (ids 62, 65, 90, 99),
    v3 +100..120 (N)."""
    table = str(tmp_path_factory.mktemp("carry") / "changing")
    write_deltalake(table, _ids(0, 60), configuration={"delta.enableDeletionVectors": "true"})
    write_deltalake(table, _ids(60, 100), mode="append")
    add_deletion_vector(table, [2, 5, 30, 39])
    write_deltalake(table, _ids(100, 120), mode="append")
    return table


def _saved(table: str, version: int, steps: int, world: int) -> tuple[dict[str, Any], list[int]]:
    return saved(lambda: open_delta(table, version=version), steps, world)


def _carried(table: str, version: int, state: dict[str, Any], world: int) -> list[list[list[int]]]:
    return carried(lambda: open_delta(table, version=version), state, world)


def test_strict_state_of_another_version_names_table_and_versions(changing: str) -> None:
    state, _ = _saved(changing, 1, 2, 1)
    loader = open_delta(changing, version=3).to_torch(**KW)
    with pytest.raises(VersionCarryError, match="loader state is for dataset") as err:
        loader.load_state_dict(state)
    assert isinstance(err.value, SpecError)
    text = str(err.value)
    assert f"table {changing!r} version 1" in text and f"table {changing!r} version 3" in text
    assert "strict=False" in text


@pytest.mark.parametrize("world", [1, 2])
def test_append_and_deletion_vector(changing: str, world: int) -> None:
    """The rest of M's epoch: M's rows not served and still live at N, in M's order; no
    deleted row, no appended row; the same global batches at 1 and 2 ranks, before and
    after the switch; then N's own epochs."""
    state, seen = _saved(changing, 1, 6 // world, world)
    assert len(seen) == 48 and state["source"]["version"] == 1
    rest = _carried(changing, 3, state, world)
    served = [i for r in rest for b in r for i in b]
    live_m, live_n = _live(changing, 1), _live(changing, 3)
    assert sorted(served) == sorted((live_m - set(seen)) & live_n)
    assert not {62, 65, 90, 99} & set(served) and max(served) < 100
    reference = _carried(changing, 3, state, 1)[0]
    assert global_batches(rest) == reference  # exact across world sizes
    # the carried epoch's order is M's order with the dead rows left out
    whole_m = flat(open_delta(changing, version=1).to_torch(**KW))
    assert served and [i for i in whole_m[48:] if i in live_n] == [i for b in reference for i in b]
    # len(loader): the carried epoch counted whole (served before the switch + live rest)
    loader = open_delta(changing, version=3).to_torch(**KW)
    loader.load_state_dict(state, strict=False)
    assert len(loader) == -(-(48 + len(served)) // 8) and loader.remaining == len(reference)
    assert len(open_delta(changing, version=3)) == 116  # the dataset: version N's size
    flat(loader)
    fresh = open_delta(changing, version=3).to_torch(**KW)
    fresh.set_epoch(1)
    assert flat(loader) == flat(fresh)  # from the next epoch on: N's own order


@pytest.mark.parametrize(("before", "after"), [(1, 2), (2, 1)])
def test_carried_states_resume_strictly_at_any_world_size(
    changing: str, before: int, after: int
) -> None:
    state, _ = _saved(changing, 1, 4 // before, before)
    reference = _carried(changing, 3, state, 1)[0]
    # the carried run, 4 global batches in, saved at ``before`` ranks
    inner = []
    for rank in range(before):
        loader = open_delta(changing, version=3).to_torch(rank=rank, world_size=before, **KW)
        loader.load_state_dict(state, strict=False)
        it = iter(loader)
        for _ in range(4 // before):
            next(it)
        inner.append(loader.state_dict())
    assert all(s == inner[0] for s in inner)
    per_rank = []
    for rank in range(after):
        loader = open_delta(changing, version=3).to_torch(rank=rank, world_size=after, **KW)
        loader.load_state_dict(inner[0])  # strict: the carried run's own state
        per_rank.append([flat([b]) for b in loader])
    assert global_batches(per_rank) == reference[4:]


@pytest.mark.parametrize("world", [1, 2])
def test_iter_batches_carries_on_like_the_torch_loader(changing: str, world: int) -> None:
    state, _ = _saved(changing, 1, 2, 1)
    torch_rest = _carried(changing, 3, state, world)
    snap = open_delta(changing, version=3)
    for rank in range(world):
        got = snap.iter_batches(state=state, strict=False, rank=rank, world_size=world, **KW)
        assert [flat([b]) for b in got] == torch_rest[rank]
    with pytest.raises(VersionCarryError, match="version 1"):
        next(snap.iter_batches(state=state, **KW))


def test_optimize_rewritten_rows_wait_for_the_next_epoch(tmp_path: Path) -> None:
    """Without row tracking, rows whose file OPTIMIZE rewrote are not live for the rest of
    the epoch (another file at N; the carry warns, naming the files, and counts them) and
    are read from N's files from the next epoch on; rows of the file it left alone carry
    on."""
    table = str(tmp_path / "optimized")

    def part(a: int, b: int, p: str) -> pa.Table:
        return _ids(a, b).append_column("p", pa.array([p] * (b - a)))

    first = pa.concat_tables([part(0, 30, "a"), part(30, 60, "b")])
    write_deltalake(table, first, partition_by=["p"])
    write_deltalake(table, part(60, 80, "a"), mode="append")  # M = 1
    DeltaTable(table).optimize.compact()  # v2: p=a's two files into one, p=b's file kept
    write_deltalake(table, part(100, 110, "b"), mode="append")  # N = 3
    kept = set(range(30, 60))
    for world in (1, 2):
        state, seen = _saved(table, 1, 4 // world, world)
        with pytest.warns(RowsDroppedWarning, match="rewritten") as said:
            rest = _carried(table, 3, state, world)
        assert {Path(f).parent.name for w in said for f in w.message.files} == {"p=a"}
        served = {i for r in rest for b in r for i in b}
        assert served == kept - set(seen) and len(served) < 30
        loader = open_delta(table, version=3).to_torch(**KW)
        with pytest.warns(RowsDroppedWarning):
            loader.load_state_dict(state, strict=False)
        dropped = loader.stats()["carry"]["dropped"]
        assert dropped == len([i for i in range(80) if i not in kept]) - len(
            [i for i in seen if i not in kept]
        )
        assert loader.epoch == 0 and sorted(flat(loader)) == sorted(served)
        everything = sorted([*range(80), *range(100, 110)])
        assert loader.epoch == 1 and sorted(flat(loader)) == everything


def test_nothing_left_live_starts_the_next_epoch(tmp_path: Path) -> None:
    """Every unserved row of M rewritten by OPTIMIZE: the carried epoch is over at the
    switch (said by a warning), so the loader reads N's next epoch."""
    table = str(tmp_path / "compacted")
    write_deltalake(table, _ids(0, 40))
    write_deltalake(table, _ids(40, 50), mode="append")  # M = 1
    DeltaTable(table).optimize.compact()  # N = 2: one file
    state, _ = _saved(table, 1, 2, 1)
    loader = open_delta(table, version=2).to_torch(**KW)
    with pytest.warns(RowsDroppedWarning, match="34 of the 34 rows epoch 0"):
        loader.load_state_dict(state, strict=False)
    fresh = open_delta(table, version=2).to_torch(**KW)
    fresh.set_epoch(1)
    assert loader.epoch == 1 and flat(loader) == flat(fresh)


def test_state_of_another_table_is_refused(changing: str, tmp_path: Path) -> None:
    other = str(tmp_path / "other")
    write_deltalake(other, _ids(0, 60))
    write_deltalake(other, _ids(500, 540), mode="append")
    write_deltalake(other, _ids(600, 610), mode="append")
    state, _ = _saved(other, 1, 2, 1)
    loader = open_delta(changing, version=3).to_torch(**KW)
    with pytest.raises(VersionCarryError) as err:
        loader.load_state_dict(state, strict=False)
    text = str(err.value)
    assert f"table {other!r} version 1" in text and f"table {changing!r} version 3" in text
    assert f"table {changing!r} version 1 is dataset" in text


def test_vacuumed_version_is_named(tmp_path: Path) -> None:
    table = str(tmp_path / "vacuumed")
    write_deltalake(table, _ids(0, 50))
    write_deltalake(table, _ids(50, 60), mode="overwrite")
    state, _ = _saved(table, 0, 2, 1)
    DeltaTable(table).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    loader = open_delta(table, version=1).to_torch(**KW)
    with pytest.raises(DeltaSnapshotError) as err:
        loader.load_state_dict(state, strict=False)
    text = str(err.value)
    assert "version 0" in text and ".parquet" in text and "version 1" in text


def test_packed_position_inside_an_epoch_is_refused(changing: str) -> None:
    state, _ = _saved(changing, 1, 2, 1)
    state = dict(state, consumed=0, pack={"settings": {}, "rows": 5, "version": 1})
    dataset: Any = open_delta(changing, version=3).dataset()
    with pytest.raises(VersionCarryError, match="packed position"):
        dataset.carry_on(LoaderState.from_dict(state), False)


def test_carried_twice_with_dataloader_workers(changing: str) -> None:
    """A carried run's state carries on again to a later version; DataLoader workers read
    the carried order as the main process does."""
    state, seen = _saved(changing, 0, 2, 1)
    first = open_delta(changing, version=1).to_torch(**KW)
    first.load_state_dict(state, strict=False)
    it = iter(first)
    seen += flat([next(it), next(it)])
    again = first.state_dict()
    reference = _carried(changing, 3, again, 1)[0]
    loader = open_delta(changing, version=3).to_torch(num_workers=2, **KW)
    loader.load_state_dict(again, strict=False)
    rest = [flat([b]) for b in loader]
    assert rest == reference and sorted(seen + _flat_ids(rest)) == list(range(60))


def _flat_ids(batches: list[list[int]]) -> list[int]:
    return [i for b in batches for i in b]
