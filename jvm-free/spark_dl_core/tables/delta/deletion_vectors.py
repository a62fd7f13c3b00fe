"""Inline deletion vectors checked before delta-rs decodes them.

An inline vector (``storageType`` ``i``) is a RoaringBitmapArray Z85-encoded in the log,
with no CRC (the on-disk kind has one, which delta-rs checks). delta-rs sizes a file's
keep-mask by the vector's largest row before comparing it with the file's ``numRecords``:
one flipped character in a bucket key asks for 4e18 bytes and Rust aborts the process.
:func:`inline_problem` reads the live inline vectors of a version from the log (the last
checkpoint's adds, then the JSON commits after it) and checks each one's structure as the
Delta protocol lays it out: the magic 1681511377 (int32, little-endian), the bucket count
(int64), then per bucket its key (uint32, increasing) and a 32-bit RoaringBitmap in the
portable format (cookie, container keys and cardinalities, offsets, containers that fit
the bytes), its cardinality the descriptor's, its largest row under ``numRecords``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

MAGIC = 1681511377
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_B85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
_TO_B85 = str.maketrans(_Z85, _B85)
_NO_RUNS, _RUNS = 12346, 12347  # the portable format's cookies
_UNKNOWN_ROWS_LIMIT = 1 << 32  # no numRecords: a vector past this is not a real file's


class _Bad(ValueError):
    """Why a vector's bytes are not a RoaringBitmapArray."""


def damaged_inline(filesystem: Any, root: str, version: int) -> str | None:
    """What to say about the first damaged inline vector live at ``version`` of the table
    at ``root`` on the pyarrow ``filesystem`` (the table's own: a remote table's endpoint
    and credentials), or None (a log this cannot list or read is left to delta-rs, which
    read it already)."""
    try:
        found = inline_problem(filesystem, f"{root.rstrip('/')}/_delta_log", version)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # pyarrow's errors are OSError / ValueError subclasses
    if found is None:
        return None
    where, path, why = found
    return f"the inline deletion vector of data file {path} in _delta_log/{where} is damaged: {why}"


def inline_problem(filesystem: Any, log_dir: str, version: int) -> tuple[str, str, str] | None:
    """(log file, data file path, why) for the first damaged inline vector live at
    ``version``; None when all are sound (or none is inline)."""
    for where, add in _live_inline(filesystem, log_dir, version):
        why = vector_problem(add.get("deletionVector") or {}, _num_records(add))
        if why:
            return where, str(add.get("path")), why
    return None


def vector_problem(dv: dict[str, Any], num_records: int | None) -> str | None:
    """Why the inline descriptor ``dv`` cannot be the vector its writer wrote, or None."""
    text, size = dv.get("pathOrInlineDv"), dv.get("sizeInBytes")
    if not isinstance(text, str) or not isinstance(size, int) or isinstance(size, bool):
        return "its pathOrInlineDv or sizeInBytes is missing or of another type"
    if len(text) % 5:
        return f"its Z85 text has {len(text)} characters, not a multiple of 5"
    try:
        raw = base64.b85decode(text.translate(_TO_B85))
    except ValueError:
        return "its Z85 text holds characters outside the alphabet"
    if not 12 <= size <= len(raw):
        return f"sizeInBytes {size} does not fit its {len(raw)} decoded bytes"
    try:
        rows, largest = _bitmap_array(raw[:size])
    except _Bad as exc:
        return str(exc)
    if dv.get("cardinality") != rows:
        return f"it holds {rows} rows, its cardinality says {dv.get('cardinality')}"
    bound = num_records if num_records is not None else _UNKNOWN_ROWS_LIMIT
    if largest is not None and largest >= bound:
        what = f"numRecords {num_records}" if num_records is not None else "2^32 rows"
        return f"it deletes row {largest}, past the file's {what}"
    return None


