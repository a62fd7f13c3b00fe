"""One metadata reader, one save-mode policy, one commit; verification on first read.

Covers the core half of the consolidation: ``write_mds`` refuses to replace a dataset by
default, append refuses drift with the same messages as the Spark writer
(``tests/spark/test_spark_datasource.py`` checks those), a commit torn between its metadata writes
is seen the same way by readers, appends and vacuum, empty tables write empty datasets, and
corrupted shards are caught on first read by default.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import spark_dl_core
from spark_dl_core import (
    DatasetError,
    DatasetSpec,
    HashMismatchError,
    SparkDLError,
    SpecError,
    open_dataset,
    write_mds,
)
from spark_dl_core.errors import (
    DatasetExistsError,
    DecompressionError,
    SchemaDriftError,
    SpecValidationError,
)
from spark_dl_core.format.compression import parse_compression
from spark_dl_core.format.index import INDEX_FILE, META_FILE, PREVIOUS_META_FILE
from spark_dl_core.maintenance import vacuum
from spark_dl_core.store.storage import Store


def _ids(start: int, stop: int) -> pa.Table:
    ids = np.arange(start, stop)
    return pa.table(
        {"id": pa.array(ids, pa.int64()), "s": pa.array([f"r{i}" for i in ids], pa.string())}
    )


# --------------------------------------------------------------------------- save modes


def test_write_mds_refuses_to_replace_by_default(tmp_path: Path) -> None:
    path = str(tmp_path / "ds")
    write_mds(_ids(0, 10), path)
    with pytest.raises(DatasetExistsError, match=r"already exists.*overwrite"):
        write_mds(_ids(10, 20), path)
    assert open_dataset(path).to_arrow()["id"].to_pylist() == list(range(10))
    write_mds(_ids(10, 20), path, mode="overwrite")
    assert open_dataset(path).to_arrow()["id"].to_pylist() == list(range(10, 20))
    kept = write_mds(_ids(0, 5), path, mode="ignore")
    assert kept.num_samples == 10
    with pytest.raises(SpecError, match="save mode 'sideways'"):
        write_mds(_ids(0, 5), path, mode="sideways")  # type: ignore[arg-type]


def test_append_refuses_spec_and_schema_drift_naming_it(tmp_path: Path) -> None:
    path = str(tmp_path / "ds")
    write_mds(_ids(0, 10), path, {"compression": "zstd"})
    with pytest.raises(
        SchemaDriftError, match=r"compression=None differs from the dataset's 'zstd'"
    ):
        write_mds(_ids(10, 20), path, {"compression": None}, mode="append")
    with pytest.raises(SchemaDriftError, match=r"column 's' encoding 'json' differs") as info:
        write_mds(_ids(10, 20), path, {"columns": {"s": "json"}}, mode="append")
    assert info.value.column == "s"
    with pytest.raises(SchemaDriftError, match=r"column 'id' has type double"):
        write_mds(pa.table({"id": [1.5], "s": ["x"]}), path, mode="append")
    with pytest.raises(SchemaDriftError, match=r"column 's' is missing from the data"):
        write_mds(pa.table({"id": pa.array([1], pa.int64())}), path, mode="append")
    # fields the append does not set are the dataset's; equal ones are fine
    write_mds(_ids(10, 20), path, {"compression": "zstd"}, mode="append")
    write_mds(_ids(20, 30), path, mode="append")
    ds = open_dataset(path)
    assert ds.to_arrow()["id"].to_pylist() == list(range(30))
    assert ds.shards[-1].compression == "zstd"


def _tear_next_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next commit dies after spark_dl.json, before index.json (as a killed driver)."""
    original = Store.write_bytes

    def write_bytes(self: Store, name: str, data: bytes) -> None:
        if name == INDEX_FILE:
            monkeypatch.setattr(Store, "write_bytes", original)
            raise OSError("killed before the index")
        original(self, name, data)

    monkeypatch.setattr(Store, "write_bytes", write_bytes)


