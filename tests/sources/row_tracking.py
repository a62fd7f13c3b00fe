"""Delta tables with row tracking, as delta-spark writes them, for the carry-on tests.

delta-rs (``deltalake``) reads such tables but writes none (it refuses the ``rowTracking``
writer feature), so the commits after the first ones are written here, action by action,
as PROTOCOL.md ("Row Tracking") tells a writer to:

- enabling it on an existing table: the ``rowTracking`` and ``domainMetadata`` writer
  features, ``delta.enableRowTracking`` and the materialized columns' names in the
  configuration, every live file re-added (``dataChange: false``) with a ``baseRowId``, and
  the ``delta.rowTracking`` domain's ``rowIdHighWaterMark``;
- an append: a new file whose ``baseRowId`` is above the high-water mark;
- a rewrite (OPTIMIZE, copy-on-write DELETE or UPDATE): the files' ``remove`` actions carry
  their ``baseRowId``; the new file holds the rows kept (updated ones changed), each row's
  stable id preserved in the materialized row-id column, and a fresh ``baseRowId``.
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
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROW_ID_COLUMN = "_row-id-col-8c1f5a"
COMMIT_VERSION_COLUMN = "_row-commit-version-col-8c1f5a"


def _log(table: str) -> Path:
    return Path(table, "_delta_log")


def _version(table: str) -> int:
    return max(int(p.stem) for p in _log(table).glob("*.json"))


def _actions(table: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(_log(table).glob("*.json")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def live_adds(table: str) -> dict[str, dict[str, Any]]:
    """Each live file's latest add action (these tests write no checkpoint)."""
    live: dict[str, dict[str, Any]] = {}
    for action in _actions(table):
        if "add" in action:
            live[action["add"]["path"]] = action["add"]
        elif "remove" in action:
            live.pop(action["remove"]["path"], None)
    return live


def _high_water_mark(table: str) -> int:
    mark = -1
    for action in _actions(table):
        domain = action.get("domainMetadata")
        if domain and domain["domain"] == "delta.rowTracking":
            mark = json.loads(domain["configuration"])["rowIdHighWaterMark"]
    return int(mark)


def _commit(table: str, operation: str, actions: list[dict[str, Any]]) -> int:
    version = _version(table) + 1
    info = {
        "timestamp": int(time.time() * 1000),
        "operation": operation,
        "tags": {"delta.rowTracking.preserved": "true"},
    }
    lines = [json.dumps({"commitInfo": info}), *(json.dumps(a) for a in actions)]
    (_log(table) / f"{version:020}.json").write_text("\n".join(lines) + "\n")
    return version


def _mark(value: int) -> dict[str, Any]:
    config = json.dumps({"rowIdHighWaterMark": value})
    return {"domainMetadata": {"domain": "delta.rowTracking", "configuration": config,
                               "removed": False}}  # fmt: skip


def enable_row_tracking(table: str) -> int:
    """Turn row tracking on for a table deltalake wrote: the commit's version."""
    actions = _actions(table)
    protocol = next(a["protocol"] for a in reversed(actions) if "protocol" in a)
    metadata = next(a["metaData"] for a in reversed(actions) if "metaData" in a)
    features = sorted({*protocol.get("writerFeatures", []), "rowTracking", "domainMetadata"})
    protocol = dict(protocol, minWriterVersion=7, writerFeatures=features)
    if protocol.get("minReaderVersion", 1) >= 3:
        protocol.setdefault("readerFeatures", [])
    configuration = dict(metadata.get("configuration") or {})
    configuration |= {
        "delta.enableRowTracking": "true",
        "delta.rowTracking.materializedRowIdColumnName": ROW_ID_COLUMN,
        "delta.rowTracking.materializedRowCommitVersionColumnName": COMMIT_VERSION_COLUMN,
    }
    version = _version(table) + 1
    out: list[dict[str, Any]] = [
        {"protocol": protocol},
        {"metaData": dict(metadata, configuration=configuration)},
    ]
    next_id = 0
    for add in live_adds(table).values():
        rows = json.loads(add["stats"])["numRecords"]
        out.append({"add": dict(add, dataChange=False, baseRowId=next_id,
                                defaultRowCommitVersion=version)})  # fmt: skip
        next_id += rows
    out.append(_mark(next_id - 1))
    return _commit(table, "SET TBLPROPERTIES", out)


