"""Iceberg tables read in place (row groups as shards, through the Parquet layer): every
snapshot of real tables written by PyIceberg (appends, merge-on-read position deletes,
copy-on-write deletes and overwrites, renamed, added and dropped columns, type promotion,
identity and transform partitions) reads PyIceberg's own rows (``scan(snapshot_id=...)
.to_arrow()``, the oracle), in one canonical order that a fresh process, any world size and
a resume share."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

pytest.importorskip("pyiceberg")
from iceberg_helpers import catalog, equality_deletes, position_deletes
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    TruncateTransform,
)
from pyiceberg.types import DoubleType, LongType

from spark_dl_core import SpecError, mix, open_dataset, write_mds
from spark_dl_core.mixture.spec import Source
from spark_dl_core.tables.iceberg.errors import (
    IcebergSnapshotError,
)
from spark_dl_core.tables.iceberg.table import open_iceberg

GROUP = 90  # rows per Parquet row group: every file holds several
ROWS = 400
PROPS = {"write.parquet.row-group-limit": str(GROUP)}
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("emb", pa.list_(pa.field("element", pa.float32(), False)), False),
        pa.field("name", pa.string(), False),
        pa.field("part", pa.string(), False),
        pa.field("n", pa.int32(), False),
    ]
)


def _data(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n)
    return pa.table(
        {
            "id": ids.astype(np.int64),
            "emb": [[float(i) / (j + 1) for j in range(8)] for i in ids],
            "name": [f"row{i}" for i in ids],
            "part": ["ab"[i % 2] for i in ids],
            "n": (ids % 7).astype(np.int32),
        },
        schema=SCHEMA,
    )


def _by_part(table: Any, ids: set[int]) -> list[dict[str, list[int]]]:
    """Positions of rows ``ids`` in each live data file, one dict per partition."""
    per: dict[str, dict[str, list[int]]] = {}
    for task in table.scan().plan_files():
        rows = pa.parquet.read_table(task.file.file_path[len("file://") :], columns=["id"])
        hit = [k for k, i in enumerate(rows["id"].to_pylist()) if i in ids]
        if hit:
            per.setdefault(str(task.file.partition), {})[task.file.file_path] = hit
    return list(per.values())


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Appends into an identity-partitioned table, position deletes after each, a
    copy-on-write delete, then a rename, an added column, a promoted type and an append."""
    import pyarrow.parquet  # noqa: F401  (pa.parquet in _by_part)

    cat = catalog(tmp_path_factory.mktemp("iceberg"))
    t = cat.create_table("db.t", schema=SCHEMA, properties=PROPS)
    with t.update_spec() as update:
        update.add_identity("part")
    for k in range(3):
        t.append(_data(k * ROWS, ROWS))
        for deletes in _by_part(t, {k * ROWS + d for d in (0, 5, 91, 92, 150 + k)}):
            position_deletes(t, deletes)
        t = cat.load_table("db.t")
    t.delete("id < 40")  # copy-on-write: files rewritten
    t = cat.load_table("db.t")
    with t.update_schema() as update:
        update.rename_column("name", "label")
        update.add_column("score", DoubleType())
        update.update_column("n", LongType())  # int -> long
    t = cat.load_table("db.t")
    more = _data(3 * ROWS, 200).rename_columns(["id", "emb", "label", "part", "n"])
    more = more.append_column("score", pa.array(np.arange(200) / 2.0))
    t.append(more.cast(t.schema().as_arrow()))
    t = cat.load_table("db.t")
    return {"catalog": cat, "table": t, "snapshots": [s.snapshot_id for s in t.snapshots()]}


COLS = ["id", "emb", "label", "n"]  # the current snapshot's columns without nulls


def _oracle(t: Any, snapshot_id: int) -> list[dict[str, Any]]:
    rows = t.scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
    return sorted(rows, key=lambda r: r["id"])


def _ids(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in np.asarray(b["id"])]


