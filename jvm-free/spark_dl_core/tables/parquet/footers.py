"""What planning a Delta snapshot in place needs of each data file's Parquet footer, and a
machine-local cache of it, so a table of 10⁵ files is not re-read footer by footer per open.

Why each mechanism:

- *A summary, not the footer*: a plan needs per row group its rows, its uncompressed and
  stored bytes, and for repeated (list) leaf columns their value counts (the batch forms);
  and per file its Arrow schema (column mapping and added columns are resolved from it).
  :class:`FileFooter` holds just that, taken from a footer already checked by
  :func:`.footer.footer_problem`.
- *One file per table*, ``plan.arrow`` under ``<tmp>/spark-dl-cache/<hash of the table URI
  and "#plan">``: an Arrow IPC table, one row per data file, schemas stored once. Opening a
  snapshot reads it once (one file, not 10⁵ footers); the files it lacks (a later version's
  new files) are read and the cache rewritten with the snapshot's files.
- *Keyed by each file's identity*: its path relative to the table, its logged size and, for
  local files, its modification time as listed at open; Delta never rewrites a data file, and
  a file changed in place has another mtime: nothing stale is read for another file.
- *Temporary file, then rename; a trailer with the payload's size and xxh3_64*: a reader sees
  a whole file or none; a torn, truncated or altered one is ignored (and rewritten).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import struct
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ...format.hashing import STORED_HASH, digest
from .footer_scan import Groups, Layout, layout_of, scan

_MAGIC = b"SDLPLAN1"
_TRAILER = struct.Struct("<8sQ16s")  # magic, payload bytes, xxh3_64 hex of the payload
_NAME = "plan.arrow"
FORMAT = "1"  # bump when what a FileFooter holds changes
_LAYOUTS = 64  # footer layouts a snapshot's reads keep (each new one: pyarrow once)


@dataclass
class FileFooter:
    """One data file's footer as a plan needs it. ``leaves``: per repeated leaf column that
    is its top-level column's only leaf (by its name in the file), each row group's value
    count, -1 when unknown or when some are null (statistics missing or null_count > 0)."""

    schema: pa.Schema
    rows: np.ndarray  # int64 per row group
    raw_bytes: np.ndarray  # uncompressed size per row group (Parquet's estimate)
    stored_bytes: np.ndarray  # compressed size per row group
    leaves: dict[str, np.ndarray]

    @property
    def num_rows(self) -> int:
        return int(self.rows.sum())


def summarize(meta: Any, levels: list[tuple[int, int, int]]) -> FileFooter:
    """The :class:`FileFooter` of pyarrow's ``meta`` (whose column chunks
    :func:`.footer.footer_problem` has checked); ``levels`` as
    :func:`.footer.leaf_levels` gives them."""
    parquet = meta.schema
    tops: dict[str, list[int]] = {}
    for i in range(len(parquet)):
        tops.setdefault(parquet.column(i).path.split(".", 1)[0], []).append(i)
    repeated = {top: at[0] for top, at in tops.items() if len(at) == 1 and levels[at[0]][1] >= 1}
    groups = meta.num_row_groups
    rows = np.empty(groups, dtype=np.int64)
    raw = np.empty(groups, dtype=np.int64)
    stored = np.empty(groups, dtype=np.int64)
    leaves = {top: np.empty(groups, dtype=np.int64) for top in repeated}
    for g in range(groups):
        rg = meta.row_group(g)
        rows[g], raw[g] = rg.num_rows, rg.total_byte_size
        stored[g] = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
        for top, at in repeated.items():
            leaves[top][g] = _leaf_values(rg.column(at))
    return FileFooter(parquet.to_arrow_schema(), rows, raw, stored, leaves)


class Summaries:
    """Footer bytes to :class:`FileFooter`: pyarrow (:func:`summarize`) for the first file
    of each footer layout (its bytes but the row groups: schema, metadata, writer), a scan
    of the others' row-group bytes (:mod:`.footer_scan`). A scan is used only where it
    agreed with pyarrow on an earlier file of the layout, statistics included; one
    disagreement and the layout is pyarrow's for good. Shared by the threads reading one
    snapshot's footers."""

    def __init__(self) -> None:
        self.layouts: list[Layout] = []
        self._lock = threading.Lock()

    def scanned(self, footer: bytes) -> FileFooter | None:
        """``footer``'s summary without pyarrow, or None: take pyarrow's path (and
        :meth:`learn` from it)."""
        found = scan(footer, self.layouts)
        if found is None:
            return None
        layout, groups = found
        if not layout.usable:
            return None
        if groups.with_stats and not (layout.trusted_stats and groups.with_stats <= layout.checked):
            return None  # statistics pyarrow has not been seen to use alike on this layout
        return _from_scan(layout, groups)

    def learn(self, footer: bytes, meta: Any, levels: list[tuple[int, int, int]]) -> FileFooter:
        """pyarrow's summary of ``footer`` (parsed as ``meta``, checked by
        :func:`.footer.footer_problem`), compared with the scan's."""
        found = summarize(meta, levels)
        with self._lock:
            scanned = scan(footer, self.layouts)
            if scanned is None:
                layout = layout_of(footer, meta, levels)
                if layout is None or len(self.layouts) >= _LAYOUTS:
                    return found
                self.layouts.insert(0, layout)
                scanned = scan(footer, self.layouts)
        if scanned is None:
            return found
        layout, groups = scanned
        if _same(_from_scan(layout, groups), found):
            layout.checked |= groups.with_stats
        else:
            layout.usable = False
        return found


