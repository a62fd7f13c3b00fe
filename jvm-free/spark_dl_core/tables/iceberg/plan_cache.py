"""A snapshot's planned data files kept on this machine's disk, so that opening it again
does not run PyIceberg's planner over its manifests (for 10⁵ data files, seconds of Avro
decoding per open).

Why it is sound, and what is checked:

- *Immutable inputs*: a snapshot's manifest list and manifests are never rewritten (a
  commit writes new ones), and so are its delete files. What planning found (data files in
  path order, sizes, record counts, partition specs, each file's rows kept after position
  and equality deletes) is a function of the table (uuid, location), the snapshot (id,
  sequence number) and its manifest list (path, size). An entry records that key and is
  served only when every part equals the snapshot's now; anything else is planned again.
- *Sealed file*: written through a temporary file and a rename, with the payload's size
  and xxh3_64 (:func:`~..parquet.footers.write_sealed`): a torn, truncated or altered entry
  is planned again, never read.
- *Still checked at each open* by the snapshot: the totals against the snapshot's summary,
  every data file present with its manifest's size.

One file per snapshot, ``iceberg-<snapshot id>.plan``, beside the footers' plan cache of
the table read in place (``<tmp>/spark-dl-cache/<hash of the table URI and "#plan">``,
``plan_cache=``); the :data:`KEEP` most recently written are kept.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..parquet.footers import read_sealed, write_sealed

FORMAT = "1"  # bump when what a SnapshotPlan holds changes
_MAGIC = b"SDLICEP1"
KEEP = 16  # snapshots' plans kept per table


@dataclass
class SnapshotPlan:
    """A snapshot's live data files, in path order, with what reading them needs."""

    paths: list[str]
    sizes: np.ndarray  # int64: each file's size as its manifest gives it
    records: np.ndarray  # int64: its record count
    specs: np.ndarray  # int64: its partition spec id
    keeps: dict[str, np.ndarray] = field(default_factory=dict)  # path: rows kept (bool)


def plan_key(table: Any, snapshot_id: int) -> dict[str, Any] | None:
    """What a cached plan of this snapshot must have been made from; None when the manifest
    list's size cannot be had (nothing cached then)."""
    meta = table.metadata
    snapshot = meta.snapshot_by_id(snapshot_id)
    if snapshot is None or not snapshot.manifest_list:
        return None
    try:
        size = len(table.io.new_input(snapshot.manifest_list))
    except Exception:  # unreachable: the planner names it
        return None
    return {
        "format": FORMAT,
        "table_uuid": str(meta.table_uuid),
        "location": str(meta.location),
        "snapshot_id": int(snapshot_id),
        "sequence_number": snapshot.sequence_number,
        "manifest_list": str(snapshot.manifest_list),
        "manifest_list_size": int(size),
    }


class PlanStore:
    """The cached plan of one snapshot, under ``directory``."""

    def __init__(self, directory: str, key: dict[str, Any]) -> None:
        self.directory = directory
        self.key = key
        self.path = os.path.join(directory, f"iceberg-{key['snapshot_id']}.plan")

    def load(self) -> SnapshotPlan | None:
        """The plan, or None: none cached, or cached for another key, or damaged."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
            return _decode(data, self.key)
        except Exception:  # absent, unreadable, torn, of another format: plan again
            return None

    def save(self, plan: SnapshotPlan) -> None:
        """Store the plan (best effort) and drop the oldest beyond :data:`KEEP`."""
        write_sealed(self.path, _encode(plan, self.key), _MAGIC)
        found = glob.glob(os.path.join(self.directory, "iceberg-*.plan"))
        if len(found) > KEEP:
            aged = []
            for path in found:
                with contextlib.suppress(OSError):
                    aged.append((os.stat(path).st_mtime_ns, path))
            for _, path in sorted(aged)[: len(aged) - KEEP]:
                with contextlib.suppress(OSError):
                    os.remove(path)


def _encode(plan: SnapshotPlan, key: dict[str, Any]) -> bytes:
    """A JSON header (the key, the paths) then int64 arrays: sizes, records, spec ids, each
    file's keep-mask length (-1: none) and deleted-row count, then the deleted rows."""
    n = len(plan.paths)
    lengths = np.full(n, -1, dtype=np.int64)
    gone_counts = np.zeros(n, dtype=np.int64)
    gone = []
    for i, path in enumerate(plan.paths):
        keep = plan.keeps.get(path)
        if keep is not None:
            rows = np.flatnonzero(~keep)
            lengths[i], gone_counts[i] = len(keep), len(rows)
            gone.append(rows)
    header = json.dumps({"key": key, "paths": plan.paths}, separators=(",", ":")).encode()
    arrays = [plan.sizes, plan.records, plan.specs, lengths, gone_counts]
    arrays.append(np.concatenate(gone) if gone else np.empty(0, np.int64))
    body = b"".join(np.asarray(a, dtype="<i8").tobytes() for a in arrays)
    return len(header).to_bytes(8, "little") + header + body


def _decode(data: bytes, key: dict[str, Any]) -> SnapshotPlan | None:
    payload = read_sealed(data, _MAGIC)
    if payload is None:
        return None
    length = int.from_bytes(payload[:8], "little")
    header = json.loads(bytes(payload[8 : 8 + length]))
    if header.get("key") != key:
        return None
    paths: list[str] = header["paths"]
    n = len(paths)
    numbers = np.frombuffer(payload[8 + length :], dtype="<i8")
    if len(numbers) < 5 * n:
        return None
    sizes, records, specs, lengths, gone_counts = (numbers[k * n : (k + 1) * n] for k in range(5))
    rows = numbers[5 * n :]
    if len(rows) != int(gone_counts.sum()):
        return None
    keeps = {}
    at = 0
    for i in np.flatnonzero(lengths >= 0).tolist():
        keep = np.ones(int(lengths[i]), dtype=bool)
        keep[rows[at : at + int(gone_counts[i])]] = False
        at += int(gone_counts[i])
        keeps[paths[i]] = keep
    return SnapshotPlan(paths, sizes.copy(), records.copy(), specs.copy(), keeps)
