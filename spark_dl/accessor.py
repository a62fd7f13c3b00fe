"""``df.dl``: write a DataFrame as MDS, or get a cached PyTorch / TensorFlow loader for it.

The accessor is a property on both ``pyspark.sql.DataFrame`` and Spark Connect's DataFrame,
and only uses public DataFrame API, so it behaves the same on both.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
)

from spark_dl_core import DatasetSpec

from .datasource import FORMAT, _is_vector

_NUMPY = {
    BooleanType: "uint8",
    ByteType: "int8",
    ShortType: "int16",
    IntegerType: "int32",
    LongType: "int64",
    FloatType: "float32",
    DoubleType: "float64",
}


def _leaf_dtype(dt: DataType) -> str | None:
    for cls, name in _NUMPY.items():
        if isinstance(dt, cls):
            return name
    return None


def fixed_shapes(df: Any, spec: DatasetSpec, vector_dtype: str = "float64") -> dict[str, str]:
    """Fixed ``ndarray`` encodings for array/vector columns whose rows all have one length.

    Spark's schema says ``array<float>`` whatever the lengths, and write tasks must agree on
    one encoding without seeing each other's data, so one small aggregate decides it here:
    equal lengths and no nulls give ``ndarray:float32:32`` (a fixed-width column that loads
    as one tensor); otherwise the column keeps the variable ``ndarray`` encoding.
    """
    candidates: dict[str, tuple[Any, str]] = {}
    for f in df.schema.fields:
        if f.name in spec.columns:
            continue
        if isinstance(f.dataType, ArrayType):
            dtype = _leaf_dtype(f.dataType.elementType)
            if dtype is not None:
                candidates[f.name] = (F.col(f.name), dtype)
        elif _is_vector(f.dataType):
            from pyspark.ml.functions import vector_to_array

            candidates[f.name] = (vector_to_array(F.col(f.name)), vector_dtype)
    if not candidates:
        return {}
    aggs = []
    for i, (column, _) in enumerate(candidates.values()):
        aggs += [
            F.min(F.size(column)).alias(f"lo{i}"),
            F.max(F.size(column)).alias(f"hi{i}"),
            F.count(F.when(column.isNull(), 1)).alias(f"nulls{i}"),
        ]
    row = df.agg(*aggs).collect()[0]
    out = {}
    for i, (name, (_, dtype)) in enumerate(candidates.items()):
        lo, hi, nulls = row[f"lo{i}"], row[f"hi{i}"], row[f"nulls{i}"]
        if lo is not None and lo == hi and lo > 0 and nulls == 0:
            out[name] = f"ndarray:{dtype}:{lo}"
    return out


def _as_spec(spec: DatasetSpec | dict[str, Any] | None) -> DatasetSpec:
    if spec is None:
        return DatasetSpec()
    return spec if isinstance(spec, DatasetSpec) else DatasetSpec(**spec)


class DLAccessor:
    """``df.dl``: MDS writes and cached loaders for one DataFrame."""

    def __init__(self, df: Any) -> None:
        self._df = df

    def resolved_spec(
        self, spec: DatasetSpec | dict[str, Any] | None = None, infer_shapes: bool = True
    ) -> DatasetSpec:
        """``spec`` with fixed array shapes filled in (see :func:`fixed_shapes`)."""
        resolved = _as_spec(spec)
        if not infer_shapes or any(t.at == "write" for t in resolved.transforms):
            return resolved  # spec columns name post-transform columns: leave them alone
        shapes = fixed_shapes(self._df, resolved)
        if not shapes:
            return resolved
        return resolved.model_copy(update={"columns": {**shapes, **resolved.columns}})

    def write_mds(
        self,
        path: str,
        spec: DatasetSpec | dict[str, Any] | None = None,
        mode: str = "error",
        *,
        infer_shapes: bool = True,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        """``df.write.format("mds")`` with the spec as an object; ``mode`` as in Spark."""
        resolved = self.resolved_spec(spec, infer_shapes and mode != "append")
        writer = self._df.write.format(FORMAT).option("spec", resolved.model_dump_json())
        for key, value in (storage_options or {}).items():
            writer = writer.option(f"storage.{key}", value)
        writer.mode(mode).save(path)

    def converter(
        self, spec: DatasetSpec | dict[str, Any] | None = None, cache_dir: str | None = None
    ) -> Any:
        """The DataFrame materialized once (cached by plan and spec) as an MDS dataset."""
        from .converter import make_converter

        return make_converter(self._df, _as_spec(spec), cache_dir)

    def to_torch(
        self, batch_size: int = 256, spec: DatasetSpec | dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        """A PyTorch loader over the cached dataset (kwargs go to the core's TorchLoader)."""
        return self.converter(spec).to_torch(batch_size=batch_size, **kwargs)

    def to_tf(
        self, batch_size: int = 256, spec: DatasetSpec | dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        """A ``tf.data.Dataset`` over the cached dataset."""
        return self.converter(spec).to_tf(batch_size=batch_size, **kwargs)


def _dl(self: Any) -> DLAccessor:
    return DLAccessor(self)


def install_accessor() -> None:
    """Add the ``dl`` property to classic and Spark Connect DataFrames."""
    from pyspark.sql import DataFrame

    DataFrame.dl = property(_dl, doc="spark-dl: MDS writes and cached loaders")  # type: ignore[attr-defined]
    try:
        from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame
    except ImportError:  # Connect's extra dependencies are not installed
        return
    ConnectDataFrame.dl = property(_dl, doc="spark-dl: MDS writes and cached loaders")  # type: ignore[attr-defined]