def test_every_snapshot_reads_pyicebergs_rows(table: dict[str, Any]) -> None:
    t, cat = table["table"], table["catalog"]
    assert len(table["snapshots"]) >= 9
    for sid in table["snapshots"]:
        snap = open_iceberg("db.t", catalog=cat, snapshot_id=sid)
        want = _oracle(t, sid)
        exported = sorted(snap.to_arrow().to_pylist(), key=lambda r: r["id"])
        assert exported == want, sid  # every row, every column, nulls included
        ds = snap.dataset({"nulls": "mask"})
        assert len(ds) == len(want)
        got = ds.to_arrow()
        order = np.argsort(got["id"].to_numpy())
        for name in ("id", "label" if "label" in snap.schema.names else "name", "part", "n"):
            assert [got[name][int(i)].as_py() for i in order] == [r[name] for r in want]
        emb = np.stack([np.asarray(got["emb"][int(i)].as_py()) for i in order]) if want else []
        assert np.array_equal(emb, np.array([r["emb"] for r in want], dtype=np.float32))
    snap = open_iceberg("db.t", catalog=cat)
    assert snap.deleted_rows() and snap.dataset().num_shards > len(snap.files) >= 6


def test_schema_evolution_by_field_id(table: dict[str, Any]) -> None:
    snap = open_iceberg("db.t", catalog=table["catalog"])
    assert snap.schema.names == ["id", "emb", "label", "part", "n", "score"]
    assert snap.schema.field("n").type == pa.int64()
    rows = {r["id"]: r for r in snap.to_arrow().to_pylist()}
    assert rows[100]["label"] == "row100" and rows[100]["score"] is None  # older file
    assert rows[3 * ROWS + 4]["score"] == 2.0
    older = open_iceberg("db.t", catalog=table["catalog"], snapshot_id=table["snapshots"][0])
    assert older.schema.names == ["id", "emb", "name", "part", "n"] and older.schema_id == 0
    assert older.lineage()["schema_id"] == 0 and snap.lineage()["schema_id"] == snap.schema_id > 0


def test_partition_transforms_are_real_columns(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), False),
            pa.field("ts", pa.timestamp("us", tz="UTC"), False),
            pa.field("tag", pa.string(), False),
        ]
    )
    t = cat.create_table("db.p", schema=schema, properties=PROPS)
    with t.update_spec() as update:
        update.add_field("id", BucketTransform(4), "id_bucket")
        update.add_field("ts", DayTransform(), "ts_day")
        update.add_field("tag", TruncateTransform(2), "tag_trunc")
    start = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
    ids = np.arange(600)
    data = pa.table(
        {
            "id": ids,
            "ts": [start + dt.timedelta(hours=int(i) * 7) for i in ids],
            "tag": [f"{'xyz'[i % 3]}{i % 5}tail" for i in ids],
        },
        schema=schema,
    )
    t.append(data)
    t = cat.load_table("db.p")
    for deletes in _by_part(t, set(range(0, 600, 37))):
        position_deletes(t, deletes)
    t = cat.load_table("db.p")
    snap = open_iceberg("db.p", catalog=cat)
    assert len(snap.files) > 10
    want = _oracle(t, snap.version)
    assert len(want) == 600 - len(range(0, 600, 37))
    assert sorted(snap.to_arrow().to_pylist(), key=lambda r: r["id"]) == want
    got = snap.dataset().to_arrow()
    assert sorted(got["id"].to_pylist()) == [r["id"] for r in want]
    assert sorted(got["tag"].to_pylist()) == sorted(r["tag"] for r in want)
    # partition evolution: the three fields dropped, an identity field added; the
    # files of both specs read together, deletes scoped by each file's own spec
    with t.update_spec() as update:
        update.remove_field("ts_day")
        update.remove_field("id_bucket")
        update.remove_field("tag_trunc")
        update.add_identity("tag")
    t = cat.load_table("db.p")
    ids = pa.array(range(600, 700), pa.int64())
    more = data.slice(0, 100).set_column(0, schema.field("id"), ids)
    t.append(more)
    t = cat.load_table("db.p")
    spec = t.metadata.default_spec_id
    new_file = next(x.file.file_path for x in t.scan().plan_files() if x.file.spec_id == spec)
    position_deletes(t, {new_file: [0]})
    t = cat.load_table("db.p")
    evolved = open_iceberg("db.p", catalog=cat)
    want = _oracle(t, evolved.version)
    assert len(want) == len(snap) + 99
    assert sorted(evolved.to_arrow().to_pylist(), key=lambda r: r["id"]) == want
    assert sorted(evolved.dataset().to_arrow()["id"].to_pylist()) == [r["id"] for r in want]


