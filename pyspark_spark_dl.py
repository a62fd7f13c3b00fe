"""PySpark's discovery hook: ``format("mds")`` and ``USING mds`` in every Spark session.

PySpark 4, at a session's first data-source call, imports each top-level ``pyspark_*``
module on its Python path and registers the module's ``DefaultSource``. Installing
spark-dl ships this module, so the ``mds`` source is there with no ``import spark_dl`` and
no ``spark_dl.register(spark)``. Its import must never break a Spark session: where
spark-dl's own dependencies are missing or broken it defines nothing, and Spark reports
``mds`` as not found, as it would without spark-dl.
"""

from __future__ import annotations

try:
    from spark_dl.datasource import MDSDataSource as DefaultSource
except Exception:  # spark-dl's dependencies missing or broken: register nothing
    __all__: list[str] = []
else:
    __all__ = ["DefaultSource"]
