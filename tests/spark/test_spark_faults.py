"""Fault injection in Spark writes: readers see exactly one committed dataset, never a mix.

Each case ends by reading the path with ``open_dataset`` and ``spark.read.format("mds")``
and by checking that ``vacuum`` (or the commit itself) leaves no file the index does not
name. The module runs its own ``local[2,3]`` session (3 attempts per task, so retries
happen locally); Spark cannot run speculative copies in local mode (one host, and a
speculative copy never runs on the host of the running attempt), so duplicate attempts are
driven through the writer API. Driver death runs the write in a subprocess and kills its
whole process tree at a hook inside the commit: ``tests/fault_hooks/sitecustomize.py``,
put on that driver's ``PYTHONPATH`` (and so on its Python workers'), armed by
``SPARK_DL_TEST_CRASH_BEFORE``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetError, open_dataset
from spark_dl_core.maintenance import vacuum

pytestmark = [pytest.mark.spark, pytest.mark.own_spark_session]  # run last: see conftest

ROWS = 1000  # per faulty job: 4 partitions of 250
FAULT_HOOKS = Path(__file__).resolve().parents[1] / "fault_hooks"  # the crash hook, test-only


@pytest.fixture(scope="module")
def spark(_spark_sessions: Any) -> Iterator[Any]:
    """``local[2,3]``: two threads, up to three attempts per task (retries need ``,3``)."""
    _spark_sessions.stop()  # one SparkContext per process: the shared one must go first
    from pyspark.sql import SparkSession

    import spark_dl

    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("test_spark_faults")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "50")  # shards flush early
        .getOrCreate()
    )
    spark_dl.register(session)
    yield session
    session.stop()


# --------------------------------------------------------------------------- helpers


def _indexed(path: str) -> set[str]:
    ds = open_dataset(path)
    return {s.stored.basename for s in ds.shards}


def _leftovers(path: str) -> list[str]:
    """Files in the directory that the committed index does not name."""
    names = set(os.listdir(path)) - {"index.json", "spark_dl.json", "spark_dl.index.arrow"}
    return sorted(names - _indexed(path)) if os.path.exists(f"{path}/index.json") else sorted(names)


def _assert_one_dataset(spark: Any, path: str, ids: list[int], fingerprint: str | None) -> None:
    """Both readers see exactly the committed rows (each once), and nothing else remains."""
    ds = open_dataset(path)
    assert sorted(ds.read(np.arange(len(ds)))["id"].tolist()) == ids
    if fingerprint is not None:
        assert ds.fingerprint == fingerprint
    assert sorted(r.id for r in spark.read.format("mds").load(path).collect()) == ids
    leftovers = _leftovers(path)
    report = vacuum(path, retention_seconds=0)
    assert sorted(report.removed) == leftovers
    assert _leftovers(path) == []
    assert len(open_dataset(path)) == len(ids)


def _old_dataset(spark: Any, path: str, n: int = 50) -> str:
    spark.range(n).write.format("mds").option("shard_size", "1KiB").save(path)
    return str(open_dataset(path).fingerprint)


def _faulty_ids(spark: Any, fail_at: int, seen: str, how: str, once: bool = False) -> Any:
    """``range(ROWS)`` in 4 partitions; the row ``fail_at`` fails its task (``raise``, or
    ``crash``: the first attempt kills its Python worker, later ones raise); with ``once``
    only the first attempt fails. Before failing,
    the task records the directory listing in ``seen``: proof of what the job had written."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    target = os.path.dirname(seen)

    @F.udf(LongType())
    def fault(x):  # no hints: the udf must stay a plain Python one
        if x == fail_at and not (once and os.path.exists(seen)):
            first = not os.path.exists(seen)
            with open(seen, "w") as f:
                json.dump(sorted(os.listdir(target + "/ds")), f)
            if how == "crash" and first:  # later attempts raise: crashes are slow to retry
                os._exit(3)
            raise RuntimeError(f"injected fault at row {x}")
        return x

    return spark.range(0, ROWS, numPartitions=4).select(fault("id").alias("id"))


# --------------------------------------------------------------------------- task faults