def test_append_after_a_torn_commit_uses_the_committed_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "ds")
    write_mds(_ids(0, 50), path, {"shard_size": "1KiB"})
    _tear_next_commit(monkeypatch)
    with pytest.raises(OSError, match="killed"):
        write_mds(_ids(100, 103), path, mode="overwrite")
    assert (tmp_path / "ds" / PREVIOUS_META_FILE).exists()  # torn: new metadata, old index
    write_mds(_ids(50, 60), path, mode="append")
    ds = open_dataset(path)
    assert ds.to_arrow()["id"].to_pylist() == list(range(60))
    # the metadata describes the index's shards with their own hashes: same as a clean append
    clean = str(tmp_path / "clean")
    write_mds(_ids(0, 50), clean, {"shard_size": "1KiB"})
    write_mds(_ids(50, 60), clean, mode="append")
    assert ds.fingerprint == open_dataset(clean).fingerprint
    assert [m["content_hash"] for m in ds.meta["shards"]] == [
        m["content_hash"] for m in open_dataset(clean).meta["shards"]
    ]
    list(ds.iter_batches(verify_hashes=True))


def test_torn_commit_read_and_settled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "ds")
    first = write_mds(_ids(0, 20), path)
    _tear_next_commit(monkeypatch)
    with pytest.raises(OSError):
        write_mds(_ids(0, 3), path, mode="overwrite")
    assert open_dataset(path).fingerprint == first.fingerprint
    vacuum(path, retention_seconds=0)
    assert not (tmp_path / "ds" / PREVIOUS_META_FILE).exists()
    on_disk = json.loads((tmp_path / "ds" / META_FILE).read_text())
    assert on_disk["fingerprint"] == first.fingerprint
    # a second tear after the first must still fall back to the committed dataset
    _tear_next_commit(monkeypatch)
    with pytest.raises(OSError):
        write_mds(_ids(0, 4), path, mode="overwrite")
    _tear_next_commit(monkeypatch)
    with pytest.raises(OSError):
        write_mds(_ids(0, 5), path, mode="overwrite")
    assert len(open_dataset(path)) == 20


# --------------------------------------------------------------------------- empty input


def test_empty_table_writes_an_empty_dataset(tmp_path: Path) -> None:
    empty = _ids(0, 0)
    assert empty.num_rows == 0
    result = write_mds(empty, str(tmp_path / "t"))
    assert (result.num_samples, result.shards) == (0, 0)
    ds = open_dataset(tmp_path / "t")
    assert len(ds) == 0 and list(ds.columns) == ["id", "s"]
    assert ds.to_arrow().schema.names == ["id", "s"]
    reader = pa.RecordBatchReader.from_batches(empty.schema, iter(()))
    assert write_mds(reader, str(tmp_path / "r")).num_samples == 0
    with pytest.raises(SpecError, match="no record batches"):
        write_mds(iter(()), str(tmp_path / "i"))


def test_delta_filter_matching_nothing_exports(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    from spark_dl_core import open_delta

    table = str(tmp_path / "delta")
    write_deltalake(table, _ids(0, 10))
    snapshot = open_delta(table, filter=pc.field("id") > 100)
    result = snapshot.write_mds(str(tmp_path / "out"))
    assert result.num_samples == 0
    ds = open_dataset(tmp_path / "out")
    assert len(ds) == 0 and ds.source["kind"] == "delta"


# --------------------------------------------------------------------------- verification


def _flip_a_byte(path: Path) -> str:
    index = json.loads((path / INDEX_FILE).read_text())
    name = str(index["shards"][0]["raw_data"]["basename"])
    data = bytearray((path / name).read_bytes())
    at = data.find(b"r1")
    data[at + 1] ^= 0x01  # "r1" becomes "r0": still valid UTF-8, wrong data
    (path / name).write_bytes(bytes(data))
    return name


def test_corruption_is_not_served_by_default(tmp_path: Path) -> None:
    path = tmp_path / "ds"
    write_mds(_ids(0, 20), str(path))  # default spec: no hashes in the index
    name = _flip_a_byte(path)
    with pytest.raises(HashMismatchError, match=rf"{name}.*spark_dl.json"):
        list(open_dataset(path).iter_batches())
    with pytest.raises(HashMismatchError, match=name):
        list(open_dataset(path).iter_batches(verify_hashes=True))
    served = [s for b in open_dataset(path).iter_batches(verify_hashes=False) for s in b["s"]]
    assert "r0" in served[1:]  # opting out serves what is stored


def test_each_shard_is_verified_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "ds")
    write_mds(_ids(0, 200), path, {"shard_size": "1KiB"})
    ds = open_dataset(path)
    calls: list[str] = []
    original = ds._verify

    def counting(where: str, *args: object) -> None:
        calls.append(where)
        original(where, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ds, "_verify", counting)
    for epoch in range(3):
        list(ds.iter_batches(batch_size=7, shuffle=True, epoch=epoch))
    assert sorted(calls) == sorted({ds.store.display(s.stored.basename) for s in ds.shards})


