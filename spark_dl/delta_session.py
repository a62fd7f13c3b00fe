"""Delta Lake on a local Spark session: ``with_delta(builder)``, from jars on disk.

delta-spark's own ``configure_spark_with_delta_pip`` sets ``spark.jars.packages``, so every
session start resolves Delta's jars through Ivy (a network round trip, a cache in the home
directory). ``make install`` instead fetches them once with Maven into a folder
(``build/delta-jars``, or wherever ``SPARK_DL_DELTA_JARS`` points), and :func:`with_delta`
puts that folder's jars on the session's classpath with Delta's SQL extension and catalog:
the session then reads and writes Delta tables as on Databricks.

Where no such folder exists (a plain ``pip install``), it falls back to the Maven
coordinates of the installed delta-spark, as delta-spark itself does.
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path
from typing import Any

from spark_dl_core.errors import SparkDLError

from .builder_lists import extend_listed

ENV_JARS = "SPARK_DL_DELTA_JARS"
EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
# the folder `make install` fills, beside this package in a source checkout
_CHECKOUT_JARS = Path(__file__).resolve().parent.parent / "build" / "delta-jars"


class DeltaSetupError(SparkDLError):
    """Delta Lake cannot be added to a Spark session: jars missing or of another version."""


def delta_jars(jars_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """The Delta jars to put on a session's classpath: ``jars_dir``, else the folder named
    by ``SPARK_DL_DELTA_JARS``, else the checkout's ``build/delta-jars``; [] when none has
    them. The jars must match the installed delta-spark's version (checked by name)."""
    named = jars_dir if jars_dir is not None else os.environ.get(ENV_JARS)
    folder = Path(named) if named else _CHECKOUT_JARS
    if not folder.is_dir():
        if named:
            raise DeltaSetupError(f"{folder}: no such folder of Delta jars ({ENV_JARS})")
        return []
    jars = sorted(str(p) for p in folder.glob("*.jar"))
    if not jars:
        if named:
            raise DeltaSetupError(f"{folder}: holds no jars; run `make install`")
        return []
    core = [Path(j).name for j in jars if Path(j).name.startswith("delta-spark_")]
    if not core:
        raise DeltaSetupError(f"{folder}: no delta-spark jar among {len(jars)} jars")
    wanted = _artifact_name()
    if wanted is not None and not any(name.startswith(f"{wanted}.") for name in core):
        raise DeltaSetupError(
            f"{folder}: holds {core[0]}, but this environment needs {wanted}.jar "
            "(delta-spark's version, built for this PySpark's Spark version); run "
            "`make install` to fetch the matching jars"
        )
    return jars


def with_delta(builder: Any, jars_dir: str | os.PathLike[str] | None = None) -> Any:
    """``builder`` (a ``SparkSession.Builder``) configured to read and write Delta tables.

    Adds Delta's jars (from :func:`delta_jars`, or as Maven coordinates where no local jars
    exist), ``DeltaSparkSessionExtension`` and ``DeltaCatalog``. Extensions already set on
    the builder are kept. For ``SparkSession.builder.remote("local[...]")`` the same
    settings reach the local Spark Connect server it starts.
    """
    jars = delta_jars(jars_dir)
    if jars:
        builder = extend_listed(builder, "spark.jars", jars)
    else:
        builder = builder.config("spark.jars.packages", _maven_coordinates())
    builder = extend_listed(builder, "spark.sql.extensions", [EXTENSION])
    return builder.config("spark.sql.catalog.spark_catalog", CATALOG)


def _delta_version() -> str | None:
    try:
        return metadata.version("delta-spark")
    except metadata.PackageNotFoundError:
        return None


def _artifact_name() -> str | None:
    """The delta-spark jar's name (without ``.jar``) for this environment:
    ``delta-spark_<spark major.minor>_2.13-<delta-spark version>``; None without delta-spark.
    Delta publishes one artifact per Spark version: a jar built for another Spark fails
    at session start or, worse, in the middle of a query."""
    import pyspark

    version = _delta_version()
    if version is None:
        return None
    spark = ".".join(pyspark.__version__.split(".")[:2])
    return f"delta-spark_{spark}_2.13-{version}"


def _maven_coordinates() -> str:
    """delta-spark's artifact for this PySpark (``io.delta:delta-spark_<spark>_2.13:<v>``)."""
    name = _artifact_name()
    if name is None:
        raise DeltaSetupError(
            "no Delta jars found and delta-spark is not installed: "
            "`pip install spark-dl[delta]`, or run `make install` in a checkout"
        )
    artifact, version = name.rsplit("-", 1)
    return f"io.delta:{artifact}:{version}"


def prune_shipped(folder: str | os.PathLike[str]) -> list[str]:
    """Remove from ``folder`` the jars PySpark already ships (by artifact name, any
    version): Spark's own copies come first on the classpath anyway, and a second copy of
    Hadoop or Jackson only wastes disk. Returns the removed file names."""
    import pyspark

    def artifact(name: str) -> str:
        stem = name.removesuffix(".jar")
        parts = stem.split("-")
        while len(parts) > 1 and parts[-1][:1].isdigit():
            parts.pop()
        return "-".join(parts)

    shipped = {artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    removed = []
    for jar in Path(folder).glob("*.jar"):
        if artifact(jar.name) in shipped and not jar.name.startswith("delta-"):
            jar.unlink()
            removed.append(jar.name)
    return sorted(removed)


def maven_properties() -> str:
    """``-D`` flags naming the Delta artifact and version for ``spark_dl/jvm/delta/pom.xml``."""
    artifact, version = _maven_coordinates().split(":")[1:]
    return f"-Ddelta.artifact={artifact} -Ddelta.version={version}"