@pytest.mark.parametrize(
    "mode,how", [("overwrite", "crash"), ("append", "raise")], ids=["overwrite-crash", "append"]
)
def test_task_failing_mid_partition_keeps_the_old_dataset(
    spark: Any, tmp_path: Path, mode: str, how: str
) -> None:
    """The last partition fails near its end, after the others have written their shards
    (an append that fails halfway): every attempt fails, the job aborts, old rows only."""
    path = str(tmp_path / "ds")
    before = _old_dataset(spark, path)
    old_files = set(os.listdir(path))
    seen = str(tmp_path / "seen.json")
    bad = _faulty_ids(spark, fail_at=ROWS - 10, seen=seen, how=how)
    with pytest.raises(Exception, match=r"injected fault|crashed|exited unexpectedly|EOF"):
        bad.write.format("mds").mode(mode).option("shard_size", "1KiB").save(path)
    written = set(json.loads(Path(seen).read_text())) - old_files
    assert any(".mds" in n for n in written), "the job should have written shards before failing"
    assert set(os.listdir(path)) == old_files  # abort removed every file of the job
    _assert_one_dataset(spark, path, list(range(50)), before)


def test_retried_task_is_indexed_once(spark: Any, tmp_path: Path) -> None:
    """A task failing on its first attempt only: the job succeeds, each row once, and the
    failed attempt's shards are neither indexed nor left behind."""
    path = str(tmp_path / "ds")
    _old_dataset(spark, path)
    seen = str(tmp_path / "seen.json")
    fail_at = 740  # partition 2 (rows 500-749), near its end
    df = _faulty_ids(spark, fail_at=fail_at, seen=seen, how="raise", once=True)
    df.write.format("mds").mode("overwrite").option("shard_size", "1KiB").save(path)
    assert os.path.exists(seen)  # the first attempt did fail
    indexed = _indexed(path)
    assert any("-p00002-a1-" in n for n in indexed)  # partition 2 from its retry
    assert not any("-p00002-a0-" in n for n in indexed)
    failed = [n for n in json.loads(Path(seen).read_text()) if "-p00002-a0-" in n]
    assert not (set(failed) & set(os.listdir(path)))
    assert _leftovers(path) == []  # the commit itself removed the failed attempt's files
    _assert_one_dataset(spark, path, list(range(ROWS)), None)


def test_duplicate_attempts_one_is_taken(spark: Any, tmp_path: Path) -> None:
    """Speculative copies, driven through the writer API: two attempts of partition 0, one
    of them still writing after the commit. The commit takes exactly one attempt per
    partition; the late loser's files stay out of the index and vacuum removes them."""
    from pyspark.sql.types import LongType, StructField, StructType

    from spark_dl.datasource import MDSWriter

    path = str(tmp_path / "ds")
    before = _old_dataset(spark, path)
    schema = StructType([StructField("id", LongType(), False)])

    def batch(start: int) -> pa.RecordBatch:
        return pa.record_batch([pa.array(np.arange(start, start + 100, dtype=np.int64))], ["id"])

    writer = MDSWriter({"path": path, "shard_size": "512"}, schema, overwrite=True)
    first = writer.write(iter([batch(0)]))
    twin = writer.write(iter([batch(0)]))  # the same partition again (a speculative copy)
    other = writer.write(iter([batch(100)]))
    other.partition = 1
    writer.commit([first, other, twin])  # should a duplicate ever reach the commit
    assert {s.stored.basename for s in open_dataset(path).shards} == {
        s.stored.basename for s in first.shards + other.shards
    }
    late = writer.write(iter([batch(0)]))  # a copy that was still running at commit time
    assert late.shards and _leftovers(path) == sorted(s.stored.basename for s in late.shards)
    assert open_dataset(path).fingerprint != before
    _assert_one_dataset(spark, path, list(range(200)), None)


def test_next_commit_sweeps_old_leftovers(spark: Any, tmp_path: Path) -> None:
    """A successful Spark write also removes unreferenced files older than its retention
    (default 1 h), and keeps younger ones: they may belong to a write in flight."""
    path = str(tmp_path / "ds")
    _old_dataset(spark, path)
    aged, young = f"{path}/shard-dead-p0.00000.mds", f"{path}/shard-dead-p1.00000.mds"
    for name in (aged, young):
        Path(name).write_bytes(b"orphan")
    os.utime(aged, (time.time() - 7200, time.time() - 7200))
    spark.range(50, 60).write.format("mds").mode("append").save(path)
    assert not os.path.exists(aged) and os.path.exists(young)
    _assert_one_dataset(spark, path, list(range(60)), None)


# --------------------------------------------------------------------------- driver death

_DRIVER = textwrap.dedent(
    """
    import sys, threading
    from pyspark.sql import SparkSession
    import spark_dl
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark_dl.register(spark)
    def write(path):
        # the JVM finds Python data sources through the thread's active session
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
        df = spark.range(100, 400, numPartitions=3)
        df.write.format("mds").mode("overwrite").option("shard_size", "1KiB").save(path)
    threads = [threading.Thread(target=write, args=(p,)) for p in sys.argv[1:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("the commit was not interrupted", file=sys.stderr)
    """
)

