"""A dataset that follows an Iceberg table (``write_mds(path, mode="update")``) on real
tables written by PyIceberg: appends, merge-on-read position deletes, equality deletes, a
copy-on-write delete and an overwrite between updates. Every held version reads exactly the
rows of its snapshot read in place, and is a fresh export of it (same fingerprint); what
cannot be followed right (a rollback, an expired snapshot, a format-1 table, another table)
is refused by a typed error naming table and snapshot."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("pyiceberg")
from iceberg_helpers import catalog, equality_deletes, position_deletes

from spark_dl_core import open_dataset
from spark_dl_core.errors import FollowError
from spark_dl_core.tables.iceberg.errors import (
    IcebergFollowError,
    UnsupportedIcebergFeatureError,
)
from spark_dl_core.tables.iceberg.table import open_iceberg

PROPS = {"write.parquet.row-group-limit": "60"}
SPEC = {"shard_size": 2000}  # several shards per data file
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("emb", pa.list_(pa.field("element", pa.float32(), False)), False),
        pa.field("name", pa.string(), False),
    ]
)


def rows(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n)
    return pa.table(
        {
            "id": ids.astype(np.int64),
            "emb": [[float(i) / (j + 1) for j in range(4)] for i in ids],
            "name": [f"row{i}" for i in ids],
        },
        schema=SCHEMA,
    )


def multiset(table: pa.Table) -> Counter[tuple[Any, ...]]:
    cols = [table[c].to_pylist() for c in ("id", "emb", "name")]
    return Counter((i, tuple(e), s) for i, e, s in zip(*cols))


def positions(t: Any, ids: set[int]) -> dict[str, list[int]]:
    """Rows ``ids`` as positions in each live data file of ``t``."""
    import pyarrow.parquet as pq

    out = {}
    for task in t.scan().plan_files():
        got = pq.read_table(task.file.file_path[len("file://") :], columns=["id"])["id"]
        hit = [k for k, i in enumerate(got.to_pylist()) if i in ids]
        if hit:
            out[task.file.file_path] = hit
    return out


def check_version(out: str, snapshot: int, cat: Any, name: str, fresh: str) -> int:
    """The held version of ``snapshot``: its rows are the snapshot's read in place (as
    multisets), and its fingerprint a fresh export's. Returns its number."""
    snap = open_iceberg(name, catalog=cat, snapshot_id=snapshot)
    number = int(snap.sequence_number or 0)
    ds = open_dataset(out, version=number)
    want = multiset(snap.to_arrow())
    got = multiset(ds.to_arrow())
    assert got == want, f"{sum(((got - want) + (want - got)).values())} wrong rows"
    snap.write_mds(fresh, SPEC, mode="overwrite")
    assert ds.fingerprint == open_dataset(fresh).fingerprint
    return number


