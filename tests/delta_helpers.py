"""Deletion vectors committed by hand, as delta-spark writes them: deltalake 1.6.6's own
``DeltaTable.delete`` rewrites files even on a table with ``delta.enableDeletionVectors``, so
tests (and the benches that reuse them) that need real deletion vectors write them here.
Also what the delta-spark oracle tests share: rows compared across readers, and tables
written through SQL side by side with cheap session settings."""

from __future__ import annotations

import contextlib
import decimal
import importlib.util
import json
import os
import struct
import sys
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = 1681511377  # RoaringBitmapArray, Delta's deletion-vector bitmap
FUZZ_BENCH = Path(__file__).resolve().parents[1] / "bench" / "fuzz.py"


def fuzz_bench() -> Any:
    """bench/fuzz.py as a module: its Delta table builders and deletion-vector encoders."""
    module = sys.modules.get("fuzz_bench")
    if module is None:
        spec = importlib.util.spec_from_file_location("fuzz_bench", FUZZ_BENCH)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["fuzz_bench"] = module
        spec.loader.exec_module(module)
    return module


def roaring64(rows: list[int]) -> bytes:
    """A deletion vector's bitmap as Delta stores it: the magic, the bucket count, then per
    32-bit bucket its key and a portable 32-bit RoaringBitmap (array containers: fine for
    the few rows a test deletes)."""
    buckets: dict[int, list[int]] = {}
    for v in sorted(set(rows)):
        buckets.setdefault(v >> 32, []).append(v & 0xFFFFFFFF)
    out = struct.pack("<iq", MAGIC, len(buckets))
    for key, values in buckets.items():
        out += struct.pack("<I", key) + _roaring32(values)
    return out


def _roaring32(values: list[int]) -> bytes:
    """The portable serialization of a 32-bit RoaringBitmap of sorted ``values``."""
    by_high: dict[int, list[int]] = {}
    for v in values:
        by_high.setdefault(v >> 16, []).append(v & 0xFFFF)
    head = struct.pack("<II", 12346, len(by_high))  # SERIAL_COOKIE_NO_RUNCONTAINER
    for key, vs in by_high.items():
        head += struct.pack("<HH", key, len(vs) - 1)
    offset = len(head) + 4 * len(by_high)
    offsets, data = b"", b""
    for vs in by_high.values():
        offsets += struct.pack("<I", offset + len(data))
        data += struct.pack(f"<{len(vs)}H", *vs)
    return head + offsets + data


def live_adds(table: str) -> dict[str, dict[str, Any]]:
    """The add action of every live file, from the JSON log (no checkpoints in these tests)."""
    live: dict[str, dict[str, Any]] = {}
    for log in sorted(Path(table, "_delta_log").glob("*.json")):
        for line in log.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                live[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    return live


def commit_deletion_vectors(table: str, deleted: dict[str, list[int]]) -> None:
    """Commit, for each live file ``path -> rows``, an on-disk deletion vector deleting exactly
    those rows (replacing the file's vector, as delta-spark's DELETE does)."""
    from deltalake import DeltaTable

    adds = live_adds(table)
    version = DeltaTable(table).version()
    ts = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [{"commitInfo": {"timestamp": ts, "operation": "DELETE"}}]
    for path, rows in deleted.items():
        add = adds[path]
        blob = roaring64(rows)
        name = f"deletion_vector_{uuid.uuid4()}.bin"
        crc = struct.pack(">I", zlib.crc32(blob))
        Path(table, name).write_bytes(b"\x01" + struct.pack(">i", len(blob)) + blob + crc)
        dv = {
            "storageType": "p",
            "pathOrInlineDv": "file://" + os.path.join(os.path.abspath(table), name),
            "offset": 1,
            "sizeInBytes": len(blob),
            "cardinality": len(set(rows)),
        }
        remove = {"path": add["path"], "deletionTimestamp": ts, "dataChange": True}
        remove |= {"extendedFileMetadata": True, "size": add["size"]}
        remove |= {"partitionValues": add["partitionValues"]}
        if "deletionVector" in add:
            remove["deletionVector"] = add["deletionVector"]
        actions += [{"remove": remove}, {"add": dict(add, deletionVector=dv, dataChange=True)}]
    Path(table, "_delta_log", f"{version + 1:020}.json").write_text(
        "\n".join(json.dumps(a) for a in actions) + "\n"
    )


def add_deletion_vector(table: str, deleted_rows: list[int]) -> None:
    """A deletion vector of ``deleted_rows`` on the data file the latest commit added."""
    from deltalake import DeltaTable

    latest = Path(table, "_delta_log", f"{DeltaTable(table).version():020}.json")
    lines = latest.read_text().splitlines()
    add = next(json.loads(line)["add"] for line in lines if '"add"' in line)
    commit_deletion_vectors(table, {add["path"]: deleted_rows})


def delete_by_dv(table: str, ids: list[int]) -> None:
    """Delete the rows holding these ``id`` values by deletion vectors: each file's vector
    is the rows it deleted before, and now these."""
    from urllib.parse import unquote

    import pyarrow.parquet as pq

    from spark_dl_core.tables.delta.table import open_delta

    before = {os.path.basename(k): v for k, v in open_delta(table).deleted_rows().items()}
    deleted: dict[str, list[int]] = {}
    for path, add in sorted(live_adds(table).items()):
        # the log escapes paths once more than the directories (part=a%20b -> part=a%2520b)
        found = pq.read_table(os.path.join(table, unquote(path)), columns=["id"]).column("id")
        hit = np.flatnonzero(np.isin(found.to_numpy(), ids)).tolist()
        if hit:
            old = before.get(os.path.basename(add["path"]), [])
            deleted[path] = sorted(set(old) | set(hit))
    commit_deletion_vectors(table, deleted)


def normal_value(value: Any) -> Any:
    """A value as compared across readers: timestamps with a zone as UTC instants, decimals
    as text, structs as sorted (name, value) pairs, lists, tuples and maps as tuples."""
    if isinstance(value, dict):
        return tuple(sorted((k, normal_value(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(normal_value(v) for v in value)
    if getattr(value, "tzinfo", None) is not None:
        return value.timestamp()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


def sorted_rows(table: Any, names: list[str]) -> list[tuple[Any, ...]]:
    """``table``'s (a ``pyarrow.Table``) rows over ``names``, values as :func:`normal_value`,
    in a canonical order: two readers of one snapshot give equal lists."""
    columns = [table.column(n).to_pylist() for n in names]
    rows = (tuple(normal_value(v) for v in row) for row in zip(*columns))
    return sorted(rows, key=repr)


@contextlib.contextmanager
def cheap_delta_writes(spark: Any) -> Iterator[None]:
    """Session settings for writing small Delta tables through SQL in tests: one shuffle
    partition for each write and for Delta's log replay (a commit's state reconstruction),
    and VACUUM's retention check off; restored afterwards."""
    settings = {
        "spark.sql.shuffle.partitions": "1",
        "spark.databricks.delta.snapshotPartitions": "1",
        "spark.databricks.delta.retentionDurationCheck.enabled": "false",
    }
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def write_concurrently(jobs: dict[str, Callable[[], Any]], workers: int = 4) -> dict[str, Any]:
    """Run each table-writing job (SQL on one shared session, one table each) in a pool of
    threads: a Delta commit through SQL is mostly driver latency (planning, log listing,
    small jobs), so tables written side by side finish in a fraction of the serial time.
    Returns each job's result by name; the first failure is raised."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        return {name: future.result() for name, future in futures.items()}
