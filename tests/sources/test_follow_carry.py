"""A run over version M of a dataset that follows a Delta table carried on to version N of
it: ``load_state_dict(state, strict=False)`` over ``open_dataset(path)`` with a state saved
over ``open_dataset(path, version=M)``, on real deltalake tables (an append and a deletion
vector between M and N), at 1 and 2 ranks, torch loader and ``iter_batches``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

deltalake = pytest.importorskip("deltalake")
pytest.importorskip("torch")
from carry_helpers import KW, carried, flat, global_batches, saved  # noqa: E402
from delta_helpers import delete_by_dv  # noqa: E402
from deltalake import write_deltalake  # noqa: E402

from spark_dl_core import SpecError, open_dataset  # noqa: E402
from spark_dl_core.errors import FollowError  # noqa: E402
from spark_dl_core.maintenance import vacuum  # noqa: E402
from spark_dl_core.tables.delta.carry import VersionCarryError  # noqa: E402
from spark_dl_core.tables.delta.table import open_delta  # noqa: E402
from tests.sources.test_delta_follow import DV_TABLE, SPEC, _rows  # noqa: E402

DELETED = [*range(5, 20), 100, 303, 307, 450]  # rows of both of M's files


def _table(root: Path) -> str:
    """v0 0..300, v1 +300..500 (M), v2 deletion vectors on both files, v3 +500..600 (N)."""
    table = str(root / "t")
    write_deltalake(table, _rows(0, 300), configuration=DV_TABLE)
    write_deltalake(table, _rows(300, 200), mode="append")
    delete_by_dv(table, DELETED)
    write_deltalake(table, _rows(500, 100), mode="append")
    return table


@pytest.fixture(scope="module")
def followed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The table, and a dataset following it that holds versions 1 and 3 (the update from 1
    to 3 masks both of M's files and converts N's new file)."""
    root = tmp_path_factory.mktemp("follow-carry")
    table = _table(root)
    out = str(root / "followed")
    open_delta(table, version=1).write_mds(out, SPEC, mode="update")
    open_delta(table, version=3).write_mds(out, SPEC, mode="update")
    assert open_dataset(out)._virtual  # N reads M's shards through masks
    return table, out


def _ids(ds: Any) -> set[int]:
    return set(ds.to_arrow()["id"].to_pylist())


def _saved(
    out: str, version: int | None, steps: int, world: int
) -> tuple[dict[str, Any], list[int]]:
    """``version``: a held version, None: the dataset as it opens."""
    return saved(lambda: open_dataset(out, version=version), steps, world)


def _carried(out: str, state: dict[str, Any], world: int, **extra: Any) -> list[list[list[int]]]:
    """Over the latest version held."""
    return carried(lambda: open_dataset(out), state, world, **extra)


def test_strict_state_of_another_version_names_table_and_versions(
    followed: tuple[str, str],
) -> None:
    table, out = followed
    state, _ = _saved(out, 1, 2, 1)
    assert state["source"]["version"] == 1 and state["source"]["export"] is True
    uri = open_delta(table).table_uri
    loader = open_dataset(out).to_torch(**KW)
    with pytest.raises(VersionCarryError, match="loader state is for dataset") as err:
        loader.load_state_dict(state)
    assert isinstance(err.value, SpecError)
    text = str(err.value)
    assert f"table {uri!r} version 1" in text and f"table {uri!r} version 3" in text
    assert "strict=False" in text


