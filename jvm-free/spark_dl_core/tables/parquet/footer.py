"""A Parquet footer's column-chunk metadata checked before pyarrow's Python accessors see it.

pyarrow builds a column chunk's metadata (``meta.row_group(g).column(c)``) in C++ code that
its Python binding calls without exception translation: a footer whose size statistics
disagree with the schema (a definition or repetition level histogram longer than the
column's maximum level + 1, after a flipped byte) throws a C++ exception there, which ends
the process (``terminate called``) instead of raising; so does a column chunk whose
physical type is not the schema's. Reading rows with
``read_row_group`` raises an ``OSError`` for the same footer; only the metadata accessors
abort. :func:`footer_problem` walks the footer's Thrift (compact protocol) itself and says
what pyarrow would throw on, so the caller can raise a typed error naming the file first.
"""

from __future__ import annotations

import os
import stat
from typing import Any

# Thrift compact protocol type ids
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY = 1, 2, 3, 4, 5, 6, 7, 8
_LIST, _SET, _MAP, _STRUCT = 9, 10, 11, 12
_MAX_DEPTH = 64


class _Broken(ValueError):
    """The footer bytes end early or hold a type the protocol does not have."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = data[at]  # IndexError past the end: the caller's _Broken
        at += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, at
        shift += 7
        if shift > 70:
            raise _Broken("a varint runs past 10 bytes")


def _field(data: bytes, at: int, last: int) -> tuple[int, int, int]:
    """The next struct field's (id, type, position after its header); type 0: the stop."""
    head = data[at]
    at += 1
    if head == 0:
        return 0, 0, at
    if head >> 4:
        return last + (head >> 4), head & 0x0F, at
    z, at = _varint(data, at)
    return (z >> 1) ^ -(z & 1), head & 0x0F, at


def _list_head(data: bytes, at: int) -> tuple[int, int, int]:
    head = data[at]
    size = head >> 4
    if size == 15:
        size, at = _varint(data, at + 1)
        return size, head & 0x0F, at
    return size, head & 0x0F, at + 1


def _skip(data: bytes, at: int, kind: int, depth: int = 0) -> int:
    """The position after a value of ``kind`` at ``at``."""
    if kind in (_I32, _I64, _I16):
        while data[at] >= 0x80:
            at += 1
        return at + 1
    if kind == _BINARY:
        length, at = _varint(data, at)
        return at + length
    if kind == _STRUCT:
        if depth > _MAX_DEPTH:
            raise _Broken("nested too deep")
        fid = 0
        while True:
            fid, k, at = _field(data, at, fid)
            if k == 0:
                return at
            at = _skip(data, at, k, depth + 1)
    if kind in (_TRUE, _FALSE):
        return at
    if kind == _BYTE:
        return at + 1
    if kind == _DOUBLE:
        return at + 8
    if kind in (_LIST, _SET):
        size, elem, at = _list_head(data, at)
        if elem in (_TRUE, _FALSE, _BYTE):
            return at + size
        if elem == _DOUBLE:
            return at + 8 * size
        for _ in range(size):
            at = _skip(data, at, elem, depth + 1)
            if at > len(data):
                raise _Broken("the footer ends early")
        return at
    if kind == _MAP:
        size, at = _varint(data, at)
        if size:
            types, at = data[at], at + 1
            for _ in range(size):
                at = _skip(data, at, types >> 4, depth + 1)
                at = _skip(data, at, types & 0x0F, depth + 1)
        return at
    raise _Broken(f"type {kind} is not a Thrift type")


def footer_problem(footer: bytes, levels: list[tuple[int, int, int]]) -> str | None:
    """Why pyarrow's metadata accessors would abort on ``footer`` (the Thrift FileMetaData
    bytes), or None. ``levels``: each leaf column's (max definition level, max repetition
    level, physical type), from the schema pyarrow parsed (:func:`leaf_levels`). Bytes this
    walk cannot follow are left to pyarrow (which parsed them already and raises its own)."""
    try:
        return _file_metadata(footer, levels)
    except (_Broken, IndexError, RecursionError):
        return None