def test_same_order_fresh_process_and_any_world_size(table: dict[str, Any]) -> None:
    snap = open_iceberg(table["table"].metadata_location, columns=COLS)
    mine = _ids(snap.iter_batches(50, shuffle=True, seed=11))
    assert sorted(mine) == sorted(r["id"] for r in _oracle(table["table"], snap.version))
    code = (
        "import json,sys; from spark_dl_core.tables.iceberg.table import open_iceberg; "
        f"s=open_iceberg(sys.argv[1], columns={COLS!r}); print(json.dumps([s.fingerprint, "
        "[int(i) for b in s.iter_batches(50, shuffle=True, seed=11) for i in b['id']]]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, snap.metadata_location],
        capture_output=True,
        text=True,
        check=True,
    )
    fingerprint, theirs = json.loads(out.stdout)
    assert fingerprint == snap.fingerprint and theirs == mine
    by_catalog = open_iceberg("db.t", catalog=table["catalog"], columns=COLS)
    assert by_catalog.fingerprint == snap.fingerprint  # the same snapshot, however opened
    for world in (2, 3):
        ranks = [
            _ids(
                snap.iter_batches(
                    50, shuffle=True, seed=11, rank=r, world_size=world, even_batches=False
                )
            )
            for r in range(world)
        ]
        assert sorted(i for r in ranks for i in r) == sorted(mine)


def test_resume_at_another_world_size(table: dict[str, Any]) -> None:
    pytest.importorskip("torch")
    cat = table["catalog"]
    snap = open_iceberg("db.t", catalog=cat, columns=COLS)
    kw = {"batch_size": 40, "shuffle": True, "seed": 9, "even_batches": False}
    seen, states = [], []
    for r in range(2):
        loader = snap.to_torch(rank=r, world_size=2, **kw)
        it = iter(loader)
        for _ in range(4):
            seen += [int(i) for i in next(it)["id"]]
        states.append(json.loads(json.dumps(loader.state_dict())))
    assert states[0] == states[1] and states[0]["consumed"] == len(seen)
    rest = []
    again = open_iceberg("db.t", catalog=cat, columns=COLS)  # a fresh open, as a restarted job does
    for r in range(3):
        loader = again.to_torch(rank=r, world_size=3, **kw)
        loader.load_state_dict(states[0])
        rest += [int(i) for b in loader for i in b["id"]]
    counts = Counter(seen + rest)
    assert sorted(counts) == sorted(r["id"] for r in _oracle(table["table"], snap.version))
    assert set(counts.values()) == {1}
    older = open_iceberg(
        "db.t", catalog=cat, snapshot_id=table["snapshots"][-2], columns=["id", "emb", "name"]
    )
    assert older.fingerprint != again.fingerprint
    loader = older.to_torch(**kw)
    with pytest.raises(SpecError, match="loader state is for dataset"):
        loader.load_state_dict(states[0])
        next(iter(loader))


