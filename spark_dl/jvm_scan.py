"""The JVM scan: ``format("mds")`` reads that Spark plans in the JVM, at Parquet's speed.

PySpark's Python Data Source API hands a reader no required columns and has no way to count
from metadata, so every ``mds`` read decoded every column in a Python worker. ``make install``
compiles ``spark_dl/jvm/*.java`` into ``spark_dl/jvm/spark-dl-jvm.jar`` (when ``javac`` is
there); :func:`install_jvm_scan` adds that jar to a classic session and an optimizer rule
that swaps the Python scan for a JVM one over only the columns a query uses (a count reads
no column at all). The rule leaves every read it cannot answer identically (another
compression, encoding or hash, read-time transforms, remote storage, a mixture,
Mosaic's datasets) to the Python reader. A missing jar and
``spark.spark_dl.jvmScan.enabled=false`` keep every read on the Python path.

Spark Connect: the client has no JVM to add a rule from, so the server gets it at start, as
a session extension: :func:`with_jvm_scan` puts the jar on ``spark.jars`` and
``sparkdl.jvm.MdsExtensions`` on ``spark.sql.extensions`` of a session builder (a local
``remote("local[...]")`` server takes them too; a cluster's Connect server takes the same two
settings). A classic session built that way has the rule from the start as well, and
:func:`install_jvm_scan` then leaves it alone.
"""

from __future__ import annotations

import contextlib
import weakref
from pathlib import Path
from typing import Any

from .builder_lists import extend_listed

JAR = Path(__file__).parent / "jvm" / "spark-dl-jvm.jar"
ENABLED = "spark.spark_dl.jvmScan.enabled"
EXTENSION = "sparkdl.jvm.MdsExtensions"
_RULE = "sparkdl.jvm.MdsScanRule"
# Sessions the rule was installed on (or found not to take it): asked once each.
_DONE: weakref.WeakSet[Any] = weakref.WeakSet()


def with_jvm_scan(builder: Any) -> Any:
    """``builder`` (a ``SparkSession.Builder``) with the JVM scan as a session extension: the
    jar on ``spark.jars`` and :data:`EXTENSION` on ``spark.sql.extensions``, keeping what the
    builder already has. The way for Spark Connect (local or a cluster's server); unchanged
    where no jar was built (no ``javac`` at install)."""
    if not JAR.is_file():
        return builder
    builder = extend_listed(builder, "spark.jars", [str(JAR)])
    return extend_listed(builder, "spark.sql.extensions", [EXTENSION])


def has_jvm_scan_extension(spark: Any) -> bool:
    """Whether ``spark``'s application was started with :data:`EXTENSION` (read from the
    session's conf: classic and Connect alike)."""
    try:
        configured = str(spark.conf.get("spark.sql.extensions", "") or "")
    except Exception:  # a conf the server will not show
        return False
    return EXTENSION in [e.strip() for e in configured.split(",")]


def install_jvm_scan(spark: Any) -> bool:
    """Add the JVM scan's jar and optimizer rule to a classic ``spark`` (once; idempotent).
    False where it does not apply: Spark Connect, a session that has the rule from
    :func:`with_jvm_scan`'s extension, no jar built, or the conf turns it off."""
    if spark is None or spark in _DONE:
        return False
    if has_jvm_scan_extension(spark):  # Spark added the rule when it built the session
        _remember(spark)
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