def _file_metadata(data: bytes, levels: list[tuple[int, int, int]]) -> str | None:
    at = fid = 0
    while True:
        fid, kind, at = _field(data, at, fid)
        if kind == 0:
            return None
        if fid != 4 or kind != _LIST:
            at = _skip(data, at, kind)
            continue
        size, _, at = _list_head(data, at)  # FileMetaData.row_groups: all the walk wants
        for g in range(size):
            why, at = _row_group(data, at, levels)
            if why:
                return f"row group {g}: {why}"
        return None


def _row_group(data: bytes, at: int, levels: list[tuple[int, int, int]]) -> tuple[str | None, int]:
    found = None
    fid = 0
    while True:
        fid, kind, at = _field(data, at, fid)
        if kind == 0:
            return found, at
        if fid != 1 or kind != _LIST:
            at = _skip(data, at, kind)
            continue
        size, _, at = _list_head(data, at)  # RowGroup.columns
        for c in range(size):
            why, at = _column_chunk(data, at, levels[c] if c < len(levels) else None)
            if why and found is None:
                found = f"column {c}: {why}"


def _column_chunk(
    data: bytes, at: int, levels: tuple[int, int, int] | None
) -> tuple[str | None, int]:
    found = None
    fid = 0
    while True:
        fid, kind, at = _field(data, at, fid)
        if kind == 0:
            return found, at
        if fid != 3 or kind != _STRUCT or levels is None:
            at = _skip(data, at, kind)
            continue
        mid = 0
        while True:  # ColumnChunk.meta_data
            mid, mkind, at = _field(data, at, mid)
            if mkind == 0:
                break
            if mid == 1 and mkind == _I32:  # type: the schema's physical type
                z, at = _varint(data, at)
                if (z >> 1) ^ -(z & 1) != levels[2] and found is None:
                    found = f"its physical type {(z >> 1) ^ -(z & 1)} is not the schema's"
            elif mid == 16 and mkind == _STRUCT:  # size_statistics
                why, at = _size_statistics(data, at, levels)
                found = found or why
            else:
                at = _skip(data, at, mkind)


def _size_statistics(data: bytes, at: int, levels: tuple[int, int, int]) -> tuple[str | None, int]:
    """SizeStatistics: field 2 the repetition, field 3 the definition level histogram; each
    empty or one count per level 0..max."""
    found = None
    fid = 0
    while True:
        fid, kind, at = _field(data, at, fid)
        if kind == 0:
            return found, at
        if fid not in (2, 3) or kind != _LIST:
            at = _skip(data, at, kind)
            continue
        size, elem, at = _list_head(data, at)
        for _ in range(size):
            at = _skip(data, at, elem)
        top = levels[1] if fid == 2 else levels[0]
        if size and size != top + 1 and found is None:
            what = "repetition" if fid == 2 else "definition"
            found = (
                f"its {what} level histogram has {size} counts, the schema's maximum "
                f"level {top} needs {top + 1}"
            )


def read_footer(filesystem: Any, path: str, guess: int = 64 << 10) -> bytes:
    """The Thrift FileMetaData bytes at the end of the Parquet file ``path``, in one read
    when the footer is under ``guess`` bytes (empty when the file is too short or its tail
    is not Parquet's: pyarrow opening the file says why)."""
    with filesystem.open_input_file(path) as f:
        size = f.size()
        if size < 12:
            return b""
        _check_head(f.read_at(4, 0))
        tail = f.read_at(min(size, guess), size - min(size, guess))
        length = int.from_bytes(tail[-8:-4], "little")
        if tail[-4:] != b"PAR1" or length > size - 12:
            return b""
        if length + 8 <= len(tail):
            return bytes(tail[len(tail) - 8 - length : -8])
        return bytes(f.read_at(length, size - 8 - length))