def test_pins_by_id_timestamp_and_ref(table: dict[str, Any]) -> None:
    cat, t = table["catalog"], table["table"]
    first = t.snapshots()[0]
    t.manage_snapshots().create_tag(first.snapshot_id, "v1").commit()
    tagged = open_iceberg("db.t", catalog=cat, ref="v1")
    pinned = open_iceberg("db.t", catalog=cat, snapshot_id=first.snapshot_id)
    assert tagged.version == pinned.version == first.snapshot_id
    assert tagged.fingerprint == pinned.fingerprint and len(tagged) == ROWS  # before deletes
    last = t.snapshots()[-1]  # the newest: no later snapshot shares its millisecond
    when = dt.datetime.fromtimestamp(last.timestamp_ms / 1000, dt.timezone.utc)
    at = open_iceberg("db.t", catalog=cat, timestamp=when.isoformat(), columns=COLS)
    assert at.version == last.snapshot_id == open_iceberg("db.t", catalog=cat).version
    assert tagged.lineage()["ref"] == "v1" and tagged.lineage()["kind"] == "iceberg"
    with pytest.raises(IcebergSnapshotError, match=r"test\.db\.t.*no snapshot for snapshot_id=1"):
        open_iceberg("db.t", catalog=cat, snapshot_id=1)
    with pytest.raises(SpecError, match="at most one"):
        open_iceberg("db.t", catalog=cat, snapshot_id=first.snapshot_id, ref="v1")
    with pytest.raises(IcebergSnapshotError, match="has no column"):
        open_iceberg("db.t", catalog=cat, columns=["nope"])


def test_sample_columns_and_export(table: dict[str, Any], tmp_path: Path) -> None:
    snap = open_iceberg("db.t", catalog=table["catalog"], columns=["id", "emb", "label"])
    assert snap.columns == {"id": "int64", "emb": "ndarray:float32", "label": "str"}
    order = snap.sample_order(32, shuffle=True, seed=2)
    batch = next(iter(snap.iter_batches(32, shuffle=True, seed=2)))
    for k, i in enumerate(order[0][:5].tolist()):
        sample = snap[i]
        assert sample["id"] == batch["id"][k] and sample["label"] == batch["label"][k]
        assert np.array_equal(sample["emb"], batch["emb"][k])
    snap.write_mds(str(tmp_path / "out"))
    out = open_dataset(str(tmp_path / "out"))
    assert out.source == snap.lineage() and len(out) == len(snap)
    assert _ids(out.iter_batches(64)) == _ids(snap.iter_batches(64))  # one canonical order
    filtered = open_iceberg(
        "db.t", catalog=table["catalog"], columns=["id"], filter=pc.field("id") > 500
    )
    assert _ids(filtered.iter_batches(64)) == [i for i in _ids(snap.iter_batches(64)) if i > 500]


def test_mix_with_an_mds_dataset(table: dict[str, Any], tmp_path: Path) -> None:
    snap = open_iceberg("db.t", catalog=table["catalog"], columns=["id", "label"])
    other = pa.table({"id": pa.array(range(10_000, 10_300), pa.int64()), "label": ["m"] * 300})
    write_mds(other, str(tmp_path / "mds"))
    m = mix([Source(snap, proportion=0.5), Source(str(tmp_path / "mds"), proportion=0.5)])
    ids = _ids(m.iter_batches(64, shuffle=True, seed=1))
    assert len(ids) == len(m) == len(snap) + 300
    assert m.lineage[0]["lineage"]["snapshot_id"] == snap.version
    from spark_dl_core import open_mixture

    saved = tmp_path / "mixture.json"
    m.save(str(saved))  # the snapshot by its metadata file and id
    assert json.loads(saved.read_text())["sources"][0]["iceberg"]["snapshot_id"] == snap.version
    again = open_mixture(str(saved))
    assert again.fingerprint == m.fingerprint
    assert _ids(again.iter_batches(64, shuffle=True, seed=1)) == ids