def _add(table: str, rows: pa.Table, base_row_id: int, version: int) -> dict[str, Any]:
    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    pq.write_table(rows, Path(table, name))
    stats = json.dumps({"numRecords": rows.num_rows})
    return {
        "add": {
            "path": name,
            "partitionValues": {},
            "size": Path(table, name).stat().st_size,
            "modificationTime": int(time.time() * 1000),
            "dataChange": True,
            "stats": stats,
            "baseRowId": base_row_id,
            "defaultRowCommitVersion": version,
        }
    }


def append(table: str, rows: pa.Table) -> int:
    """Append ``rows`` as one new file with fresh row ids: the commit's version."""
    start = _high_water_mark(table) + 1
    version = _version(table) + 1
    actions = [_add(table, rows, start, version), _mark(start + rows.num_rows - 1)]
    return _commit(table, "WRITE", actions)


def stable_ids(table: str, path: str) -> np.ndarray:
    """The stable row id of each row of a live file (materialized, else baseRowId + row)."""
    add = live_adds(table)[path]
    data = pq.read_table(Path(table, path))
    ids = add["baseRowId"] + np.arange(data.num_rows, dtype=np.int64)
    if ROW_ID_COLUMN in data.column_names:
        kept = data.column(ROW_ID_COLUMN)
        valid = kept.is_valid().to_numpy(zero_copy_only=False)
        ids[valid] = kept.fill_null(0).to_numpy()[valid]
    return ids


def rewrite(
    table: str,
    operation: str,
    paths: list[str] | None = None,
    keep: Callable[[pa.Table], Any] | None = None,
    update: Callable[[pa.Table], pa.Table] | None = None,
) -> int:
    """Rewrite the files ``paths`` (all live files by default) into one, copy-on-write:
    ``keep`` (a mask over their rows) drops deleted rows, ``update`` changes values; each
    row keeps its stable id. OPTIMIZE is neither. The commit's version."""
    adds = live_adds(table)
    paths = sorted(adds) if paths is None else paths
    version = _version(table) + 1
    ts = int(time.time() * 1000)
    parts, ids = [], []
    removes: list[dict[str, Any]] = []
    for path in paths:
        add = adds[path]
        data = pq.read_table(Path(table, path))
        if ROW_ID_COLUMN in data.column_names:
            data = data.drop_columns([ROW_ID_COLUMN])
        parts.append(data)
        ids.append(stable_ids(table, path))
        remove = {k: add[k] for k in ("path", "partitionValues", "size", "baseRowId")}
        remove |= {"deletionTimestamp": ts, "dataChange": operation != "OPTIMIZE"}
        remove |= {"extendedFileMetadata": True}
        remove["defaultRowCommitVersion"] = add["defaultRowCommitVersion"]
        removes.append({"remove": remove})
    rows = pa.concat_tables(parts)
    row_ids = np.concatenate(ids)
    if keep is not None:
        mask = np.asarray(keep(rows), dtype=bool)
        rows, row_ids = rows.filter(pa.array(mask)), row_ids[mask]
    if update is not None:
        rows = update(rows)
    rows = rows.append_column(ROW_ID_COLUMN, pa.array(row_ids, pa.int64()))
    start = _high_water_mark(table) + 1
    add = _add(table, rows, start, version)
    add["add"]["dataChange"] = operation != "OPTIMIZE"
    actions = [*removes, add, _mark(start + rows.num_rows - 1)]
    return _commit(table, operation, actions)


def where(column: str, values: list[int]) -> Callable[[pa.Table], Any]:
    """A ``keep`` mask: rows whose ``column`` is not among ``values``."""
    return lambda rows: pc.invert(pc.is_in(rows.column(column), pa.array(values))).to_numpy(
        zero_copy_only=False
    )
