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
  (``SPARK_DL_CACHE_BYTES`` or ``limit_bytes``; default 32 GiB). The directory is scanned
  (a ``stat`` per file) only when this process's running estimate of its size comes within
  1/8 of the limit, or once the last scan is older than 1 s (or 20 times that scan's own
  time): a scan per download made fetching N small files (footers) O(N^2). Files other
  processes add meanwhile are counted at the next scan.
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
import errno
import fcntl
import hashlib
import heapq
import os
import random
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import HashMismatchError, ShardError
from ..format.hashing import digest, fastest

DEFAULT_LIMIT = 32 << 30
DEFAULT_RETRIES = 5
DEFAULT_BACKOFF_S = 0.2
# Download threads per process (each one GET in flight) and the byte range one GET fetches:
# enough connections to fill a ~1 GB/s link at ~50-100 MB/s per connection, ranges large
# enough that a request's round trip is small next to its transfer time.
DEFAULT_THREADS = 8
DEFAULT_PART_BYTES = 8 << 20
_LOCKS = ".locks"
_TMP = ".tmp-"


def default_cache_dir(url: str) -> str:
    """``<tmp>/spark-dl-cache/<hash of url>``: per dataset, on the (usually fast) temp disk."""
    key = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:20]
    return os.path.join(tempfile.gettempdir(), "spark-dl-cache", key)


def default_threads() -> int:
    """``SPARK_DL_DOWNLOAD_THREADS``, else :data:`DEFAULT_THREADS`."""
    return max(1, int(os.environ.get("SPARK_DL_DOWNLOAD_THREADS") or DEFAULT_THREADS))


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class _Job:
    """One shard's background download: a start step, then its byte ranges ("parts")."""

    def __init__(self, basename: str, nbytes: int, seq: int, urgent: bool) -> None:
        self.basename, self.nbytes, self.seq, self.urgent = basename, nbytes, seq, urgent
        # queued -> running -> done | cached | elsewhere | skipped | failed | cancelled
        self.state = "queued"
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.hold: int | None = None  # shared ``use`` lock kept until the shard is fetched
        self.dl: int | None = None  # exclusive ``dl`` lock while downloading
        self.fd: int | None = None  # the temporary file being written
        self.temp = ""
        self.parts: list[tuple[int, int]] = []
        self.next_part = 0
        self.parts_left = 0
        self.attempt = 1  # whole-shard attempts: a hash mismatch is downloaded once more
        self.released = False
        self.bar: Any = None

    @property
    def priority(self) -> tuple[int, int]:
        return (0 if self.urgent else 1, self.seq)


