"""Delta column mapping (``name`` and ``id``): physical Parquet columns read back as the
table's logical ones by the export, the in-place dataset and Spark's deltalake path.

Tables are written by deltalake (which writes column-mapped tables: physical names and field
ids in the files, physical keys in ``partitionValues``); renames, drops and added columns are
committed by hand as delta-spark commits them (a new ``metaData`` action), since deltalake
cannot alter a column-mapped schema. deltalake's SQL scan (``QueryBuilder``) is the reference:
its ``to_pyarrow_table()`` reads such tables as nulls.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

deltalake = pytest.importorskip("deltalake")
from deltalake import DeltaTable, QueryBuilder, write_deltalake  # noqa: E402

from spark_dl_core.tables.delta.snapshot import DeltaSnapshotError  # noqa: E402
from spark_dl_core.tables.delta.table import open_delta  # noqa: E402

MODES = ["name", "id"]


def _data(ids: range, extra: bool = False) -> pa.Table:
    cols: dict[str, Any] = {
        "id": pa.array(list(ids), pa.int64()),
        "x": pa.array([i / 2 for i in ids], pa.float32()),
        "name": [f"row{i}" for i in ids],
        "s": pa.array(
            [{"a": i * 10, "b": f"b{i}"} for i in ids],
            pa.struct([("a", pa.int64()), ("b", pa.string())]),
        ),
        "items": pa.array(
            [[{"k": j, "v": f"v{i}.{j}"} for j in range(i % 3)] for i in ids],
            pa.list_(pa.struct([("k", pa.int32()), ("v", pa.string())])),
        ),
        "emb": pa.array([[float(i)] * 4 for i in ids], pa.list_(pa.float32())),
        "p": ["ab"[i % 2] for i in ids],
    }
    return pa.table(cols)


def _latest_metadata(path: str) -> tuple[int, dict[str, Any]]:
    """The table's latest version and metaData action, from its JSON commits."""
    meta: dict[str, Any] = {}
    commits = sorted(Path(path, "_delta_log").glob("*.json"))
    for commit in commits:
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            meta = action.get("metaData", meta)
    return int(commits[-1].stem), meta


