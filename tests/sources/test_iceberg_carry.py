"""A run over one snapshot of an Iceberg table read in place carried on to a later one
(``load_state_dict(state, strict=False)``), under Delta's rule: an append and merge-on-read
position deletes between, at 1 and 2 ranks; a copy-on-write rewrite drops the rewritten
file's rows with a warning; the carried run's own states resume strictly; a state of
another table is refused. Real tables written by PyIceberg."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyiceberg")
pytest.importorskip("torch")
from carry_helpers import KW, carried, flat, global_batches, saved
from iceberg_helpers import catalog, position_deletes
from test_iceberg_follow import PROPS, SCHEMA, positions, rows

from spark_dl_core import SpecError
from spark_dl_core.errors import RowsDroppedWarning
from spark_dl_core.sources.row_carry import VersionCarryError
from spark_dl_core.tables.iceberg.errors import IcebergSnapshotError
from spark_dl_core.tables.iceberg.table import open_iceberg

DELETED = [*range(5, 20), 100, 303, 307, 450]


@pytest.fixture(scope="module")
def changing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, int, int]:
    """M: 0..300 and 300..500; N: position deletes on both of M's files, then 500..600."""
    cat = catalog(tmp_path_factory.mktemp("iceberg-carry"))
    t = cat.create_table("db.c", schema=SCHEMA, properties=PROPS)
    t.append(rows(0, 300))
    t = cat.load_table("db.c")
    t.append(rows(300, 200))
    t = cat.load_table("db.c")
    m = t.current_snapshot().snapshot_id
    position_deletes(t, positions(t, set(DELETED)))
    t = cat.load_table("db.c")
    t.append(rows(500, 100))
    n = cat.load_table("db.c").current_snapshot().snapshot_id
    return cat, m, n


def _open(cat: Any, snapshot: int) -> Any:
    return open_iceberg("db.c", catalog=cat, snapshot_id=snapshot)


def _live(cat: Any, snapshot: int) -> set[int]:
    return set(_open(cat, snapshot).to_arrow()["id"].to_pylist())


def test_strict_state_of_another_snapshot_names_both(changing: tuple[Any, int, int]) -> None:
    cat, m, n = changing
    state, _ = saved(lambda: _open(cat, m), 2, 1)
    assert state["source"]["kind"] == "iceberg" and state["source"]["version"] == m
    loader = _open(cat, n).to_torch(**KW)
    with pytest.raises(VersionCarryError, match="loader state is for dataset") as err:
        loader.load_state_dict(state)
    assert isinstance(err.value, SpecError)
    text = str(err.value)
    assert f"snapshot {m}" in text and f"snapshot {n}" in text and "strict=False" in text


@pytest.mark.parametrize("world", [1, 2])
def test_append_and_position_deletes(changing: tuple[Any, int, int], world: int) -> None:
    cat, m, n = changing
    state, seen = saved(lambda: _open(cat, m), 6 // world, world)
    assert len(seen) == 48
    rest = carried(lambda: _open(cat, n), state, world)
    served = [i for r in rest for b in r for i in b]
    live_m, live_n = _live(cat, m), _live(cat, n)
    assert sorted(served) == sorted((live_m - set(seen)) & live_n)  # no repeat, no loss
    assert not set(DELETED) & set(served) and max(served) < 500
    reference = carried(lambda: _open(cat, n), state, 1)[0]
    assert global_batches(rest) == reference  # exact across world sizes
    whole_m = flat(_open(cat, m).to_torch(**KW))
    assert [i for i in whole_m[48:] if i in live_n] == [i for b in reference for i in b]
    loader = _open(cat, n).to_torch(**KW)
    loader.load_state_dict(state, strict=False)
    flat(loader)
    fresh = _open(cat, n).to_torch(**KW)
    fresh.set_epoch(1)
    assert flat(loader) == flat(fresh)  # from the next epoch on: N's own order


def test_carried_state_resumes_strictly_at_another_world_size(
    changing: tuple[Any, int, int],
) -> None:
    cat, m, n = changing
    state, _ = saved(lambda: _open(cat, m), 2, 1)
    reference = carried(lambda: _open(cat, n), state, 1)[0]
    inner = []
    for rank in range(2):
        loader = _open(cat, n).to_torch(rank=rank, world_size=2, **KW)
        loader.load_state_dict(state, strict=False)
        it = iter(loader)
        for _ in range(2):
            next(it)
        inner.append(loader.state_dict())
    assert inner[0] == inner[1]
    loader = _open(cat, n).to_torch(**KW)
    loader.load_state_dict(inner[0])  # strict: the carried run's own state
    assert [flat([b]) for b in loader] == reference[4:]


def test_a_rewrite_drops_rows_with_a_warning_and_other_tables_are_refused(
    tmp_path: Path,
) -> None:
    cat = catalog(tmp_path)
    t = cat.create_table("db.c", schema=SCHEMA, properties=PROPS)
    t.append(rows(0, 200))
    t = cat.load_table("db.c")
    t.append(rows(200, 100))
    m = cat.load_table("db.c").current_snapshot().snapshot_id
    old_files = set(_open(cat, m).files)
    state, seen = saved(lambda: _open(cat, m), 2, 1)
    t = cat.load_table("db.c")
    t.delete("id < 3")  # copy-on-write: the file of 0..200 rewritten
    now = open_iceberg("db.c", catalog=cat)
    gone = old_files - set(now.files)
    assert len(gone) == 1
    loader = now.to_torch(**KW)
    with pytest.warns(RowsDroppedWarning, match=Path(next(iter(gone))).name):
        loader.load_state_dict(state, strict=False)
    assert sorted(flat(loader)) == sorted(set(range(200, 300)) - set(seen))

    other = cat.create_table("db.o", schema=SCHEMA, properties=PROPS)
    other.append(rows(0, 300))
    theirs = open_iceberg("db.o", catalog=cat).to_torch(**KW)
    with pytest.raises((VersionCarryError, IcebergSnapshotError), match=str(m)):
        theirs.load_state_dict(state, strict=False)