class ShardCache:
    """Remote shard files of one dataset, fetched once into ``directory``.

    ``durable``: fsync each file and the directory before a reader may see it (a subclass
    whose reader recovers from a file torn by a power loss may skip it: many small files).

    ``hashes`` maps shard basenames to the index's ``{algorithm: hexdigest}``; a download
    whose bytes do not match is never committed to the cache.

    Downloads run on ``threads`` background threads (:meth:`set_threads`), each serving
    one byte range at a time: :meth:`prefetch` queues shards in the order a reader will need
    them, and a shard larger than ``part_bytes`` is fetched as concurrent ranges written
    into one temporary file. :meth:`fetch` waits for (or starts, ahead of everything queued)
    the shard it needs.
    """

    durable = True

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
        threads: int | None = None,
        part_bytes: int | None = None,
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
        env_part = os.environ.get("SPARK_DL_PART_BYTES")
        self.part_bytes = max(
            1, int(part_bytes if part_bytes is not None else env_part or DEFAULT_PART_BYTES)
        )
        self.downloads = 0  # remote reads made by this process (tests and progress)
        self.failed_attempts = 0  # transient download failures retried or given up on
        self.hits = 0
        self.redownloads = 0  # shards downloaded again after their bytes did not verify
        # Telemetry: bytes received, seconds with at least one range in flight, seconds
        # fetch() waited for a download.
        self.bytes_downloaded = 0
        # Shard bytes fetch() handed out (from the machine's cache, downloaded first or
        # not): less the bytes downloaded meanwhile, what the node cache served.
        self.fetched_bytes = 0
        self.download_s = 0.0
        self.network_wait_s = 0.0
        self._active = 0
        self._busy_since = 0.0
        self.scans = 0  # directory scans made to enforce the limit (telemetry, tests)
        self._stale_temps: set[str] = set()  # shards with temporary files at the last scan
        self._usage: int | None = None  # bytes at the last scan, plus this process's since
        self._scanned_at = 0.0
        self._scan_s = 0.0
        os.makedirs(os.path.join(directory, _LOCKS), exist_ok=True)
        self._mutex = threading.Lock()
        self._work = threading.Condition(self._mutex)
        self._heap: list[tuple[tuple[int, int], int, _Job]] = []
        self._tokens = 0
        self._seq = 0
        self._jobs: dict[str, _Job] = {}
        self._running = 0  # download threads alive
        self.threads = max(1, threads if threads is not None else default_threads())

    # -- the download threads

    def set_threads(self, threads: int) -> None:
        """Run ``threads`` download threads (started when there is work; extra ones end
        once idle)."""
        with self._mutex:
            self.threads = max(1, int(threads))
            self._work.notify_all()

    def _push(self, job: _Job, count: int = 1) -> None:
        """Queue ``count`` work tokens of ``job`` (caller holds ``_mutex``)."""
        while self._running < self.threads:
            self._running += 1
            t = threading.Thread(target=self._serve, name="spark-dl-download", daemon=True)
            t.start()
        for _ in range(count):
            self._tokens += 1
            heapq.heappush(self._heap, (job.priority, self._tokens, job))
        self._work.notify(count)

    def _serve(self) -> None:
        while True:
            with self._work:
                while not self._heap and self._running <= self.threads:
                    self._work.wait()
                if self._running > self.threads:  # fewer threads were asked for
                    self._running -= 1
                    return
                job = heapq.heappop(self._heap)[2]
                if job.state == "queued":
                    job.state, step = "starting", -1
                elif job.state == "running" and job.next_part < len(job.parts):
                    step, job.next_part = job.next_part, job.next_part + 1
                else:
                    continue  # a stale token: the job moved on or was cancelled
            try:
                if step < 0:
                    self._start(job)
                else:
                    self._part(job, step)
            except BaseException as exc:  # never lose a worker; the waiter gets the error
                self._fail(job, exc if isinstance(exc, Exception) else RuntimeError(str(exc)))

    # -- queueing

    def prefetch(self, items: list[tuple[str, int, Mapping[str, str] | None]]) -> None:
        """Queue downloads of shards not cached yet, in the given order (behind those
        queued before): ``(basename, nbytes, hashes)`` each."""
        with self._mutex:
            for basename, nbytes, hashes in items:
                if hashes and basename not in self.hashes:
                    self.hashes[basename] = dict(hashes)
                if basename in self._jobs:
                    continue
                if self._complete(os.path.join(self.directory, basename), nbytes):
                    continue
                self._seq += 1
                job = self._jobs[basename] = _Job(basename, nbytes, self._seq, False)
                self._push(job)

    def release(self, basenames: list[str]) -> None:
        """Forget queued downloads nobody will fetch and let go of finished ones
        (they become evictable again)."""
        with self._mutex:
            for name in basenames:
                job = self._jobs.get(name)
                if job is None or job.urgent:
                    continue
                if job.state == "queued":
                    job.state = "cancelled"
                    job.done.set()
                if job.done.is_set():
                    self._jobs.pop(name, None)
                    self._close_hold(job)
                else:
                    job.released = True  # finishing: its hold is closed then

    def _close_hold(self, job: _Job) -> None:
        if job.hold is not None:
            os.close(job.hold)
            job.hold = None

    def _urgent(self, basename: str, nbytes: int) -> _Job:
        """The job bringing ``basename``, moved ahead of every other (created if needed)."""
        with self._mutex:
            job = self._jobs.get(basename)
            if job is None or job.released:
                self._seq += 1
                job = self._jobs[basename] = _Job(basename, nbytes, self._seq, True)
                self._push(job)
            elif not job.urgent:
                job.urgent = True
                if job.state == "queued":
                    self._push(job)
                elif job.state == "running":
                    self._push(job, len(job.parts) - job.next_part)
            return job

    # -- fetching

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
                self._wait_download(basename, path, nbytes)
            with self._mutex:
                self.fetched_bytes += nbytes
            data: np.ndarray = (
                np.memmap(path, dtype=np.uint8, mode="r") if nbytes else np.empty(0, dtype=np.uint8)
            )
        except BaseException:
            os.close(use)
            raise
        weakref.finalize(data, os.close, use)  # the shared lock lasts as long as the array
        return data

    def _wait_download(self, basename: str, path: str, nbytes: int) -> None:
        """Until ``path`` is complete: wait for this process's download of it, or for
        another process's (its ``dl`` lock), or download it now."""
        started = time.perf_counter()
        try:
            while True:
                job = self._urgent(basename, nbytes)
                job.done.wait()
                with self._mutex:
                    if self._jobs.get(basename) is job:
                        del self._jobs[basename]
                    self._close_hold(job)
                if job.error is not None:
                    raise job.error
                if job.state == "elsewhere":  # another process downloads it: wait for it
                    dl = self._lock(basename, "dl")
                    try:
                        fcntl.flock(dl, fcntl.LOCK_EX)
                    finally:
                        os.close(dl)
                if self._complete(path, nbytes):
                    if job.state not in ("done", "elsewhere"):
                        self._hit(path)
                    return
        finally:
            with self._mutex:
                self.network_wait_s += time.perf_counter() - started

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

    # -- one download: start, parts, finish

    def _shown(self, basename: str) -> str:
        if hasattr(self.store, "display"):
            return str(self.store.display(basename))
        return str(self.store.path(basename))

    def _start(self, job: _Job) -> None:
        """Hold the shard, take its download lock (or leave it to the process that has
        it), make room, then queue its parts."""
        path = os.path.join(self.directory, job.basename)
        job.hold = self._lock(job.basename, "use")
        fcntl.flock(job.hold, fcntl.LOCK_SH)
        if self._complete(path, job.nbytes):
            return self._finish(job, "cached")
        dl = self._lock(job.basename, "dl")
        try:
            fcntl.flock(dl, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(dl)  # another process downloads it; fetch() waits on its lock
            return self._finish(job, "elsewhere")
        job.dl = dl
        if self._complete(path, job.nbytes):
            return self._finish(job, "cached")
        fits = self._make_room(job.nbytes, keep=job.basename)
        if job.basename in self._stale_temps:  # left by a crashed downloader (seen by a scan)
            self._remove_temps(job.basename)
        if not fits and not job.urgent:
            return self._finish(job, "skipped")  # read ahead only within the limit
        self._begin(job)

    def _begin(self, job: _Job) -> None:
        """A fresh temporary file of the shard's size and its parts queued."""
        job.temp = os.path.join(self.directory, f"{_TMP}{uuid.uuid4().hex}-{job.basename}")
        job.fd = os.open(job.temp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.ftruncate(job.fd, job.nbytes)
        step = self._part_size(job)
        job.parts = [(a, min(a + step, job.nbytes)) for a in range(0, job.nbytes, step)]
        if job.bar is not None:
            job.bar.close()
        if self.progress:
            from tqdm.auto import tqdm

            job.bar = tqdm(
                desc=job.basename, total=job.nbytes, unit="B", unit_scale=True, leave=False
            )
        with self._mutex:
            job.next_part, job.parts_left = 0, len(job.parts)
            job.state = "running"
            if job.parts:
                self._push(job, len(job.parts))
        if not job.parts:  # an empty shard
            self._complete_download(job)

    def _part_size(self, job: _Job) -> int:
        """Bytes per range of ``job``: :attr:`part_bytes`; for a shard a reader already
        waits for (urgent: the first of an epoch, a prefetch that fell behind), split over
        every download thread, no finer than an eighth of :attr:`part_bytes`, so it arrives
        at the link's speed rather than one connection's while the others bring later ones
        (urgent ranges are served first)."""
        if not job.urgent:
            return self.part_bytes
        spread = -(-job.nbytes // max(1, self.threads))
        return max(1, min(self.part_bytes, max(self.part_bytes // 8, spread)))

    def _part(self, job: _Job, i: int) -> None:
        """Fetch one byte range (retrying transient failures) into the temporary file."""
        start, end = job.parts[i]
        remote = self.store.path(job.basename)
        shown = self._shown(job.basename)
        last = end == job.nbytes
        attempts = self.retries + 1
        for attempt in range(1, attempts + 1):
            if job.error is not None:
                break  # another part failed: the download is over
            self._busy(+1)
            try:
                got = self._range(remote, start, end, last)
                if len(got) > end - start:
                    if last and len(got) == end - start + 1:
                        raise ShardError(
                            shown, f"has more than the {job.nbytes} bytes the index says"
                        )
                    raise ShardError(
                        shown,
                        f"the store ignored a byte-range request (asked {end - start} bytes "
                        f"at {start}, got {len(got)})",
                    )
                if len(got) < end - start:
                    self._check_size(remote, shown, job.nbytes)
                    raise _ShortRead(f"short read: {len(got)} of {end - start} bytes at {start}")
                os.pwrite(job.fd or -1, got, start)
                with self._mutex:
                    self.bytes_downloaded += len(got)
                if job.bar is not None:
                    job.bar.update(len(got))
                break
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
                    raise ShardError(
                        shown,
                        f"download failed after {attempts} attempts "
                        f"(last: {type(exc).__name__}: {self._redact(exc)})",
                    ) from None
                if isinstance(exc, OSError) and exc.errno == errno.EINVAL:
                    self._check_size(remote, shown, job.nbytes)  # 416: a shorter object?
                time.sleep(self._delay(attempt))
            finally:
                self._busy(-1)
        with self._mutex:
            job.parts_left -= 1
            last_part = job.parts_left == 0
        if last_part:
            self._complete_download(job)

    def _range(self, remote: str, start: int, end: int, last: bool) -> bytes:
        """One GET of bytes ``[start, end)`` (the last part asks one byte more, so an
        object longer than the index says shows)."""
        return bytes(self.store.fs.cat_file(remote, start=start, end=end + 1 if last else end))

    def _check_size(self, remote: str, shown: str, nbytes: int) -> None:
        """After a short or refused range: a wrong-size object is an error, not a retry."""
        try:
            size = int(self.store.fs.size(remote))
        except FileNotFoundError:
            raise ShardError(shown, "does not exist on the store") from None
        except Exception:
            return  # the probe failed too: let the retry loop decide
        if size != nbytes:
            raise ShardError(shown, f"has {size} bytes, the index says {nbytes}")

    def _busy(self, delta: int) -> None:
        with self._mutex:
            now = time.perf_counter()
            if delta > 0 and self._active == 0:
                self._busy_since = now
            self._active += delta
            if delta < 0 and self._active == 0:
                self.download_s += now - self._busy_since

    def _complete_download(self, job: _Job) -> None:
        """Every part is in: verify, then rename into place (or download once more)."""
        if job.error is not None:
            return self._finish(job, "failed")
        shown = self._shown(job.basename)
        try:
            self._check(shown, job.basename, job.temp, job.nbytes)
        except HashMismatchError as exc:
            self._close_temp(job)
            if job.attempt == 1:  # once more: a torn or stale object may have been read
                job.attempt += 1
                with self._mutex:
                    self.redownloads += 1
                return self._begin(job)
            job.error = exc
            return self._finish(job, "failed")
        except Exception as exc:
            job.error = exc
            return self._finish(job, "failed")
        with self._mutex:  # counted first: a reader may use the file once it is renamed
            self.downloads += 1
        os.replace(job.temp, os.path.join(self.directory, job.basename))
        if self.durable:
            _fsync_dir(self.directory)
        self._finish(job, "done")

    def _close_temp(self, job: _Job) -> None:
        if job.fd is not None:
            os.close(job.fd)
            job.fd = None
        if job.temp:
            _remove(job.temp)  # a no-op after the rename; never a partial file left
            job.temp = ""

    def _fail(self, job: _Job, exc: Exception) -> None:
        """A part (or the start) failed for good: the job ends once no part runs."""
        with self._mutex:
            if job.error is None:
                job.error = exc
            if job.state != "running":
                pass
            else:
                unclaimed = len(job.parts) - job.next_part
                job.next_part = len(job.parts)
                job.parts_left -= unclaimed + 1
                if job.parts_left > 0:
                    return  # the parts still running finish it
        self._finish(job, "failed")

    def _finish(self, job: _Job, state: str) -> None:
        self._close_temp(job)
        if job.bar is not None:
            job.bar.close()
            job.bar = None
        if job.dl is not None:
            os.close(job.dl)
            job.dl = None
        with self._mutex:
            job.state = state
            if state == "failed" or job.released:
                self._close_hold(job)
            if job.released and self._jobs.get(job.basename) is job:
                del self._jobs[job.basename]
            job.done.set()

    def stats(self) -> dict[str, float]:
        """Cumulative download telemetry of this process, and the cache's byte limit."""
        with self._mutex:
            busy = self.download_s
            if self._active:
                busy += time.perf_counter() - self._busy_since
            return {
                "download_bytes": float(self.bytes_downloaded),
                "fetched_bytes": float(self.fetched_bytes),
                "download_s": busy,
                "network_wait_s": self.network_wait_s,
                "cache_limit_bytes": float(self.limit),
            }

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
            if self.durable:
                os.fsync(f.fileno())

    def _redact(self, exc: BaseException) -> str:
        text = str(exc)
        return self.store.redact(text) if hasattr(self.store, "redact") else text

    def _files(self) -> list[tuple[float, int, str]]:
        """Complete files (mtime, size, name), oldest first; notes the shards that have
        temporary files (removed when one of them is downloaded next)."""
        out = []
        stale = set()
        for name in os.listdir(self.directory):
            if name.startswith(_TMP):
                stale.add(name[len(_TMP) + 33 :])
            if name.startswith(".") or name == _LOCKS:
                continue
            try:
                st = os.stat(os.path.join(self.directory, name))
            except FileNotFoundError:
                continue
            out.append((st.st_mtime, st.st_size, name))
        with self._mutex:
            self._stale_temps = stale
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

    def _make_room(self, nbytes: int, keep: str) -> bool:
        """Evict least recently used shards not in use by any process until ``nbytes`` fit
        (False: they do not, every other shard being in use). Scans the directory only when
        the running estimate nears the limit or is stale (see the module's docstring)."""
        with self._mutex:
            now = time.monotonic()
            fresh = now - self._scanned_at < max(1.0, 20 * self._scan_s)
            room = self.limit - self.limit // 8
            if self._usage is not None and fresh and self._usage + nbytes <= room:
                self._usage += nbytes
                return True
        fits = self._scan_and_evict(nbytes, keep)
        with self._mutex:
            self._scan_s = time.monotonic() - now
            self._scanned_at = time.monotonic()
        return fits

    def _scan_and_evict(self, nbytes: int, keep: str) -> bool:
        """:meth:`_make_room` with a fresh scan of the directory."""
        files = self._files()
        used = sum(size for _, size, _ in files)
        with self._mutex:
            self.scans += 1
            self._usage = used + nbytes
        if used + nbytes <= self.limit:
            return True
        self._remove_temps()
        for _, size, name in files:
            if used + nbytes <= self.limit:
                break
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
        with self._mutex:
            self._usage = used + nbytes
        return used + nbytes <= self.limit


class _ShortRead(OSError):
    """A range came back with fewer bytes than asked (a torn body): retried."""


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
