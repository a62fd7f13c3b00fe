"""Comma-separated list settings of a ``SparkSession.Builder`` (``spark.jars``,
``spark.jars.packages``, ``spark.sql.extensions``), extended without losing what is set.

Why: the session helpers (``with_delta``, ``with_iceberg``, ``with_jvm_scan``) compose on one
builder in any order, and each must keep the jars and extensions the others (or the user)
set, with nothing listed twice.
"""

from __future__ import annotations

from typing import Any


def extend_listed(builder: Any, key: str, values: list[str], *, first: bool = False) -> Any:
    """``builder`` with ``values`` added to its comma-separated setting ``key`` where not
    already listed: after what is there, or before it (``first``: a jar that must come
    first on the class path)."""
    earlier = [v for v in str(getattr(builder, "_options", {}).get(key, "")).split(",") if v]
    added = [v for v in dict.fromkeys(values) if v not in earlier]
    if not added:
        return builder
    listed = [*added, *earlier] if first else [*earlier, *added]
    return builder.config(key, ",".join(listed))
