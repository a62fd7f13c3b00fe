"""Mixtures on the Spark side: sources that are DataFrames (Delta tables at a version
included) are materialized once through the converter cache, then mixed by the core.

``spark_dl.mix([Source(df_web, proportion=0.7), Source(read_delta(spark, "code", version=12),
proportion=0.3)])`` returns the core's :class:`~spark_dl_core.Mixture`: loaders, state and
``lineage`` (each source's table@version and fingerprint) as for paths.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from spark_dl_core import Mixture, Source
from spark_dl_core import mix as core_mix

from .converter import Converter, as_spec, make_converter


def _is_dataframe(value: Any) -> bool:
    """A classic or Spark Connect DataFrame (both have these; paths and Datasets do not)."""
    return hasattr(value, "sparkSession") and hasattr(value, "schema") and hasattr(value, "write")


def _lineage_name(lineage: dict[str, Any]) -> str | None:
    if lineage.get("kind") == "delta" and lineage.get("table"):
        return f"{lineage['table']}@{lineage.get('version')}"
    return None


def mix(
    sources: Sequence[Source],
    *,
    spec: Any = None,
    cache_dir: str | None = None,
    **kwargs: Any,
) -> Mixture:
    """:func:`spark_dl_core.mix` where a source may also be a DataFrame.

    Each DataFrame is written once into the converter cache (reused while its plan and
    ``spec`` are unchanged, as ``df.dl.to_torch`` does) and read from there; a DataFrame from
    :func:`spark_dl.read_delta` records its table and version in the mixture's lineage and is
    named ``table@version`` unless the source has a name. Other keywords are the core's.
    """
    converters: list[Converter] = []
    resolved = []
    for i, source in enumerate(sources):
        if isinstance(source, Source) and _is_dataframe(source.dataset):
            converter = make_converter(source.dataset, as_spec(spec), cache_dir)
            converters.append(converter)
            dataset = converter.dataset
            name = source.name or _lineage_name(dataset.source) or f"dataframe {i}"
            source = dataclasses.replace(source, dataset=dataset, name=name)
        resolved.append(source)
    mixture = core_mix(resolved, **kwargs)
    mixture.converters = converters  # the cached copies stay while the mixture is used
    return mixture
