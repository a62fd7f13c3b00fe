"""The converter cache: a DataFrame materialized once as MDS, reused while its plan holds.

The cache key is the DataFrame's ``semanticHash()`` (its analyzed plan, available on classic
and Spark Connect sessions alike), its schema, the spec and its input files
(``inputFiles()``) with their sizes and modification times. The same DataFrame (or an equal
plan over unchanged files) reuses the dataset; a changed plan, or a source rewritten under
the same path and read again, writes a new one. Where the files cannot be listed the key is
the plan alone, and a warning says so.

Deleting is reference-counted within the process: every dataset opened through a
converter and every loader made from one (``df.dl.to_torch`` / ``to_tf``, or the
converter's own, inside ``with`` too) holds the cache directory; ``delete()`` or leaving
``with df.dl.converter():`` removes it once the last holder is gone, never under a loader
still reading it. Datasets this process wrote are deleted at exit, best effort.

Data flows one way here: ``accessor`` (``df.dl``) → ``converter`` → ``datasource``.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import posixpath
import shutil
import tempfile
import threading
import warnings
import weakref
from typing import Any

from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType

from spark_dl_core import DatasetSpec, open_dataset
from spark_dl_core.spec import planned_spec
from spark_dl_core.store.storage import Store, uri_location

from .mds_options import FORMAT

CACHE_DIR_CONF = "spark.spark_dl.cache.dir"
OLD_CACHE_DIR_CONF = "spark_dl.cache.dir"  # Spark warns "Ignoring non-Spark config property"
_created: set[str] = set()
_holders: dict[str, int] = {}  # live datasets opened through converters, per cache path
_pending: set[str] = set()  # deleted while held: removed when the last holder goes
_lock = threading.RLock()


def ragged_nested_as_json(df: Any, spec: DatasetSpec) -> dict[str, str]:
    """``json`` for the nested arrays (``array<array<…>>``) whose inner arrays differ in
    length within a row, which the encoding their type infers (``ndarray``, rectangular
    values only) cannot store: every other writer refuses such a column, naming it.

    Nothing else is decided here: a column's encoding is inferred from its Arrow type alone
    (``spark_dl_core.format.encodings.infer_encoding``), by every path alike, so one Delta
    version gives one dataset whether ``df.dl``, ``format("mds")`` or the core writes it.
    Arrays of one length per row need no fixed encoding for that: the writer records each
    shard's one shape, and loaders give them as one dense tensor.
    """
    nested = [
        f.name
        for f in df.schema.fields
        if f.name not in spec.columns
        and isinstance(f.dataType, ArrayType)
        and isinstance(f.dataType.elementType, ArrayType)
    ]
    if not nested:
        return {}
    aggs = []
    for i, name in enumerate(nested):  # distinct inner lengths within one row
        lengths = F.array_distinct(F.transform(F.col(name), lambda inner: F.size(inner)))
        aggs.append(F.max(F.size(lengths)).alias(f"ragged{i}"))
    row = df.agg(*aggs).collect()[0]
    return {name: "json" for i, name in enumerate(nested) if (row[f"ragged{i}"] or 0) > 1}


def as_spec(spec: DatasetSpec | dict[str, Any] | None) -> DatasetSpec:
    if spec is None:
        return DatasetSpec()
    return spec if isinstance(spec, DatasetSpec) else DatasetSpec(**spec)


def resolve_spec(
    df: Any, spec: DatasetSpec | dict[str, Any] | None = None, infer_shapes: bool = True
) -> DatasetSpec:
    """``spec`` with ``json`` for ragged nested arrays (see :func:`ragged_nested_as_json`)."""
    resolved = as_spec(spec)
    if not infer_shapes or any(t.at == "write" for t in resolved.transforms):
        return resolved  # spec columns name post-transform columns: leave them alone
    shapes = ragged_nested_as_json(df, resolved)
    if not shapes:
        return resolved
    return resolved.model_copy(update={"columns": {**shapes, **resolved.columns}})


def _conf(spark: Any, key: str) -> str | None:
    try:
        return spark.conf.get(key, None) or None
    except Exception:  # a conf the server refuses to read: as if unset
        return None


def default_cache_dir(spark: Any) -> str:
    """``spark.spark_dl.cache.dir`` if set (any fsspec URL), else a temp directory.

    The old key ``spark_dl.cache.dir`` (which Spark warns about when given to the builder)
    is still read, with a deprecation warning."""
    configured = _conf(spark, CACHE_DIR_CONF)
    if configured is None:
        configured = _conf(spark, OLD_CACHE_DIR_CONF)
        if configured is not None:
            warnings.warn(
                f"Spark conf {OLD_CACHE_DIR_CONF!r} is deprecated: set {CACHE_DIR_CONF!r}",
                DeprecationWarning,
                stacklevel=3,
            )
    return configured or os.path.join(tempfile.gettempdir(), "spark_dl_cache")


_STAMPS = ("mtime", "LastModified", "last_modified", "updated", "modificationTime")


def _stamp(entry: dict[str, Any]) -> list[str]:
    """A listed file's size and modification time (and ETag where the store gives one)."""
    found = [str(entry[k]) for k in (*_STAMPS, "ETag", "etag") if entry.get(k) is not None]
    return [str(entry.get("size")), *found]


