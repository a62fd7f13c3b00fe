"""Spark <-> Arrow type mapping for MDS datasets.

Spark has no unsigned integers or half floats, so a dataset's Arrow schema (which may come
from Mosaic's writer: ``uint8``, ``float16``…) is widened to the nearest type Spark can
hold before it becomes a Spark schema; readers cast their batches to that Arrow schema.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

_WIDER: dict[pa.DataType, pa.DataType] = {
    pa.uint8(): pa.int16(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    pa.uint64(): pa.decimal128(20, 0),
    pa.float16(): pa.float32(),
}


def spark_compatible(t: pa.DataType) -> pa.DataType:
    """``t`` with every part Spark cannot represent widened (lists/structs/maps recursed)."""
    if t in _WIDER:
        return _WIDER[t]
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        # Spark's Arrow readers expect zoned timestamps as UTC, whatever the session zone
        # or the zone name a dataset stored (``Etc/UTC``, ``America/New_York``): same instants
        return pa.timestamp("us", tz="UTC" if t.tz else None)
    if pa.types.is_date64(t):
        return pa.date32()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return pa.list_(_field(t.value_field))
    if pa.types.is_struct(t):
        return pa.struct([_field(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(spark_compatible(t.key_type), _field(t.item_field))
    return t


def _field(f: pa.Field) -> pa.Field:
    return pa.field(f.name, spark_compatible(f.type), nullable=f.nullable)


def spark_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """The Arrow schema a Spark reader yields for a dataset whose schema is ``schema``."""
    return pa.schema([_field(f) for f in schema])


def to_spark_schema(schema: pa.Schema) -> StructType:
    """A Spark schema for an Arrow schema (after :func:`spark_arrow_schema`).

    Timestamps without a zone become ``timestamp_ntz``; with a zone, ``timestamp``.
    """
    return from_arrow_schema(spark_arrow_schema(schema), prefer_timestamp_ntz=True)


def utc_timestamps(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Zoned timestamp columns relabelled as UTC (same instants): Spark hands write tasks
    the session's zone, and the stored type, hence the fingerprint, must not depend on it."""
    fields = list(batch.schema)
    changed = False
    arrays = list(batch.columns)
    for i, f in enumerate(fields):
        if pa.types.is_timestamp(f.type) and f.type.tz not in (None, "UTC"):
            t = pa.timestamp(f.type.unit, tz="UTC")
            arrays[i] = arrays[i].cast(t)
            fields[i] = pa.field(f.name, t, nullable=f.nullable, metadata=f.metadata)
            changed = True
    if not changed:
        return batch
    return pa.RecordBatch.from_arrays(
        arrays, schema=pa.schema(fields, metadata=batch.schema.metadata)
    )


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` cast to ``schema`` (a no-op when the types already match)."""
    if batch.schema.equals(schema):
        return batch
    arrays = [
        batch.column(i) if batch.column(i).type == f.type else batch.column(i).cast(f.type)
        for i, f in enumerate(schema)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