def read_local_footer(path: str, guess: int = 64 << 10) -> bytes:
    """:func:`read_footer` of a local file with ``os.pread`` (a pyarrow filesystem and file
    object cost ~20-35 µs a file: seconds at 10⁵ files). Anything but a regular file that
    opens and reads is read again through pyarrow, so errors stay pyarrow's, word for word."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return read_footer(_local_fs(), path, guess)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return read_footer(_local_fs(), path, guess)
        size = info.st_size
        if size < 12:
            return b""
        _check_head(os.pread(fd, 4, 0))
        tail = os.pread(fd, min(size, guess), size - min(size, guess))
        length = int.from_bytes(tail[-8:-4], "little")
        if tail[-4:] != b"PAR1" or length > size - 12:
            return b""
        if length + 8 <= len(tail):
            return tail[len(tail) - 8 - length : -8]
        return os.pread(fd, length, size - 8 - length)
    except OSError:
        return read_footer(_local_fs(), path, guess)
    finally:
        os.close(fd)


def _local_fs() -> Any:
    from pyarrow import fs as pafs

    return pafs.LocalFileSystem()


def check_head(filesystem: Any, path: str) -> None:
    """Raise ValueError when the file ``path`` does not start with Parquet's magic (pyarrow
    reads from the footer and never looks: a damaged head would go unseen)."""
    with filesystem.open_input_file(path) as f:
        if f.size() >= 12:
            _check_head(f.read_at(4, 0))


def _check_head(head: bytes) -> None:
    if head != b"PAR1":
        raise ValueError(f"does not start with Parquet's magic PAR1 (starts {head!r})")


def parse_footer(footer: bytes) -> Any:
    """pyarrow's FileMetaData of ``footer`` (as :func:`read_footer` returns it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tail = footer + len(footer).to_bytes(4, "little") + b"PAR1"
    return pq.read_metadata(pa.BufferReader(tail))


# Thrift's Type enum, in order
_PHYSICAL = [
    "BOOLEAN",
    "INT32",
    "INT64",
    "INT96",
    "FLOAT",
    "DOUBLE",
    "BYTE_ARRAY",
    "FIXED_LEN_BYTE_ARRAY",
]


def leaf_levels(meta: Any) -> list[tuple[int, int, int]]:
    """Each leaf column's (max definition level, max repetition level, physical type as
    Thrift numbers it), from the schema pyarrow parsed."""
    schema = meta.schema
    out = []
    for i in range(len(schema)):
        c = schema.column(i)
        kind = _PHYSICAL.index(c.physical_type) if c.physical_type in _PHYSICAL else -1
        out.append((c.max_definition_level, c.max_repetition_level, kind))
    return out


READ_BATCH_ROWS = 65_536


def read_group(pf: Any, group: int, columns: list[str] | None = None) -> Any:
    """Row group ``group`` of the open ``pyarrow.parquet.ParquetFile`` ``pf`` as a table of
    ``READ_BATCH_ROWS``-row chunks. Why not ``read_row_group``: it decodes each column into
    one buffer the size of the whole group, growing it as it goes, which costs 2-7x the
    decode itself in a fresh process (0.3-0.7 s against 0.1 s for a 500k-row group of
    float32[32] lists here); streamed batches reuse small buffers. Values, types and errors
    are the same (pyarrow raises ``OSError`` / ``ArrowInvalid`` for a bad page either way).
    Decoded on the calling thread: callers already read several row groups at once."""
    import pyarrow as pa

    batches = list(
        pf.iter_batches(
            batch_size=READ_BATCH_ROWS, row_groups=[group], columns=columns, use_threads=False
        )
    )
    schema = batches[0].schema if batches else pf.schema_arrow
    if not batches and columns is not None:
        schema = pa.schema([schema.field(name) for name in columns])
    return pa.Table.from_batches(batches, schema=schema)