def test_datasets_without_stored_hashes_use_the_content_hash(tmp_path: Path) -> None:
    """Datasets written before stored-file hashes existed: the content hash checks them."""
    path = tmp_path / "ds"
    write_mds(_ids(0, 20), str(path), {"compression": "zstd"})
    meta = json.loads((path / META_FILE).read_text())
    for entry in meta["shards"]:
        del entry["stored_hashes"]
    del meta["digest"], meta["index_digest"]  # as written then: no digests either
    (path / META_FILE).write_text(json.dumps(meta))
    ds = open_dataset(path)
    shard = ds.shards[0]
    raw = bytearray(parse_compression("zstd").decompress(ds.stored_bytes(0), shard.raw_data.bytes))  # type: ignore[union-attr]
    raw[raw.find(b"r1") + 1] ^= 0x01
    (path / shard.stored.basename).write_bytes(parse_compression("zstd").compress(bytes(raw)))  # type: ignore[union-attr]
    index = json.loads((path / INDEX_FILE).read_text())
    index["shards"][0]["zip_data"]["bytes"] = os.path.getsize(path / shard.stored.basename)
    (path / INDEX_FILE).write_text(json.dumps(index))
    (path / "spark_dl.index.arrow").unlink(missing_ok=True)  # edited by hand: drop the compact copy
    for verify in (None, True):
        with pytest.raises(HashMismatchError, match="content hash"):
            list(open_dataset(path).iter_batches(verify_hashes=verify))


