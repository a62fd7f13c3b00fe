"""``vacuum``: leftovers go, committed files and anything young or foreign stay (no Spark)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl.cli import main
from spark_dl_core import (
    DatasetError,
    DatasetSpec,
    ShardWriter,
    maintenance,
    open_dataset,
    vacuum,
    write_mds,
)
from spark_dl_core.store.storage import Store

OLD = time.time() - 7200  # older than the default retention


def _table(n: int, start: int = 0) -> pa.Table:
    return pa.table({"x": np.arange(start, start + n, dtype=np.int64)})


def _age(path: Path, *names: str) -> None:
    for name in names:
        os.utime(path / name, (OLD, OLD))


def _orphans(path: Path) -> list[str]:
    """Shards a failed task wrote (never indexed) plus a torn temporary file."""
    writer = ShardWriter(Store(str(path)), DatasetSpec(shard_size=256), prefix="shard-dead-p0")
    writer.write(_table(100))
    names = [s.stored.basename for s in writer.finish()]
    (path / "index.json.tmp-0123abcd").write_bytes(b'{"half')
    return [*names, "index.json.tmp-0123abcd"]


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Path, list[str]]:
    path = tmp_path / "ds"
    write_mds(_table(300), str(path), DatasetSpec(shard_size=1024, compression="zstd"))
    orphans = _orphans(path)
    (path / "README.txt").write_text("not ours")
    (path / "sub").mkdir()
    (path / "sub" / "shard.00000.mds").write_bytes(b"x")
    _age(path, *os.listdir(path))
    return path, orphans


def test_vacuum_is_public() -> None:
    """The docs call vacuum(...) from the package, as the CLI's vacuum does."""
    import spark_dl_core

    assert vacuum is maintenance.vacuum and {"vacuum", "VacuumReport"} <= set(spark_dl_core.__all__)


def test_removes_only_unreferenced_leftovers(dataset: tuple[Path, list[str]]) -> None:
    path, orphans = dataset
    before = open_dataset(str(path)).fingerprint
    committed = [s.stored.basename for s in open_dataset(str(path)).shards]
    sizes = sum((path / n).stat().st_size for n in orphans)
    report = vacuum(str(path))
    assert sorted(report.removed) == sorted(orphans)
    assert report.bytes_removed == sizes
    assert report.committed and not report.dry_run
    left = set(os.listdir(path))
    assert left == {
        *committed,
        "index.json",
        "spark_dl.json",
        "spark_dl.index.arrow",
        "README.txt",
        "sub",
    }
    assert (path / "sub" / "shard.00000.mds").exists()  # subdirectories are not ours
    assert open_dataset(str(path)).fingerprint == before
    assert vacuum(str(path)).removed == []  # idempotent


def test_dry_run_deletes_nothing(dataset: tuple[Path, list[str]]) -> None:
    path, orphans = dataset
    before = sorted(os.listdir(path))
    report = vacuum(str(path), dry_run=True)
    assert sorted(report.removed) == sorted(orphans) and report.dry_run
    assert sorted(os.listdir(path)) == before


def test_retention_keeps_young_files(tmp_path: Path) -> None:
    """A shard written a moment ago may belong to a write in flight: it stays."""
    path = tmp_path / "ds"
    write_mds(_table(50), str(path))
    young = _orphans(path)
    report = vacuum(str(path))
    assert report.removed == [] and sorted(report.too_new) == sorted(young)
    _age(path, young[0])
    assert vacuum(str(path), retention_seconds=3600).removed == [young[0]]
    assert sorted(vacuum(str(path), retention_seconds=0).removed) == sorted(young[1:])
    assert len(open_dataset(str(path))) == 50


def test_replaced_dataset_shards_go(tmp_path: Path) -> None:
    """Shards an overwrite left behind (e.g. its deletes failed) are unreferenced."""
    path = tmp_path / "ds"
    write_mds(_table(50), str(path))
    old = sorted(n for n in os.listdir(path) if n.endswith(".mds"))
    saved = {n: (path / n).read_bytes() for n in old}
    write_mds(_table(70, 100), str(path), mode="overwrite")
    for name, data in saved.items():  # as if the overwrite's deletes had not happened
        (path / name).write_bytes(data)
    assert sorted(vacuum(str(path), retention_seconds=0).removed) == old
    assert len(open_dataset(str(path))) == 70


