"""A local disk cache of remote shards, shared safely by every process on a machine.

Why each mechanism:

- *Download to a temporary name, check the size against the index, then rename*: readers
  (other ranks, DataLoader workers) only ever see complete files.
- *A per-shard ``flock``*: one process downloads a shard while others wait for it, instead
  of all fetching it. The same lock is held *shared* while a shard is in use (for as long
  as the returned array lives), and eviction takes it *exclusive, non-blocking*, so a shard
  in use is never evicted.
- *LRU by modification time* (touched on every hit), under a byte limit
  (``SPARK_DL_CACHE_BYTES`` or ``limit_bytes``; default 32 GiB).
- *Retries with exponential backoff* on transient errors (connection resets, throttling).

Locks are plain files and kernel ``flock``s: they vanish with the process, nothing
outlives a crash except files that a later process can read or evict.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import threading
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ShardError

if TYPE_CHECKING:
    from .dataset import Dataset

DEFAULT_LIMIT = 32 << 30
_LOCKS = ".locks"


def default_cache_dir(url: str) -> str:
    """``<tmp>/spark-dl-cache/<hash of url>``: per dataset, on the (usually fast) temp disk."""
    key = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:20]
    return os.path.join(tempfile.gettempdir(), "spark-dl-cache", key)


class ShardCache:
    """Remote shard files of one dataset, fetched once into ``directory``."""

    def __init__(
        self,
        store: Any,
        directory: str,
        limit_bytes: int | None = None,
        retries: int = 5,
        backoff_s: float = 0.2,
    ) -> None:
        self.store, self.directory = store, directory
        env = os.environ.get("SPARK_DL_CACHE_BYTES")
        self.limit = int(limit_bytes if limit_bytes is not None else env or DEFAULT_LIMIT)
        self.retries, self.backoff_s = retries, backoff_s
        self.downloads = 0  # remote reads made by this process (tests and progress)
        self.hits = 0
        os.makedirs(os.path.join(directory, _LOCKS), exist_ok=True)
        self._mutex = threading.Lock()

    def _lock_path(self, name: str) -> str:
        return os.path.join(self.directory, _LOCKS, name + ".lock")

    def fetch(self, basename: str, nbytes: int) -> np.ndarray:
        """The shard's bytes (memory-mapped), downloading it first if not yet cached."""
        path = os.path.join(self.directory, basename)
        fd = os.open(self._lock_path(basename), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            if not self._complete(path, nbytes):
                fcntl.flock(fd, fcntl.LOCK_EX)  # one downloader; the others wait here
                if not self._complete(path, nbytes):
                    self._make_room(nbytes, keep=basename)
                    self._download(basename, path, nbytes)
                else:
                    self._hit(path)
                fcntl.flock(fd, fcntl.LOCK_SH)  # downgrade: in use from here on
            else:
                self._hit(path)
            data: np.ndarray = (
                np.memmap(path, dtype=np.uint8, mode="r") if nbytes else np.empty(0, dtype=np.uint8)
            )
        except BaseException:
            os.close(fd)
            raise
        weakref.finalize(data, os.close, fd)  # the shared lock lasts as long as the array
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

    def _download(self, basename: str, path: str, nbytes: int) -> None:
        remote = self.store.path(basename)
        temp = os.path.join(self.directory, f".tmp-{uuid.uuid4().hex}-{basename}")
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                self.store.fs.get_file(remote, temp)
                size = os.path.getsize(temp)
                if size != nbytes:
                    raise ShardError(remote, f"has {size} bytes, the index says {nbytes}")
                os.replace(temp, path)
                with self._mutex:
                    self.downloads += 1
                return
            except (FileNotFoundError, ShardError):
                _remove(temp)
                raise
            except Exception:  # transient: network, throttling, server errors
                _remove(temp)
                if attempt == self.retries:
                    raise
                time.sleep(delay)
                delay *= 2

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

    def _make_room(self, nbytes: int, keep: str) -> None:
        """Evict least recently used shards not in use by any process until ``nbytes`` fit."""
        files = self._files()
        used = sum(size for _, size, _ in files)
        for _, size, name in files:
            if used + nbytes <= self.limit:
                return
            if name == keep:
                continue
            fd = os.open(self._lock_path(name), os.O_RDWR | os.O_CREAT, 0o644)
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


_CACHES: dict[tuple[int, str], ShardCache] = {}


def shard_cache(dataset: Dataset) -> ShardCache:
    """The cache of ``dataset`` in this process (created on first use, after fork too)."""
    directory = dataset.cache_dir or default_cache_dir(dataset.store.url)
    key = (os.getpid(), directory)
    cache = _CACHES.get(key)
    if cache is None:
        cache = _CACHES[key] = ShardCache(dataset.store, directory)
    return cache
