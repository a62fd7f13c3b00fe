"""Installed means available: PySpark discovers the ``mds`` source through ``pyspark_spark_dl``.

Each case runs in a fresh interpreter whose driver never imports ``spark_dl``: what is
tested is PySpark's own discovery (``pyspark.sql.worker.lookup_data_sources``), which
imports every top-level ``pyspark_*`` module on the path in a Python worker.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def _python(code: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def _lookup(cwd: Path, env: dict[str, str] | None = None) -> str:
    code = """
    import io, sys
    from pyspark.serializers import read_int, UTF8Deserializer, PickleSerializer
    from pyspark.sql.worker.lookup_data_sources import _main
    out = io.BytesIO()
    _main(io.BytesIO(), out)
    out.seek(0)
    names = []
    for _ in range(read_int(out)):
        names.append(UTF8Deserializer().loads(out))
        out.read(read_int(out))  # the pickled DefaultSource
    print("names:", sorted(names))
    """
    return _python(code, cwd, env)


def test_pyspark_discovery_finds_mds(tmp_path: Path) -> None:
    assert "names: ['mds']" in _lookup(tmp_path)


def test_plugin_fails_soft_without_dependencies(tmp_path: Path) -> None:
    """A broken dependency of spark-dl must not break Spark's discovery: no ``mds``,
    and every other source still registers."""
    broken = tmp_path / "broken"
    (broken / "pydantic").mkdir(parents=True)
    (broken / "pydantic" / "__init__.py").write_text("raise ImportError('pydantic missing')\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "pyspark_other_source.py").write_text(
        "from pyspark.sql.datasource import DataSource\n"
        "class DefaultSource(DataSource):\n"
        "    @classmethod\n"
        "    def name(cls):\n"
        "        return 'other'\n"
    )
    path = os.pathsep.join([str(broken), str(other), os.environ.get("PYTHONPATH", "")])
    out = _lookup(tmp_path, {"PYTHONPATH": path})
    assert "names: ['other']" in out


SESSION = """
import os, sys
from pyspark.sql import SparkSession

kind, path = sys.argv[1], sys.argv[2]
if kind == "connect":
    os.environ["SPARK_TESTING"] = "1"  # ephemeral port for the local Connect server
    builder = SparkSession.builder.remote("local[1]")
else:
    builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
spark = builder.config("spark.sql.shuffle.partitions", "1").getOrCreate()
frame = spark.range(25).selectExpr("id", "cast(id * 2 as string) AS s")
# the default mode (error) needs ``import spark_dl``'s client-side save; Spark hands Python
# sources only append and overwrite
frame.write.format("mds").mode("overwrite").save(path)
back = spark.read.format("mds").load(path)
print("read:", back.count(), sorted(back.columns))
spark.sql(f"CREATE TEMPORARY VIEW plugged USING mds OPTIONS (path '{path}')")
print("sql:", spark.sql("SELECT sum(id) AS t FROM plugged").collect()[0].t)
print("spark_dl imported:", any(m.split(".")[0] == "spark_dl" for m in sys.modules))
spark.stop()
"""


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["classic", "connect"])
def test_fresh_session_without_import_reads_and_writes_mds(kind: str, tmp_path: Path) -> None:
    if kind == "connect":
        pytest.importorskip("grpc")
    script = tmp_path / "session.py"
    script.write_text(SESSION)
    done = subprocess.run(
        [sys.executable, str(script), kind, str(tmp_path / "ds")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "read: 25 ['id', 's']" in done.stdout
    assert f"sql: {sum(range(25))}" in done.stdout
    assert "spark_dl imported: False" in done.stdout


ACCESSOR = """
import sys
import pkgutil

if any(m.name == "pyspark_spark_dl" for m in pkgutil.iter_modules()):
    print("discoverable")
    sys.exit(0)

import spark_dl  # before the session exists: nothing to register on yet
from pyspark.sql import SparkSession

from spark_dl_core.errors import DatasetError

spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
try:
    spark.range(3).write.format("mds").save(sys.argv[1])
except DatasetError as exc:  # Spark cannot find it: the error says what to do
    print("explained:", "spark_dl.register(spark)" in str(exc))
spark.range(12).dl.write_mds(sys.argv[1])
print("rows:", len(spark_dl.open_dataset(sys.argv[1])))
spark.stop()
"""


@pytest.mark.spark
@pytest.mark.slow
def test_accessor_registers_on_its_own_session(tmp_path: Path) -> None:
    """spark-dl only on a path (Spark cannot discover it) and imported before the session:
    ``df.dl`` registers the source on ``df.sparkSession`` itself."""
    onpath = tmp_path / "onpath"
    onpath.mkdir()
    for package in ("spark_dl", "spark_dl_core"):
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.origin is not None
        (onpath / package).symlink_to(Path(spec.origin).parent, target_is_directory=True)
    script = tmp_path / "accessor.py"
    script.write_text(ACCESSOR)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ds")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(onpath)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    if "discoverable" in done.stdout:
        pytest.skip("spark-dl is installed here, so Spark discovers mds without df.dl's help")
    assert "explained: True" in done.stdout
    assert "rows: 12" in done.stdout


REGISTER_TWICE = """
import sys
from pyspark.sql import SparkSession

import spark_dl

spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
spark_dl.register(spark)  # what the quickstart does, on a session that discovered mds
spark_dl.register(spark)
spark.range(7).dl.write_mds(sys.argv[1])
print("rows:", spark.read.format("mds").load(sys.argv[1]).count())
spark.stop()
"""


@pytest.mark.spark
@pytest.mark.slow
def test_register_on_a_session_that_has_mds_is_silent(tmp_path: Path) -> None:
    """Installed, spark-dl is discovered by PySpark; ``spark_dl.register(spark)`` then must
    not replace it (Spark WARNs "The data source mds replaced a statically registered data
    source"), nor must a second call or ``df.dl``."""
    script = tmp_path / "register.py"
    script.write_text(REGISTER_TWICE)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ds")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "rows: 7" in done.stdout
    assert "replaced a" not in done.stderr, done.stderr[-2000:]
