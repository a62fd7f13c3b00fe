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
from pathlib import Path
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
# Tests that need a JVM whatever their fixtures (marked ``jvm`` below)
SPARK_TESTS = Path(__file__).parent / "spark"
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
    # Iceberg's jars on every session: the first session launches the JVM, whose classpath
    # a later session cannot extend for the driver. The classic session also gets Iceberg's
    # extension and a Hadoop catalog named "iceberg" (tests/spark/test_iceberg_spark.py
    # writes its tables there), so no module stops the shared session for an Iceberg one.
    from spark_dl.iceberg_session import IcebergSetupError, iceberg_jars

    with contextlib.suppress(IcebergSetupError):
        if jars := iceberg_jars():
            if not connect:
                warehouse = os.path.join(tmp, "iceberg-warehouse")
                builder = spark_dl.with_iceberg(builder, warehouse)
            else:
                earlier = [j for j in str(builder._options.get("spark.jars", "")).split(",") if j]
                builder = builder.config("spark.jars", ",".join([*earlier, *jars]))
    for key, value in _CONF.items():
        if not (connect and key.startswith("spark.ui")):  # static: Connect refuses them
            builder = builder.config(key, value)
    if connect:  # the JVM scan as a Connect server gets it: a session extension
        return spark_dl.with_jvm_scan(builder)
    return builder.config("spark.sql.warehouse.dir", os.path.join(tmp, "warehouse"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "own_spark_session: the module stops the shared session and runs its own (ordered last)",
    )
    config.addinivalue_line(
        "markers", "jvm: starts or shares a JVM (marked here: -m jvm runs them apart)"
    )
    config.pluginmanager.register(_JvmTests(), "spark-dl-jvm-tests")


def _kind(item: pytest.Item) -> str | None:
    """The shared session kind ``item`` asks for, if any."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "spark_kind" in callspec.params:
        return str(callspec.params["spark_kind"])
    names = getattr(item, "fixturenames", ())
    return (
        "connect" if "connect_spark" in names else "classic" if "classic_spark" in names else None
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each session kind starts once a run: after pytest's grouping by the ``spark`` param,
    tests asking for ``connect_spark`` directly join the Connect group, and modules that
    stop the shared session for their own run last (nothing restarts the shared one)."""
    param = [i for i in items if _kind(i) and "spark_kind" in getattr(i, "fixturenames", ())]
    connect = [item for item in param if _kind(item) == "connect"]
    if connect:
        strays = [item for item in items if _kind(item) == "connect" and item not in param]
        rest = [item for item in items if item not in strays]
        at = rest.index(connect[-1]) + 1
        items[:] = [*rest[:at], *strays, *rest[at:]]
    own = [item for item in items if item.get_closest_marker("own_spark_session")]
    items[:] = [*(item for item in items if item not in own), *own]


class _JvmTests:
    """Marks ``jvm`` every test that starts or shares a JVM, so ``-m jvm`` / ``-m "not jvm"``
    run them apart (one JVM, each session kind started once, in the order above) from the
    rest. Marked first, so that selection sees it."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            shares = "_spark_sessions" in getattr(item, "fixturenames", ())  # the closure
            own = item.get_closest_marker("own_spark_session") is not None
            if shares or own or SPARK_TESTS in item.path.parents:
                item.add_marker(pytest.mark.jvm)


class _Sessions:
    """At most one Spark session kind at a time in this process.

    A local Spark Connect server needs its own SparkContext (with the Connect plugin), and
    while it runs PySpark routes ``pyspark.sql.functions`` to Connect; so switching kinds
    stops the other one first. pytest groups tests by the ``spark`` param and
    ``pytest_collection_modifyitems`` above puts the rest beside their kind's group.
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