@pytest.mark.parametrize("world", [1, 2])
def test_append_and_deletion_vector(followed: tuple[str, str], world: int) -> None:
    """The rest of M's epoch: M's samples not served and still live at N, in M's order (no
    deleted row, no appended one), the same global batches at 1 and 2 ranks; then N's own
    epochs: a fresh export's batches."""
    table, out = followed
    state, seen = _saved(out, 1, 6 // world, world)
    assert len(seen) == 48
    rest = _carried(out, state, world)
    served = [i for r in rest for b in r for i in b]
    live_m, live_n = _ids(open_dataset(out, version=1)), _ids(open_dataset(out))
    assert live_n == set(range(600)) - set(DELETED)
    assert sorted(served) == sorted((live_m - set(seen)) & live_n)
    assert not set(DELETED) & set(served) and max(served) < 500
    reference = _carried(out, state, 1)[0]
    assert global_batches(rest) == reference  # exact across world sizes
    whole_m = flat(open_dataset(out, version=1).to_torch(**KW))
    assert [i for i in whole_m[48:] if i in live_n] == [i for b in reference for i in b]
    loader = open_dataset(out).to_torch(**KW)
    loader.load_state_dict(state, strict=False)
    assert len(loader) == -(-(48 + len(served)) // 8) and loader.remaining == len(reference)
    assert len(open_dataset(out)) == 600 - len(DELETED)
    flat(loader)
    fresh_path = str(Path(out).parent / f"fresh-3-{world}")
    open_delta(table, version=3).write_mds(fresh_path, SPEC)
    fresh = open_dataset(fresh_path).to_torch(**KW)
    fresh.set_epoch(1)
    assert flat(loader) == flat(fresh)  # from the next epoch on: version N's own order


@pytest.mark.parametrize("world", [1, 2])
def test_iter_batches_carries_on_like_the_torch_loader(
    followed: tuple[str, str], world: int
) -> None:
    _, out = followed
    state, _ = _saved(out, 1, 3, 1)
    torch_rest = _carried(out, state, world)
    ds = open_dataset(out)
    for rank in range(world):
        got = ds.iter_batches(state=state, strict=False, rank=rank, world_size=world, **KW)
        assert [flat([b]) for b in got] == torch_rest[rank]
    with pytest.raises(VersionCarryError, match="version 1"):
        next(ds.iter_batches(state=state, **KW))


@pytest.mark.parametrize(("before", "after"), [(1, 2), (2, 1)])
def test_carried_states_resume_strictly_with_workers(
    followed: tuple[str, str], before: int, after: int
) -> None:
    """The carried run's own states resume with strict=True at another world size, and
    DataLoader workers read the carried order as the main process does."""
    _, out = followed
    state, _ = _saved(out, 1, 4 // before, before)
    reference = _carried(out, state, 1)[0]
    inner = []
    for rank in range(before):
        loader = open_dataset(out).to_torch(rank=rank, world_size=before, **KW)
        loader.load_state_dict(state, strict=False)
        it = iter(loader)
        for _ in range(4 // before):
            next(it)
        inner.append(loader.state_dict())
    assert all(s == inner[0] for s in inner) and inner[0]["source"]["carry"]["consumed"] == 32
    per_rank = []
    for rank in range(after):
        loader = open_dataset(out).to_torch(rank=rank, world_size=after, num_workers=2, **KW)
        loader.load_state_dict(inner[0])  # strict: the carried run's own state
        per_rank.append([flat([b]) for b in loader])
    assert global_batches(per_rank) == reference[4:]


def test_adopted_plain_export_and_carrying_twice(tmp_path: Path) -> None:
    """A state saved over a plain export of M (no table version recorded) carries on once
    the dataset adopted it; that carried run's state carries on again to a later version."""
    table = _table(tmp_path)
    out = str(tmp_path / "plain")
    open_delta(table, version=1).write_mds(out, SPEC)  # a plain export, no mode
    state, seen = _saved(out, None, 2, 1)
    assert state.get("source") is None
    open_delta(table, version=2).write_mds(out, SPEC, mode="update")  # adopts 1, then 2
    uri = open_delta(table).table_uri
    with pytest.raises(VersionCarryError) as err:
        open_dataset(out).to_torch(**KW).load_state_dict(state)
    assert f"table {uri!r} version 1" in str(err.value) and "version 2" in str(err.value)
    first = open_dataset(out).to_torch(**KW)
    first.load_state_dict(state, strict=False)
    it = iter(first)
    seen += flat([next(it), next(it)])
    again = first.state_dict()
    assert again["source"]["version"] == 2 and again["source"]["carry"]["epoch"] == 0
    open_delta(table, version=3).write_mds(out, SPEC, mode="update")
    loader = open_dataset(out).to_torch(**KW)
    loader.load_state_dict(again, strict=False)
    rest = flat(loader)
    live_2 = set(range(500)) - set(DELETED)
    assert sorted(rest) == sorted(live_2 - set(seen)) and len(set(seen)) == len(seen) == 32


def test_vacuumed_version_is_named(tmp_path: Path) -> None:
    table = _table(tmp_path)
    out = str(tmp_path / "followed")
    open_delta(table, version=1).write_mds(out, SPEC, mode="update")
    state, _ = _saved(out, None, 2, 1)
    open_delta(table, version=3).write_mds(out, SPEC, mode="update")
    vacuum(out, keep_versions=1, retention_seconds=0)
    loader = open_dataset(out).to_torch(**KW)
    with pytest.raises(FollowError) as err:
        loader.load_state_dict(state, strict=False)
    text = str(err.value)
    assert "version 1" in text and "vacuumed" in text and "version 3" in text
    assert err.value.asked == 1 and err.value.held == [3]


def test_states_of_another_table_or_an_in_place_read_are_refused(
    followed: tuple[str, str], tmp_path: Path
) -> None:
    table, out = followed
    other = _table(tmp_path)
    other_out = str(tmp_path / "other")
    open_delta(other, version=1).write_mds(other_out, SPEC, mode="update")
    state, _ = _saved(other_out, None, 2, 1)
    loader = open_dataset(out).to_torch(**KW)
    with pytest.raises(VersionCarryError, match="another table"):
        loader.load_state_dict(state, strict=False)
    in_place = open_delta(table, version=1).to_torch(**KW)
    it = iter(in_place)
    next(it)
    with pytest.raises(VersionCarryError, match="read in place"):
        loader.load_state_dict(in_place.state_dict(), strict=False)


def test_a_streamed_packed_position_inside_an_epoch_is_refused(tmp_path: Path) -> None:
    """A packed loader over a followed export cuts rows from streams (its shards record their
    tokens), so its position counts global batches, not rows: one inside an epoch cannot
    carry on to another version (other shards, other streams), as a position in rows cannot."""
    table, out = str(tmp_path / "t"), str(tmp_path / "followed")
    lengths = np.random.default_rng(0).integers(1, 40, size=1500)
    docs = pa.array([list(range(1, k + 1)) for k in lengths.tolist()], pa.list_(pa.int32()))
    write_deltalake(table, pa.table({"tokens": docs.slice(0, 1000)}))
    open_delta(table).write_mds(out, {"shard_size": "8KiB"}, mode="update")
    write_deltalake(table, pa.table({"tokens": docs.slice(1000)}), mode="append")
    open_delta(table).write_mds(out, {"shard_size": "8KiB"}, mode="update")
    packed = {**KW, "batch_size": 4, "streams": 4, "pack": {"column": "tokens", "seq_len": 32}}
    loader = open_dataset(out, version=0).to_torch(**packed)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["pack"]["version"] == 2 and state["pack"]["batches"] == 1
    with pytest.raises(VersionCarryError, match="packed position inside an epoch"):
        open_dataset(out).to_torch(**packed).load_state_dict(state, strict=False)


def _where(ds: Any) -> dict[int, tuple[str, int]]:
    """Each sample's ``id`` -> (data file's name, row in the file), by its row layout."""
    layout = ds.row_layout()
    ids = np.arange(len(ds))
    file, rows = layout.rows_of(ids)
    assert layout.ids_of(layout.files, file, rows).tolist() == ids.tolist()
    names = [os.path.basename(layout.files[f]) for f in file]
    return dict(zip(ds[ids]["id"].tolist(), zip(names, rows.tolist())))


def test_row_layout_names_the_rows_an_in_place_read_names(followed: tuple[str, str]) -> None:
    """Each sample of a held version is (data file, row in the file) as the same version
    read in place names it: the carry rule sees the same rows on both paths (their orders
    differ: an export's shards are not row groups, docs/delta.md)."""
    table, out = followed
    for version in (1, 3):
        in_place = _where(open_delta(table, version=version).dataset())
        assert _where(open_dataset(out, version=version)) == in_place