def _from_scan(layout: Layout, groups: Groups) -> FileFooter:
    leaves = {
        top: np.array(groups.leaves[at], dtype=np.int64) for top, at in layout.repeated.items()
    }
    return FileFooter(
        layout.schema,
        np.array(groups.rows, dtype=np.int64),
        np.array(groups.raw, dtype=np.int64),
        np.array(groups.stored, dtype=np.int64),
        leaves,
    )


def _same(a: FileFooter, b: FileFooter) -> bool:
    arrays = ("rows", "raw_bytes", "stored_bytes")
    return (
        all(np.array_equal(getattr(a, k), getattr(b, k)) for k in arrays)
        and list(a.leaves) == list(b.leaves)
        and all(np.array_equal(a.leaves[k], b.leaves[k]) for k in a.leaves)
        and a.schema.equals(b.schema, check_metadata=True)
    )


def _leaf_values(column: Any) -> int:
    """A list column's leaf values in a row group; -1 when unknown or when some are null
    (null or empty lists count one null leaf each: not a fixed width)."""
    stats = column.statistics
    if stats is None or not stats.has_null_count or stats.null_count:
        return -1
    return int(column.num_values)


def footer_key(relative: str, size: int | None, mtime: int | None) -> str:
    """A data file's identity in the cache."""
    return f"{relative}\0{size}\0{mtime}"


class PlanCache:
    """The footers of one table's data files, on this machine's disk under ``directory``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, _NAME)

    def load(self) -> dict[str, FileFooter]:
        """Every cached file's footer by :func:`footer_key`; empty when there is no cache or
        it is damaged (it is rewritten by the next :meth:`save`)."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
            return _decode(data)
        except Exception:  # absent, unreadable, torn, from another format: read footers
            return {}

    def save(self, keys: list[str], footers: list[FileFooter]) -> None:
        """Store these files' footers (replacing the cache); best effort: a full or
        read-only disk only costs the next open its footer reads."""
        write_sealed(self.path, _encode(keys, footers))


def write_sealed(path: str, payload: bytes, magic: bytes = _MAGIC) -> None:
    """``payload`` then a trailer (``magic``, its size, its xxh3_64) written to ``path``
    through a temporary file and a rename, so a reader sees a whole file or none; best
    effort (a full or read-only disk only costs a cache its next hit)."""
    directory = os.path.dirname(path)
    temp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
    try:
        trailer = _TRAILER.pack(magic, len(payload), digest(STORED_HASH, payload).encode())
        os.makedirs(directory, exist_ok=True)
        with open(temp, "wb") as f:
            f.write(payload)
            f.write(trailer)
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(temp)