def _file_stamps(files: list[str]) -> list[list[str]]:
    """Each input file (a URI, as ``inputFiles()`` names it) with its size and modification
    time: one listing per directory (a file missing from it is asked for alone); a
    filesystem that gives no times is refused, so the caller warns instead of keying by
    names and sizes only. A URI is decoded once to the file it names: an escaped partition
    directory (``part=a%20b``, ``part=100%25``) is otherwise a path that is not there."""
    from fsspec.core import url_to_fs

    by_dir: dict[tuple[int, str], list[tuple[str, Any, str]]] = {}
    for url in files:
        fs, path = url_to_fs(uri_location(url))
        by_dir.setdefault((id(fs), posixpath.dirname(path)), []).append((url, fs, path))
    out = []
    for (_, parent), entries in by_dir.items():
        fs = entries[0][1]
        listed = {e["name"].rstrip("/"): e for e in fs.ls(parent, detail=True)}
        for url, _, path in entries:
            entry = listed.get(path) or fs.info(path)
            stamp = _stamp(entry)
            if len(stamp) < 2:
                raise OSError(f"{type(fs).__name__} lists no modification time for {url}")
            out.append([url, *stamp])
    return out


def input_stamps(df: Any) -> list[list[str]] | None:
    """The DataFrame's input files (``df.inputFiles()``) with sizes and modification times,
    so a source rewritten under the same path gets a new cache key. None, with a warning
    naming why, where they cannot be listed: the key is then the plan alone."""
    try:
        files = sorted(df.inputFiles())
    except Exception as exc:  # a source Spark cannot list files for
        _warn_unlisted(f"its input files cannot be listed ({type(exc).__name__}: {exc})")
        return None
    try:
        return _file_stamps(files)
    except Exception as exc:
        _warn_unlisted(f"its input files cannot be stat'ed ({type(exc).__name__}: {exc})")
        return None


def _warn_unlisted(why: str) -> None:
    warnings.warn(
        f"spark-dl converter cache: {why}; the cache is keyed by the DataFrame's plan only and "
        "will not notice files rewritten under the same path (delete() the converter, or use "
        "a new cache_dir, after changing them)",
        stacklevel=4,
    )


def cache_key(df: Any, spec: DatasetSpec) -> str:
    """Identifies (analyzed plan, schema, spec, input files with sizes and times)."""
    payload = {
        "plan": df.semanticHash(),
        "schema": df.schema.json(),
        "spec": spec.canonical(),
        "files": input_stamps(df),
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


def _hold(path: str, dataset: Any) -> None:
    """Count ``dataset`` as a holder of ``path`` until it is garbage-collected."""
    with _lock:
        _holders[path] = _holders.get(path, 0) + 1
    weakref.finalize(dataset, _release, path)


def _release(path: str) -> None:
    with _lock:
        _holders[path] = _holders.get(path, 1) - 1
        if _holders[path] > 0 or path not in _pending:
            return
        _pending.discard(path)
        _created.discard(path)
    _remove(path)


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
            _hold(self.path, self._dataset)
        return self._dataset

    @property
    def in_use(self) -> bool:
        """Whether a dataset or loader other than this converter's still reads the cache."""
        with _lock:
            return _holders.get(self.path, 0) > (1 if self._dataset is not None else 0)

    def __len__(self) -> int:
        return len(self.dataset)

    def to_torch(self, batch_size: int | None = None, **kwargs: Any) -> Any:
        loader = self.dataset.to_torch(batch_size=batch_size, **kwargs)
        _hold(self.path, loader)  # a holder of its own: it shares this converter's dataset
        return loader

    def to_tf(self, batch_size: int | None = None, **kwargs: Any) -> Any:
        loader = self.dataset.to_tf(batch_size=batch_size, **kwargs)
        _hold(self.path, loader)
        return loader

    def delete(self) -> None:
        """Remove the cached dataset (later conversions of the DataFrame write anew).

        While a loader made from this or another converter of the same cache still holds
        it (made inside ``with`` and not yet iterated included), removal waits until the
        last one is garbage-collected (or the interpreter exits)."""
        with _lock:
            _pending.add(self.path)
        # our own hold goes: if nothing else keeps the dataset, its finalizer removes it now
        self._dataset = None
        with _lock:
            if self.path not in _pending or _holders.get(self.path, 0) > 0:
                return  # removed by that finalizer, or by the last holder when it goes
            _pending.discard(self.path)
            _created.discard(self.path)
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
    spec = planned_spec(spec)  # a tokenizer file's content is part of the key
    path = f"{base}/{cache_key(df, spec)}"
    if Store(path).exists("index.json"):
        with _lock:
            _pending.discard(path)  # wanted again: no longer waiting for removal
        return Converter(path, created=False)
    resolved = resolve_spec(df, spec)
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
    _pending.clear()
