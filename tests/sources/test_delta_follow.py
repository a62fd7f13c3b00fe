"""A dataset that follows a Delta table: each version reached by updates is a fresh export."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

deltalake = pytest.importorskip("deltalake")
from delta_helpers import delete_by_dv  # noqa: E402
from deltalake import DeltaTable, write_deltalake  # noqa: E402

from spark_dl_core import open_dataset  # noqa: E402
from spark_dl_core.errors import FollowError, SpecError  # noqa: E402
from spark_dl_core.maintenance import vacuum  # noqa: E402
from spark_dl_core.tables.delta.table import open_delta  # noqa: E402
from spark_dl_core.versions import held_versions  # noqa: E402

SPEC = {"shard_size": 4096, "nulls": "mask"}  # several shards per file; a column added
DV_TABLE = {"delta.enableDeletionVectors": "true"}


def _rows(start: int, n: int, tag: bool = False) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    vec = np.stack([ids * 0.5 + k for k in range(4)], axis=1).astype(np.float32)
    cols: dict[str, Any] = {
        "id": pa.array(ids),
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1)), 4),
    }
    if tag:
        cols["tag"] = pa.array([f"t{i % 7}" for i in ids])
    return pa.table(cols)


# ------------------------------------------------------------------ deletion vectors by hand


# ------------------------------------------------------------------ the comparison


def _same(followed: Any, fresh: Any) -> None:
    assert len(followed) == len(fresh)
    assert followed.fingerprint == fresh.fingerprint
    assert list(followed.shards.samples) == list(fresh.shards.samples)
    assert followed.to_arrow().equals(fresh.to_arrow())
    for a, b in zip(
        followed.iter_batches(16, shuffle=True, seed=7),
        fresh.iter_batches(16, shuffle=True, seed=7),
    ):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def _fresh(table: str, version: int, tmp: Path) -> Any:
    out = str(tmp / f"fresh-{version}")
    open_delta(table, version=version).write_mds(out, SPEC)
    return open_dataset(out)


@pytest.fixture
def history(tmp_path: Path) -> tuple[str, list[int]]:
    """A table through appends, DV deletes, a rewriting delete, schema evolution, an
    OPTIMIZE and an overwrite; the versions to follow."""
    table = str(tmp_path / "t")
    write_deltalake(table, _rows(0, 300), configuration=DV_TABLE)  # 0
    write_deltalake(table, _rows(300, 200), mode="append")  # 1
    write_deltalake(table, _rows(500, 250), mode="append")  # 2
    delete_by_dv(table, [*range(5, 20), 100, 303, 307])  # 3
    delete_by_dv(table, [*range(150, 161), 500, 749])  # 4: vectors grow
    write_deltalake(table, _rows(750, 120), mode="append")  # 5
    DeltaTable(table).delete("id >= 760 AND id < 770")  # 6: rewrites the file
    write_deltalake(table, _rows(870, 90, tag=True), mode="append", schema_mode="merge")  # 7
    DeltaTable(table).optimize.compact()  # 8
    delete_by_dv(table, [1, 2, 3, 2000])  # 9
    write_deltalake(table, _rows(2000, 130, tag=True), mode="overwrite")  # 10
    write_deltalake(table, _rows(3000, 40, tag=True), mode="append")  # 11
    return table, list(range(DeltaTable(table).version() + 1))


def test_updates_equal_fresh_exports(history: tuple[str, list[int]], tmp_path: Path) -> None:
    table, versions = history
    out = str(tmp_path / "followed")
    fingerprints, masked = {}, {}
    for v in versions:
        result = open_delta(table, version=v).write_mds(out, SPEC, mode="update")
        fresh = _fresh(table, v, tmp_path)
        followed = open_dataset(out)
        assert followed.version == v
        masked[v] = bool(followed._virtual)
        assert result.fingerprint == fresh.fingerprint
        _same(followed, fresh)
        assert followed.source == fresh.source  # lineage: table and version
        fingerprints[v] = fresh.fingerprint
    assert held_versions(open_dataset(out).store) == versions
    # deletion vectors became masks (3, 4, 9) and stayed while their files did (5, 6); the
    # column added (7), OPTIMIZE (8) and the overwrite (10) left none
    assert [v for v in versions if masked[v]] == [3, 4, 5, 6, 9]
    for v in versions:  # every version held opens as it was
        old = open_dataset(out, version=v)
        assert old.fingerprint == fingerprints[v]
        assert old.source["version"] == v and old.source["table"] == open_delta(table).table_uri
        _same(old, open_dataset(str(tmp_path / f"fresh-{v}")))


def test_dv_growth_writes_no_shard(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    write_deltalake(table, _rows(0, 400), configuration=DV_TABLE)
    write_deltalake(table, _rows(400, 400), mode="append")
    out = str(tmp_path / "followed")
    open_delta(table).write_mds(out, SPEC, mode="update")
    before = sorted(os.listdir(out))
    delete_by_dv(table, [400, 450, 451, 452, 799])
    open_delta(table).write_mds(out, SPEC, mode="update")
    after = sorted(os.listdir(out))
    assert [n for n in after if ".mds" in n] == [n for n in before if ".mds" in n]
    assert "index.json" not in after  # a plain MDS reader must not serve the deleted rows
    _same(open_dataset(out), _fresh(table, 2, tmp_path))
    write_deltalake(table, _rows(800, 10), mode="append")  # no masks left at the latest?
    open_delta(table).write_mds(out, SPEC, mode="update")
    assert "index.json" not in os.listdir(out)  # the DV'd file is still masked


def test_root_index_is_the_latest_without_masks(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    write_deltalake(table, _rows(0, 200))
    out = str(tmp_path / "followed")
    open_delta(table).write_mds(out, SPEC, mode="update")
    write_deltalake(table, _rows(200, 50), mode="append")
    open_delta(table).write_mds(out, SPEC, mode="update")
    from spark_dl_core.meta import read_meta
    from spark_dl_core.store.storage import Store

    root = read_meta(Store(out))
    assert root is not None and root.meta is not None
    assert root.meta["source"]["version"] == 1
    assert root.meta["fingerprint"] == _fresh(table, 1, tmp_path).fingerprint


def test_plain_export_is_adopted(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    write_deltalake(table, _rows(0, 300), configuration=DV_TABLE)
    write_deltalake(table, _rows(300, 100), mode="append")
    delete_by_dv(table, [1, 2])
    out = str(tmp_path / "plain")
    open_delta(table, version=2).write_mds(out, SPEC)
    write_deltalake(table, _rows(400, 100), mode="append")
    delete_by_dv(table, [9])
    open_delta(table).write_mds(out, SPEC, mode="update")
    assert held_versions(open_dataset(out).store) == [2, 4]
    _same(open_dataset(out), _fresh(table, 4, tmp_path))
    _same(open_dataset(out, version=2), _fresh(table, 2, tmp_path))


def _listing(path: str) -> dict[str, bytes]:
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            out[os.path.relpath(os.path.join(root, f), path)] = Path(root, f).read_bytes()
    return out


def test_bad_updates_are_refused_and_write_nothing(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    write_deltalake(table, _rows(0, 100))
    write_deltalake(table, _rows(100, 100), mode="append")
    out = str(tmp_path / "followed")
    open_delta(table, version=1).write_mds(out, SPEC, mode="update")
    before = _listing(out)
    with pytest.raises(FollowError, match=r"from version 1 to version 0 .*backwards") as err:
        open_delta(table, version=0).write_mds(out, SPEC, mode="update")
    assert err.value.table and err.value.held == [1] and err.value.asked == 0
    assert str(tmp_path / "followed") in str(err.value)
    other = str(tmp_path / "other")
    write_deltalake(other, _rows(0, 100))
    write_deltalake(other, _rows(0, 10), mode="append")
    write_deltalake(other, _rows(0, 10), mode="append")
    with pytest.raises(FollowError, match="follows"):
        open_delta(other).write_mds(out, SPEC, mode="update")
    # the table replaced by another at the same path: its history does not reach version 1
    import shutil

    shutil.rmtree(table)
    write_deltalake(table, _rows(0, 5))
    for _ in range(3):
        write_deltalake(table, _rows(0, 5), mode="append")
    with pytest.raises(FollowError, match=r"another table|replaced"):
        open_delta(table).write_mds(out, SPEC, mode="update")
    with pytest.raises(FollowError, match=r"holds table versions \[1\], not 5"):
        open_dataset(out, version=5)
    assert _listing(out) == before
    with pytest.raises(FollowError, match="mode='update'"):
        open_delta(other).write_mds(out, SPEC, mode="overwrite")
    assert _listing(out) == before


def test_concurrent_updaters_commit_a_version_once(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    write_deltalake(table, _rows(0, 300))
    out = str(tmp_path / "followed")
    open_delta(table, version=0).write_mds(out, SPEC, mode="update")
    write_deltalake(table, _rows(300, 300), mode="append")
    snap = open_delta(table, version=1)
    outcomes: list[Any] = []
    barrier = threading.Barrier(2)

    def update() -> None:
        barrier.wait()
        try:
            outcomes.append(snap.write_mds(out, SPEC, mode="update"))
        except FollowError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=update) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [o for o in outcomes if isinstance(o, FollowError)]
    done = [o for o in outcomes if not isinstance(o, FollowError)]
    assert len(done) >= 1 and len(done) + len(errors) == 2
    _same(open_dataset(out), _fresh(table, 1, tmp_path))
    named = set(_listing(out))
    assert not [n for n in named if ".tmp-" in n]
    shards = [n for n in named if n.endswith(".mds")]
    assert len(shards) == open_dataset(out, version=1).num_shards  # the loser's are gone


def test_readers_of_an_older_version_are_undisturbed(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    write_deltalake(table, _rows(0, 300), configuration=DV_TABLE)
    out = str(tmp_path / "followed")
    open_delta(table).write_mds(out, SPEC, mode="update")
    reader = open_dataset(out)
    expected = reader.to_arrow()
    delete_by_dv(table, [5, 6])
    DeltaTable(table).optimize.compact()
    write_deltalake(table, _rows(300, 300), mode="overwrite")
    open_delta(table).write_mds(out, SPEC, mode="update")
    assert reader.to_arrow().equals(expected)
    assert open_dataset(out, version=0).to_arrow().equals(expected)


def test_vacuum_keeps_what_retained_versions_name(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    write_deltalake(table, _rows(0, 200))
    out = str(tmp_path / "followed")
    open_delta(table).write_mds(out, SPEC, mode="update")
    only_v0 = {n for n in os.listdir(out) if n.endswith(".mds")}
    write_deltalake(table, _rows(1000, 200), mode="overwrite")
    open_delta(table).write_mds(out, SPEC, mode="update")
    write_deltalake(table, _rows(2000, 100), mode="append")
    open_delta(table).write_mds(out, SPEC, mode="update")
    report = vacuum(out, retention_seconds=0)  # no version rule: every version is kept
    assert report.removed == [] and report.dropped_versions == []
    report = vacuum(out, retention_seconds=0, keep_seconds=3600)  # all committed just now
    assert report.dropped_versions == []
    report = vacuum(out, retention_seconds=0, keep_versions=2, dry_run=True)
    assert report.dropped_versions == [0] and set(report.removed) == only_v0
    assert held_versions(open_dataset(out).store) == [0, 1, 2]
    report = vacuum(out, retention_seconds=0, keep_versions=2)
    assert report.dropped_versions == [0] and set(report.removed) == only_v0
    assert held_versions(open_dataset(out).store) == [1, 2]
    with pytest.raises(FollowError, match=r"holds table versions \[1, 2\], not 0.*version="):
        open_dataset(out, version=0)
    for v in (1, 2):
        _same(open_dataset(out, version=v), _fresh(table, v, tmp_path))
    # digits, as open_delta and Spark's versionAsOf take them; other values named and refused
    assert open_dataset(out, version="1").version == 1
    for bad in ("v1", "one", 1.5, True):
        with pytest.raises(SpecError, match=r"open_dataset\(.*\): version=.* whole number"):
            open_dataset(out, version=bad)  # type: ignore[arg-type]


def test_vacuum_keeps_the_lengths_files_retained_versions_name(tmp_path: Path) -> None:
    """A token column's per-row lengths files go with their shards: kept while a held
    version names them (its ``bin`` loader counts rows from them), dropped with it."""

    def docs(start: int, n: int) -> pa.Table:
        tokens = [list(range(1, 2 + (i * 7) % 40)) for i in range(start, start + n)]
        return pa.table({"id": pa.array(np.arange(start, start + n)), "tokens": tokens})

    table = str(tmp_path / "t")
    write_deltalake(table, docs(0, 200))
    out = str(tmp_path / "followed")
    open_delta(table).write_mds(out, SPEC, mode="update")
    only_v0 = set(os.listdir(out)) - {"index.json", "spark_dl.json", "spark_dl.index.arrow"}
    only_v0 = {n for n in only_v0 if ".mds" in n}
    assert any(n.endswith(".mds.lengths") for n in only_v0)
    write_deltalake(table, docs(1000, 200), mode="overwrite")
    open_delta(table).write_mds(out, SPEC, mode="update")
    write_deltalake(table, docs(2000, 100), mode="overwrite")  # version 1's files only held
    open_delta(table).write_mds(out, SPEC, mode="update")
    report = vacuum(out, retention_seconds=0, keep_versions=2)
    assert report.dropped_versions == [0] and set(report.removed) == only_v0
    held = open_dataset(out, version=1)
    lengths = held.doc_lengths("tokens", range(held.num_shards))
    assert lengths is not None and len(np.concatenate(lengths)) == 200
    pack = {"column": "tokens", "seq_len": 16, "mode": "bin"}
    batches = list(held.iter_batches(4, shuffle=True, seed=1, streams=2, pack=pack))
    served = np.concatenate([b["input_ids"].reshape(-1) for b in batches])
    assert (served > 0).sum() == sum(len(t) for t in docs(1000, 200)["tokens"].to_pylist())


def test_vacuum_keeps_the_shards_of_a_masked_latest(tmp_path: Path) -> None:
    """With the latest version masked there is no root index: the versions name the files."""
    table = str(tmp_path / "t")
    write_deltalake(table, _rows(0, 300), configuration=DV_TABLE)
    out = str(tmp_path / "followed")
    open_delta(table).write_mds(out, SPEC, mode="update")
    delete_by_dv(table, [4])
    open_delta(table).write_mds(out, SPEC, mode="update")
    report = vacuum(out, retention_seconds=0, keep_versions=1)
    assert report.dropped_versions == [0] and report.removed == []
    _same(open_dataset(out), _fresh(table, 1, tmp_path))


def test_rows_new_since_a_version_cannot_follow(tmp_path: Path) -> None:
    """A ``since=`` snapshot is not a version of the table: following it (or adopting its
    export) would make the next update's dataset miss every row older than ``since``."""
    table = str(tmp_path / "t")
    write_deltalake(table, _rows(0, 10))
    write_deltalake(table, _rows(10, 5), mode="append")
    out = tmp_path / "new"
    with pytest.raises(FollowError, match="since=0") as err:
        open_delta(table, version=1, since=0).write_mds(str(out), mode="update")
    assert err.value.table == table and not out.exists()
    open_delta(table, version=1, since=0).write_mds(str(out))  # a plain export is fine
    before = sorted(os.listdir(out))
    with pytest.raises(FollowError, match="since= export cannot be adopted"):
        open_delta(table, version=1).write_mds(str(out), mode="update")
    assert sorted(os.listdir(out)) == before