def read_sealed(data: bytes, magic: bytes = _MAGIC) -> memoryview | None:
    """The payload :func:`write_sealed` wrote, or None when ``data`` is torn, truncated,
    altered or of another ``magic``."""
    if len(data) <= _TRAILER.size:
        return None
    found, nbytes, recorded = _TRAILER.unpack(data[-_TRAILER.size :])
    payload = memoryview(data)[: -_TRAILER.size]
    if found != magic or nbytes != len(payload):
        return None
    if digest(STORED_HASH, payload).encode() != recorded:
        return None
    return payload


def _encode(keys: list[str], footers: list[FileFooter]) -> bytes:
    """A JSON header (the files' keys and schema indexes; the distinct schemas, Arrow IPC in
    base64, and their leaf names) then int64 arrays: row groups per file, their rows, raw
    and stored bytes, and leaf counts (row group major)."""
    schemas: list[pa.Schema] = []
    names: list[list[str]] = []
    index = []
    for foot in footers:
        leaf_names = list(foot.leaves)
        at = _find(schemas, names, foot.schema, leaf_names)
        if at < 0:
            schemas.append(foot.schema)
            names.append(leaf_names)
            at = len(schemas) - 1
        index.append(at)
    header = {
        "format": FORMAT,
        "keys": keys,
        "schema": index,
        "schemas": [base64.b64encode(s.serialize().to_pybytes()).decode() for s in schemas],
        "leaf_names": names,
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    counts = np.fromiter((len(f.rows) for f in footers), dtype=np.int64, count=len(footers))
    leaves = [
        np.stack([f.leaves[n] for n in f.leaves], axis=1).ravel() for f in footers if f.leaves
    ]
    arrays = [
        counts,
        *(_cat([getattr(f, a) for f in footers]) for a in ("rows", "raw_bytes", "stored_bytes")),
        _cat(leaves),
    ]
    body = b"".join(a.astype("<i8").tobytes() for a in arrays)
    return len(text).to_bytes(8, "little") + text + body


def _cat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.empty(0, np.int64)


def _find(
    schemas: list[pa.Schema], names: list[list[str]], schema: pa.Schema, leaf: list[str]
) -> int:
    """The index of an equal (schema, leaf names) in the lists, -1 if none (the last one
    first: files written together share one)."""
    for at in range(len(schemas) - 1, -1, -1):
        same = schemas[at] is schema or schemas[at].equals(schema, check_metadata=True)
        if same and names[at] == leaf:
            return at
    return -1


def _decode(data: bytes) -> dict[str, FileFooter]:
    payload = read_sealed(data)
    if payload is None:
        return {}
    length = int.from_bytes(payload[:8], "little")
    header = json.loads(bytes(payload[8 : 8 + length]))
    if header.get("format") != FORMAT:
        return {}
    schemas = [pa.ipc.read_schema(pa.py_buffer(base64.b64decode(s))) for s in header["schemas"]]
    names: list[list[str]] = header["leaf_names"]
    keys, index = header["keys"], header["schema"]
    numbers = np.frombuffer(payload[8 + length :], dtype="<i8")
    counts = numbers[: len(keys)]
    groups = int(counts.sum())
    rows, raw, stored = (numbers[len(keys) + k * groups :][:groups] for k in range(3))
    leaf_flat = numbers[len(keys) + 3 * groups :]
    out = {}
    at = leaf_at = 0
    for key, n, s in zip(keys, counts.tolist(), index):
        width = len(names[s])
        grid = leaf_flat[leaf_at : leaf_at + n * width].reshape(n, width)
        leaves = {name: grid[:, k] for k, name in enumerate(names[s])}
        out[key] = FileFooter(
            schemas[s], rows[at : at + n], raw[at : at + n], stored[at : at + n], leaves
        )
        at, leaf_at = at + n, leaf_at + n * width
    return out
