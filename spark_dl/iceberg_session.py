"""Apache Iceberg on a local Spark session: ``with_iceberg(builder, warehouse=...)``.

``make install`` fetches Iceberg's Spark runtime jar once with Maven into a folder
(``build/iceberg-jars``, or wherever ``SPARK_DL_ICEBERG_JARS`` points); :func:`with_iceberg`
puts it on the session's classpath with ``IcebergSparkSessionExtensions`` and a Hadoop-type
catalog over ``warehouse`` (``spark.table("iceberg.db.t")``, ``CREATE TABLE iceberg.db.t``).

Iceberg publishes one runtime per Spark version, and none yet for Spark 4.2: there the
Spark 4.1 runtime is used with a small compatibility jar built at install time
(``spark_dl/jvm/iceberg/``: a ``SparkView`` for Spark 4.2's ``View`` class, and two
rewritten linkages), put ahead of the runtime. Its catalog then offers tables, not Iceberg
views. Where no folder exists it falls back to the runtime's Maven coordinates, except
where that compatibility jar is needed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from spark_dl_core.errors import SparkDLError

from .builder_lists import extend_listed

ENV_JARS = "SPARK_DL_ICEBERG_JARS"
EXTENSION = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
CATALOG_CLASS = "org.apache.iceberg.spark.SparkCatalog"
COMPAT_JAR = "spark-dl-iceberg-compat.jar"
# Spark major.minor -> (the runtime's Spark version, Iceberg version). Spark 4.2 has no
# runtime of its own: it runs 4.1's with the compatibility jar.
RUNTIMES = {"4.0": ("4.0", "1.10.1"), "4.1": ("4.1", "1.12.0"), "4.2": ("4.1", "1.12.0")}
_SOURCES = Path(__file__).resolve().parent / "jvm" / "iceberg"
_CHECKOUT_JARS = Path(__file__).resolve().parent.parent / "build" / "iceberg-jars"


class IcebergSetupError(SparkDLError):
    """Iceberg cannot be added to a Spark session: jars missing or of another version."""


def _spark_version() -> str:
    import pyspark

    return ".".join(pyspark.__version__.split(".")[:2])


def runtime_artifact() -> tuple[str, str, bool]:
    """(artifact, version, compat) of the Iceberg Spark runtime for this PySpark; compat:
    the runtime was built for an older Spark and needs the compatibility jar."""
    spark = _spark_version()
    if spark not in RUNTIMES:
        raise IcebergSetupError(
            f"no known Iceberg Spark runtime for Spark {spark} (known: {sorted(RUNTIMES)})"
        )
    runtime_spark, version = RUNTIMES[spark]
    return f"iceberg-spark-runtime-{runtime_spark}_2.13", version, runtime_spark != spark


def iceberg_jars(jars_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """The Iceberg jars for a session's classpath, the compatibility jar (where needed)
    first: from ``jars_dir``, else ``SPARK_DL_ICEBERG_JARS``, else the checkout's
    ``build/iceberg-jars``; [] when none has them. The runtime must be the one
    :func:`runtime_artifact` names (checked by file name)."""
    named = jars_dir if jars_dir is not None else os.environ.get(ENV_JARS)
    folder = Path(named) if named else _CHECKOUT_JARS
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not jars:
        if named:
            raise IcebergSetupError(
                f"{folder}: holds no Iceberg jars ({ENV_JARS}); run `make install`"
            )
        return []
    artifact, version, compat = runtime_artifact()
    wanted = f"{artifact}-{version}.jar"
    if not any(j.name == wanted for j in jars):
        raise IcebergSetupError(
            f"{folder}: holds {[j.name for j in jars]}, but this PySpark needs {wanted}; "
            "run `make install` to fetch it"
        )
    runtime = str(folder / wanted)
    if not compat:
        return [runtime]
    if not (folder / COMPAT_JAR).is_file():
        raise IcebergSetupError(
            f"{folder}: no {COMPAT_JAR}, which {wanted} needs on Spark {_spark_version()} "
            "(built by `make install` with javac)"
        )
    return [str(folder / COMPAT_JAR), runtime]


def with_iceberg(
    builder: Any,
    warehouse: str | os.PathLike[str],
    *,
    catalog: str = "iceberg",
    jars_dir: str | os.PathLike[str] | None = None,
) -> Any:
    """``builder`` (a ``SparkSession.Builder``) configured to read and write Iceberg tables
    in a Hadoop-type catalog named ``catalog`` over the folder ``warehouse``
    (``spark.table(f"{catalog}.db.t")``; the table's files under ``warehouse/db/t``).

    Adds the jars (from :func:`iceberg_jars`, or Maven coordinates where none are on
    disk), ``IcebergSparkSessionExtensions`` after any extensions already set (Delta's
    with :func:`~spark_dl.with_delta`), and the catalog. Jars already set are kept.
    """
    jars = iceberg_jars(jars_dir)
    if jars:
        builder = extend_listed(builder, "spark.jars", jars, first=True)
    else:
        artifact, version, compat = runtime_artifact()
        if compat:
            raise IcebergSetupError(
                f"no Iceberg jars found: Spark {_spark_version()} needs {artifact} with "
                "spark-dl's compatibility jar, built by `make install` in a checkout"
            )
        coords = f"org.apache.iceberg:{artifact}:{version}"
        builder = extend_listed(builder, "spark.jars.packages", [coords])
    builder = extend_listed(builder, "spark.sql.extensions", [EXTENSION])
    prefix = f"spark.sql.catalog.{catalog}"
    return (
        builder.config(prefix, CATALOG_CLASS)
        .config(f"{prefix}.type", "hadoop")
        .config(f"{prefix}.warehouse", str(warehouse))
    )


def maven_properties() -> str:
    """``-D`` flags naming the runtime artifact and version for ``jvm/iceberg/pom.xml``."""
    artifact, version, _ = runtime_artifact()
    return f"-Diceberg.artifact={artifact} -Diceberg.version={version}"


def build_compat(folder: str | os.PathLike[str]) -> str | None:
    """Build ``folder/spark-dl-iceberg-compat.jar`` where this PySpark needs it (javac and
    java against PySpark's own jars); the jar's path, or None where none is needed or it
    cannot be built (no JDK: said on stderr, as for the JVM scan; ``with_iceberg`` then
    refuses by name)."""
    artifact, version, compat = runtime_artifact()
    target = Path(folder) / COMPAT_JAR
    target.unlink(missing_ok=True)
    if not compat:
        return None
    import pyspark

    spark_jars = os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")
    runtime = Path(folder) / f"{artifact}-{version}.jar"
    javac, java = shutil.which("javac"), shutil.which("java")
    if javac is None or java is None:
        print(
            "spark-dl: no javac; the Iceberg compatibility jar is not built, so "
            f"with_iceberg is unavailable on Spark {_spark_version()}",
            file=sys.stderr,
        )
        return None
    with tempfile.TemporaryDirectory() as tmp:
        tool, classes = Path(tmp, "tool"), Path(tmp, "classes")
        cp = f"{spark_jars}{os.pathsep}{runtime}"
        subprocess.run(
            [javac, "--release", "17", "-nowarn", "-d", str(tool), "-cp", cp,
             str(_SOURCES / "Spark42Compat.java")],
            check=True,
        )  # fmt: skip
        subprocess.run(
            [java, "-cp", f"{tool}{os.pathsep}{spark_jars}", "Spark42Compat", str(runtime),
             str(classes)],
            check=True,
        )  # fmt: skip
        subprocess.run(
            [javac, "--release", "17", "-nowarn", "-d", str(classes), "-cp", cp,
             str(_SOURCES / "SparkView.java")],
            check=True,
        )  # fmt: skip
        with zipfile.ZipFile(target, "w") as jar:
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
    return str(target)
