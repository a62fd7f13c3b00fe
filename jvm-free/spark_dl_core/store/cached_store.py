"""The stores a reader opens, and the one :class:`~.cache.ShardCache` per directory and process
their remote shards go through.

:func:`shard_store` gives local paths their plain :class:`~.storage.Store` and remote URLs a
:class:`CachedStore`, whose shard reads download once per machine into the disk cache and
memory-map the copy. A process keeps one cache per directory (its threads share it; a forked
child makes its own and closes the parent's download locks).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from ..errors import SpecError
from ..format.index import ShardInfo
from .cache import ShardCache, default_cache_dir
from .network import network_mount
from .storage import Store

_CACHES: dict[tuple[int, str], ShardCache] = {}
_CACHES_LOCK = threading.Lock()


def _fresh_lock_after_fork() -> None:  # a thread of the parent may have held it
    global _CACHES_LOCK
    _CACHES_LOCK = threading.Lock()
    for cache in _CACHES.values():  # the parent's download locks are not the child's to keep
        for job in cache._jobs.values():
            for fd in (job.hold, job.dl, job.fd):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            job.hold = job.dl = job.fd = None
        cache._jobs = {}


os.register_at_fork(after_in_child=_fresh_lock_after_fork)


def _cache_for(store: Store, directory: str, hashes: Mapping[str, Mapping[str, str]]) -> ShardCache:
    """The one cache of ``directory`` in this process."""
    return cache_for(directory, lambda: ShardCache(store, directory, hashes=hashes))


def cache_for(directory: str, make: Any) -> ShardCache:
    """The one cache of ``directory`` in this process, ``make()`` on first use (after fork
    too; under a lock, as a reader's threads load shards at the same time)."""
    key = (os.getpid(), directory)
    with _CACHES_LOCK:
        cache = _CACHES.get(key)
        if cache is None:
            cache = _CACHES[key] = make()
    return cache


_CLAIM = ".dataset"  # in a cache directory: the URL of the one dataset whose shards it holds


def claim_cache_dir(directory: str, url: str) -> None:
    """Make an explicit ``cache_dir`` this dataset's, or refuse it if another dataset's
    shards are there: both name their shards ``shard.00000.mds`` and so on, so a second
    dataset would be served the first one's bytes (refused by a hash check where the index
    has hashes, silently wrong where it has none). The first dataset to use a directory
    writes its URL in ``.dataset`` (published with a hard link, so two processes cannot both
    claim it); a directory without one (made before the claim existed) is claimed as is."""
    mine = url.rstrip("/")
    os.makedirs(directory, exist_ok=True)
    marker = os.path.join(directory, _CLAIM)
    if not os.path.exists(marker):
        temp = f"{marker}.{os.getpid()}.{threading.get_ident()}"
        with open(temp, "w", encoding="utf-8") as f:
            f.write(mine)
        try:
            os.link(temp, marker)
        except FileExistsError:
            pass  # another process claimed it first: compared below
        finally:
            os.unlink(temp)
    with open(marker, encoding="utf-8") as f:
        owner = f.read()
    if owner != mine:
        raise SpecError(
            f"cache_dir {directory!r} holds the shards of {owner!r}, not {mine!r}: shard "
            "files of two datasets share names there; give each dataset its own cache_dir "
            "(a subdirectory), or leave it unset for one per URL under the temp dir"
        )


class CachedStore(Store):
    """A remote store whose shard files are served from the local cache.

    Metadata reads go to the store; :meth:`read_shard` downloads a shard once per machine
    (see :class:`ShardCache`) and memory-maps the local copy.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | None = None,
    ) -> None:
        super().__init__(url, storage_options)
        if cache_dir:
            claim_cache_dir(cache_dir, self.url)
        self.cache_dir = cache_dir or default_cache_dir(self.url)
        if self.url.split("://", 1)[0] in ("s3", "s3a"):
            # botocore keeps 10 connections per client: fewer than download threads may use
            config = dict(self.storage_options.get("config_kwargs") or {})
            config.setdefault("max_pool_connections", 64)
            self.storage_options["config_kwargs"] = config

    @property
    def in_place(self) -> bool:
        return False  # shard files come through the cache, a local path's too

    def cache(self, hashes: Mapping[str, Mapping[str, str]] | None = None) -> ShardCache:
        """This process's cache of the store's shards."""
        return _cache_for(self, self.cache_dir, hashes or {})

    def read_shard(
        self, name: str, nbytes: int, hashes: Mapping[str, str] | None = None
    ) -> np.ndarray:
        return self.cache().fetch(name, nbytes, hashes)

    def prefetch_shards(
        self, items: list[tuple[str, int, Mapping[str, str] | None]], threads: int | None = None
    ) -> bool:
        cache = self.cache()
        if threads is not None and threads != cache.threads:
            cache.set_threads(threads)
        cache.prefetch(items)
        return True

    def release_shards(self, names: list[str]) -> None:
        self.cache().release(names)

    def download_stats(self) -> dict[str, float] | None:
        return self.cache().stats()


def shard_store(
    url: str,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | None = None,
    node_cache: bool | None = None,
) -> Store:
    """The store a reader opens: remote URLs through the node cache, local paths as they
    are, unless on a network or FUSE mount (:func:`~.network.network_mount`; ``node_cache``
    None, the default) or ``node_cache=True``: such a path's shards are copied to the node
    cache once, in plan order and verified, as a remote URL's are, so a second epoch reads
    local disk. ``node_cache=False`` reads a local path in place whatever holds it."""
    store = Store(url, storage_options)
    if not store.remote:
        wanted = network_mount(store.root) is not None if node_cache is None else node_cache
        if not wanted:
            return store
    return CachedStore(url, storage_options, cache_dir)


class _HasShards(Protocol):
    store: Store
    cache_dir: str | None
    shards: list[ShardInfo]


def shard_cache(dataset: _HasShards) -> ShardCache:
    """The cache a remote dataset's shards go through in this process."""
    hashes = {s.stored.basename: s.stored.hashes for s in dataset.shards if s.stored.hashes}
    if isinstance(dataset.store, CachedStore):
        return dataset.store.cache(hashes)
    directory = dataset.cache_dir or default_cache_dir(dataset.store.url)
    return _cache_for(dataset.store, directory, hashes)
