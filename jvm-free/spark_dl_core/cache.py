"""A local disk cache of remote shards, shared safely by every process on a machine.

Why each mechanism:

- *Download to a temporary name, check size (and hash, when the index records one), fsync,
  then rename*: readers (other ranks, DataLoader workers) only ever see complete, verified
  files; a download that fails or is killed midway leaves at most a ``.tmp-*`` file that no
  reader opens and that the next downloader of that shard (or any eviction pass) removes.
- *Two ``flock``s per shard*: ``<name>.dl`` is held exclusive by the one process that
  downloads the shard while the others wait for it; ``<name>.use`` is held *shared* while a
  shard is in use (for as long as the returned array lives), and eviction takes it
  *exclusive, non-blocking*, so a shard in use is never evicted. Keeping the two apart means
  waiting for a download never waits on a reader that holds the shard (no rank or thread
  can stall on another's window, hence no deadlock with collective ops).
- *LRU by modification time* (touched on every hit), under a byte limit
  (``SPARK_DL_CACHE_BYTES`` or ``limit_bytes``; default 32 GiB).
- *Retries with exponential backoff and jitter* on transient errors (connection resets,
  HTTP 5xx, throttling, torn bodies): ``retries`` extra attempts (``SPARK_DL_RETRIES``,
  default 5), first delay ``backoff_s`` (``SPARK_DL_RETRY_BACKOFF_S``, default 0.2 s),
  doubling up to ``max_backoff_s`` (10 s). Then a :class:`ShardError` names the shard and its
  URL, with credentials redacted.
- *Optional progress*: a tqdm bar per download (``progress=True`` or ``SPARK_DL_PROGRESS=1``).

Locks are plain files and kernel ``flock``s: they vanish with the process, nothing
outlives a crash except files that a later process can read, evict or delete.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import random
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from .errors import HashMismatchError, ShardError
from .format.hashing import digest, fastest
from .format.index import ShardInfo
from .storage import Store

DEFAULT_LIMIT = 32 << 30
DEFAULT_RETRIES = 5
DEFAULT_BACKOFF_S = 0.2
_LOCKS = ".locks"
_TMP = ".tmp-"


def default_cache_dir(url: str) -> str:
    """``<tmp>/spark-dl-cache/<hash of url>``: per dataset, on the (usually fast) temp disk."""
    key = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:20]
    return os.path.join(tempfile.gettempdir(), "spark-dl-cache", key)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class ShardCache:
    """Remote shard files of one dataset, fetched once into ``directory``.

    ``hashes`` maps shard basenames to the index's ``{algorithm: hexdigest}``; a download
    whose bytes do not match is never committed to the cache.
    """

    def __init__(
        self,
        store: Any,
        directory: str,
        limit_bytes: int | None = None,
        retries: int | None = None,
        backoff_s: float | None = None,
        *,
        max_backoff_s: float = 10.0,
        progress: bool | None = None,
        hashes: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.store, self.directory = store, directory
        env = os.environ.get("SPARK_DL_CACHE_BYTES")
        self.limit = int(limit_bytes if limit_bytes is not None else env or DEFAULT_LIMIT)
        env_retries = os.environ.get("SPARK_DL_RETRIES")
        self.retries = max(
            0, int(retries if retries is not None else env_retries or DEFAULT_RETRIES)
        )
        env_backoff = os.environ.get("SPARK_DL_RETRY_BACKOFF_S")
        self.backoff_s = float(
            backoff_s if backoff_s is not None else env_backoff or DEFAULT_BACKOFF_S
        )
        self.max_backoff_s = max_backoff_s
        self.progress = _env_flag("SPARK_DL_PROGRESS") if progress is None else progress
        self.hashes = dict(hashes or {})
        self.downloads = 0  # remote reads made by this process (tests and progress)
        self.failed_attempts = 0  # transient download failures retried or given up on
        self.hits = 0
        os.makedirs(os.path.join(directory, _LOCKS), exist_ok=True)
        self._mutex = threading.Lock()

    def _lock(self, name: str, kind: str) -> int:
        """An fd on the lock file of ``name`` (``kind`` is ``dl`` or ``use``)."""
        path = os.path.join(self.directory, _LOCKS, f"{name}.{kind}")
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def fetch(
        self, basename: str, nbytes: int, hashes: Mapping[str, str] | None = None
    ) -> np.ndarray:
        """The shard's bytes (memory-mapped), downloading it first if not yet cached.

        ``hashes`` (the index's, for this shard) add to those given at construction."""
        if hashes and basename not in self.hashes:
            with self._mutex:
                self.hashes[basename] = dict(hashes)
        path = os.path.join(self.directory, basename)
        use = self._lock(basename, "use")
        try:
            fcntl.flock(use, fcntl.LOCK_SH)  # in use from here on: never evicted
            if self._complete(path, nbytes):
                self._hit(path)
            else:
                dl = self._lock(basename, "dl")
                try:
                    fcntl.flock(dl, fcntl.LOCK_EX)  # one downloader; the others wait here
                    if self._complete(path, nbytes):
                        self._hit(path)
                    else:
                        self._remove_temps(basename)  # left by a crashed downloader
                        self._make_room(nbytes, keep=basename)
                        self._download(basename, path, nbytes)
                finally:
                    os.close(dl)
            data: np.ndarray = (
                np.memmap(path, dtype=np.uint8, mode="r") if nbytes else np.empty(0, dtype=np.uint8)
            )
        except BaseException:
            os.close(use)
            raise
        weakref.finalize(data, os.close, use)  # the shared lock lasts as long as the array
        return data

    @staticmethod
    def _complete(path: str, nbytes: int) -> bool:
        try:
            return os.path.getsize(path) == nbytes
        except FileNotFoundError:
            return False

    def _hit(self, path: str) -> None:
        with self._mutex:
            self.hits += 1
        with contextlib.suppress(FileNotFoundError):  # evicted between check and touch
            os.utime(path)  # LRU clock

    def _delay(self, attempt: int) -> float:
        """Exponential backoff with jitter (half fixed, half random): spreads out the
        retries of many ranks hitting the same throttled store."""
        base = min(self.max_backoff_s, self.backoff_s * (2 ** (attempt - 1)))
        return base * (0.5 + 0.5 * random.random())

    def _download(self, basename: str, path: str, nbytes: int) -> None:
        remote = self.store.path(basename)
        shown = self.store.display(basename) if hasattr(self.store, "display") else remote
        attempts = self.retries + 1
        for attempt in range(1, attempts + 1):
            temp = os.path.join(self.directory, f"{_TMP}{uuid.uuid4().hex}-{basename}")
            try:
                self._get(remote, temp, basename)
                self._check(shown, basename, temp, nbytes)
                os.replace(temp, path)
                _fsync_dir(self.directory)
                with self._mutex:
                    self.downloads += 1
                return
            except FileNotFoundError:
                raise ShardError(shown, "does not exist on the store") from None
            except PermissionError as exc:
                raise ShardError(shown, f"access denied: {self._redact(exc)}") from None
            except ShardError:
                raise  # the stored object disagrees with the index: retrying will not help
            except Exception as exc:  # transient: network, throttling, server errors
                with self._mutex:
                    self.failed_attempts += 1
                if attempt == attempts:
                    err = ShardError(
                        shown,
                        f"download failed after {attempts} attempts "
                        f"(last: {type(exc).__name__}: {self._redact(exc)})",
                    )
                    raise err from None
                time.sleep(self._delay(attempt))
            finally:
                _remove(temp)  # a no-op after the rename; never a partial file left

    def _get(self, remote: str, temp: str, basename: str) -> None:
        if not self.progress:
            self.store.fs.get_file(remote, temp)
            return
        from fsspec.callbacks import TqdmCallback

        bar = TqdmCallback(
            tqdm_kwargs={"desc": basename, "unit": "B", "unit_scale": True, "leave": False}
        )
        try:
            self.store.fs.get_file(remote, temp, callback=bar)
        finally:
            bar.close()

    def _check(self, shown: str, basename: str, temp: str, nbytes: int) -> None:
        """Size, then (if the index records one) the fastest hash, then fsync."""
        size = os.path.getsize(temp)
        if size != nbytes:
            raise ShardError(shown, f"has {size} bytes, the index says {nbytes}")
        expected = self.hashes.get(basename) or {}
        name = fastest(expected)
        with open(temp, "rb") as f:
            if name is not None and size:
                view = np.memmap(f, dtype=np.uint8, mode="r")
                try:
                    actual = digest(name, view)
                finally:
                    del view
                if actual != expected[name]:
                    raise HashMismatchError(
                        shown, f"{name} is {actual}, the index says {expected[name]}"
                    )
            os.fsync(f.fileno())

    def _redact(self, exc: BaseException) -> str:
        text = str(exc)
        return self.store.redact(text) if hasattr(self.store, "redact") else text

    def _files(self) -> list[tuple[float, int, str]]:
        out = []
        for name in os.listdir(self.directory):
            if name.startswith(".") or name == _LOCKS:
                continue
            try:
                st = os.stat(os.path.join(self.directory, name))
            except FileNotFoundError:
                continue
            out.append((st.st_mtime, st.st_size, name))
        return sorted(out)

    def usage(self) -> int:
        """Bytes of complete shards in the cache directory."""
        return sum(size for _, size, _ in self._files())

    def _remove_temps(self, basename: str | None = None) -> None:
        """Delete ``.tmp-*`` files nobody is writing (of ``basename``, or of every shard whose
        download lock is free): what a process killed mid-download left behind."""
        for name in os.listdir(self.directory):
            if not name.startswith(_TMP):
                continue
            target = name[len(_TMP) + 33 :]
            if basename is not None:
                if target == basename:
                    _remove(os.path.join(self.directory, name))
                continue
            fd = self._lock(target, "dl")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                _remove(os.path.join(self.directory, name))
            except BlockingIOError:
                pass  # being downloaded right now
            finally:
                os.close(fd)

    def _make_room(self, nbytes: int, keep: str) -> None:
        """Evict least recently used shards not in use by any process until ``nbytes`` fit."""
        files = self._files()
        used = sum(size for _, size, _ in files)
        if used + nbytes <= self.limit:
            return
        self._remove_temps()
        for _, size, name in files:
            if used + nbytes <= self.limit:
                return
            if name == keep:
                continue
            fd = self._lock(name, "use")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # in use somewhere
            try:
                _remove(os.path.join(self.directory, name))
                used -= size
            finally:
                os.close(fd)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def _fsync_dir(directory: str) -> None:
    """Make the rename durable (best effort: some filesystems refuse directory fsync)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


_CACHES: dict[tuple[int, str], ShardCache] = {}
_CACHES_LOCK = threading.Lock()


def _fresh_lock_after_fork() -> None:  # a thread of the parent may have held it
    global _CACHES_LOCK
    _CACHES_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_after_fork)


def _cache_for(store: Store, directory: str, hashes: Mapping[str, Mapping[str, str]]) -> ShardCache:
    """The one cache of ``directory`` in this process (created on first use, after fork too;
    under a lock, as a reader's threads load shards at the same time)."""
    key = (os.getpid(), directory)
    with _CACHES_LOCK:
        cache = _CACHES.get(key)
        if cache is None:
            cache = _CACHES[key] = ShardCache(store, directory, hashes=hashes)
    return cache


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
        self.cache_dir = cache_dir or default_cache_dir(self.url)

    def cache(self, hashes: Mapping[str, Mapping[str, str]] | None = None) -> ShardCache:
        """This process's cache of the store's shards."""
        return _cache_for(self, self.cache_dir, hashes or {})

    def read_shard(
        self, name: str, nbytes: int, hashes: Mapping[str, str] | None = None
    ) -> np.ndarray:
        return self.cache().fetch(name, nbytes, hashes)


def shard_store(
    url: str, storage_options: dict[str, Any] | None = None, cache_dir: str | None = None
) -> Store:
    """The store a reader opens: local paths as they are, remote URLs through the cache."""
    store = Store(url, storage_options)
    if not store.remote:
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
