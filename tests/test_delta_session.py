"""``spark_dl.with_delta``: which jars a session gets, and the mismatches it refuses by name.

The Spark sessions of the whole suite are built with it (tests/conftest.py) over the jars
``make install`` fetched; these tests check its choices without starting a JVM."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("delta")

import spark_dl
from spark_dl.delta_session import (
    CATALOG,
    EXTENSION,
    DeltaSetupError,
    _artifact_name,
    delta_jars,
)


def _folder(tmp_path: Path, *names: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name in names:
        (tmp_path / name).write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip
    return tmp_path


def test_installed_jars_match_this_environment() -> None:
    """`make install` fetched the delta-spark jar built for this PySpark, at the installed
    delta-spark's version, and what it needs that PySpark does not ship."""
    jars = [Path(j).name for j in delta_jars()]
    assert f"{_artifact_name()}.jar" in jars
    assert any(j.startswith("delta-storage-") for j in jars)
    assert not any(j.startswith(("scala-library", "hadoop-client", "jackson-core")) for j in jars)


def test_with_delta_configures_a_builder(tmp_path: Path) -> None:
    from pyspark.sql import SparkSession

    folder = _folder(tmp_path, f"{_artifact_name()}.jar", "delta-storage-x.jar")
    builder = SparkSession.Builder().config("spark.sql.extensions", "my.Extension")
    options = spark_dl.with_delta(builder, jars_dir=folder)._options
    assert options["spark.sql.extensions"] == f"my.Extension,{EXTENSION}"  # kept, then Delta
    assert options["spark.sql.catalog.spark_catalog"] == CATALOG
    assert sorted(options["spark.jars"].split(",")) == sorted(str(p) for p in folder.glob("*"))


def test_jars_of_another_spark_or_delta_are_refused_naming_both(tmp_path: Path) -> None:
    name = _artifact_name()
    assert name is not None
    other_spark = name.replace("delta-spark_4.", "delta-spark_3.")
    with pytest.raises(DeltaSetupError, match=rf"{other_spark}.jar.*needs {name}.jar"):
        delta_jars(_folder(tmp_path / "spark", f"{other_spark}.jar"))
    other_delta = name.rsplit("-", 1)[0] + "-3.0.0"
    with pytest.raises(DeltaSetupError, match=rf"{other_delta}.jar.*needs {name}.jar"):
        delta_jars(_folder(tmp_path / "delta", f"{other_delta}.jar"))


def test_a_named_folder_that_cannot_serve_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_DL_DELTA_JARS", str(tmp_path / "missing"))
    with pytest.raises(DeltaSetupError, match="no such folder of Delta jars"):
        delta_jars()
    with pytest.raises(DeltaSetupError, match="holds no jars"):
        delta_jars(_folder(tmp_path / "empty"))
    with pytest.raises(DeltaSetupError, match="no delta-spark jar"):
        delta_jars(_folder(tmp_path / "other", "delta-storage-4.4.0.jar"))