def test_equality_deletes_are_applied(tmp_path: Path) -> None:
    """Equality deletes (which PyIceberg refuses to read): on one key, on two keys with a
    null matching a null, scoped by sequence number (rows appended after the delete stay)
    and by partition."""
    cat = catalog(tmp_path)
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("tag", pa.string())])
    t = cat.create_table("db.e", schema=schema, properties=PROPS)
    tags = [None if i % 10 == 0 else "xy"[i % 2] for i in range(300)]
    t.append(pa.table({"id": pa.array(range(300), pa.int64()), "tag": tags}, schema=schema))
    equality_deletes(cat.load_table("db.e"), pa.table({"id": pa.array([3, 4, 250], pa.int64())}))
    two = pa.table({"id": pa.array([10, 11, 12], pa.int64()), "tag": [None, "y", "y"]})
    equality_deletes(cat.load_table("db.e"), two)  # 10 (null = null) and 11; 12 is "x"
    t = cat.load_table("db.e")
    t.append(pa.table({"id": pa.array([3, 4], pa.int64()), "tag": ["new", "new"]}, schema=schema))
    snap = open_iceberg("db.e", catalog=cat)
    want = sorted([i for i in range(300) if i not in {3, 4, 250, 10, 11}] + [3, 4])
    assert sorted(snap.to_arrow()["id"].to_pylist()) == want
    ds = snap.dataset({"nulls": "mask"})
    assert sorted(ds.to_arrow()["id"].to_pylist()) == want and len(snap) == len(want)
    with pytest.raises(ValueError, match="equality deletes"):
        t.scan().to_arrow()  # the oracle cannot read this table: the expected rows are built

    # partitioned: an equality delete scoped to one partition leaves the others' rows
    p = cat.create_table("db.ep", schema=schema, properties=PROPS)
    with p.update_spec() as update:
        update.add_identity("tag")
    data = pa.table(
        {"id": pa.array(range(40), pa.int64()), "tag": ["xy"[i % 2] for i in range(40)]}
    )
    p.append(data.cast(schema))
    p = cat.load_table("db.ep")
    in_x = next(t.file.file_path for t in p.scan().plan_files() if t.file.partition[0] == "x")
    equality_deletes(p, pa.table({"id": pa.array([2, 3, 4], pa.int64())}), partition_of=in_x)
    got = sorted(open_iceberg("db.ep", catalog=cat).to_arrow()["id"].to_pylist())
    assert got == [i for i in range(40) if i not in {2, 4}]  # 3 is in partition "y"


