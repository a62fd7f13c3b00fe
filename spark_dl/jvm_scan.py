"""The JVM scan: ``format("mds")`` reads that Spark plans in the JVM, at Parquet's speed.

PySpark's Python Data Source API hands a reader no required columns and has no way to count
from metadata, so every ``mds`` read decoded every column in a Python worker. ``make install``
compiles ``spark_dl/jvm/*.java`` into ``spark_dl/jvm/spark-dl-jvm.jar`` (when ``javac`` is
there); :func:`install_jvm_scan` adds that jar to a classic session and an optimizer rule
that swaps the Python scan for a JVM one over only the columns a query uses (a count reads
no column at all). The rule leaves every read it cannot answer identically (another
compression, encoding or hash, read-time transforms, remote storage, a mixture,
Mosaic's datasets) to the Python reader. Spark Connect sessions, a missing jar, and
``spark.spark_dl.jvmScan.enabled=false`` keep every read on the Python path.
"""

from __future__ import annotations

import contextlib
import weakref
from pathlib import Path
from typing import Any

JAR = Path(__file__).parent / "jvm" / "spark-dl-jvm.jar"
ENABLED = "spark.spark_dl.jvmScan.enabled"
_RULE = "sparkdl.jvm.MdsScanRule"
# Sessions the rule was installed on (or found not to take it): asked once each.
_DONE: weakref.WeakSet[Any] = weakref.WeakSet()


def install_jvm_scan(spark: Any) -> bool:
    """Add the JVM scan's jar and optimizer rule to ``spark`` (once; idempotent). False
    where it does not apply: Spark Connect, no jar built, or the conf turns it off."""
    if spark is None or spark in _DONE:
        return False
    jsession = _classic_jsession(spark)
    if jsession is None or not JAR.is_file():  # Spark Connect (no JVM here), or no javac
        _remember(spark)
        return False
    if str(spark.conf.get(ENABLED, "true")).strip().lower() == "false":
        return False  # no jar added; a register/load after turning it on installs it
    _remember(spark)
    try:
        rule = _rule_class(spark, jsession)
        jvm = spark._jvm
        gateway = spark.sparkContext._gateway
        types = gateway.new_array(jvm.java.lang.Class, 1)
        types[0] = jvm.java.lang.Class.forName("org.apache.spark.sql.SparkSession")
        args = gateway.new_array(jvm.java.lang.Object, 1)
        args[0] = jsession
        rule.getMethod("install", types).invoke(None, args)
    except Exception as exc:  # a Spark whose internals differ: the Python path, said once
        import warnings

        warnings.warn(
            f"spark-dl: JVM scan not installed, reads stay in Python: {exc}", stacklevel=2
        )
        return False
    return True


def _classic_jsession(spark: Any) -> Any:
    """The JVM session behind a classic session, or None: a Spark Connect session has no
    JVM in this process (its reads stay on the Python reader, which Connect runs), so no
    JVM attribute of it is touched."""
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError:  # Connect's extra dependencies (grpc) are not installed
        pass
    else:
        if isinstance(spark, ConnectSession):
            return None
    return getattr(spark, "_jsparkSession", None)


def _remember(spark: Any) -> None:
    with contextlib.suppress(TypeError):  # a session type without weak references
        _DONE.add(spark)


def _rule_class(spark: Any, jsession: Any) -> Any:
    """The rule's class through the session's jar class loader (``ADD JAR``'s: executors
    get the jar too), adding the jar first where it is not there yet."""
    Class = spark._jvm.java.lang.Class
    loader = jsession.sharedState().jarClassLoader()
    try:
        return Class.forName(_RULE, True, loader)
    except Exception:  # not loaded yet in this SparkContext
        jsession.sessionState().resourceLoader().addJar(str(JAR))
        return Class.forName(_RULE, True, loader)
