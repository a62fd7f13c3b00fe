"""Where the compact index lives: build it for a dataset, find and check it when opening.

The bytes are :mod:`spark_dl_core.format.compact`'s; this module adds the store: writing
the file beside ``index.json`` at commit (or later, for datasets Mosaic wrote), checking
that it describes the ``index.json`` it sits beside, and keeping one copy per machine of a
remote dataset's compact index in the local cache.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from typing import Any

import pyarrow as pa
import xxhash

from ..errors import DatasetError, MetadataError
from ..format.compact import (
    ARROW_MAGIC,
    COMPACT_FILE,
    CompactIndex,
    build_compact,
    index_digest,
)
from ..format.compact import index_fingerprint as index_fingerprint
from ..format.index import INDEX_FILE, parse_index
from .storage import Store

_WARNED: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, UserWarning, stacklevel=4)


def commit_index(store: Store, index_bytes: bytes, meta_fingerprint: str | None = None) -> None:
    """Write ``index.json`` (the commit point), then its compact index.

    The old compact index goes first, so a commit torn anywhere leaves either no compact
    index (readers fall back to ``index.json``) or the one matching ``index.json``.
    """
    store.delete(COMPACT_FILE)
    store.write_bytes(INDEX_FILE, index_bytes)
    write_compact_for(store, index_bytes, meta_fingerprint)


def write_compact_for(
    store: Store, index_bytes: bytes | None = None, meta_fingerprint: str | None = None
) -> int:
    """Write ``spark_dl.index.arrow`` for the ``index.json`` at ``store``; its shard count.

    ``meta_fingerprint``: the fingerprint of the ``spark_dl.json`` committed with it.
    """
    text = store.read_bytes(INDEX_FILE) if index_bytes is None else index_bytes
    shards = parse_index(text, store.display(INDEX_FILE))
    compact = build_compact(shards, text, index_fingerprint(text), meta_fingerprint)
    store.write_bytes(COMPACT_FILE, compact)
    return len(shards)


def write_compact_index(
    path: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None
) -> str:
    """Build the compact index of an existing dataset (spark-dl's or Mosaic's) in place.

    Returns the path of the file written. ``index.json`` is left untouched.
    """
    store = Store(str(path), storage_options)
    if not store.exists(INDEX_FILE):
        raise DatasetError(f"{store.display()}: no index.json; is this an MDS dataset?")
    write_compact_for(store)
    return store.display(COMPACT_FILE)


def _local_copy(store: Store, cache_dir: str | None) -> str:
    """A remote compact index, downloaded once per machine (keyed by its size and tag)."""
    remote = store.path(COMPACT_FILE)
    info = store.fs.info(remote)
    tag = str(info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified"))
    key = index_digest(f"{store.url}|{info.get('size')}|{tag}".encode())[:24]
    from .cache import default_cache_dir

    # a dot-directory: the shard cache's LRU neither counts nor evicts it
    directory = os.path.join(cache_dir or default_cache_dir(store.url), ".index")
    os.makedirs(directory, exist_ok=True)
    local = os.path.join(directory, f"compact-{key}.arrow")
    if not (os.path.exists(local) and os.path.getsize(local) == info.get("size")):
        data = store.read_bytes(COMPACT_FILE)
        fd, temp = tempfile.mkstemp(dir=directory, prefix=".tmp-compact-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, local)
    return local


def _local_digest(path: str, expected_size: int) -> str | None:
    """index.json's digest, read in chunks (flat memory at hundreds of MB); None if its size
    already differs from ``expected_size``."""
    if os.path.getsize(path) != expected_size:
        return None
    hasher = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            hasher.update(chunk)
    return str(hasher.hexdigest())


def read_compact(store: Store, cache_dir: str | None = None) -> CompactIndex | None:
    """The dataset's compact index, checked against ``index.json``; None to use index.json.

    Local: ``index.json``'s digest must match the one recorded (reading and hashing the
    file costs far less than parsing it). Remote: its size must match (one metadata call).
    A compact index that disagrees with ``index.json`` on any shard's sample count,
    basename or size is refused naming the shard; one that agrees but is out of date (the
    file was rewritten), or one of version 1 (no digest), is ignored with a warning. A
    corrupted one raises :class:`MetadataError` naming it (``read_meta`` decides whether
    ``index.json`` may be read instead).
    """
    shown = store.display(COMPACT_FILE)
    if not store.exists(COMPACT_FILE):
        _warn_once(
            store.display(),
            f"{store.display()}: no compact index ({COMPACT_FILE}); reading index.json "
            f"instead, slow at many shards. Build it with `spark-dl index {store.display()}`",
        )
        return None
    try:  # mapped: every writer replaces the file whole, so the bytes checked stay the same
        local = _local_copy(store, cache_dir) if store.remote else store.path(COMPACT_FILE)
        data = pa.memory_map(local).read_buffer()
    except OSError as exc:
        raise MetadataError(shown, f"cannot be read ({exc})") from None
    if data[: len(ARROW_MAGIC)].to_pybytes() == ARROW_MAGIC:  # version 1: no digest to check
        _warn_once(
            store.display() + "|v1",
            f"{shown} was built by an older spark-dl (no digest); reading index.json instead. "
            f"Rebuild it with `spark-dl index {store.display()}`",
        )
        return None
    compact = CompactIndex(data, shown)  # checks its digest before parsing (MetadataError)
    if store.remote:
        same = int(store.fs.size(store.path(INDEX_FILE))) == compact.index_bytes
    else:
        same = _local_digest(store.path(INDEX_FILE), compact.index_bytes) == compact.index_digest
    if same:
        return compact
    text = store.read_bytes(INDEX_FILE)
    where = compact.disagreement(parse_index(text, store.display(INDEX_FILE)))
    if where is not None:
        raise DatasetError(
            f"{shown} disagrees with index.json: {where}. Rebuild it with "
            f"`spark-dl index {store.display()}` (or delete it to read index.json)"
        )
    _warn_once(
        store.display() + "|stale",
        f"{shown} was built for another index.json; reading index.json instead. Rebuild it "
        f"with `spark-dl index {store.display()}`",
    )
    return None
