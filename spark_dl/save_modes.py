"""Save modes PySpark does not hand to Python data sources (``error``, ``ignore``), applied
in the client before a write, with the lineage and canonical file order of a ``read_delta``
DataFrame; the same policy as the core's ``commit``."""

from __future__ import annotations

import contextlib
import json
import re
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from spark_dl_core.commit import (
    normalize_mode,
    plan_write,
)
from spark_dl_core.errors import DatasetError, SpecError
from spark_dl_core.meta import (
    schema_to_text,
)
from spark_dl_core.store.storage import Store

from .follow import UPDATE, is_update, update_from_frame
from .mds_options import (
    _ROW_INDEX_COLUMN,
    _SPLIT_START_COLUMN,
    FORMAT,
    SOURCE_FILE_COLUMN,
    _storage_options,
)

NOT_REGISTERED = (
    "the 'mds' data source is not registered on this Spark session: Spark finds it by "
    "itself only where spark-dl is installed for the Python that Spark runs (its "
    "pyspark_spark_dl module); otherwise call spark_dl.register(spark) once the session exists"
)

if TYPE_CHECKING:  # pragma: no cover
    from .delta import FileOrderBlock


@contextlib.contextmanager
def _explain_unregistered() -> Iterator[None]:
    """Spark's bare DATA_SOURCE_NOT_FOUND for ``mds`` becomes an error saying what to do."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        unknown = "DATA_SOURCE_NOT_FOUND" in text or "DATA_SOURCE_NOT_EXIST" in text
        if unknown and re.search(r"\bmds\b", text[:2000], re.IGNORECASE):
            raise DatasetError(NOT_REGISTERED) from exc
        raise


def _wrap_writer_class(cls: Any) -> None:
    """Record format/mode/path options on ``cls`` and give ``save`` Spark's default modes.

    PySpark rejects every save mode but append and overwrite for Python data sources, so
    a plain ``df.write.format("mds").save(path)`` would fail. For ``mds`` only, error and
    ignore are decided here, on the client, from the dataset at ``path``; the write then
    runs as append with option ``save_mode`` set, and the driver's commit checks again
    (a dataset that appeared meanwhile fails an ``error`` write, nothing is replaced).
    """
    if getattr(cls, "_spark_dl_wrapped", False):
        return
    orig_mode, orig_format, orig_option, orig_save = cls.mode, cls.format, cls.option, cls.save
    orig_options = cls.options

    def mode(self: Any, saveMode: str | None) -> Any:
        if is_update(saveMode):  # no Spark save mode: ``save`` takes it, for mds only
            self._spark_dl_mode = UPDATE
            return self
        if saveMode is not None:
            self._spark_dl_mode = saveMode
        return orig_mode(self, saveMode)

    def format(self: Any, source: str) -> Any:
        self._spark_dl_format = source
        return orig_format(self, source)

    def option(self: Any, key: str, value: Any) -> Any:
        if value is not None:
            recorded = self.__dict__.setdefault("_spark_dl_options", {})
            recorded[key.lower()] = str(value)
        return orig_option(self, key, value)

    def options(self: Any, **opts: Any) -> Any:
        recorded = self.__dict__.setdefault("_spark_dl_options", {})
        recorded.update({k.lower(): str(v) for k, v in opts.items() if v is not None})
        return orig_options(self, **opts)

    def save(
        self: Any,
        path: str | None = None,
        format: str | None = None,
        mode: str | None = None,
        partitionBy: Any = None,
        **options: Any,
    ) -> None:
        fmt = format or getattr(self, "_spark_dl_format", None)
        asked = mode or getattr(self, "_spark_dl_mode", None)
        recorded = {**getattr(self, "_spark_dl_options", {}), **options}
        if is_update(asked):
            return _update(self, fmt, path or recorded.get("path"), recorded)
        if fmt is None or fmt.lower() != FORMAT:
            return orig_save(self, path, format, mode, partitionBy, **options)
        chosen = normalize_mode(asked)
        extra: dict[str, str] = {}
        spark_mode = chosen
        if chosen in ("error", "ignore"):
            target = path or recorded.get("path")
            if not target:
                raise DatasetError("the mds data source needs a path: .save(path)")
            # the core's policy: error raises DatasetExistsError, ignore plans a skip
            if plan_write(Store(target, _storage_options(recorded)), chosen, None).skip:
                return None
            extra["save_mode"] = chosen
            spark_mode = "append"
        writer = _lineage_writer(self, recorded, extra)
        if writer is None:
            for key, value in extra.items():
                orig_option(self, key, value)
            writer = self
        with _explain_unregistered():
            return orig_save(writer, path, format, spark_mode, partitionBy, **options)

    def _lineage_writer(self: Any, recorded: dict[str, str], extra: dict[str, str]) -> Any:
        """Lineage (option ``source``) and canonical order for a pinned Delta read.

        Returns a writer over the canonically ordered DataFrame, or None to write ``self``
        as it is (``extra`` then gains the ``source`` option when lineage is known).
        """
        frame = _written_frame(self)
        if frame is None:
            return None
        from .delta import canonical_files, delta_fields, file_order_block, source_option
        from .delta_scan import pin_delta_scan

        # a catalog table or time-travel read of delta-spark: written as its pinned read
        pinned = pin_delta_scan(frame)
        if pinned is not None:
            frame = pinned
        plain = None if pinned is None else orig_format(pinned.write, FORMAT)

        if "source" not in recorded:
            found = source_option(frame)
            if found is not None:
                extra["source"] = found
        if "delta_schema" not in recorded:
            fields = delta_fields(frame)
            if fields is not None:
                extra["delta_schema"] = schema_to_text(fields)
        files = canonical_files(frame)
        ordered = None
        if files and "canonical_files" not in recorded:
            ordered = _canonical_frame(frame, file_order_block(frame))
        if ordered is None or files is None:
            return None if plain is None else orig_options(plain, **recorded, **extra)
        writer = orig_format(ordered.write, FORMAT)
        return orig_options(writer, **recorded, **extra, canonical_files=json.dumps(list(files)))

    wrapped = {"mode": mode, "format": format, "option": option, "options": options, "save": save}
    for name, fn in wrapped.items():
        fn.__doc__ = getattr(cls, name).__doc__
        fn.__name__ = name
        setattr(cls, name, fn)
    cls._spark_dl_wrapped = True


def _update(writer: Any, fmt: str | None, path: str | None, options: dict[str, str]) -> None:
    """``mode("update")``: the followed dataset at ``path`` updated to the version the
    written DataFrame pins, in this process (:mod:`.follow`); only ``format("mds")``."""
    if fmt is None or fmt.lower() != FORMAT:
        raise SpecError(
            f"save mode 'update' is format('mds')'s (a dataset that follows a Delta table), "
            f"not format({fmt!r})'s: Spark has no such mode"
        )
    if not path:
        raise DatasetError("the mds data source needs a path: .save(path)")
    frame = _written_frame(writer)
    if frame is None:
        raise SpecError("mode('update'): this writer does not say which DataFrame it writes")
    update_from_frame(frame, path, {k: v for k, v in options.items() if k != "path"})


def _wrap_reader_class(cls: Any) -> None:
    """``spark.read.format("mds").load(...)`` on a session without the source: explained.
    (Spark Connect resolves lazily; there the first action raises Spark's own error.)"""
    if getattr(cls, "_spark_dl_wrapped", False):
        return
    orig_load = cls.load

    def load(self: Any, *args: Any, **kwargs: Any) -> Any:
        from .jvm_scan import install_jvm_scan

        install_jvm_scan(getattr(self, "_spark", None))  # a session made after the import
        with _explain_unregistered():
            return orig_load(self, *args, **kwargs)

    load.__doc__ = orig_load.__doc__
    load.__name__ = "load"
    cls.load = load
    cls._spark_dl_wrapped = True


def _written_frame(writer: Any) -> Any:
    """The DataFrame a (classic or Connect) ``DataFrameWriter`` writes, or None."""
    df = getattr(writer, "_df", None)
    if df is None:
        return None
    if hasattr(df, "schema"):  # classic: the DataFrame itself
        return df
    spark = getattr(writer, "_spark", None)
    if spark is None:
        return None
    from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame

    return ConnectDataFrame(df, spark)  # Connect: the writer holds the plan


def _canonical_frame(df: Any, block: FileOrderBlock | None) -> Any:
    """``df`` with every data file's rows in one partition, in file row order, and a
    column naming the file: what lets each task cut shards at file boundaries and the
    commit order them by the snapshot's file order, whatever Spark's file splitting and
    packing did (``maxPartitionBytes``, parallelism). None, with a warning saying why and
    what is written instead, when the plan (``block``) or the scan's file metadata does not
    allow it; nothing is resolved that could fail (PySpark logs failed analyses as ERRORs)."""
    from pyspark.sql import functions as F

    if block is not None and block.sorted:
        _warn_layout(
            "it is sorted (orderBy, sort or sortWithinPartitions): the rows are written in "
            "that order, not in the snapshot's file order, so the dataset is not the "
            "snapshot's canonical export (another fingerprint; rows that tie on the sort "
            "keys may come in any order)"
        )
        return None
    if block is not None:
        _warn_layout(
            f"its rows no longer name their data file after {block.node} in the plan "
            "(a join, union or aggregation such as groupBy or distinct): writing in Spark's "
            "partition order, which depends on parallelism"
        )
        return None
    try:  # above the nodes file_order_block lets through, a file scan's _metadata resolves
        fields = df.select("_metadata").schema["_metadata"].dataType.fieldNames()
    except Exception as exc:  # a scan without file metadata
        _warn_layout(f"its scan has no file metadata ({exc}): writing in Spark's partition order")
        return None
    order = _file_row_order(fields)
    if "file_name" not in fields or order is None:
        _warn_layout(
            f"the scan's file metadata cannot name each row's file and place (it has "
            f"{fields}): writing in Spark's partition order, which depends on parallelism"
        )
        return None
    keyed = df.withColumn(SOURCE_FILE_COLUMN, F.col("_metadata.file_name")).withColumns(order)
    return (
        keyed.repartition(F.col(SOURCE_FILE_COLUMN))
        .sortWithinPartitions(SOURCE_FILE_COLUMN, *order)
        .drop(*order)
    )


def _file_row_order(fields: list[str]) -> dict[str, Any] | None:
    """The columns that sort each data file's rows into file order, given the scan's
    ``_metadata`` fields: the Parquet scan's ``row_index``; where the scan has none (Delta's
    own reader exposes no row index), the split's start offset, then the scan task's row
    counter, which follows file order within a split (deletion vectors only drop rows)."""
    from pyspark.sql import functions as F

    if "row_index" in fields:
        return {_ROW_INDEX_COLUMN: F.col("_metadata.row_index")}
    if "file_block_start" in fields:
        return {
            _SPLIT_START_COLUMN: F.col("_metadata.file_block_start"),
            _ROW_INDEX_COLUMN: F.monotonically_increasing_id(),
        }
    return None


def _warn_layout(why: str) -> None:
    warnings.warn(f"spark-dl: writing a pinned Delta read: {why}", stacklevel=5)


def install_save_modes() -> None:
    """Apply :func:`_wrap_writer_class` to the classic and Spark Connect writers."""
    from pyspark.sql.readwriter import DataFrameReader, DataFrameWriter

    _wrap_writer_class(DataFrameWriter)
    _wrap_reader_class(DataFrameReader)
    try:
        from pyspark.sql.connect.readwriter import DataFrameReader as ConnectReader
        from pyspark.sql.connect.readwriter import DataFrameWriter as ConnectWriter
    except ImportError:  # Connect's extra dependencies (grpc) are not installed
        return
    _wrap_writer_class(ConnectWriter)
    _wrap_reader_class(ConnectReader)
