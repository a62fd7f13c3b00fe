"""Iceberg tables on S3 read in place: a real S3-compatible server (moto, its own process on
loopback), a table written there by PyIceberg (SQL catalog, ``s3://`` warehouse) with a
merge-on-read position delete and an equality delete; every snapshot read in place equals
PyIceberg's own read, a second epoch comes from the node's span cache, faults are typed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
pytest.importorskip("torch")
pytest.importorskip("pyiceberg")

from iceberg_helpers import equality_deletes, position_deletes
from pyiceberg.catalog.sql import SqlCatalog
from s3_helpers import aws_test_env, endpoint_options, moto_process

from spark_dl_core.tables.iceberg.errors import (
    IcebergSnapshotError,
    UnsupportedIcebergFeatureError,
)
from spark_dl_core.tables.iceberg.snapshot import IcebergSnapshot, _scheme_check
from spark_dl_core.tables.iceberg.table import _io_properties, open_iceberg, reopen_in_place

PER = 300


def _rows(start: int) -> pa.Table:
    ids = np.arange(start, start + PER, dtype=np.int64)
    return pa.table({"id": ids, "x": (ids * 0.5).astype(np.float64)})


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The bucket's s3fs filesystem, fsspec storage options, and a SQL catalog whose
    warehouse is on the bucket."""
    with moto_process() as (host, port), aws_test_env():
        import s3fs

        options = endpoint_options(host, port)
        fs = s3fs.S3FileSystem(**options)
        fs.call_s3("create_bucket", Bucket="bucket")
        where = tmp_path_factory.mktemp("catalog")
        cat = SqlCatalog(
            "remote",
            uri=f"sqlite:///{where}/catalog.db",
            warehouse="s3://bucket/wh",
            **_io_properties("s3://bucket", {**options, "key": "testing", "secret": "testing"}),
        )
        cat.create_namespace("db")
        yield fs, options, cat


@pytest.fixture(scope="module")
def table(s3: Any) -> Any:
    """Snapshots: an append; a position delete; an append; an equality delete."""
    _fs, _options, cat = s3
    t = cat.create_table("db.t", schema=_rows(0).schema)
    t.append(_rows(0))
    first = t.scan().plan_files()[0].file.file_path
    position_deletes(t, {first: [1, 5, 7]})
    t.append(_rows(PER))
    equality_deletes(t, pa.table({"id": pa.array([PER + 2, 10], pa.int64())}))
    return t


def _sorted(rows: pa.Table) -> pa.Table:
    return rows.select(["id", "x"]).sort_by("id")


def test_storage_options_become_pyiceberg_s3_properties() -> None:
    got = _io_properties(
        "s3://b/t",
        {"key": "a", "secret": "s", "client_kwargs": {"endpoint_url": "http://h:1"}},
    )
    assert got == {
        "s3.access-key-id": "a",
        "s3.secret-access-key": "s",
        "s3.endpoint": "http://h:1",
    }
    deltas = _io_properties("s3://b/t", {"AWS_ENDPOINT_URL": "http://h:2", "AWS_REGION": "r"})
    assert deltas == {"s3.endpoint": "http://h:2", "s3.region": "r"}


