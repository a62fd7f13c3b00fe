"""spark-dl: Spark DataFrames into PyTorch and TensorFlow through MDS datasets.

Installing spark-dl makes the ``mds`` data source known to every Spark session (PySpark
discovers its ``pyspark_spark_dl`` module). ``import spark_dl`` also registers it on the
active session (classic or Connect), for environments where the package is only on a path;
adds the ``df.dl`` accessor, which registers it on the DataFrame's own session on first use;
and teaches ``DataFrameWriter.save`` Spark's default save modes for ``format("mds")``
(PySpark only hands Python data sources append/overwrite; see docs/spark.md, "Save modes").
"""

from __future__ import annotations

from typing import Any

from spark_dl_core import DatasetSpec, Source, open_dataset, write_mds

from ._version import __version__
from .accessor import DLAccessor, install_accessor
from .converter import Converter
from .datasource import MDSDataSource, install_save_modes, register_source
from .delta import read_delta
from .delta_session import delta_jars, with_delta
from .iceberg_session import iceberg_jars, with_iceberg
from .jvm_scan import with_jvm_scan
from .mixtures import mix
from .sql import register_dataset, run_sql_file


def register(spark: Any) -> Any:
    """Register the ``mds`` data source on ``spark`` (classic or Spark Connect session).

    Only needed where spark-dl is on a path rather than installed; harmless (and silent)
    on a session that already has the source."""
    return register_source(spark)


def _register_active() -> None:
    """Best effort: the active session, if any, gets the data source at import time."""
    try:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    except Exception:  # no session machinery available: nothing to do
        return
    if spark is not None:
        register(spark)


install_accessor()
install_save_modes()
_register_active()

__all__ = [
    "Converter",
    "DLAccessor",
    "DatasetSpec",
    "MDSDataSource",
    "Source",
    "__version__",
    "delta_jars",
    "iceberg_jars",
    "mix",
    "open_dataset",
    "read_delta",
    "register",
    "register_dataset",
    "run_sql_file",
    "with_delta",
    "with_iceberg",
    "with_jvm_scan",
    "write_mds",
]