def test_missing_or_truncated_data_file_names_it(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    t = cat.create_table("db.m", schema=SCHEMA, properties=PROPS)
    t.append(_data(0, 300))
    snap = open_iceberg("db.m", catalog=cat)
    victim = Path(snap.files[0][len("file://") :])
    victim.write_bytes(victim.read_bytes()[:-10])
    with pytest.raises(
        IcebergSnapshotError, match=rf"snapshot {snap.version}.*{victim.name}.*trunc"
    ):
        open_iceberg("db.m", catalog=cat)
    victim.unlink()
    with pytest.raises(IcebergSnapshotError, match=rf"{victim.name} is missing"):
        open_iceberg("db.m", catalog=cat)


def test_expired_snapshot_and_damaged_manifest_are_named(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    t = cat.create_table("db.x", schema=SCHEMA, properties=PROPS)
    t.append(_data(0, 100))
    first = cat.load_table("db.x").current_snapshot().snapshot_id
    t = cat.load_table("db.x")
    t.append(_data(100, 100))
    t = cat.load_table("db.x")
    t.maintenance.expire_snapshots().by_id(first).commit()
    with pytest.raises(IcebergSnapshotError, match=rf"db\.x.*no snapshot for snapshot_id={first}"):
        open_iceberg("db.x", catalog=cat, snapshot_id=first)
    snap = open_iceberg("db.x", catalog=cat)
    assert len(snap) == 200
    manifest_list = cat.load_table("db.x").current_snapshot().manifest_list
    Path(manifest_list[len("file://") :]).write_bytes(b"not avro")
    with pytest.raises(IcebergSnapshotError, match=rf"snapshot {snap.version}.*manifests cannot"):
        open_iceberg("db.x", catalog=cat)


def test_nested_columns_and_timestamps_and_a_nested_rename(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    point = pa.struct([pa.field("x", pa.float64(), False), pa.field("y", pa.float64(), False)])
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), False),
            pa.field("ts", pa.timestamp("us", tz="UTC"), False),
            pa.field("local", pa.timestamp("us"), False),
            pa.field("pt", point, False),
            pa.field("tags", pa.list_(pa.field("element", pa.string(), False)), False),
        ]
    )
    t = cat.create_table("db.n", schema=schema, properties=PROPS)
    start = dt.datetime(2024, 1, 1)
    rows = {
        "id": range(200),
        "ts": [start.replace(tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i) for i in range(200)],
        "local": [start + dt.timedelta(minutes=i) for i in range(200)],
        "pt": [{"x": i * 1.0, "y": -i * 1.0} for i in range(200)],
        "tags": [["a", "b"][: i % 3] for i in range(200)],
    }
    t.append(pa.table(rows, schema=schema))
    first = cat.load_table("db.n").current_snapshot().snapshot_id
    with cat.load_table("db.n").update_schema() as update:
        update.rename_column("pt.x", "px")  # a schema change alone: no new snapshot
    t = cat.load_table("db.n")
    now = open_iceberg("db.n", catalog=cat)  # the table's schema: px
    assert now.version == first and now.to_arrow().to_pylist() == t.scan().to_arrow().to_pylist()
    assert now.to_arrow()["pt"][0].as_py() == {"px": 0.0, "y": -0.0}
    then = open_iceberg("db.n", catalog=cat, snapshot_id=first)  # the snapshot's schema: x
    assert then.to_arrow().to_pylist() == t.scan(snapshot_id=first).to_arrow().to_pylist()
    assert then.to_arrow()["pt"][0].as_py() == {"x": 0.0, "y": -0.0}
    assert now.fingerprint != then.fingerprint
    got = now.dataset().to_arrow()
    assert got["id"].to_pylist() == list(range(200)) and len(now) == 200


def test_since_an_earlier_snapshot_reads_the_rows_appended_since(table: dict[str, Any]) -> None:
    cat, t = table["catalog"], table["table"]
    snaps = t.snapshots()
    ops = [(s.summary.operation.value, int(s.summary.get("added-data-files") or 0)) for s in snaps]
    rewrite = next(k for k, (op, added) in enumerate(ops) if op != "append" and added)
    before = snaps[rewrite - 1].snapshot_id  # appends and position deletes up to here
    new = open_iceberg(
        "db.t", catalog=cat, snapshot_id=before, since=snaps[0].snapshot_id, columns=["id"]
    )
    want = [r["id"] for r in _oracle(t, before) if r["id"] >= ROWS]  # appends 2 and 3, live
    assert sorted(new.to_arrow()["id"].to_pylist()) == want
    assert sorted(_ids(new.iter_batches(64))) == want and len(new) == len(want)
    assert new.lineage()["since"] == snaps[0].snapshot_id and ".." in new.shown
    whole = open_iceberg("db.t", catalog=cat, snapshot_id=before, columns=["id"])
    assert new.fingerprint != whole.fingerprint
    last = open_iceberg("db.t", catalog=cat, since=snaps[rewrite].snapshot_id, columns=["id"])
    assert sorted(last.to_arrow()["id"].to_pylist()) == list(range(3 * ROWS, 3 * ROWS + 200))
    with pytest.raises(IcebergSnapshotError, match=r"since=.*rewrites data files"):
        open_iceberg("db.t", catalog=cat, since=snaps[0].snapshot_id)
    with pytest.raises(IcebergSnapshotError, match="not an ancestor"):
        open_iceberg("db.t", catalog=cat, snapshot_id=before, since=snaps[-1].snapshot_id)


def _plans_run() -> int:
    from spark_dl_core.tables.iceberg import deletes

    return deletes.plans_run