def _bitmap_array(blob: bytes) -> tuple[int, int | None]:
    """(rows, largest row) of a RoaringBitmapArray with its magic, every byte accounted."""
    if int.from_bytes(blob[:4], "little", signed=True) != MAGIC:
        raise _Bad("its magic number is not a deletion vector's")
    buckets = int.from_bytes(blob[4:12], "little", signed=True)
    if not 0 <= buckets <= (len(blob) - 12) // 12:
        raise _Bad(f"its bucket count {buckets} does not fit its {len(blob)} bytes")
    at, rows, largest, last_key = 12, 0, None, -1
    for _ in range(buckets):
        key = _u32(blob, at)
        if key <= last_key:
            raise _Bad("its bucket keys are not increasing")
        last_key = key
        n, high, at = _roaring32(blob, at + 4)
        rows += n
        if high is not None:
            largest = (key << 32) | high
    if at != len(blob):
        raise _Bad(f"its bitmaps end at byte {at} of {len(blob)}")
    return rows, largest


def _roaring32(blob: bytes, start: int) -> tuple[int, int | None, int]:
    """(values, largest value, end) of the portable 32-bit RoaringBitmap at ``start``."""
    cookie = _u32(blob, start)
    at = start + 4
    if cookie & 0xFFFF == _RUNS:
        count = (cookie >> 16) + 1
        run_flags = blob[at : at + (count + 7) // 8]
        at += (count + 7) // 8
        offsets = count >= 4
    elif cookie == _NO_RUNS:
        count, run_flags, offsets = _u32(blob, at), b"", True
        at += 4
    else:
        raise _Bad("a bitmap's cookie is not a RoaringBitmap's")
    if count > 65536 or at + 4 * count > len(blob):
        raise _Bad(f"a bitmap's {count} containers do not fit the bytes")
    head = np.frombuffer(blob, "<u2", 2 * count, at).reshape(count, 2).astype(np.int64)
    at += 4 * count
    if count > 1 and not (np.diff(head[:, 0]) > 0).all():
        raise _Bad("a bitmap's container keys are not increasing")
    table = np.frombuffer(blob, "<u4", count, at) if offsets and count else None
    at += 4 * count if offsets else 0
    total, high = 0, None
    for i in range(count):
        if table is not None and int(table[i]) != at - start:
            raise _Bad(f"a bitmap's container {i} is not at its offset")
        is_run = bool(run_flags) and bool(run_flags[i // 8] >> (i % 8) & 1)
        n, low, at = _container(blob, at, int(head[i, 1]) + 1, is_run)
        total += n
        high = (int(head[i, 0]) << 16) | low
    return total, high, at


def _container(blob: bytes, at: int, card: int, is_run: bool) -> tuple[int, int, int]:
    """(values, largest low 16 bits, end) of one container, checked against its header."""
    if is_run:
        runs = _u16(blob, at)
        end = at + 2 + 4 * runs
        _fits(blob, end)
        pairs = np.frombuffer(blob, "<u2", 2 * runs, at + 2).reshape(runs, 2).astype(np.int64)
        stops = pairs[:, 0] + pairs[:, 1]
        if not runs or (stops > 0xFFFF).any() or (pairs[1:, 0] <= stops[:-1]).any():
            raise _Bad("a run container's runs are empty, overlap or pass 65535")
        n = int((pairs[:, 1] + 1).sum())
        if n != card:
            raise _Bad(f"a run container holds {n} values, its header says {card}")
        return n, int(stops[-1]), end
    if card <= 4096:
        end = at + 2 * card
        _fits(blob, end)
        values = np.frombuffer(blob, "<u2", card, at)
        if card > 1 and not (np.diff(values.astype(np.int64)) > 0).all():
            raise _Bad("an array container's values are not increasing")
        return card, int(values[-1]), end
    end = at + 8192
    _fits(blob, end)
    bits = np.unpackbits(np.frombuffer(blob, np.uint8, 8192, at), bitorder="little")
    set_bits = np.flatnonzero(bits)
    if len(set_bits) != card:
        raise _Bad(f"a bitset container holds {len(set_bits)} values, its header says {card}")
    return card, int(set_bits[-1]), end


def _fits(blob: bytes, end: int) -> None:
    if end > len(blob):
        raise _Bad(f"a container runs past the vector's {len(blob)} bytes")


def _u32(blob: bytes, at: int) -> int:
    _fits(blob, at + 4)
    return int.from_bytes(blob[at : at + 4], "little")


def _u16(blob: bytes, at: int) -> int:
    _fits(blob, at + 2)
    return int.from_bytes(blob[at : at + 2], "little")


def _num_records(add: dict[str, Any]) -> int | None:
    stats = add.get("stats")
    if isinstance(stats, str):
        try:
            stats = json.loads(stats)
        except ValueError:
            stats = None
    if not isinstance(stats, dict):
        stats = add.get("stats_parsed")
    n = stats.get("numRecords") if isinstance(stats, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


# -- the live adds with inline vectors, from the log


def _live_inline(filesystem: Any, log_dir: str, version: int) -> list[tuple[str, dict[str, Any]]]:
    """(log file name, add action) of each inline-vector add live at ``version``."""
    from pyarrow import fs as pafs

    infos = filesystem.get_file_info(pafs.FileSelector(log_dir, allow_not_found=True))
    names = {i.base_name for i in infos}
    checkpoint, parts = _checkpoint(names, version)
    live: dict[str, tuple[str, dict[str, Any]]] = {}
    for name in parts:
        for add in _checkpoint_adds(filesystem, f"{log_dir}/{name}"):
            live[str(add.get("path"))] = (name, add)
    for v in range(checkpoint + 1, version + 1):
        name = f"{v:020}.json"
        if name in names:
            _replay(filesystem, f"{log_dir}/{name}", name, live)
    return list(live.values())


def _checkpoint(names: set[str], version: int) -> tuple[int, list[str]]:
    """The latest checkpoint at or before ``version`` and its files ((-1, []) if none)."""
    found: dict[int, list[str]] = {}
    for name in names:
        head, _, rest = name.partition(".")
        kind = rest.startswith("checkpoint.") and rest.endswith((".parquet", ".json"))
        if kind and head.isdigit() and int(head) <= version:
            found.setdefault(int(head), []).append(name)
    if not found:
        return -1, []
    best = max(found)
    return best, sorted(found[best])


def _replay(filesystem: Any, path: str, name: str, live: dict[str, Any]) -> None:
    """Apply one commit's adds and removes to ``live`` (only lines that can matter are
    parsed: a large commit without vectors costs a substring search per line)."""
    with filesystem.open_input_stream(path) as f:
        text = f.read()
    for line in text.splitlines():
        inline = b'"storageType"' in line
        if not inline and not (live and b'"remove"' in line):
            continue
        try:
            action = json.loads(line)
        except ValueError:
            continue  # delta-rs parsed this log already: left to it
        if not isinstance(action, dict):
            continue
        remove, add = action.get("remove"), action.get("add")
        if isinstance(remove, dict):
            live.pop(str(remove.get("path")), None)
        if isinstance(add, dict):
            live.pop(str(add.get("path")), None)
            if _is_inline(add):
                live[str(add.get("path"))] = (name, add)


def _is_inline(add: dict[str, Any]) -> bool:
    dv = add.get("deletionVector")
    return isinstance(dv, dict) and dv.get("storageType") == "i"


def _checkpoint_adds(filesystem: Any, path: str) -> list[dict[str, Any]]:
    """The inline-vector adds of one checkpoint file (a v2 checkpoint's sidecars too)."""
    if path.endswith(".json"):
        live: dict[str, Any] = {}
        _replay(filesystem, path, path.rsplit("/", 1)[-1], live)
        return [add for _, add in live.values()]
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    with filesystem.open_input_file(path) as f:
        pf = pq.ParquetFile(f)
        names = pf.schema_arrow.names
        out: list[dict[str, Any]] = []
        if "add" in names:
            dv_type = pf.schema_arrow.field("add").type
            if dv_type.get_field_index("deletionVector") >= 0:
                adds = pf.read(columns=["add"]).column("add")
                kind = pc.struct_field(pc.struct_field(adds, "deletionVector"), "storageType")
                out += [a for a in adds.filter(pc.equal(kind, "i")).to_pylist() if a]
        if "sidecar" in names:
            base = path.rsplit("/", 1)[0] + "/_sidecars/"
            for s in pf.read(columns=["sidecar"]).column("sidecar").to_pylist():
                if s and s.get("path"):
                    out += _checkpoint_adds(filesystem, base + str(s["path"]))
    return out
