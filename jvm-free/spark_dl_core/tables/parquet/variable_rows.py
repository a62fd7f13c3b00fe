"""A row group of variable-size rows (Spark's and delta-rs's ``list<float>``, strings,
bytes) converted straight into its MDS shard's bytes: each column's parts copied once into
place.

Why: the writer's general path (:meth:`~spark_dl_core.writer.ShardWriter.write`, then
``finish``) copies every value four times before the shard is whole: the ndarray encoding
lays each row's header before its values, the sample layout joins the columns into one
buffer and then gathers them per sample, and the shard copies the samples after its offset
table. For a 500k-row group of 32-float lists that was ~75 MB copied four times into fresh
memory, about half of the converting time before an in-place dataset's first batch. Here
each column's parts (an ndarray's shape headers, its values: views of the Arrow buffers)
are copied once, per sample, into the buffer ``alloc`` gives (the row-group cache's memory
map). The bytes are those the writer's path gives (tested); anything this does not cover
(nulls, null masks, write ops, compression, a row group past one shard) returns None, and
the caller takes the writer's path, which also raises its errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ...errors import EncodingError
from ...format.buffers import (
    I64,
    U8,
    Pieces,
    copy_pieces,
    interleave,
    offsets_from_lengths,
    one_width,
)
from ...format.encodings import get_encoding, merge_shapes, uniform_shape
from ...format.ndarray import NDArrayEncoding
from ...meta import stored_layout

if TYPE_CHECKING:  # pragma: no cover
    from ...format.encoding_base import Encoding
    from ...meta import ColumnPlan

Shapes = dict[str, list[int] | None]
_U32 = 1 << 32


def variable_shard(
    plans: list[ColumnPlan],
    config: bytes,
    limit: int,
    table: pa.Table,
    alloc: Callable[[int], np.ndarray],
) -> tuple[np.ndarray, Shapes] | None:
    """All of ``table`` as one shard's bytes (laid in ``alloc(nbytes)``) and its arrays'
    shapes, as the writer with ``plans``, shard ``config`` bytes and size ``limit`` would
    write them; None where the writer's path must do it."""
    n = table.num_rows
    layout = stored_layout(plans)
    names = [p.name for p in plans]
    if not n or list(layout.names) != names:
        return None  # null-mask columns (or none at all): the writer's path
    if [(f.name, f.type) for f in table.schema] != [(p.name, p.arrow_type) for p in plans]:
        return None  # the writer's path names what differs
    chunks: list[tuple[int, list[list[Pieces]]]] = []
    shapes: Shapes | None = None
    for batch in table.to_batches():
        if batch.num_rows:
            encoded = _encoded(plans, batch)
            if encoded is None:
                return None
            chunks.append((batch.num_rows, encoded[0]))
            shapes = merge_shapes(shapes, encoded[1])
    variable = layout.variable
    head = 4 * len(variable)
    lengths = np.full(n, head, dtype=I64)
    column_sizes: list[list[np.ndarray]] = []  # per chunk, per column: each row's bytes
    row = 0
    for count, columns in chunks:
        sizes = [_lengths(column, count) for column in columns]
        for size in sizes:
            lengths[row : row + count] += size
        column_sizes.append(sizes)
        row += count
    # the writer's limit: 8 bytes + the config + each sample's bytes and its offset
    if 8 + len(config) + int(lengths.sum()) + 4 * n > limit:
        return None
    start = 4 + 4 * (n + 1) + len(config)
    offsets = offsets_from_lengths(lengths) + start
    if int(offsets[-1]) >= _U32:
        return None
    out = alloc(int(offsets[-1]))
    out[:4] = np.frombuffer(np.uint32(n).tobytes(), dtype=U8)
    out[4 : 4 + 4 * (n + 1)] = offsets.astype("<u4").view(U8)
    out[4 + 4 * (n + 1) : start] = np.frombuffer(config, dtype=U8)
    row = 0
    for (count, columns), sizes in zip(chunks, column_sizes):
        parts = [part for column in columns for part in column]
        if variable:  # each sample's u32 size of each variable column, first
            header = np.stack([sizes[i] for i in variable], axis=1).astype("<u4")
            parts.insert(0, Pieces(header.view(U8).reshape(-1), width=head))
        at = offsets[row : row + count].copy()
        for part in _runs(parts, count):
            lengths = part.lengths(count)
            copy_pieces(out, at, part.data, part.starts(count), lengths)
            at += lengths
        row += count
    return out, shapes or {}


def _encoded(
    plans: list[ColumnPlan], batch: pa.RecordBatch
) -> tuple[list[list[Pieces]], Shapes] | None:
    """Each column's stored parts for ``batch`` (in sample order: an ndarray's header parts,
    then its values), and its arrays' shapes; None when the writer's path must encode."""
    columns: list[list[Pieces]] = []
    shapes: Shapes = {}
    for plan in plans:
        array = batch.column(plan.name)
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        if array.null_count or plan.null_mask:
            return None
        encoding = get_encoding(plan.encoding)
        try:
            columns.append(_parts(encoding, array, plan.name))
        except EncodingError:  # the writer's path says where
            return None
        if encoding.size is None and encoding.ndarray:
            shapes[plan.name] = uniform_shape(array, plan.name)
    return columns, shapes


def _parts(encoding: Encoding, array: pa.Array, name: str) -> list[Pieces]:
    """A column's stored bytes for each row, as parts laid one after another per row: a
    variable ndarray's headers and then its values (a view of the Arrow buffer), not
    interleaved first; any other encoding's one part."""
    if isinstance(encoding, NDArrayEncoding) and encoding.shape is None:
        values, shapes = encoding._values(array, name)
        nbytes = np.prod(shapes, axis=1) * values.dtype.itemsize
        value_part = Pieces(values.view(U8).reshape(-1), offsets=offsets_from_lengths(nbytes))
        return [*encoding._headers(values.dtype, shapes), value_part]
    return [encoding.encode(array, name)]


def _lengths(parts: list[Pieces], count: int) -> np.ndarray:
    """Each row's bytes in a column of ``parts``."""
    total = np.zeros(count, dtype=I64)
    for part in parts:
        total += part.lengths(count)
    return total


def _runs(parts: list[Pieces], count: int) -> list[Pieces]:
    """``parts`` (laid one after another in each row) with each run of parts of one width
    per row (the size header, scalars, an ndarray's shape header) joined into one block of
    rows: a copy per row for the run, not one per part (the first copy into the fresh
    output is the costly one)."""
    out: list[Pieces] = []
    run: list[Pieces] = []
    for part in parts:
        if one_width(part, count) is not None:
            run.append(part)
            continue
        if run:
            out.append(run[0] if len(run) == 1 else interleave(run, count))
            run = []
        out.append(part)
    if run:
        out.append(run[0] if len(run) == 1 else interleave(run, count))
    return out
