"""Shared Spark sessions: one classic ``local[2]`` and one Spark Connect ``remote("local[2]")``.

Both are session-scoped (Spark starts slowly); tests take ``spark`` (parametrized over both
kinds) or ``classic_spark`` / ``connect_spark`` directly. Spark-free test modules never
touch these fixtures, so they do not start a JVM.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Delta's log replay shuffles into 50 partitions by default: seconds per query here
    "spark.databricks.delta.snapshotPartitions": "2",
}
# Not "UTC": Spark hands Python data sources the session zone's name, and a reader or writer
# that only works when it is spelled exactly "UTC" must fail here (issue: Etc/UTC, New York).
_ZONES = {"classic": "America/New_York", "connect": "Etc/UTC"}


def _builder(builder: Any, tmp: str, connect: bool) -> Any:
    import spark_dl

    # Delta Lake as a Databricks user has it (jars from `make install`): read_delta(engine=
    # "auto"), spark.read.format("delta") and SQL on Delta tables all go through delta-spark.
    builder = spark_dl.with_delta(builder).config(
        "spark.sql.session.timeZone", _ZONES["connect" if connect else "classic"]
    )
    # Iceberg's jars (not its extension or catalog) on every session: the first session
    # launches the JVM, whose classpath a later session cannot extend for the driver, and
    # tests/spark/test_iceberg_spark.py starts its own session with Iceberg configured
    from spark_dl.iceberg_session import IcebergSetupError, iceberg_jars

    with contextlib.suppress(IcebergSetupError):
        earlier = [j for j in str(builder._options.get("spark.jars", "")).split(",") if j]
        if jars := iceberg_jars():
            builder = builder.config("spark.jars", ",".join([*earlier, *jars]))
    for key, value in _CONF.items():
        if not (connect and key.startswith("spark.ui")):  # static: Connect refuses them
            builder = builder.config(key, value)
    if connect:
        return builder
    return builder.config("spark.sql.warehouse.dir", os.path.join(tmp, "warehouse"))


class _Sessions:
    """At most one Spark session kind at a time in this process.

    A local Spark Connect server needs its own SparkContext (with the Connect plugin), and
    while it runs PySpark routes ``pyspark.sql.functions`` to Connect; so switching kinds
    stops the other one first. pytest groups tests by the ``spark`` param, so each kind
    starts once per run.
    """

    def __init__(self, tmp: str) -> None:
        self.tmp = tmp
        self.kind: str | None = None
        self.session: Any = None

    def get(self, kind: str) -> Any:
        if self.kind == kind:
            return self.session
        self.stop()
        from pyspark.sql import SparkSession

        if kind == "connect":
            pytest.importorskip("grpc")
            builder = SparkSession.builder.remote("local[2]")
            # PySpark's own test switch: the local Connect server binds an ephemeral port
            # and the client asks the JVM for it, so test runs side by side do not collide
            # on the default 15002. Only set while the session starts.
            os.environ["SPARK_TESTING"] = "1"
        else:
            builder = SparkSession.builder.master("local[2]")
        try:
            self.session = _builder(builder, self.tmp, kind == "connect").getOrCreate()
        finally:
            os.environ.pop("SPARK_TESTING", None)
        import spark_dl

        spark_dl.register(self.session)
        self.kind = kind
        return self.session

    def stop(self) -> None:
        if self.session is not None:
            self.session.stop()
        self.session, self.kind = None, None


@pytest.fixture(scope="session")
def _spark_sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Sessions]:
    sessions = _Sessions(str(tmp_path_factory.mktemp("spark")))
    yield sessions
    sessions.stop()


@pytest.fixture(scope="session", params=["classic", "connect"])
def spark_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def spark(spark_kind: str, _spark_sessions: _Sessions) -> Any:
    """Each Spark test runs on a classic ``local[2]`` and a Connect ``remote("local[2]")``."""
    return _spark_sessions.get(spark_kind)


@pytest.fixture
def classic_spark(_spark_sessions: _Sessions) -> Any:
    return _spark_sessions.get("classic")


@pytest.fixture
def connect_spark(_spark_sessions: _Sessions) -> Any:
    return _spark_sessions.get("connect")