# driver process -> the file its commits are about to write when it dies -> the paths it
# writes concurrently (case name: whether an old dataset is there)
_KILLS = {
    "spark_dl.json": {"old-before-metadata": True, "none": False},
    "index.json": {"old-between-metadata-and-index": True},
}


def _kill_tree(proc: subprocess.Popen[bytes], workers: list[int]) -> None:
    """SIGKILL the driver's process group (Python driver, JVM) and those of the commit
    workers (PySpark's daemon makes its own group); never our own group."""
    groups = {proc.pid}
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(pid))
    for group in groups - {os.getpgrp()}:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    for group in groups - {os.getpgrp()}:  # nothing of the killed driver lives on
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"process group {group} survived SIGKILL")


@pytest.fixture(scope="module")
def killed(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Runs the ``_KILLS`` drivers at once; each is killed once all its commits are
    inside the hook. Returns case -> (path, (old fingerprint, old files))."""
    root = tmp_path_factory.mktemp("killed")
    out: dict[str, Any] = {}
    runs = {}
    for before_file, cases in _KILLS.items():
        paths = []
        for case, has_old in cases.items():
            path = str(root / case)
            fingerprint = _old_dataset(spark, path) if has_old else None
            out[case] = (path, (fingerprint, set(os.listdir(path)) if has_old else set()))
            paths.append(path)
        marker = str(root / f"{before_file}.marker")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(FAULT_HOOKS), os.environ.get("PYTHONPATH")) if p
            ),
            "SPARK_DL_TEST_CRASH_BEFORE": before_file,
            "SPARK_DL_TEST_CRASH_MARKER": marker,
        }
        proc = subprocess.Popen(
            [sys.executable, "-c", _DRIVER, *paths],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        runs[before_file] = (marker, len(paths), proc)
    deadline = time.monotonic() + 240
    pending = dict(runs)
    errors = {}
    while pending and time.monotonic() < deadline:
        for key, (marker, n, proc) in list(pending.items()):
            folder, prefix = os.path.split(marker)
            hits = [f for f in os.listdir(folder) if f.startswith(prefix + ".")]
            hits = [f for f in hits if not f.endswith(".tmp")]
            if len(hits) == n:
                _kill_tree(proc, [int(f.rsplit(".", 1)[1]) for f in hits])
                del pending[key]
            elif proc.poll() is not None:
                errors[key] = proc.stderr.read().decode()[-3000:] if proc.stderr else ""
                _kill_tree(proc, [])
                del pending[key]
        time.sleep(0.2)
    for key, (_, _, proc) in pending.items():
        _kill_tree(proc, [])
        errors[key] = "timed out before the commit hook"
    for _, _, proc in runs.values():
        if proc.stderr:
            proc.stderr.close()
    assert not errors, errors
    return out


def _job_files(path: str, old_files: set[str]) -> list[str]:
    """Shards the killed job's tasks wrote."""
    return sorted(n for n in set(os.listdir(path)) - old_files if n.endswith(".mds"))


def test_driver_killed_before_the_commit_keeps_the_old_dataset(
    spark: Any, killed: dict[str, Any]
) -> None:
    path, (fingerprint, old_files) = killed["old-before-metadata"]
    orphans = _job_files(path, old_files)
    assert len(orphans) >= 3, "the killed job's task shards should still be there"
    assert set(orphans).isdisjoint(_indexed(path))
    _assert_one_dataset(spark, path, list(range(50)), fingerprint)
    assert _job_files(path, old_files) == []


def test_driver_killed_on_first_write_leaves_no_dataset(spark: Any, killed: dict[str, Any]) -> None:
    path, _ = killed["none"]
    assert _job_files(path, set())
    with pytest.raises(DatasetError, match=r"index\.json"):
        open_dataset(path)
    with pytest.raises(Exception, match=r"index\.json"):
        spark.read.format("mds").load(path).collect()
    report = vacuum(path, retention_seconds=0)
    assert report.removed and not report.committed
    assert os.listdir(path) == []


def test_driver_killed_between_metadata_and_index(spark: Any, killed: dict[str, Any]) -> None:
    """The new spark_dl.json beside the old index: readers fall back to spark_dl.prev.json."""
    path, (fingerprint, old_files) = killed["old-between-metadata-and-index"]
    assert _job_files(path, old_files)
    _assert_one_dataset(spark, path, list(range(50)), fingerprint)
