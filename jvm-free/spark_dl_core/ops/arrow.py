"""Decoded numpy batches back to Arrow, with the types recorded at write time.

Datasets written by spark-dl carry their Arrow schema in ``spark_dl.json``: booleans,
dates, timestamps, decimals, structs and maps come back as they went in, and null masks
become nulls again. Datasets from other writers get each encoding's natural Arrow type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ColumnNotFoundError
from ..format.buffers import Jagged
from ..format.encodings import json_value_as_py

if TYPE_CHECKING:
    from ..shard_source import Batch, ShardSource


def read_transforms(dataset: ShardSource) -> list[Any]:
    """The spec's ``"at": "read"`` transforms, which every reader applies."""
    from .transforms import parse_transforms

    recorded = (dataset.spec or {}).get("transforms", [])
    return parse_transforms([t for t in recorded if t.get("at") == "read"])


def arrow_schema(dataset: ShardSource, columns: list[str] | None = None) -> pa.Schema:
    """The Arrow schema a reader of ``dataset`` produces: the stored columns (masks folded
    into nullability) after the spec's read-time transforms."""
    schema = stored_schema(dataset, columns)
    transforms = read_transforms(dataset)
    if not transforms:
        return schema
    from .transforms import apply_transforms

    empty = pa.RecordBatch.from_pylist([], schema=schema)
    return apply_transforms(empty, transforms, "read").schema


def stored_schema(dataset: ShardSource, columns: list[str] | None = None) -> pa.Schema:
    """The Arrow schema of the stored columns (masks folded into nullability)."""
    if dataset.plans:
        fields = [pa.field(p.name, p.arrow_type, nullable=p.nullable) for p in dataset.plans]
    else:
        fields = [
            pa.field(n, e.arrow_type(), nullable=False)
            for n, e in zip(dataset.layout.names, dataset.layout.encodings)
        ]
    if columns is not None:
        by_name = {f.name: f for f in fields}
        missing = [c for c in columns if c not in by_name]
        if missing:
            raise ColumnNotFoundError(f"{dataset.shown} has no column(s) {missing}")
        fields = [by_name[c] for c in columns]
    return pa.schema(fields)


def batch_to_arrow(
    dataset: ShardSource, batch: Batch, columns: list[str] | None = None
) -> pa.RecordBatch:
    schema = stored_schema(dataset, columns)
    masks = {p.name: p.null_mask for p in dataset.plans or [] if p.null_mask}
    arrays = []
    for f in schema:
        array = numpy_to_arrow(batch[f.name], f.type)
        mask_name = masks.get(f.name)
        if mask_name and mask_name in batch and batch[mask_name].any():
            nulls = pa.array(batch[mask_name].astype(bool))
            array = pc.if_else(nulls, pa.scalar(None, type=f.type), array)
        arrays.append(array)
    record = pa.RecordBatch.from_arrays(arrays, schema=schema)
    transforms = read_transforms(dataset)
    if transforms:
        from .transforms import apply_transforms

        record = apply_transforms(record, transforms, "read")
    return record


def numpy_to_arrow(values: np.ndarray | Jagged, t: pa.DataType) -> pa.Array:
    """One decoded column as an Arrow array of type ``t``."""
    if isinstance(values, Jagged):
        leaf = t.value_type if pa.types.is_list(t) or pa.types.is_large_list(t) else t
        inner = pa.array(values.values[values.offsets[0] : values.offsets[-1]])
        if inner.type != leaf:
            inner = inner.cast(leaf)
        offsets = (values.offsets - values.offsets[0]).astype(np.int32)
        array = pa.ListArray.from_arrays(pa.array(offsets), inner)
        return array if array.type == t else array.cast(t)
    if values.dtype == object:
        items = list(values)
        if (
            pa.types.is_struct(t)
            or pa.types.is_map(t)
            or (pa.types.is_list(t) and items and not isinstance(items[0], np.ndarray))
        ):
            items = [json_value_as_py(v, t, map_pairs=True) for v in items]
        elif items and isinstance(items[0], np.ndarray):
            # booleans are stored as uint8, and Arrow takes no ints for a bool
            as_bool = pa.types.is_boolean(_leaf(t))
            items = [(v.astype(bool) if as_bool else v).tolist() for v in items]
        return pa.array(items, type=t)
    if values.ndim > 1:
        return _nested(values, t)
    if pa.types.is_boolean(t):
        return pa.array(values.astype(bool))
    if pa.types.is_temporal(t):
        storage = pa.int32() if t.bit_width == 32 else pa.int64()
        return pa.array(values.astype(storage.to_pandas_dtype())).view(t)
    if pa.types.is_decimal(t) or pa.types.is_string(t):
        return pa.array(values.tolist(), type=t)
    array = pa.array(values)
    return array if array.type == t else array.cast(t)


def _leaf(t: pa.DataType) -> pa.DataType:
    """The element type below every list level of ``t``."""
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return t


def _nested(values: np.ndarray, t: pa.DataType) -> pa.Array:
    """Stacked ``(n, d1, d2, ...)`` arrays as (fixed-size) lists nested like ``t``."""
    levels = []
    leaf = t
    for _ in range(values.ndim - 1):
        if not (
            pa.types.is_list(leaf)
            or pa.types.is_large_list(leaf)
            or pa.types.is_fixed_size_list(leaf)
        ):
            break
        levels.append(leaf)
        leaf = leaf.value_type
    inner: pa.Array = pa.array(values.reshape(-1))
    if inner.type != leaf and not pa.types.is_list(leaf):
        inner = inner.cast(leaf)
    dims = values.shape[: 1 + len(levels)]
    for depth in range(len(levels), 0, -1):  # innermost level first
        level, dim = levels[depth - 1], int(dims[depth])
        count = int(np.prod(dims[:depth], dtype=np.int64))  # lists at this level
        if pa.types.is_fixed_size_list(level):
            inner = pa.FixedSizeListArray.from_arrays(inner, dim)
        else:
            offsets = pa.array(np.arange(count + 1, dtype=np.int32) * dim)
            inner = pa.ListArray.from_arrays(offsets, inner)
        if inner.type != level:
            inner = inner.cast(level)
    return inner


def arrow_to_numpy(array: pa.Array | pa.ChunkedArray) -> Any:
    """An Arrow column as a reader hands it out: numbers as numpy, lists of numbers as
    :class:`Jagged` (or dense when fixed-size), anything else as an object array."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    t = array.type
    if pa.types.is_fixed_size_list(t):
        shape = []
        leaf = array
        while pa.types.is_fixed_size_list(leaf.type):
            shape.append(leaf.type.list_size)
            leaf = leaf.flatten()
        return leaf.to_numpy(zero_copy_only=False).reshape(len(array), *shape)
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and (
        pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)
    ):
        offsets = np.asarray(array.offsets, dtype=np.int64)
        values = array.values.to_numpy(zero_copy_only=False)
        return Jagged(values, offsets)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return array.to_numpy(zero_copy_only=False)
    out = np.empty(len(array), dtype=object)
    out[:] = array.to_pylist()
    return out