def test_every_snapshot_on_s3_reads_pyiceberg_rows_in_place(
    s3: Any, table: Any, tmp_path: Path
) -> None:
    _fs, options, cat = s3
    table = table.refresh()
    metadata = table.metadata_location
    assert metadata.startswith("s3://bucket/wh/")
    snapshots = [s.snapshot_id for s in table.snapshots()]
    assert len(snapshots) == 4
    for sid in snapshots[:3]:  # PyIceberg applies position deletes, not equality deletes
        want = _sorted(table.scan(snapshot_id=sid).to_arrow())
        snap = open_iceberg(metadata, snapshot_id=sid, storage_options=options)
        assert _sorted(snap.to_arrow()).equals(want), sid
        ds = snap.dataset(cache=False, span_dir=str(tmp_path / f"s{sid}"), plan_cache=False)
        got = [i for b in ds.iter_batches(128) for i in b["id"].tolist()]
        assert sorted(got) == want.column("id").to_pylist()
    # the last snapshot: the equality delete applied by this reader; opened again, its
    # plan comes from this machine's plan cache (the manifest list's size asked of S3)
    from spark_dl_core.tables.iceberg import deletes

    plans = str(tmp_path / "plans")
    cold = open_iceberg(
        metadata, snapshot_id=snapshots[3], storage_options=options, plan_cache=plans
    )
    ran = deletes.plans_run
    last = open_iceberg(
        metadata, snapshot_id=snapshots[3], storage_options=options, plan_cache=plans
    )
    assert deletes.plans_run == ran and last.files == cold.files
    live = [i for i in range(2 * PER) if i not in (1, 5, 7, 10, PER + 2)]
    assert sorted(last.to_arrow().column("id").to_pylist()) == live
    # A second epoch reads every row group from the node's span cache.
    ds = last.dataset(cache=False, span_dir=str(tmp_path / "spans"), plan_cache=False)
    assert ds.through_spans
    loader = ds.to_torch(batch_size=64, shuffle=True, seed=3)
    first = [i for b in loader for i in b["id"].tolist()]
    assert sorted(first) == live and loader.stats()["download_bytes"] > 0
    loader.set_epoch(1)
    assert sorted(i for b in loader for i in b["id"].tolist()) == live
    assert loader.stats()["download_bytes"] == 0
    # Opened by catalog and name, with no storage options: the catalog's own S3 properties
    # reach the data files too; a reopened snapshot keeps them.
    by_name = open_iceberg("db.t", catalog=cat, snapshot_id=snapshots[1])
    assert by_name.storage_options is not None
    assert _sorted(by_name.to_arrow()).equals(
        _sorted(table.scan(snapshot_id=snapshots[1]).to_arrow())
    )
    again = last.reopen(snapshots[2])
    assert again.storage_options == options and len(again) == 2 * PER - 3
    # A saved mixture's source, reopened with the options open_mixture is given.
    kind, record = ds.in_place_record()
    reopened = reopen_in_place(record, options)
    assert kind == "iceberg" and reopened.fingerprint == ds.fingerprint


def test_a_missing_data_file_on_s3_is_a_typed_error_naming_it(s3: Any) -> None:
    fs, options, cat = s3
    t = cat.create_table("db.gone", schema=_rows(0).schema)
    t.append(_rows(0))
    path = t.scan().plan_files()[0].file.file_path
    fs.rm(path[len("s3://") :])
    with pytest.raises(IcebergSnapshotError, match=r"data file .* is missing") as err:
        open_iceberg(t.metadata_location, storage_options=options)
    assert path in str(err.value)


@pytest.mark.parametrize(
    ("location", "uri", "why"),
    [
        ("s3://bucket/wh/t", "gs://other/t/x.parquet", "on scheme 'gs'"),
        ("s3://bucket/wh/t", "/local/t/x.parquet", "on scheme 'file'"),
        ("s3://bucket/wh/t", "s3://bucket/elsewhere/x.parquet", "outside the table's location"),
        ("nosuch://b/t", "nosuch://b/t/x.parquet", "no installed fsspec filesystem"),
    ],
)
def test_data_files_the_reader_cannot_reach_are_refused_by_name(
    location: str, uri: str, why: str
) -> None:
    snap = IcebergSnapshot(
        table_uri=location,
        version=7,
        files=[],
        schema=pa.schema([]),
        name="db.t",
        metadata_location=f"{location}/metadata/v1.metadata.json",
        schema_id=0,
    )
    with pytest.raises(UnsupportedIcebergFeatureError, match=why) as err:
        _scheme_check(snap, uri, lambda _: "")
    assert uri in str(err.value) and "snapshot 7" in str(err.value)