def test_a_warm_open_is_served_the_cached_plan(table: dict[str, Any], tmp_path: Path) -> None:
    """A second open of a snapshot takes its planned files and deletes from the plan cache
    (PyIceberg's planner not run again) and reads the same rows as the first and as
    PyIceberg's scan, in the same order; ``plan_cache=False`` plans and stores nothing."""
    cat, t = table["catalog"], table["table"]
    plans, cols = str(tmp_path / "plans"), ["id", "emb", "n"]  # in every snapshot, no nulls
    for sid in (table["snapshots"][1], table["snapshots"][-1]):  # position deletes in both
        cold = open_iceberg("db.t", catalog=cat, snapshot_id=sid, plan_cache=plans, columns=cols)
        ran = _plans_run()
        warm = open_iceberg("db.t", catalog=cat, snapshot_id=sid, plan_cache=plans, columns=cols)
        assert _plans_run() == ran  # not planned again
        assert warm.files == cold.files and warm.deleted_rows() == cold.deleted_rows() != {}
        assert warm.to_arrow().equals(cold.to_arrow())
        oracle = [{c: r[c] for c in cols} for r in _oracle(t, sid)]
        assert sorted(warm.to_arrow().to_pylist(), key=lambda r: r["id"]) == oracle
        assert _ids(warm.iter_batches(64)) == _ids(cold.iter_batches(64))
        assert warm.fingerprint == cold.fingerprint
    off = tmp_path / "off"
    open_iceberg("db.t", catalog=cat, plan_cache=False)
    ran = _plans_run()
    open_iceberg("db.t", catalog=cat, plan_cache=False)
    assert _plans_run() == ran + 1 and not off.exists()


def test_a_new_snapshot_or_a_damaged_plan_is_planned_again(tmp_path: Path) -> None:
    """The cache is keyed by snapshot and manifest list: a commit's new snapshot is planned
    (its new rows and deletes read), the old one still served; a cached plan that is cut,
    altered or holds another snapshot's files is planned again, never read as rows."""
    import pyarrow.parquet as pq

    cat = catalog(tmp_path)
    schema = pa.schema([pa.field("id", pa.int64(), False)])
    t = cat.create_table("db.c", schema=schema)
    t.append(pa.table({"id": pa.array(range(100), pa.int64())}, schema=schema))
    t = cat.load_table("db.c")
    first = t.current_snapshot().snapshot_id
    plans = tmp_path / "plans"

    def ids(**pin: Any) -> list[int]:
        snap = open_iceberg("db.c", catalog=cat, plan_cache=str(plans), **pin)
        return sorted(snap.to_arrow()["id"].to_pylist())

    assert ids() == list(range(100))
    path = next(p.file.file_path for p in t.scan().plan_files())
    assert pq.read_table(path.removeprefix("file://")).num_rows == 100
    position_deletes(t, {path: [1, 2]})
    t = cat.load_table("db.c")
    t.append(pa.table({"id": pa.array(range(100, 150), pa.int64())}, schema=schema))
    ran = _plans_run()
    want = [i for i in range(150) if i not in (1, 2)]
    assert ids() == want and _plans_run() == ran + 1  # the new snapshot: planned
    assert ids(snapshot_id=first) == list(range(100)) and _plans_run() == ran + 1  # cached
    assert ids(since=first) == list(range(100, 150)) and _plans_run() == ran + 1  # both cached
    current = cat.load_table("db.c").current_snapshot().snapshot_id
    entry = plans / f"iceberg-{current}.plan"
    whole = entry.read_bytes()
    older = (plans / f"iceberg-{first}.plan").read_bytes()
    flipped = bytearray(whole)
    flipped[len(whole) // 2] ^= 0xFF
    for damaged in (whole[:-9], bytes(flipped), older, b""):  # cut, altered, another's
        entry.write_bytes(damaged)
        ran = _plans_run()
        assert ids() == want and _plans_run() == ran + 1
        assert entry.read_bytes() == whole  # written again whole
