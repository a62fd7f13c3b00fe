"""The ``mds`` Python Data Source: Spark writes and reads MDS datasets.

Bytes are the core's business (:class:`spark_dl_core.ShardWriter`, :class:`Dataset`); the
Spark side plans around them in four rooms, of which this module is the face (the
:class:`MDSDataSource` Spark registers, and registering it): ``mds_options`` (what each read
and write takes, and the spec it describes), ``mds_writer`` (each write task encodes its
partition into shards under a task-attempt-unique prefix; the driver's commit merges the
reports into one index, written last, and deletes every file of the job the index does not
name, so failed and speculative attempts leave nothing behind), ``mds_reader`` (shards to
Arrow batches in read tasks) and ``save_modes`` (the modes PySpark does not hand to Python
data sources, applied in the client).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
)
from pyspark.sql.types import StructType

from spark_dl_core import open_dataset
from spark_dl_core.ops.arrow import arrow_schema

from .jvm_scan import install_jvm_scan
from .mds_options import FORMAT as FORMAT
from .mds_options import _path, _storage_options, validate_options, version_option
from .mds_options import spec_from_options as spec_from_options
from .mds_reader import MDSReader, _reader_options, _unprefixed, _with_table_options
from .mds_writer import MDSWriter as MDSWriter
from .mixture_source import MixtureReader, mixture_schema
from .save_modes import install_save_modes as install_save_modes
from .types import to_spark_schema


class MDSDataSource(DataSource):
    """``format("mds")``: MDS datasets (spark-dl's or Mosaic Streaming's) as Spark tables."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        options = _unprefixed(self.options)
        validate_options(options, "read")
        if "mixture" in options:  # a saved mixture: one epoch's rows (mixture_source)
            schema = mixture_schema(options)
        else:
            ds = open_dataset(
                _path(options),
                storage_options=_storage_options(options),
                version=version_option(options),
            )
            schema = to_spark_schema(arrow_schema(ds))
        if "provider" in options:  # a catalog table being created
            schema = _with_table_options(schema, options)
        return schema

    def reader(self, schema: StructType) -> DataSourceReader:
        options = _reader_options(self.options, schema)
        validate_options(options, "read")
        if "mixture" in options:
            return MixtureReader(options, schema)
        return MDSReader(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> MDSWriter:
        validate_options(self.options, "write")
        return MDSWriter(dict(self.options), schema, overwrite)


# Sessions this process registered the source on (``register_source`` is then a no-op).
_REGISTERED: weakref.WeakSet[Any] = weakref.WeakSet()


def register_source(spark: Any, *, force: bool = False) -> Any:
    """Register the ``mds`` source on ``spark`` (classic or Connect) unless the session has
    it already: an installed spark-dl is registered by PySpark's discovery hook
    (``pyspark_spark_dl``), and registering again makes Spark WARN that it replaced a
    registered source. ``force=True`` registers regardless (new code after a reload).
    A classic session also gets the JVM scan (:mod:`spark_dl.jvm_scan`)."""
    if force or (spark not in _REGISTERED and not _session_has_source(spark)):
        spark.dataSource.register(MDSDataSource)
    install_jvm_scan(spark)
    with contextlib.suppress(TypeError):  # a session type without weak references
        _REGISTERED.add(spark)
    return spark


def _session_has_source(spark: Any) -> bool:
    """Whether a classic session already knows ``mds`` (discovered or registered); a Spark
    Connect client cannot ask, so there the source is registered (the server logs it)."""
    try:
        manager = spark._jsparkSession.sessionState().dataSourceManager()
        return bool(manager.dataSourceExists(FORMAT))
    except Exception:  # Spark Connect (no JVM here), or a Spark without the manager
        return False
