"""A Parquet footer's row-group numbers read straight from its Thrift bytes, without pyarrow,
when its schema is one pyarrow already parsed for another file of the table.

Why: planning a snapshot of 10⁵ files in place read every footer with pyarrow (parse, then
Python accessors per row group and column: ~100 µs a file) after walking it for safety
(:mod:`.footer`). Files written by one job share their footer's bytes but for the
row groups (``num_rows`` and ``row_groups`` sit between the schema and the key-value
metadata). :func:`split_top` finds that middle in a footer pyarrow parsed, a
:class:`Layout` keeps the bytes around it; :func:`scan` matches another footer's bytes
around its middle against them (two compares: the schema is not walked again) and walks
its row groups once, taking what :func:`.footers.summarize` takes (rows, uncompressed
and stored bytes, list leaves' value counts) and checking what
:func:`.footer.footer_problem` checks. Anything it does not expect (a required
Thrift field missing, encrypted or unusual metadata, a type or histogram the schema
contradicts) answers None: the caller then takes pyarrow's path, which raises or reads
exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .footer import _BINARY, _I32, _I64, _LIST, _STRUCT, _Broken, _skip, _varint

_LIMIT = 1_000_000  # list sizes beyond this: pyarrow's Thrift limits decide (its path)
_MODERN = (b"parquet-cpp-arrow version ", b"parquet-rs version ")


@dataclass
class Layout:
    """What one footer's bytes around its row groups (parsed by pyarrow) tell of the
    footers that repeat them."""

    prefix: bytes  # the footer before num_rows: version, the schema
    suffix: bytes  # the footer after the row groups: key-value metadata, writer, orders
    schema: Any  # pa.Schema
    types: list[int]  # per leaf column: its physical type (Thrift's number)
    levels: list[tuple[int, int]]  # per leaf: histogram lengths its levels allow
    repeated: dict[str, int]  # a list column's name -> its only leaf's index
    trusted_stats: bool  # statistics are used or not by pyarrow regardless of their values
    checked: set[int] = field(default_factory=set)  # leaves whose statistics agreed
    usable: bool = True  # False: the scan disagreed with pyarrow once: always pyarrow


@dataclass
class Groups:
    """A footer's row groups as :func:`scan` read them."""

    rows: list[int]
    raw: list[int]
    stored: list[int]
    leaves: dict[int, list[int]]  # leaf index -> per row group its value count or -1
    with_stats: set[int]  # leaves that had statistics in some row group


def split_top(data: bytes) -> tuple[int, int] | None:
    """Where the footer's ``num_rows`` field starts and its row groups end, when the one
    follows the other (as every writer writes them), else None."""
    try:
        at = fid = 0
        while True:
            start = at
            fid, kind, at = _field(data, at, fid)
            if kind == 0:
                return None
            if fid == 3 and kind == _I64 and data[_skip(data, at, kind)] == 0x19:
                end = _skip(data, _skip(data, at, kind) + 1, _LIST)  # num_rows, row_groups
                return start, end
            at = _skip(data, at, kind)
    except (_Broken, IndexError, RecursionError):
        return None


def scan(data: bytes, layouts: list[Layout]) -> tuple[Layout, Groups] | None:
    """The row groups of the footer ``data`` when its bytes around them are a layout's (and
    the layout is still trusted), or None when anything is not what it leads to expect."""
    for layout in layouts:
        if data.startswith(layout.prefix) and data.endswith(layout.suffix):
            break
    else:
        return None
    try:
        at = len(layout.prefix)
        if data[at] != 0x16:  # field 3 (num_rows), i64, after field 2
            return None
        while data[at + 1] >= 0x80:
            at += 1
        if data[at + 2] != 0x19:  # field 4 (row_groups), a list
            return None
        groups, at = _scan_groups(data, at + 3, layout)
    except (_Broken, IndexError, RecursionError):
        return None
    if groups is None or at != len(data) - len(layout.suffix):
        return None
    return layout, groups


def modern_writer(suffix: bytes) -> bool:
    """Whether the writer (``created_by``, in the footer after its row groups) is one whose
    statistics pyarrow uses or not by their column's type alone (old parquet-mr and
    parquet-cpp: by their values too)."""
    created = b""
    try:
        at, fid = 0, 4
        while True:
            fid, kind, at = _field(suffix, at, fid)
            if kind == 0:
                break
            if fid == 6 and kind == _BINARY:
                length, at = _varint(suffix, at)
                created = bytes(suffix[at : at + length])
            at = _skip(suffix, at, kind) if not (fid == 6 and kind == _BINARY) else at + length
    except (_Broken, IndexError, RecursionError):
        return False
    if created.startswith(_MODERN):
        return True
    for app, least in ((b"parquet-mr version ", (1, 10)), (b"parquet-cpp version ", (1, 3))):
        if created.startswith(app):
            numbers = created[len(app) :].split(b" ", 1)[0].split(b".")
            try:
                return (int(numbers[0]), int(numbers[1].split(b"-")[0])) >= least
            except (ValueError, IndexError):
                return False
    return False


