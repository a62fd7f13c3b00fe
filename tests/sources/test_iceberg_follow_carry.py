"""A run over one held version of a dataset that follows an Iceberg table carried on to a
later one (``load_state_dict(state, strict=False)``), under Delta's rule
(:mod:`spark_dl_core.sources.row_carry`): the old epoch finishes over its samples still
live, in the old order, the same global batches at 1 and 2 ranks; rows of a file a rewrite
replaced are dropped with a warning (Iceberg gives no row identity here); from the next
epoch on the order is a fresh export's. Real tables written by PyIceberg."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyiceberg")
pytest.importorskip("torch")
from carry_helpers import KW, carried, flat, global_batches, saved
from iceberg_helpers import catalog, position_deletes
from test_iceberg_follow import PROPS, SCHEMA, SPEC, positions, rows

from spark_dl_core import SpecError, open_dataset
from spark_dl_core.errors import RowsDroppedWarning
from spark_dl_core.sources.row_carry import VersionCarryError
from spark_dl_core.tables.iceberg.table import open_iceberg

DELETED = [*range(5, 20), 100, 303, 307, 450]  # rows of both of M's files


def _ids(ds: Any) -> set[int]:
    return set(ds.to_arrow()["id"].to_pylist())


def _follow(cat: Any, out: str) -> int:
    """Update ``out`` to the table's current snapshot; its held version's number."""
    open_iceberg("db.c", catalog=cat).write_mds(out, SPEC, mode="update")
    return int(open_dataset(out).version or 0)


@pytest.fixture(scope="module")
def followed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str, int, int]:
    """M: 0..300 and 300..500 in two files; N: position deletes on both, then 500..600."""
    root = tmp_path_factory.mktemp("iceberg-carry")
    cat = catalog(root)
    t = cat.create_table("db.c", schema=SCHEMA, properties=PROPS)
    t.append(rows(0, 300))
    t = cat.load_table("db.c")
    t.append(rows(300, 200))
    out = str(root / "followed")
    m = _follow(cat, out)
    t = cat.load_table("db.c")
    position_deletes(t, positions(t, set(DELETED)))
    t = cat.load_table("db.c")
    t.append(rows(500, 100))
    n = _follow(cat, out)
    assert open_dataset(out)._virtual  # N reads M's shards through masks
    return cat, out, m, n


def test_strict_state_of_another_version_names_both(followed: tuple[Any, str, int, int]) -> None:
    _, out, m, n = followed
    state, _ = saved(lambda: open_dataset(out, version=m), 2, 1)
    assert state["source"]["kind"] == "iceberg" and state["source"]["version"] == m
    loader = open_dataset(out).to_torch(**KW)
    with pytest.raises(VersionCarryError, match="loader state is for dataset") as err:
        loader.load_state_dict(state)
    assert isinstance(err.value, SpecError)
    text = str(err.value)
    assert f"version {m}" in text and f"version {n}" in text and "strict=False" in text


@pytest.mark.parametrize("world", [1, 2])
def test_appends_and_deletes_carry_on(followed: tuple[Any, str, int, int], world: int) -> None:
    cat, out, m, _ = followed
    state, seen = saved(lambda: open_dataset(out, version=m), 6 // world, world)
    assert len(seen) == 48
    rest = carried(lambda: open_dataset(out), state, world)
    served = [i for r in rest for b in r for i in b]
    live_m, live_n = _ids(open_dataset(out, version=m)), _ids(open_dataset(out))
    assert live_n == set(range(600)) - set(DELETED)
    assert sorted(served) == sorted((live_m - set(seen)) & live_n)  # no repeat, no loss
    assert not set(DELETED) & set(served) and max(served) < 500
    reference = carried(lambda: open_dataset(out), state, 1)[0]
    assert global_batches(rest) == reference  # exact across world sizes
    whole_m = flat(open_dataset(out, version=m).to_torch(**KW))
    assert [i for i in whole_m[48:] if i in live_n] == [i for b in reference for i in b]
    loader = open_dataset(out).to_torch(**KW)
    loader.load_state_dict(state, strict=False)
    flat(loader)
    fresh_path = str(Path(out).parent / f"fresh-{world}")
    open_iceberg("db.c", catalog=cat).write_mds(fresh_path, SPEC)
    fresh = open_dataset(fresh_path).to_torch(**KW)
    fresh.set_epoch(1)
    assert flat(loader) == flat(fresh)  # from the next epoch on: N's own order


def test_rows_of_a_rewritten_file_are_dropped_with_a_warning(tmp_path: Path) -> None:
    """A copy-on-write delete rewrites a file: Iceberg gives no row identity here, so the
    rows of the old file not served yet are dropped, and the warning names the file."""
    cat = catalog(tmp_path)
    t = cat.create_table("db.c", schema=SCHEMA, properties=PROPS)
    t.append(rows(0, 200))
    t = cat.load_table("db.c")
    t.append(rows(200, 100))
    out = str(tmp_path / "followed")
    m = _follow(cat, out)
    old_files = set(open_iceberg("db.c", catalog=cat).files)
    state, seen = saved(lambda: open_dataset(out, version=m), 2, 1)
    t = cat.load_table("db.c")
    t.delete("id < 3")  # rewrites the file of 0..200
    _follow(cat, out)
    gone = old_files - set(open_iceberg("db.c", catalog=cat).files)
    assert len(gone) == 1
    loader = open_dataset(out).to_torch(**KW)
    with pytest.warns(RowsDroppedWarning, match=Path(next(iter(gone))).name):
        loader.load_state_dict(state, strict=False)
    rest = flat(loader)
    assert sorted(rest) == sorted(set(range(200, 300)) - set(seen))  # the kept file's rows
