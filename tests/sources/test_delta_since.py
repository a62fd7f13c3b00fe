"""``open_delta(uri, version=N, since=M)``: the rows live at N that were not live at M, on
real tables written by deltalake (appends, a deletion vector, OPTIMIZE, overwrite, UPDATE)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

deltalake = pytest.importorskip("deltalake")
from delta_helpers import add_deletion_vector  # noqa: E402
from deltalake import DeltaTable, write_deltalake  # noqa: E402

from spark_dl_core import Source, mix, open_dataset  # noqa: E402
from spark_dl_core.tables.delta.since import SinceError  # noqa: E402
from spark_dl_core.tables.delta.table import open_delta  # noqa: E402


def _ids(a: int, b: int) -> pa.Table:
    return pa.table({"id": pa.array(range(a, b), pa.int64()), "x": pa.array([1.5] * (b - a))})


def _live(table: str, version: int) -> list[int]:
    return list(open_delta(table, version=version).to_arrow()["id"].to_pylist())


@pytest.fixture(scope="module")
def growing(tmp_path_factory: pytest.TempPathFactory) -> str:
    """v0 0..10, v1 +10..15, v2 OPTIMIZE (v0 and v1 into one file), v3 +20..30,
    v4 a deletion vector deleting 21 and 24, v5 +30..35."""
    table = str(tmp_path_factory.mktemp("since") / "growing")
    write_deltalake(table, _ids(0, 10), configuration={"delta.enableDeletionVectors": "true"})
    write_deltalake(table, _ids(10, 15), mode="append")
    DeltaTable(table).optimize.compact()
    write_deltalake(table, _ids(20, 30), mode="append")
    add_deletion_vector(table, [1, 4])  # on v3's file: ids 21 and 24
    write_deltalake(table, _ids(30, 35), mode="append")
    ops = [h["operation"] for h in sorted(DeltaTable(table).history(), key=lambda h: h["version"])]
    assert ops[2] == "OPTIMIZE" and ops[4] == "DELETE"
    return table


@pytest.mark.parametrize(("since", "version"), [(0, 1), (1, 3), (1, 5), (2, 4), (3, 4), (3, 5)])
def test_new_rows_are_live_at_n_and_not_at_m(growing: str, since: int, version: int) -> None:
    """Exactly the set difference, in the version's own order (files in log order)."""
    new = open_delta(growing, version=version, since=since)
    before = set(_live(growing, since))
    expected = [i for i in _live(growing, version) if i not in before]
    assert new.to_arrow()["id"].to_pylist() == expected
    assert len(new) == len(expected)
    assert new.lineage()["since"] == since and new.lineage()["version"] == version


def test_deletion_vector_only_adds_nothing_and_deletes_new_rows(growing: str) -> None:
    assert len(open_delta(growing, version=4, since=3)) == 0  # a DV delete: no new row
    ids = open_delta(growing, version=4, since=2).to_arrow()["id"].to_pylist()
    assert ids == [20, 22, 23, 25, 26, 27, 28, 29]  # N's deletion vector applies


def test_compaction_of_old_and_new_rows_is_refused(growing: str) -> None:
    """OPTIMIZE at v2 put v0's rows (live at 0) and v1's (added after) in one file."""
    with pytest.raises(SinceError) as err:
        open_delta(growing, version=3, since=0)
    text = str(err.value)
    assert growing in text and "version 3 since 0" in text and "commit 2" in text
    assert "since >= 2" in text


def test_identity_and_in_place_read(growing: str, tmp_path: Path) -> None:
    new = open_delta(growing, version=5, since=3)
    same = open_delta(growing, version=5, since=3)
    assert new.fingerprint == same.fingerprint
    assert new.fingerprint != open_delta(growing, version=5).fingerprint
    assert new.fingerprint != open_delta(growing, version=5, since=4).fingerprint
    assert new.dataset().path.endswith("@v3..v5")
    batches = list(new.iter_batches(2))
    assert sorted(int(i) for b in batches for i in b["id"]) == list(range(30, 35))
    result = new.write_mds(str(tmp_path / "export"))
    assert result is not None
    exported = open_dataset(str(tmp_path / "export"))
    assert exported.source["since"] == 3 and exported.source["version"] == 5
    assert [int(exported[i]["id"]) for i in range(len(exported))] == list(range(30, 35))


