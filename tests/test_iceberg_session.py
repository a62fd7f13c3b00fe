"""``spark_dl.with_iceberg``: which jars and settings a session builder gets, and the
folders it refuses by name, without starting a JVM (tests/spark/test_iceberg_spark.py runs
a session)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

import spark_dl
from spark_dl.iceberg_session import (
    CATALOG_CLASS,
    COMPAT_JAR,
    EXTENSION,
    IcebergSetupError,
    iceberg_jars,
    runtime_artifact,
)


def _folder(path: Path, *names: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name in names:
        (path / name).write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip
    return path


def _runtime() -> str:
    artifact, version, _ = runtime_artifact()
    return f"{artifact}-{version}.jar"


def test_with_iceberg_configures_a_builder(tmp_path: Path) -> None:
    from pyspark.sql import SparkSession

    folder = _folder(tmp_path / "jars", _runtime(), COMPAT_JAR)
    builder = (
        SparkSession.Builder()
        .config("spark.sql.extensions", "my.Extension")
        .config("spark.jars", "/x/delta.jar")
    )
    options = spark_dl.with_iceberg(builder, tmp_path / "wh", catalog="lake", jars_dir=folder)
    options = options._options
    assert options["spark.sql.extensions"] == f"my.Extension,{EXTENSION}"
    assert options["spark.sql.catalog.lake"] == CATALOG_CLASS
    assert options["spark.sql.catalog.lake.type"] == "hadoop"
    assert options["spark.sql.catalog.lake.warehouse"] == str(tmp_path / "wh")
    jars = options["spark.jars"].split(",")
    assert jars[-1] == "/x/delta.jar" and str(folder / _runtime()) in jars
    if runtime_artifact()[2]:  # the compatibility jar goes before the runtime it patches
        assert jars.index(str(folder / COMPAT_JAR)) < jars.index(str(folder / _runtime()))


def test_folders_that_cannot_serve_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_DL_ICEBERG_JARS", str(tmp_path / "missing"))
    with pytest.raises(IcebergSetupError, match="holds no Iceberg jars"):
        iceberg_jars()
    other = _folder(tmp_path / "other", "iceberg-spark-runtime-3.5_2.12-1.4.0.jar")
    with pytest.raises(IcebergSetupError, match=rf"needs {_runtime()}"):
        iceberg_jars(other)
    if runtime_artifact()[2]:
        with pytest.raises(IcebergSetupError, match=f"no {COMPAT_JAR}"):
            iceberg_jars(_folder(tmp_path / "bare", _runtime()))


def test_installed_jars_match_this_environment() -> None:
    """`make install` fetched the runtime this PySpark needs (and built the compatibility
    jar where it is needed)."""
    try:
        names = [Path(j).name for j in iceberg_jars()]
    except IcebergSetupError as exc:  # no JDK here to build the compatibility jar with
        pytest.skip(str(exc))
    if not names:
        pytest.skip("no Iceberg jars: run `make install`")
    assert _runtime() in names
    assert (COMPAT_JAR in names) == runtime_artifact()[2]
