"""Each way a corrupted copy is read, as a user would read it, reduced to a digest that
equals the pristine copy's only when everything read is the same: the core's reader
(``read``), the command line (``cli-inspect``, ``cli-verify``), a local Spark session
(``spark-read``), a Delta table exported or read in place, and the harness's own
self-tests (a crash, a hang)."""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

DELTA_TARGETS = ("delta-export", "delta-inplace")
ICEBERG_TARGETS = ("iceberg-export", "iceberg-inplace", "iceberg-mds")


def _canon(value: Any, h: Any) -> None:
    import numpy as np

    if hasattr(value, "offsets") and hasattr(value, "values"):  # a jagged batch
        _canon(np.asarray(value.values), h)
        _canon(np.asarray(value.offsets), h)
    elif isinstance(value, np.ndarray) and value.dtype != object:
        h.update(f"{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, (np.ndarray, list, tuple)):
        h.update(f"[{len(value)}".encode())
        for v in value:
            _canon(v, h)
    else:
        h.update(repr(value).encode())


def snapshot(path: str) -> str:
    """A digest of everything a reader gets: facts, then every batch in order."""
    from spark_dl_core import open_dataset

    ds = open_dataset(path)
    h = hashlib.sha256(repr((len(ds), ds.fingerprint, ds.columns)).encode())
    for batch in ds.iter_batches(batch_size=16, shuffle=True, seed=3):
        for name in sorted(batch):
            h.update(name.encode())
            _canon(batch[name], h)
    for batch in ds.iter_batches(batch_size=64, images="numpy"):
        for name in ("png", "jpeg"):
            if name in batch:
                _canon(batch[name], h)
    return h.hexdigest()


def _cli(command: str, path: str) -> str:
    import contextlib
    import io

    from spark_dl.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()) as err:
        code = main([command, "--json", path] if command == "inspect" else [command, path])
    if code == 1:
        raise CliFailed(err.getvalue())
    if code != 0:
        raise RuntimeError(f"spark-dl {command} exited {code}: {err.getvalue()}")
    text = out.getvalue().replace(path, "<path>")
    if command == "verify":  # "ok" must mean the data is the original's
        text += snapshot(path)
    return command + hashlib.sha256(text.encode()).hexdigest()


class CliFailed(Exception):
    """The CLI reported a deliberate error (exit code 1, one line naming the problem)."""


_SPARK: list[Any] = []


def spark_session() -> Any:
    if not _SPARK:
        from pyspark.sql import SparkSession

        import spark_dl

        session = (
            SparkSession.builder.master("local[1]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        spark_dl.register(session)
        _SPARK.append(session)
    return _SPARK[0]


def _spark_read(path: str) -> str:
    """``spark.read.format("mds")`` on a local session: every row (as a sorted multiset)."""
    try:
        rows = spark_session().read.format("mds").load(path).collect()
    except Exception as exc:  # Spark wraps the data source's error: look for ours inside
        text = str(exc)
        if "spark_dl_core.errors." in text or "SparkDLError" in text:
            raise CliFailed(text[-2000:]) from None
        raise
    return hashlib.sha256(repr(sorted(map(repr, rows))).encode()).hexdigest()


def delta_snapshot(path: str, target: str, version: int | None = None) -> str:
    """A digest of what a reader of the table at ``version`` gets: the exported rows
    (``delta-export``: ``to_arrow``, the rows ``write_mds`` writes) or the batches read in
    place (``delta-inplace``: shuffled, no converted-row-group cache)."""
    from spark_dl_core.tables.delta.table import open_delta

    snap = open_delta(path, version=version)
    if target == "delta-export":
        table = snap.to_arrow()
        text = repr((snap.version, table.schema, table.to_pylist()))
        return hashlib.sha256(text.encode()).hexdigest()
    return _in_place_digest(snap.version, snap.dataset(cache=False))


def iceberg_snapshot(path: str, target: str, out: str | None = None) -> str:
    """A digest of what a reader of the pristine table's snapshot gets (opened by its
    metadata file, pinned by id): the exported rows (``iceberg-export``: ``to_arrow``), the
    batches read in place (``iceberg-inplace``: shuffled, no caches), or the MDS dataset
    ``write_mds`` writes (``iceberg-mds``, into ``out``) read back."""
    from pyiceberg.manifest import clear_manifest_cache

    from bench.fuzzing.iceberg_tables import pin_of
    from spark_dl_core.tables.iceberg.table import open_iceberg

    clear_manifest_cache()  # PyIceberg keeps manifest-list entries per process, by path
    pin = pin_of(path)
    # planned from the manifests every time: a plan cached from the pristine files would
    # serve their rows, and the damaged manifests would go unread
    snap = open_iceberg(pin["metadata"], snapshot_id=pin["snapshot_id"], plan_cache=False)
    if target == "iceberg-export":
        table = snap.to_arrow()
        text = repr((snap.version, len(snap), table.schema, table.to_pylist()))
        return hashlib.sha256(text.encode()).hexdigest()
    if target == "iceberg-mds":
        assert out is not None
        snap.write_mds(out, {"nulls": "mask"})  # a column added later: nulls in older files
        return snapshot(out)
    ds = snap.dataset({"nulls": "mask"}, cache=False, plan_cache=False)
    return _in_place_digest(snap.version, ds)


def _in_place_digest(version: int, ds: Any) -> str:
    """A table snapshot read in place: its facts, then every batch in one shuffled order."""
    h = hashlib.sha256(repr((version, len(ds), ds.columns)).encode())
    for batch in ds.iter_batches(batch_size=16, shuffle=True, seed=3):
        for name in sorted(batch):
            h.update(name.encode())
            _canon(batch[name], h)
    return h.hexdigest()


def run_target(target: str, path: str, version: int | None = None) -> str:
    if target in DELTA_TARGETS:  # pinned at the pristine table's version, as training is
        return delta_snapshot(path, target, version)
    if target == "read":
        return snapshot(path)
    if target == "spark-read":
        return _spark_read(path)
    if target == "selftest-abort":  # the harness's own tests: a crash and a hang are counted
        os.abort()
    if target == "selftest-hang":
        time.sleep(3600)
    return _cli(target.removeprefix("cli-"), path)