def test_mixture_upweights_new_rows(growing: str) -> None:
    everything = open_delta(growing, version=5)
    new = open_delta(growing, version=5, since=3)
    mixed = mix([Source(everything, proportion=0.8), Source(new, proportion=0.2)], epoch_size=100)
    ids = [int(i) for b in mixed.iter_batches(50, shuffle=True, seed=1) for i in b["id"]]
    again = [int(i) for b in mixed.iter_batches(50, shuffle=True, seed=1) for i in b["id"]]
    assert ids == again and len(ids) == 100
    assert sum(i >= 30 for i in ids) >= 20  # the new rows' share, plus their share of all
    assert Source(new).label(1).endswith("@v3..v5") and Source(everything).label(0)[-3:] == "@v5"


def test_overwrite_and_update(tmp_path: Path) -> None:
    """An overwrite's rows are all new; an UPDATE rewrites a file: all its rows count as new
    (the add/remove actions cannot tell copied rows from changed ones)."""
    table = str(tmp_path / "ow")
    write_deltalake(table, _ids(0, 5))
    write_deltalake(table, _ids(5, 10), mode="append")
    write_deltalake(table, _ids(100, 104), mode="overwrite")  # v2
    write_deltalake(table, _ids(104, 106), mode="append")  # v3
    DeltaTable(table).update({"id": "id + 1000"}, predicate="id = 100")  # v4
    ids = open_delta(table, version=3, since=1).to_arrow()["id"].to_pylist()
    assert sorted(ids) == list(range(100, 106))
    assert sorted(open_delta(table, version=3, since=2).to_arrow()["id"].to_pylist()) == [104, 105]
    updated = open_delta(table, version=4, since=3).to_arrow()["id"].to_pylist()
    assert sorted(updated) == [101, 102, 103, 1100]  # 101..103 were copied: counted as new


def test_delete_rewrite_keeps_old_rows_old(tmp_path: Path) -> None:
    """deltalake's DELETE rewrites a file without the deleted rows (dataChange true): the
    rows it keeps were live before, so they stay old or new as they were. A DELETE that
    merges an old file and a new one into one file cannot be split: a typed error."""
    table = str(tmp_path / "del")
    write_deltalake(table, _ids(0, 5))
    write_deltalake(table, _ids(5, 10), mode="append")
    DeltaTable(table).delete("id = 7")  # v2: rewrites v1's file only
    assert len(open_delta(table, version=2, since=1)) == 0
    assert open_delta(table, version=2, since=0).to_arrow()["id"].to_pylist() == [5, 6, 8, 9]
    DeltaTable(table).delete("id = 2 OR id = 8")  # v3: v0's and v2's files into one
    assert len(open_delta(table, version=3, since=2)) == 0  # all old: fine
    with pytest.raises(SinceError, match="commit 3 moved rows"):
        open_delta(table, version=3, since=0)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"version": 1, "since": 3}, ["since=3 is after version=1", "version 1 since 3"]),
        ({"version": 1, "since": -1}, ["since=-1 is not a version"]),
        ({"version": 1, "since": "one"}, ["since='one' is not a version"]),
    ],
)
def test_bad_since_names_table_and_versions(
    growing: str, kwargs: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(SinceError) as err:
        open_delta(growing, **kwargs)
    assert growing in str(err.value)
    for w in words:
        assert w in str(err.value)


def test_since_no_longer_in_the_log(tmp_path: Path) -> None:
    table = str(tmp_path / "cleaned")
    retention = {"delta.logRetentionDuration": "interval 0 seconds"}
    write_deltalake(table, _ids(0, 10), configuration=retention)
    write_deltalake(table, _ids(10, 15), mode="append")
    DeltaTable(table).create_checkpoint()
    write_deltalake(table, _ids(15, 20), mode="append")
    time.sleep(0.05)
    DeltaTable(table).cleanup_metadata()
    with pytest.raises(SinceError, match=r"version 2 since 0: the log no longer holds version 0"):
        open_delta(table, version=2, since=0)
    assert open_delta(table, version=2, since=1).to_arrow()["id"].to_pylist() == list(range(15, 20))


def test_partition_values_that_need_escaping(tmp_path: Path) -> None:
    """The log escapes partition directories (``part=a%20b``): files live at M and the
    commits after it are matched by the same decoded location."""
    table = str(tmp_path / "parts")
    data = _ids(0, 6).append_column("part", pa.array(["a b", "c:d", "e%f"] * 2))
    write_deltalake(table, data, partition_by=["part"])
    more = _ids(6, 9).append_column("part", pa.array(["a b", "c:d", "g"]))
    write_deltalake(table, more, mode="append")
    new = open_delta(table, version=1, since=0).to_arrow()
    assert sorted(zip(new["id"].to_pylist(), new["part"].to_pylist())) == [
        (6, "a b"),
        (7, "c:d"),
        (8, "g"),
    ]