def test_updates_follow_every_kind_of_change(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    t = cat.create_table("db.f", schema=SCHEMA, properties=PROPS)
    out, fresh = str(tmp_path / "followed"), str(tmp_path / "fresh")
    followed: list[int] = []

    def follow() -> Any:
        snap = open_iceberg("db.f", catalog=cat)
        result = snap.write_mds(out, SPEC, mode="update")
        followed.append(snap.version)
        return result

    t.append(rows(0, 300))
    first = follow()
    assert not first.skipped and first.num_samples == 300
    t = cat.load_table("db.f")
    t.append(rows(300, 200))
    t = cat.load_table("db.f")
    position_deletes(t, positions(t, {3, 4, 5, 150, 301, 420}))  # both files: masked
    follow()  # the append and the deletes in one update
    held = open_dataset(out)
    assert held._virtual  # the deletes are virtual shards over the shards on disk
    t = cat.load_table("db.f")
    t.append(rows(500, 100))
    follow()
    t = cat.load_table("db.f")
    t.delete("id < 40")  # copy-on-write: a data file rewritten
    follow()
    t = cat.load_table("db.f")
    t.overwrite(rows(1000, 120))  # every file replaced
    follow()
    t = cat.load_table("db.f")  # equality deletes last: PyIceberg's own writes refuse them
    equality_deletes(t, pa.table({"id": pa.array([1007, 1050], pa.int64())}))
    t = cat.load_table("db.f")
    t.append(rows(2000, 30))
    follow()
    again = open_iceberg("db.f", catalog=cat).write_mds(out, SPEC, mode="update")
    assert again.skipped  # the snapshot held: nothing to do
    numbers = [check_version(out, s, cat, "db.f", fresh) for s in followed]
    assert numbers == sorted(numbers) and open_dataset(out).version == numbers[-1]
    assert open_dataset(out).version == numbers[-1]


def test_only_new_files_are_converted(tmp_path: Path) -> None:
    """An append converts only its file: the shards of the files held are kept as they are."""
    cat = catalog(tmp_path)
    t = cat.create_table("db.n", schema=SCHEMA, properties=PROPS)
    out = str(tmp_path / "followed")
    empty = open_iceberg("db.n", catalog=cat).write_mds(out, SPEC, mode="update")
    assert empty.num_samples == 0 and open_dataset(out).version == 0  # no snapshot yet
    t.append(rows(0, 300))
    open_iceberg("db.n", catalog=cat).write_mds(out, SPEC, mode="update")
    before = {p.name for p in Path(out).glob("*.mds*")}
    t = cat.load_table("db.n")
    t.append(rows(300, 50))
    open_iceberg("db.n", catalog=cat).write_mds(out, SPEC, mode="update")
    after = {p.name for p in Path(out).glob("*.mds*")}
    assert before < after
    ds = open_dataset(out)
    assert sorted(ds.to_arrow()["id"].to_pylist()) == list(range(350))


def test_a_plain_export_is_adopted(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    t = cat.create_table("db.a", schema=SCHEMA, properties=PROPS)
    out, fresh = str(tmp_path / "out"), str(tmp_path / "fresh")
    t.append(rows(0, 200))
    first = open_iceberg("db.a", catalog=cat)
    first.write_mds(out, SPEC)  # a plain export
    t = cat.load_table("db.a")
    position_deletes(t, positions(t, {10, 11}))
    t = cat.load_table("db.a")
    t.append(rows(200, 80))
    open_iceberg("db.a", catalog=cat).write_mds(out, SPEC, mode="update")
    for s in (first.version, cat.load_table("db.a").current_snapshot().snapshot_id):
        check_version(out, s, cat, "db.a", fresh)


def test_what_cannot_be_followed_is_refused(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    t = cat.create_table("db.r", schema=SCHEMA, properties=PROPS)
    out = str(tmp_path / "out")
    t.append(rows(0, 100))
    base = cat.load_table("db.r").current_snapshot().snapshot_id
    t = cat.load_table("db.r")
    t.append(rows(100, 100))
    t = cat.load_table("db.r")
    held = t.current_snapshot().snapshot_id
    open_iceberg("db.r", catalog=cat).write_mds(out, SPEC, mode="update")

    # backwards: an older snapshot
    with pytest.raises(
        IcebergFollowError,
        match=rf"snapshot {held} to snapshot {base} of Iceberg table 'test\.db\.r'.*backwards",
    ) as err:
        open_iceberg("db.r", catalog=cat, snapshot_id=base).write_mds(out, mode="update")
    assert isinstance(err.value, FollowError) and err.value.snapshot == base

    # a rollback, then a new commit: not a descendant of the snapshot held
    t.manage_snapshots().rollback_to_snapshot(base).commit()
    t = cat.load_table("db.r")
    t.append(rows(500, 10))
    t = cat.load_table("db.r")
    other = t.current_snapshot().snapshot_id
    with pytest.raises(IcebergFollowError, match=rf"{held} held is not an ancestor of.*{other}"):
        open_iceberg("db.r", catalog=cat).write_mds(out, mode="update")

    # the snapshot held expired
    out2 = str(tmp_path / "out2")
    open_iceberg("db.r", catalog=cat).write_mds(out2, SPEC, mode="update")
    t.append(rows(600, 10))
    t = cat.load_table("db.r")
    t.maintenance.expire_snapshots().by_id(other).commit()
    with pytest.raises(IcebergFollowError, match=rf"snapshot {other} held is no longer"):
        open_iceberg("db.r", catalog=cat).write_mds(out2, mode="update")
    assert len(open_dataset(out2)) == 110  # nothing was written

    # since= is the rows new since a snapshot, not a snapshot
    newest = cat.load_table("db.r").current_snapshot().snapshot_id
    with pytest.raises(IcebergFollowError, match=r"since="):
        open_iceberg("db.r", catalog=cat, since=newest).write_mds(
            str(tmp_path / "s"), mode="update"
        )

    # another table into the same path
    u = cat.create_table("db.u", schema=SCHEMA, properties=PROPS)
    u.append(rows(0, 10))
    with pytest.raises(IcebergFollowError, match=r"follows"):
        open_iceberg("db.u", catalog=cat).write_mds(out2, mode="update")


def test_a_format_1_table_is_refused(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    t = cat.create_table("db.v1", schema=SCHEMA, properties={**PROPS, "format-version": "1"})
    t.append(rows(0, 10))
    with pytest.raises(UnsupportedIcebergFeatureError, match=r"db\.v1.*format version 1"):
        open_iceberg("db.v1", catalog=cat).write_mds(str(tmp_path / "o"), mode="update")
