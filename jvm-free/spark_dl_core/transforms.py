"""Declarative, serializable transforms over Arrow record batches.

A transform runs at write time (before encoding; the stored data is the result) or at read
time (after decoding, in the loader). Because they are data, transforms are recorded in the
spec, feed the fingerprint and survive a trip through JSON. The ``python`` transform is the
escape hatch (Petastorm's TransformSpec idea): a function named by import path plus the
schema it promises, which is checked on every batch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Annotated, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from .errors import SpecError


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    at: Literal["write", "read"] = "write"


class Select(_Base):
    op: Literal["select"] = "select"
    columns: list[str]

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        _require(batch, self.columns, self.op)
        return batch.select(self.columns)


class Drop(_Base):
    op: Literal["drop"] = "drop"
    columns: list[str]

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        _require(batch, self.columns, self.op)
        keep = [n for n in batch.schema.names if n not in set(self.columns)]
        return batch.select(keep)


class Rename(_Base):
    op: Literal["rename"] = "rename"
    mapping: dict[str, str]

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        _require(batch, list(self.mapping), self.op)
        return batch.rename_columns([self.mapping.get(n, n) for n in batch.schema.names])


class Cast(_Base):
    """Cast a column to an Arrow type named as pyarrow names it (``float32``, ``int16``…)."""

    op: Literal["cast"] = "cast"
    column: str
    to: str

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        _require(batch, [self.column], self.op)
        target = _arrow_type(self.to)
        array = batch.column(self.column)
        if pa.types.is_list(array.type) or pa.types.is_fixed_size_list(array.type):
            target = _with_leaf(array.type, target)
        try:
            cast = pc.cast(array, target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SpecError(f"cast of column {self.column!r} to {self.to}: {exc}") from None
        return _replace(batch, self.column, cast)


class Normalize(_Base):
    """``(x - mean) / std`` as float32, for numeric columns and numeric arrays."""

    op: Literal["normalize"] = "normalize"
    column: str
    mean: float
    std: float = Field(gt=0)

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        _require(batch, [self.column], self.op)
        array = batch.column(self.column)
        leaf = array
        while pa.types.is_list(leaf.type) or pa.types.is_fixed_size_list(leaf.type):
            leaf = leaf.flatten()
        values = leaf.to_numpy(zero_copy_only=False).astype(np.float32)
        scaled = pa.array((values - np.float32(self.mean)) / np.float32(self.std))
        if leaf is array:
            return _replace(batch, self.column, scaled)
        return _replace(batch, self.column, _rewrap(array, scaled))


class PythonTransform(_Base):
    """Call ``module:function`` on each batch (as pandas, or Arrow with ``arrow=True``).

    ``output_schema`` maps each output column to its Arrow type name; the result is cast to
    it and any column missing or extra is an error naming it.
    """

    op: Literal["python"] = "python"
    function: str
    output_schema: dict[str, str]
    arrow: bool = False

    def resolve(self) -> Callable[[Any], Any]:
        module_name, _, attr = self.function.partition(":")
        if not module_name or not attr:
            raise SpecError(f"python transform {self.function!r}: write it as 'module:function'")
        try:
            function: Callable[[Any], Any] = getattr(importlib.import_module(module_name), attr)
            return function
        except (ImportError, AttributeError) as exc:
            raise SpecError(
                f"python transform {self.function!r} cannot be imported: {exc}"
            ) from None

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        function = self.resolve()
        result = function(batch if self.arrow else batch.to_pandas())
        if not isinstance(result, (pa.RecordBatch, pa.Table)):
            result = pa.RecordBatch.from_pandas(result, preserve_index=False)
        got, want = set(result.schema.names), set(self.output_schema)
        if got != want:
            raise SpecError(
                f"python transform {self.function!r} returned columns {sorted(got)}, "
                f"its output_schema declares {sorted(want)}"
            )
        schema = pa.schema([(n, _arrow_type(t)) for n, t in self.output_schema.items()])
        try:
            table = result if isinstance(result, pa.Table) else pa.Table.from_batches([result])
            table = table.select(schema.names).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SpecError(f"python transform {self.function!r}: {exc}") from None
        if table.num_rows == 0:
            return pa.RecordBatch.from_pylist([], schema=schema)
        return table.combine_chunks().to_batches()[0]


Transform = Annotated[
    Select | Drop | Rename | Cast | Normalize | PythonTransform, Field(discriminator="op")
]


def apply_transforms(
    batch: pa.RecordBatch, transforms: list[Any], at: Literal["write", "read"]
) -> pa.RecordBatch:
    """Run, in order, the transforms that belong to stage ``at``."""
    for transform in transforms:
        if transform.at == at:
            batch = transform.apply(batch)
    return batch


def _require(batch: pa.RecordBatch, columns: list[str], op: str) -> None:
    missing = [c for c in columns if c not in batch.schema.names]
    if missing:
        raise SpecError(f"{op} transform names missing column(s) {missing}")


def _arrow_type(name: str) -> pa.DataType:
    try:
        return pa.type_for_alias(name)
    except (ValueError, KeyError):
        raise SpecError(
            f"{name!r} is not an Arrow type name (try float32, int64, string)"
        ) from None


def _with_leaf(list_type: pa.DataType, leaf: pa.DataType) -> pa.DataType:
    if pa.types.is_fixed_size_list(list_type):
        return pa.list_(_with_leaf(list_type.value_type, leaf), list_type.list_size)
    if pa.types.is_list(list_type):
        return pa.list_(_with_leaf(list_type.value_type, leaf))
    return leaf


def _rewrap(array: pa.Array, leaves: pa.Array) -> pa.Array:
    """Put new leaf values back into the list structure of ``array``."""
    if pa.types.is_fixed_size_list(array.type):
        inner = _rewrap(array.flatten(), leaves)
        return pa.FixedSizeListArray.from_arrays(inner, array.type.list_size)
    if pa.types.is_list(array.type):
        offsets = pc.subtract(array.offsets, array.offsets[0])
        return pa.ListArray.from_arrays(offsets, _rewrap(array.flatten(), leaves))
    return leaves


def _replace(batch: pa.RecordBatch, column: str, array: pa.Array) -> pa.RecordBatch:
    index = batch.schema.get_field_index(column)
    arrays = list(batch.columns)
    arrays[index] = array
    names = batch.schema.names
    return pa.RecordBatch.from_arrays(arrays, names=names)