def test_without_index_everything_ours_is_leftover(tmp_path: Path) -> None:
    """A first write that never committed: its shards go, the directory stays."""
    path = tmp_path / "never"
    path.mkdir()
    orphans = _orphans(path)
    report = vacuum(str(path), retention_seconds=0)
    assert not report.committed and sorted(report.removed) == sorted(orphans)
    assert os.listdir(path) == []


def test_corrupt_index_deletes_nothing(dataset: tuple[Path, list[str]]) -> None:
    path, _ = dataset
    (path / "index.json").write_text("{not json")
    before = sorted(os.listdir(path))
    with pytest.raises(DatasetError, match=r"index\.json"):
        vacuum(str(path), retention_seconds=0)
    assert sorted(os.listdir(path)) == before


def test_missing_path_and_bad_retention(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="nowhere"):
        vacuum(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="retention"):
        vacuum(str(tmp_path), retention_seconds=-1)


def test_fsspec_url(tmp_path: Path) -> None:
    """Remote stores go through fsspec (memory:// here; s3:// is the same code path)."""
    pytest.importorskip("fsspec")
    url = f"memory://vacuum-{os.getpid()}/ds"
    write_mds(_table(40), url, DatasetSpec(shard_size=256))
    store = Store(url)
    store.write_bytes("shard-dead.00000.mds", b"orphan")
    store.write_bytes("notes.txt", b"foreign")
    assert vacuum(url).removed == []  # just written: within the retention
    report = vacuum(url, retention_seconds=0)
    assert report.removed == ["shard-dead.00000.mds"] and report.bytes_removed == 6
    assert "notes.txt" in store.listdir() and len(open_dataset(url)) == 40


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if "--json" in argv and code == 0 else out), err


def test_cli(dataset: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    path, orphans = dataset
    code, data, _ = _cli(capsys, "vacuum", str(path), "--dry-run", "--json")
    assert code == 0 and data["dry_run"] and sorted(data["removed"]) == sorted(orphans)
    assert all((path / n).exists() for n in orphans)
    code, text, _ = _cli(capsys, "vacuum", str(path), "--retention", "0")
    assert code == 0 and f"removed {len(orphans)} file(s)" in text
    code, data, _ = _cli(capsys, "vacuum", str(path), "--json")
    assert code == 0 and data["removed"] == [] and "index.json" in data["kept"]
    code, _, err = _cli(capsys, "vacuum", str(path / "missing"))
    assert code == 1 and "missing" in err
    with pytest.raises(SystemExit) as exc:
        main(["vacuum", str(path), "--retention", "soon"])
    assert exc.value.code == 2


def test_lengths_files_stay_with_their_shards_and_go_with_them(tmp_path: Path) -> None:
    """A token column's per-row lengths file beside each shard is kept while
    ``spark_dl.json`` names it; an overwrite deletes the replaced ones, and a vacuum the
    lengths file of a shard no index names (a failed task's)."""
    path = tmp_path / "ds"
    docs = pa.table({"tokens": pa.array([[1] * (i % 9) for i in range(200)], pa.list_(pa.int32()))})
    write_mds(docs, str(path), DatasetSpec(shard_size=512))
    lengths = sorted(n for n in os.listdir(path) if n.endswith(".mds.lengths"))
    meta = json.loads((path / "spark_dl.json").read_text())
    assert lengths == sorted(m["lengths"]["basename"] for m in meta["shards"]) and len(lengths) > 2
    writer = ShardWriter(Store(str(path)), DatasetSpec(shard_size=512), prefix="shard-dead-p0")
    writer.write(docs)
    dead = [n for s in writer.finish() for n in s.files()]
    assert any(n.endswith(".lengths") for n in dead)
    _age(path, *os.listdir(path))
    report = vacuum(str(path), retention_seconds=0)
    assert sorted(report.removed) == sorted(dead)
    assert set(lengths) <= set(os.listdir(path))
    write_mds(docs.slice(0, 50), str(path), DatasetSpec(shard_size=4096), mode="overwrite")
    now = json.loads((path / "spark_dl.json").read_text())
    assert sorted(n for n in os.listdir(path) if n.endswith(".lengths")) == sorted(
        m["lengths"]["basename"] for m in now["shards"]
    )