def _scan_groups(data: bytes, at: int, layout: Layout) -> tuple[Groups | None, int]:
    size, elem, at = _list_head(data, at)
    if elem != _STRUCT or size > _LIMIT:
        return None, at
    out = Groups([], [], [], {c: [] for c in layout.repeated.values()}, set())
    for _ in range(size):
        at = _row_group(data, at, layout, out)
        if at < 0:
            return None, at
    return out, at


def _row_group(data: bytes, at: int, layout: Layout, out: Groups) -> int:
    """The position after one RowGroup, its numbers appended to ``out``; -1: unexpected."""
    fid = seen = 0
    rows = raw = stored = 0
    while True:
        fid, kind, at = _field(data, at, fid)
        if kind == 0:
            break
        if fid == 1 and kind == _LIST:
            size, elem, at = _list_head(data, at)
            if elem != _STRUCT or size != len(layout.types):
                return -1
            stored = 0
            for c in range(size):
                at, compressed = _column_chunk(data, at, c, layout, out)
                if at < 0:
                    return -1
                stored += compressed
            seen |= 2
        elif fid in (2, 3) and kind == _I64:
            z, at = _varint(data, at)
            if fid == 2:
                raw = (z >> 1) ^ -(z & 1)
            else:
                rows = (z >> 1) ^ -(z & 1)
            seen |= 1 << fid
        elif fid == 4:
            return -1  # sorting columns: left to pyarrow
        else:
            at = _skip(data, at, kind)
    if seen != 0b1110:
        return -1
    out.rows.append(rows)
    out.raw.append(raw)
    out.stored.append(stored)
    return at


def _column_chunk(data: bytes, at: int, c: int, layout: Layout, out: Groups) -> tuple[int, int]:
    """(position after one ColumnChunk, its stored bytes); position -1: unexpected."""
    fid = 0
    compressed = -1
    offset = False
    while True:
        fid, kind, at = _field(data, at, fid)
        if kind == 0:
            break
        if fid == 3 and kind == _STRUCT:
            at, compressed = _column_meta(data, at, c, layout, out)
            if at < 0:
                return -1, 0
        elif fid in (8, 9):
            return -1, 0  # encrypted: pyarrow's
        else:
            offset = offset or (fid == 2 and kind == _I64)
            at = _skip(data, at, kind)
    if not offset or compressed < 0:
        return -1, 0
    return at, compressed


# ColumnMetaData's required fields and their types
_META_REQUIRED = {1: _I32, 2: _LIST, 3: _LIST, 4: _I32, 5: _I64, 6: _I64, 7: _I64, 9: _I64}
_META_ALL = sum(1 << f for f in _META_REQUIRED)


def _column_meta(data: bytes, at: int, c: int, layout: Layout, out: Groups) -> tuple[int, int]:
    """(position after one ColumnMetaData, its total_compressed_size)."""
    fid = seen = 0
    values = compressed = 0
    nulls: int | None = None
    stats = False
    required = _META_REQUIRED
    while True:
        head = data[at]
        at += 1
        if head == 0:
            break
        kind = head & 0x0F
        if head >> 4:
            fid += head >> 4
        else:
            z, at = _varint(data, at)
            fid = (z >> 1) ^ -(z & 1)
        if required.get(fid) == kind:
            seen |= 1 << fid
        if fid in (8, 17):
            return -1, 0  # key-value metadata, geospatial statistics: pyarrow's
        if kind in (_I32, _I64):
            if fid in (5, 7, 1):
                z, at = _varint(data, at)
                number = (z >> 1) ^ -(z & 1)
                if fid == 5:
                    values = number
                elif fid == 7:
                    compressed = number
                elif kind == _I32 and number != layout.types[c]:
                    return -1, 0  # not the schema's physical type
            else:
                while data[at] >= 0x80:
                    at += 1
                at += 1
        elif fid == 12 and kind == _STRUCT:
            stats = True
            nulls, at = _statistics(data, at)
        elif fid == 13 and kind == _LIST:
            at = _encoding_stats(data, at)
        elif fid == 16 and kind == _STRUCT:
            at = _size_statistics(data, at, layout.levels[c])
        elif kind == _LIST:
            at = _skip_list(data, at)
        else:
            at = _skip(data, at, kind)
        if at < 0:
            return -1, 0
    if seen != _META_ALL:
        return -1, 0
    leaves = out.leaves.get(c)
    if leaves is not None:
        if stats:
            out.with_stats.add(c)
        leaves.append(values if stats and nulls == 0 else -1)
    return at, compressed


