"""Delta DataFrames that ``read_delta`` did not make, on classic and Spark Connect sessions
with the Delta extension (issue 43): a catalog table (``spark.table``), SQL time travel
(``VERSION AS OF``, by name and by ``delta.`path```) and a ``versionAsOf`` load. Each,
whole or as a select of columns, is written and loaded as the pinned read of its snapshot:
the table, version and catalog name in the lineage, the core's fingerprint for that
version, and the same batches as ``open_delta(path, version=n)`` in place.

The table is written with deltalake (no Spark commits: CI time); the catalog only names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("deltalake")
pytest.importorskip("delta")

from deltalake import write_deltalake

from spark_dl_core import open_dataset
from spark_dl_core.tables.delta.table import open_delta

pytestmark = pytest.mark.spark

SPEC = {"shard_size": 1500, "hashes": ["xxh64"]}
NAME = "catalog_events"
QUALIFIED = f"spark_catalog.default.{NAME}"


def _rows(start: int, n: int) -> pa.Table:
    ids = range(start, start + n)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "x": pa.array([i / 4 for i in ids], pa.float64()),
            "name": [f"n{i}" for i in ids],
            "part": ["ab"[i % 2] for i in ids],
        }
    )


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Versions 0, 1, 2 (two files each: one per partition)."""
    path = str(tmp_path_factory.mktemp("catalog") / "events")
    for start, n in [(0, 90), (1000, 60), (2000, 40)]:
        write_deltalake(path, _rows(start, n), mode="append", partition_by=["part"])
    return path


def _frames(spark: Any, path: str) -> dict[str, tuple[Any, int, str | None]]:
    """Each kind of delta-spark DataFrame: (the frame, its version, its catalog name)."""
    spark.sql(f"CREATE TABLE IF NOT EXISTS {NAME} USING delta LOCATION '{path}'")
    return {
        "spark.table": (spark.table(NAME), 2, QUALIFIED),
        "VERSION AS OF": (spark.sql(f"SELECT * FROM {NAME} VERSION AS OF 1"), 1, QUALIFIED),
        "delta.`path` VERSION AS OF": (
            spark.sql(f"SELECT * FROM delta.`{path}` VERSION AS OF 0"),
            0,
            None,
        ),
        "versionAsOf": (
            spark.read.format("delta").option("versionAsOf", 1).load(path),
            1,
            None,
        ),
    }


def _epoch(loader: Any) -> list[list[int]]:
    return [b["id"].tolist() for b in loader]


def test_catalog_and_time_travel_frames_write_the_core_export(
    spark: Any, table: str, tmp_path: Path
) -> None:
    """``df.write.format("mds")`` and ``df.dl.write_mds`` of each: the core's export of that
    version (fingerprint, shards), its table, version and catalog name recorded."""
    cores = {}
    for version in range(3):
        out = str(tmp_path / f"core{version}")
        cores[version] = open_delta(table, version=version).write_mds(out, SPEC)
    for i, (how, (df, version, name)) in enumerate(_frames(spark, table).items()):
        out = str(tmp_path / f"format{i}")
        df.write.format("mds").option("shard_size", "1500").option("hashes", "xxh64").save(out)
        df.dl.write_mds(str(tmp_path / f"dl{i}"), SPEC)
        for written in (out, str(tmp_path / f"dl{i}")):
            ds = open_dataset(written)
            assert (ds.fingerprint, ds.num_shards) == (
                cores[version].fingerprint,
                cores[version].shards,
            ), how
            source = ds.source
            assert (source["table"], source["version"]) == (table, version), how
            assert source.get("catalog_table") == name, how
            assert source["reader"] == "delta-spark" and "derived" not in source, how


def test_catalog_and_time_travel_frames_load_as_the_core(
    spark: Any, table: str, tmp_path: Path
) -> None:
    """``df.dl.to_torch(in_place=True)`` of each (whole, or a select of columns) serves the
    batches of ``open_delta(path, version=n)`` in place; the cached copy is the core's
    export; a filter is not a pinned read and is refused in place, naming the node."""
    from spark_dl.delta_inplace import NotInPlaceError

    for how, (df, version, name) in _frames(spark, table).items():
        for columns in (None, ["id", "x"]):
            frame = df if columns is None else df.select(*columns)
            core = open_delta(table, version=version, columns=columns).dataset()
            want = _epoch(core.to_torch(batch_size=16, shuffle=True, seed=3))
            got = _epoch(frame.dl.to_torch(batch_size=16, shuffle=True, seed=3, in_place=True))
            assert got == want, (how, columns)
        export = open_delta(table, version=version).write_mds(str(tmp_path / how), SPEC)
        with df.dl.converter(SPEC, cache_dir=str(tmp_path / "cache")) as conv:
            assert conv.dataset.fingerprint == export.fingerprint, how
            assert conv.dataset.source["version"] == version, how
            assert conv.dataset.source.get("catalog_table") == name, how
    filtered = spark.table(NAME).filter("id > 3")
    with pytest.raises(NotInPlaceError, match=r"no spark_dl\.read_delta read"):
        filtered.dl.to_torch(batch_size=16, in_place=True)
    assert sorted(i for b in filtered.dl.to_torch(batch_size=64) for i in b["id"].tolist()) == [
        i for i in sorted(open_delta(table).to_arrow().column("id").to_pylist()) if i > 3
    ]
