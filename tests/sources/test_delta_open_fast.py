"""Opening a local snapshot skips per-file work (tables/delta/snapshot, tables/delta/log): the
table URI is decoded once for all relative paths, and files are stat'ed with ``os.stat``, not a
pyarrow listing. Each shortcut gives what the general path gives: the same locations,
sizes, modification times and errors. A real table written by deltalake."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest

deltalake = pytest.importorskip("deltalake")
from deltalake import write_deltalake  # noqa: E402

from spark_dl_core.tables.delta.log import log_location, log_locations, log_uri  # noqa: E402
from spark_dl_core.tables.delta.snapshot import DeltaSnapshotError  # noqa: E402
from spark_dl_core.tables.delta.table import open_delta  # noqa: E402

BASES = [
    "file:///tmp/t",
    "file:/tmp/a%2520b",
    "file:///",
    "file:",
    "file://",
    "s3://bucket/t%20x",
    "abfss://c@acct.dfs.core.windows.net/t%",
    "/plain/base%41",
    "gs://b/t%4",
]
PATHS = [
    "part-0.parquet",
    "p=a%2520b/part.parquet",
    "p=%C3%A9/x.parquet",
    "%",
    "%4",
    "%41%",
    "a%2Fb",
    "s3://other/x%20y",
    "file:///abs/x%20",
    "file:rel",
    "/abs/%41",
    "",
]


def test_locations_decoded_at_once_equal_one_by_one() -> None:
    for base in BASES:
        expected = [log_location(log_uri(base, p)) for p in PATHS]
        assert log_locations(base, PATHS) == expected, base


@pytest.fixture
def delta_table(tmp_path: Path) -> Path:
    path = tmp_path / "t"
    for k in range(3):
        write_deltalake(
            str(path), pa.table({"id": pa.array(range(k * 10, k * 10 + 10))}), mode="append"
        )
    return path


def _data_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.parquet"))


def test_a_data_file_become_a_directory_is_refused_naming_it(delta_table: Path) -> None:
    """Not a plain file: the stat shortcut leaves it to pyarrow's listing, as before."""
    victim = _data_files(delta_table)[1]
    victim.unlink()
    victim.mkdir()
    with pytest.raises(DeltaSnapshotError, match=victim.name) as info:
        open_delta(str(delta_table)).dataset(cache=False, plan_cache=False)
    assert "version 2" in str(info.value)


def test_snapshot_files_sizes_and_rows_as_logged(delta_table: Path) -> None:
    snap = open_delta(str(delta_table))
    files = _data_files(delta_table)
    assert snap.files == [str(f) for f in files]
    assert [snap.file_size(u) for u in snap.files] == [f.stat().st_size for f in files]
    assert snap._mtimes == {str(f): f.stat().st_mtime_ns for f in files}
    assert sorted(snap.to_arrow()["id"].to_pylist()) == list(range(30))


def test_a_data_file_shorter_than_logged_is_refused_at_open(delta_table: Path) -> None:
    victim = _data_files(delta_table)[2]
    shutil.copyfile(victim, victim.with_suffix(".bak"))
    victim.write_bytes(victim.read_bytes()[:-1])
    with pytest.raises(DeltaSnapshotError, match=rf"{victim.name} has \d+ bytes, its add action"):
        open_delta(str(delta_table))