def _skip_list(data: bytes, at: int) -> int:
    """The position after a list (of numbers or strings without a call per element)."""
    size, elem, start = _list_head(data, at)
    if elem in (_I32, _I64):
        at = start
        for _ in range(size):
            while data[at] >= 0x80:
                at += 1
            at += 1
        return at
    if elem == _BINARY:
        at = start
        for _ in range(size):
            length, at = _varint(data, at)
            at += length
        if at > len(data):
            raise _Broken("the footer ends early")
        return at
    return _skip(data, at, _LIST)


def _statistics(data: bytes, at: int) -> tuple[int | None, int]:
    """(null_count or None, position after a Statistics struct)."""
    fid = 0
    nulls = None
    while True:
        fid, kind, at = _field(data, at, fid)
        if kind == 0:
            return nulls, at
        if fid == 3 and kind == _I64:
            z, at = _varint(data, at)
            nulls = (z >> 1) ^ -(z & 1)
        elif kind == _BINARY:
            length, at = _varint(data, at)
            at += length
        else:
            at = _skip(data, at, kind)


def _encoding_stats(data: bytes, at: int) -> int:
    """The position after a list of PageEncodingStats (-1: one lacks a required field)."""
    size, elem, at = _list_head(data, at)
    if elem != _STRUCT or size > _LIMIT:
        return -1
    for _ in range(size):
        fid = seen = 0
        while True:
            fid, kind, at = _field(data, at, fid)
            if kind == 0:
                break
            if kind == _I32 and fid in (1, 2, 3):
                seen |= 1 << fid
            at = _skip(data, at, kind)
        if seen != 0b1110:
            return -1
    return at


def _size_statistics(data: bytes, at: int, allowed: tuple[int, int]) -> int:
    """The position after a SizeStatistics whose level histograms fit the column's levels
    (-1 otherwise: pyarrow's path names the problem)."""
    fid = 0
    while True:
        fid, kind, at = _field(data, at, fid)
        if kind == 0:
            return at
        if fid in (2, 3) and kind == _LIST:
            size, _, _ = _list_head(data, at)
            if size and size != allowed[fid - 2]:
                return -1
        at = _skip(data, at, kind)


def _field(data: bytes, at: int, last: int) -> tuple[int, int, int]:
    """The next struct field's (id, type, position after its header); type 0: the stop."""
    head = data[at]
    if head == 0:
        return 0, 0, at + 1
    if head >> 4:
        return last + (head >> 4), head & 0x0F, at + 1
    z, at = _varint(data, at + 1)
    return (z >> 1) ^ -(z & 1), head & 0x0F, at


def _list_head(data: bytes, at: int) -> tuple[int, int, int]:
    head = data[at]
    if head >> 4 == 15:
        size, at = _varint(data, at + 1)
        return size, head & 0x0F, at
    return head >> 4, head & 0x0F, at + 1


def layout_of(data: bytes, meta: Any, levels: list[tuple[int, int, int]]) -> Layout | None:
    """The :class:`Layout` of the footer ``data`` pyarrow parsed as ``meta`` (``levels`` as
    :func:`.footer.leaf_levels` gives them); None when its row groups are not in
    one piece after ``num_rows``."""
    where = split_top(data)
    if where is None:
        return None
    parquet = meta.schema
    tops: dict[str, list[int]] = {}
    for i in range(len(parquet)):
        tops.setdefault(parquet.column(i).path.split(".", 1)[0], []).append(i)
    repeated = {top: at[0] for top, at in tops.items() if len(at) == 1 and levels[at[0]][1] >= 1}
    suffix = data[where[1] :]
    return Layout(
        prefix=data[: where[0]],
        suffix=suffix,
        schema=parquet.to_arrow_schema(),
        types=[kind for _, _, kind in levels],
        levels=[(rep + 1, dfn + 1) for dfn, rep, _ in levels],
        repeated=repeated,
        trusted_stats=modern_writer(suffix),
    )