def commit_actions(path: str, actions: list[dict[str, Any]], operation: str) -> int:
    version = _latest_metadata(path)[0] + 1
    info = {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": operation}}
    lines = [json.dumps(a) for a in [info, *actions]]
    Path(path, "_delta_log", f"{version:020}.json").write_text("\n".join(lines) + "\n")
    return version


def change_schema(
    path: str, edit: Callable[[list[dict[str, Any]], dict[str, Any]], None], operation: str
) -> int:
    """Commit a new metaData whose schema ``edit(fields, metaData)`` changed in place."""
    _, meta = _latest_metadata(path)
    schema = json.loads(meta["schemaString"])
    edit(schema["fields"], meta)
    meta["schemaString"] = json.dumps(schema)
    return commit_actions(path, [{"metaData": meta}], operation)


def _field(fields: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(f for f in fields if f["name"] == name)


def new_column(meta: dict[str, Any], name: str, type_: Any) -> dict[str, Any]:
    """A field as Delta adds one under column mapping: a fresh physical name, the next id."""
    config = meta["configuration"]
    next_id = int(config["delta.columnMapping.maxColumnId"]) + 1
    config["delta.columnMapping.maxColumnId"] = str(next_id)
    mapping = {
        "delta.columnMapping.id": next_id,
        "delta.columnMapping.physicalName": f"col-{uuid.uuid4()}",
    }
    return {"name": name, "type": type_, "nullable": True, "metadata": mapping}


def reference(path: str, version: int | None = None) -> list[dict[str, Any]]:
    """The rows deltalake's SQL scan reads, sorted by id."""
    table = DeltaTable(path, version=version)
    got = pa.table(QueryBuilder().register("t", table).execute("select * from t").read_all())
    return sorted(got.to_pylist(), key=lambda r: r["id"])


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: r["id"])


def _in_place(snap: Any, **options: Any) -> list[dict[str, Any]]:
    """Every row read in place (unshuffled), as Python values by column."""
    ds = snap.dataset({"nulls": "mask"}, **options)
    rows = [ds[i] for i in range(len(ds))]
    return sorted(rows, key=lambda r: int(r["id"]))


@pytest.fixture(scope="module", params=MODES)
def evolved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A partitioned column-mapped table: written, columns renamed (top-level, nested, the
    partition column), one dropped, two added (top-level, nested), then appended to."""
    mode = request.param
    path = str(tmp_path_factory.mktemp(f"cm_{mode}") / "t")
    config = {"delta.columnMapping.mode": mode}
    write_deltalake(path, _data(range(0, 6)), partition_by=["p"], configuration=config)
    write_deltalake(path, _data(range(6, 10)), partition_by=["p"], mode="append")

    def rename(fields: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        _field(fields, "x")["name"] = "x2"
        _field(_field(fields, "s")["type"]["fields"], "a")["name"] = "alpha"
        _field(fields, "p")["name"] = "part"
        meta["partitionColumns"] = ["part"]

    def drop(fields: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        fields.remove(_field(fields, "name"))

    def add(fields: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        fields.append(new_column(meta, "extra", "string"))
        _field(fields, "s")["type"]["fields"].append(new_column(meta, "c", "long"))

    renamed = change_schema(path, rename, "RENAME COLUMN")
    dropped = change_schema(path, drop, "DROP COLUMNS")
    added = change_schema(path, add, "ADD COLUMNS")
    later = (
        _data(range(10, 14))
        .drop_columns(["name"])
        .rename_columns(["id", "x2", "s", "items", "emb", "part"])
    )
    s = pa.array(
        [{"alpha": i * 10, "b": f"b{i}", "c": -i} for i in range(10, 14)],
        pa.struct([("alpha", pa.int64()), ("b", pa.string()), ("c", pa.int64())]),
    )
    later = later.set_column(2, "s", s).append_column("extra", pa.array(["e"] * 4))
    later = later.select(["id", "x2", "s", "items", "emb", "part", "extra"])
    write_deltalake(path, later, mode="append")
    return {"path": path, "mode": mode, "versions": [1, renamed, dropped, added, added + 1]}


def test_files_hold_physical_names(evolved: Any) -> None:
    """The table exercises mapping: no data file names a column by its logical name."""
    snap = open_delta(evolved["path"])
    assert snap.column_mapping is not None and snap.column_mapping.mode == evolved["mode"]
    for uri in snap.files:
        names = pq.read_schema(uri).names
        assert not set(names) & {"id", "x", "x2", "s", "extra"}, names


def test_every_version_reads_as_deltalake_reads_it(evolved: Any) -> None:
    """Renamed, dropped, added (nulls in older files) and nested columns, partition values
    keyed by physical name: the export path equals deltalake's scan at every version."""
    for version in evolved["versions"]:
        snap = open_delta(evolved["path"], version=version)
        got = _sorted(snap.to_arrow())
        assert got == reference(evolved["path"], version), version
    last = _sorted(open_delta(evolved["path"]).to_arrow())
    assert list(last[0]) == ["id", "x2", "s", "items", "emb", "part", "extra"]
    assert last[0]["s"] == {"alpha": 0, "b": "b0", "c": None} and last[0]["extra"] is None
    assert last[-1]["s"] == {"alpha": 130, "b": "b13", "c": -13} and last[-1]["extra"] == "e"
    assert [r["part"] for r in last[:3]] == ["a", "b", "a"]


def test_in_place_reads_the_logical_columns(evolved: Any, tmp_path: Path) -> None:
    snap = open_delta(evolved["path"])
    expected = reference(evolved["path"])
    got = _in_place(snap, cache_dir=str(tmp_path))
    assert [int(r["id"]) for r in got] == [r["id"] for r in expected]
    assert [r["s"] for r in got] == [r["s"] for r in expected]
    assert [None if r["extra__isnull"] else r["extra"] for r in got] == [
        r["extra"] for r in expected
    ]
    assert [r["part"] for r in got] == [r["part"] for r in expected]
    np.testing.assert_allclose([float(r["x2"]) for r in got], [r["x2"] for r in expected])
    # the list column's dense width comes from the footers, found by physical name
    ds = snap.dataset({"nulls": "mask"}, cache=False)
    assert ds.forms["emb"] == ("dense", (4,))
    batches = list(ds.iter_batches(5, shuffle=True, seed=3))
    assert sorted(int(i) for b in batches for i in b["id"]) == list(range(14))


def test_export_to_mds_reads_back_the_logical_columns(evolved: Any, tmp_path: Path) -> None:
    from spark_dl_core import open_dataset

    snap = open_delta(evolved["path"])
    snap.write_mds(str(tmp_path / "mds"), {"nulls": "mask"})
    ds = open_dataset(str(tmp_path / "mds"))
    rows = sorted((ds[i] for i in range(len(ds))), key=lambda r: int(r["id"]))
    expected = reference(evolved["path"])
    assert [None if r["extra__isnull"] else r["extra"] for r in rows] == [
        r["extra"] for r in expected
    ]
    assert [r["s"] for r in rows] == [r["s"] for r in expected]


def _mapped_field(f: dict[str, Any], name: str | None = None) -> pa.Field:
    """A log field as a column-mapped writer stores it: physical name (or ``name``), field id."""
    types = {"long": pa.int64(), "double": pa.float64(), "string": pa.string()}
    meta = f["metadata"]
    field_id = {b"PARQUET:field_id": str(meta["delta.columnMapping.id"]).encode()}
    physical = name or meta["delta.columnMapping.physicalName"]
    return pa.field(physical, types[f["type"]], True, field_id)


def add_file(path: str, columns: dict[str, tuple[pa.Field, list[Any]]]) -> tuple[int, str]:
    """Commit a Parquet file written by pyarrow holding exactly ``columns``."""
    rel = f"part-{uuid.uuid4()}.parquet"
    table = pa.table({n: pa.array(v, f.type) for n, (f, v) in columns.items()})
    table = table.cast(pa.schema([f for f, _ in columns.values()]))
    pq.write_table(table, Path(path, rel))
    add = {"path": rel, "partitionValues": {}, "size": Path(path, rel).stat().st_size}
    add |= {"modificationTime": 0, "dataChange": True}
    return commit_actions(path, [{"add": add}], "WRITE"), rel


def _simple(path: str, mode: str) -> list[dict[str, Any]]:
    data = pa.table({"id": pa.array([0, 1], pa.int64()), "x": [0.5, 1.5], "name": ["a", "b"]})
    write_deltalake(path, data, configuration={"delta.columnMapping.mode": mode})
    return json.loads(_latest_metadata(path)[1]["schemaString"])["fields"]


@pytest.mark.parametrize("mode", MODES)
def test_a_file_lacking_an_older_column_is_refused(mode: str, tmp_path: Path) -> None:
    """The file holds ids 1 and 3 but not 2 ('x'): it was written when 'x' existed, so nulls
    would be wrong data. Export and in-place read name table, version, file and column."""
    path = str(tmp_path / "t")
    fields = _simple(path, mode)
    ident, _, name = (_mapped_field(f) for f in fields)
    version, rel = add_file(path, {ident.name: (ident, [7]), name.name: (name, ["c"])})
    snap = open_delta(path)
    pattern = rf"{path}'? at version {version}: data file .*{rel}.* has no column for 'x'"
    with pytest.raises(DeltaSnapshotError, match=pattern):
        snap.to_arrow()
    with pytest.raises(DeltaSnapshotError, match=pattern):
        snap.dataset(cache=False)


def test_id_mode_resolves_by_field_id_not_by_name(tmp_path: Path) -> None:
    """In id mode a file whose columns carry other names but the right field ids reads by
    id (e.g. files converted from Iceberg); a file without field ids is refused."""
    path = str(tmp_path / "t")
    fields = _simple(path, "id")
    ident, x, name = (_mapped_field(f, f"other_{f['name']}") for f in fields)
    # the physical names of x and name swapped: by name, each would read the other's values
    swapped_x = _mapped_field(fields[1], fields[2]["metadata"]["delta.columnMapping.physicalName"])
    swapped_name = _mapped_field(
        fields[2], fields[1]["metadata"]["delta.columnMapping.physicalName"]
    )
    add_file(path, {ident.name: (ident, [2]), x.name: (x, [2.5]), name.name: (name, ["c"])})
    add_file(
        path,
        {
            ident.name: (ident, [3]),
            swapped_x.name: (swapped_x, [3.5]),
            swapped_name.name: (swapped_name, ["d"]),
        },
    )
    snap = open_delta(path)
    expected = [
        {"id": 0, "x": 0.5, "name": "a"},
        {"id": 1, "x": 1.5, "name": "b"},
        {"id": 2, "x": 2.5, "name": "c"},
        {"id": 3, "x": 3.5, "name": "d"},
    ]
    assert _sorted(snap.to_arrow()) == expected
    got = _in_place(snap, cache=False)
    assert [(int(r["id"]), float(r["x"]), r["name"]) for r in got] == [
        tuple(r.values()) for r in expected
    ]
    plain = pa.field("id", pa.int64())
    _, rel = add_file(path, {"id": (plain, [4])})
    with pytest.raises(DeltaSnapshotError, match=rf"{rel} has no Parquet field ids"):
        open_delta(path).to_arrow()


def test_a_dropped_then_readded_column_is_not_served_from_the_cache(tmp_path: Path) -> None:
    """'x' dropped and added again under the same name and type is a new column (a new
    physical name): older files read it as nulls. The converted-row-group cache and the
    fingerprint key on the mapping, so the old version's cached 'x' is not served."""
    path = str(tmp_path / "t")
    _simple(path, "name")
    cache = str(tmp_path / "cache")
    spec = {"nulls": "mask"}
    before = open_delta(path, version=0)
    assert [float(r["x"]) for r in _in_place(before, cache_dir=cache)] == [0.5, 1.5]

    def drop(fields: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        fields.remove(_field(fields, "x"))

    def add(fields: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        fields.insert(1, new_column(meta, "x", "double"))

    change_schema(path, drop, "DROP COLUMNS")
    change_schema(path, add, "ADD COLUMNS")
    after = open_delta(path)
    assert reference(path)[0]["x"] is None
    assert after.to_arrow().column("x").null_count == 2
    assert [bool(r["x__isnull"]) for r in _in_place(after, cache_dir=cache)] == [True, True]
    assert after.dataset(spec).fingerprint != before.dataset(spec).fingerprint


def _spark_rows(df: Any) -> list[dict[str, Any]]:
    rows = (r.asDict(recursive=True) for r in df.collect())
    return sorted(rows, key=lambda r: r["id"])


@pytest.mark.spark
def test_read_delta_deltalake_path_reads_the_logical_columns(spark: Any, evolved: Any) -> None:
    """Spark reads the files by physical name and renames: the same rows as deltalake's
    scan, without a trip through driver memory."""
    from spark_dl.delta import lineage_for, read_delta

    expected = reference(evolved["path"])
    # the fallback for sessions without delta-spark, and Delta's own reader as the oracle
    for engine, reader in (("deltalake", "spark-parquet"), ("spark", "delta-spark")):
        df = read_delta(spark, evolved["path"], engine=engine)  # type: ignore[arg-type]
        assert df.columns == list(expected[0])
        got = _spark_rows(df)
        assert [r["s"] for r in got] == [r["s"] for r in expected], engine
        assert [r["items"] for r in got] == [r["items"] for r in expected], engine
        assert [(r["id"], r["extra"], r["part"]) for r in got] == [
            (r["id"], r["extra"], r["part"]) for r in expected
        ], engine
        assert lineage_for(df)["reader"] == reader  # type: ignore[index]


@pytest.mark.spark
def test_read_delta_id_mode_names_that_disagree_go_through_arrow(
    classic_spark: Any, tmp_path: Path
) -> None:
    """In id mode, a file whose physical names name other columns than its field ids would
    be read wrong by Spark's by-name scan: that snapshot is read through Arrow, by id."""
    from spark_dl.delta import lineage_for, read_delta

    path = str(tmp_path / "t")
    fields = _simple(path, "id")
    names = [f["metadata"]["delta.columnMapping.physicalName"] for f in fields]
    ident = _mapped_field(fields[0])
    x, name = _mapped_field(fields[1], names[2]), _mapped_field(fields[2], names[1])
    add_file(path, {ident.name: (ident, [3]), x.name: (x, [3.5]), name.name: (name, ["d"])})
    df = read_delta(classic_spark, path, engine="deltalake")
    assert _spark_rows(df)[-1] == {"id": 3, "x": 3.5, "name": "d"}
    assert lineage_for(df)["reader"] == "spark-arrow"  # type: ignore[index]