def test_datasets_with_no_hashes_at_all_warn_once(tmp_path: Path) -> None:
    """As Mosaic's MDSWriter writes without hashes: no spark_dl.json, no index hashes."""
    path = tmp_path / "ds"
    write_mds(_ids(0, 200), str(path), {"shard_size": "1KiB"})
    (path / META_FILE).unlink()
    (path / "spark_dl.index.arrow").unlink()  # it records spark_dl.json: Mosaic's have neither
    ds = open_dataset(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sum(len(b["id"]) for b in ds.iter_batches(batch_size=16)) == 200
        assert sum(len(b["id"]) for b in ds.iter_batches(verify_hashes=True)) == 200
    assert len([w for w in caught if "cannot be detected" in str(w.message)]) == 1


def test_fingerprints_keep_their_meaning() -> None:
    """Values computed by the release before stored-file hashes were recorded."""
    import tempfile

    table = pa.table(
        {"id": pa.array(np.arange(100), pa.int64()), "s": [f"r{i}" for i in range(100)]}
    )
    with tempfile.TemporaryDirectory() as tmp:
        a = write_mds(table, f"{tmp}/a", DatasetSpec(shard_size="1KiB"))
        b = write_mds(
            table, f"{tmp}/b", DatasetSpec(shard_size="1KiB", compression="zstd", hashes=["xxh64"])
        )
    assert a.fingerprint == "82c83558bcc7452caeb972e09de1cd9c243f7a2a2a4ce0b6b5c4c6e58a0521dd"
    assert b.fingerprint == "68295ca8e9217f585010c7d5c774ffa1e530c55fc1d0772b094eb51531d763e6"


# --------------------------------------------------------------------------- errors, version


def test_errors_share_one_root() -> None:
    with pytest.raises(SpecValidationError) as info:
        DatasetSpec(compression="lz4", shard_size=0)
    assert set(info.value.fields) == {"compression", "shard_size"}
    assert "compression" in str(info.value) and "shard_size" in str(info.value)
    with pytest.raises(SparkDLError):
        DatasetSpec.model_validate({"nulls": "maybe"})
    with pytest.raises(SparkDLError):
        DatasetSpec.model_validate_json('{"hashes": ["crc9"]}')
    assert issubclass(DecompressionError, SparkDLError)
    assert issubclass(DatasetExistsError, DatasetError)
    with pytest.raises(DecompressionError):
        parse_compression("zstd").decompress(b"not zstd", 10)  # type: ignore[union-attr]
    with pytest.raises(SpecError):
        write_mds(42, "/nonexistent")


def test_one_version_per_distribution() -> None:
    import spark_dl

    assert spark_dl.__version__ == spark_dl_core.__version__
    assert importlib.metadata.version("spark-dl-core") == spark_dl_core.__version__
    assert importlib.metadata.version("spark-dl") == spark_dl.__version__


@pytest.mark.parametrize(
    "damage",
    ["flip", "truncate", "wrong type", "removed with the compact index kept"],
)
def test_append_to_corrupted_metadata_is_refused_and_changes_nothing(
    tmp_path: Path, damage: str
) -> None:
    """An append reads the dataset it extends through the checked reader: damaged metadata
    refuses it naming the file, before any shard is written or any file replaced."""
    from spark_dl_core.errors import MetadataError

    path = tmp_path / "ds"
    write_mds(_ids(0, 50), str(path), {"shard_size": "1KiB"})
    meta = path / META_FILE
    text = meta.read_bytes()
    if damage == "flip":
        at = text.index(b'"num_samples"') + 16
        meta.write_bytes(text[:at] + b"7" + text[at + 1 :])
    elif damage == "truncate":
        meta.write_bytes(text[: len(text) // 2])
    elif damage == "wrong type":
        obj = json.loads(text)
        obj["shards"][0]["samples"] = str(obj["shards"][0]["samples"])
        del obj["digest"]
        meta.write_text(json.dumps(obj))
    else:
        meta.unlink()
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    with pytest.raises(MetadataError, match=r"spark_dl\.json") as info:
        write_mds(_ids(50, 60), str(path), mode="append")
    assert info.value.file.endswith(META_FILE)
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before


@pytest.mark.parametrize("mode", ["error", "overwrite", "append", "ignore"])
def test_a_file_where_the_dataset_goes_is_refused_first(tmp_path: Path, mode: str) -> None:
    """A path that is a file (or lies under one) gave a bare FileExistsError at the first
    shard; it is refused before any work, naming the path."""
    from spark_dl_core import SpecError

    afile = tmp_path / "data.parquet"
    afile.write_bytes(b"PAR1 not a directory")
    table = pa.table({"id": list(range(10))})
    for target in (afile, afile / "sub"):
        with pytest.raises(SpecError, match=rf"{afile}.* is a file, and a dataset is a dir"):
            write_mds(table, str(target), mode=mode)  # type: ignore[arg-type]
    assert afile.read_bytes() == b"PAR1 not a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.parquet"]


def test_a_dataset_opened_before_an_overwrite_says_it_changed(tmp_path: Path) -> None:
    """It said "shard ... does not exist", which reads like data loss; now it says the
    dataset changed since it was opened and to reopen it (as the Spark reader does)."""
    from spark_dl_core.errors import DatasetChangedError, DatasetError, ShardError

    path = str(tmp_path / "ds")
    write_mds(pa.table({"id": list(range(100))}), path, {"shard_size": "256B"})
    old = open_dataset(path)
    write_mds(pa.table({"id": list(range(50))}), path, mode="overwrite")
    for read in (lambda: list(old.iter_batches(batch_size=10)), lambda: old[3], old.to_arrow):
        with pytest.raises(DatasetChangedError, match=r"changed since it was opened.*open it"):
            read()
    assert issubclass(DatasetChangedError, DatasetError)
    new = open_dataset(path)
    assert len(new) == 50 and new.to_arrow()["id"].to_pylist() == list(range(50))
    shard = tmp_path / "ds" / new.shards[0].stored.basename
    shard.write_bytes(shard.read_bytes()[:-1])  # damaged in place: not a change of dataset
    with pytest.raises(ShardError) as caught:
        new.to_arrow()
    assert not isinstance(caught.value, DatasetChangedError)
