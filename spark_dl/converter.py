"""The converter cache: a DataFrame materialized once as MDS, reused while its plan holds.

The cache key is the DataFrame's ``semanticHash()`` (its analyzed plan, available on classic
and Spark Connect sessions alike), its schema and the spec. The same DataFrame (or an equal
plan) reuses the dataset; a changed plan writes a new one. The plan hash does not see new
files under an unchanged source path: call ``delete()`` (or use a new cache dir) then.
Datasets this process wrote are deleted at exit, best effort.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
from typing import Any

from spark_dl_core import DatasetSpec, open_dataset
from spark_dl_core.storage import Store

from .datasource import FORMAT

CACHE_DIR_CONF = "spark_dl.cache.dir"
_created: set[str] = set()
_lock = threading.Lock()


def default_cache_dir(spark: Any) -> str:
    """``spark_dl.cache.dir`` if set (any fsspec URL), else a temp directory."""
    try:
        configured = spark.conf.get(CACHE_DIR_CONF, None)
    except Exception:  # a conf the server refuses to read: fall back to the default
        configured = None
    return configured or os.path.join(tempfile.gettempdir(), "spark_dl_cache")


def cache_key(df: Any, spec: DatasetSpec) -> str:
    """Identifies (analyzed plan, schema, spec)."""
    payload = {
        "plan": df.semanticHash(),
        "schema": df.schema.json(),
        "spec": spec.canonical(),
    }
    text = json.dumps(payload, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _remove(path: str) -> None:
    store = Store(path)
    if store.remote:
        if store.exists():
            store.fs.rm(store.root, recursive=True)
    else:
        shutil.rmtree(store.root, ignore_errors=True)


class Converter:
    """A cached MDS copy of a DataFrame: ``.path``, ``.dataset``, loaders, ``delete()``."""

    def __init__(self, path: str, created: bool) -> None:
        self.path = path
        self.created = created
        self._dataset: Any = None

    @property
    def dataset(self) -> Any:
        if self._dataset is None:
            self._dataset = open_dataset(self.path)
        return self._dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def to_torch(self, batch_size: int = 256, **kwargs: Any) -> Any:
        return self.dataset.to_torch(batch_size=batch_size, **kwargs)

    def to_tf(self, batch_size: int = 256, **kwargs: Any) -> Any:
        return self.dataset.to_tf(batch_size=batch_size, **kwargs)

    def delete(self) -> None:
        """Remove the cached dataset now (later conversions of the DataFrame write anew)."""
        with _lock:
            _created.discard(self.path)
        self._dataset = None
        _remove(self.path)

    def __enter__(self) -> Converter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()

    def __repr__(self) -> str:
        return f"<Converter {self.path!r}>"


def make_converter(df: Any, spec: DatasetSpec, cache_dir: str | None = None) -> Converter:
    """Reuse the cached dataset for ``(df's plan, spec)`` or write it (overwrite, atomic)."""
    base = (cache_dir or default_cache_dir(df.sparkSession)).rstrip("/")
    path = f"{base}/{cache_key(df, spec)}"
    if Store(path).exists("index.json"):
        return Converter(path, created=False)
    from .accessor import DLAccessor

    resolved = DLAccessor(df).resolved_spec(spec)
    df.write.format(FORMAT).option("spec", resolved.model_dump_json()).mode("overwrite").save(path)
    with _lock:
        _created.add(path)
    return Converter(path, created=True)


@atexit.register
def _cleanup() -> None:
    for path in list(_created):
        with contextlib.suppress(Exception):  # best effort at interpreter exit
            _remove(path)
    _created.clear()
