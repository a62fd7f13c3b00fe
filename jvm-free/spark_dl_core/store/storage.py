"""Where a dataset lives: a local directory or any fsspec URL (s3://, gs://, file://…).

Writes of small metadata files are atomic on local disks (temporary name, then rename) and
single PUTs on object stores, which S3-compatible stores apply atomically.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np

from ..errors import DatasetError, SparkDLError, SpecError, optional_import

_SECRET_NAME = re.compile(r"key|secret|token|passw|credential|sas|signature|auth", re.I)
_SECRET_ENV = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_CLIENT_SECRET",
    "GOOGLE_API_KEY",
)
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def _secret_values(options: Any, named: bool = False) -> Iterator[str]:
    """String values stored under secret-looking names, at any depth of ``options``."""
    if isinstance(options, Mapping):
        for key, value in options.items():
            yield from _secret_values(value, named or bool(_SECRET_NAME.search(str(key))))
    elif isinstance(options, list | tuple):
        for value in options:
            yield from _secret_values(value, named)
    elif named and isinstance(options, str) and len(options) >= 4:
        yield options


def redact(text: str, storage_options: Mapping[str, Any] | None = None) -> str:
    """``text`` without credentials: URL userinfo, secret ``storage_options`` values and
    the usual secret environment variables become ``***`` (for error messages and logs)."""
    text = _USERINFO.sub(r"\1***@", text)
    secrets = set(_secret_values(storage_options or {}))
    secrets.update(v for k in _SECRET_ENV if len(v := os.environ.get(k, "")) >= 4)
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def is_remote(url: str) -> bool:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    return scheme not in ("", "file", "local")


def uri_location(uri: str) -> str:
    """The location a URI names (a Hadoop path's ``toUri``, a Delta log's ``add.path``):
    percent-escapes decoded exactly once, ``file:`` URIs as plain paths. Spark escapes
    Hive-style partition directories itself (``part=a b`` is the directory ``part=a%20b``),
    and the URI escapes that again (``part=a%2520b``): decoding twice, or not at all, names
    a file that is not there."""
    if uri.startswith("file:"):
        path = unquote(uri[len("file:") :])
        return "/" + path.lstrip("/")  # file:/x, file:///x -> /x
    scheme, sep, rest = uri.partition("://")
    return scheme + sep + unquote(rest) if sep else unquote(uri)


def _local_path(url: str) -> str:
    if url.startswith("file://"):
        return url[len("file://") :]
    return os.path.expanduser(url)


def check_path(url: Any) -> None:
    """Refuse what cannot name a dataset (None, "", a number) before it becomes a path."""
    if not isinstance(url, (str, os.PathLike)):
        raise SpecError(
            f"a dataset path is a string or path-like (local directory or URL), "
            f"not {type(url).__name__}"
        )
    if not os.fspath(url).strip():
        raise SpecError("the dataset path is empty; give a local directory or a URL")


def _complete_temp(path: str, data: bytes) -> str:
    """``data`` written and synced to a new temporary file beside local ``path`` (its folder
    made): what a write moves or links into place, so readers never see part of a file."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    temp = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(temp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return temp


class Store:
    """Files of one dataset directory, addressed by names relative to it."""

    def __init__(self, url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None):
        check_path(url)
        self.url = str(url).rstrip("/") or "/"
        self.remote = is_remote(self.url)
        self.storage_options = dict(storage_options or {})
        self._fs: Any = None
        self._fs_pid = 0
        self.root = self.url if self.remote else os.path.abspath(_local_path(self.url))

    @property
    def in_place(self) -> bool:
        """Whether shard files are read where they lie (local files, memory-mapped), not
        through the node cache."""
        return not self.remote

    @property
    def fs(self) -> Any:
        """The fsspec filesystem for a remote store (created on first use, per process:
        a forked DataLoader worker makes its own, async filesystems are not fork-safe)."""
        if self._fs is None or self._fs_pid != os.getpid():
            fsspec = optional_import("fsspec", self.url)
            self._fs, _ = fsspec.core.url_to_fs(self.url, **self.storage_options)
            self._fs_pid = os.getpid()
        return self._fs

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = None  # filesystems hold sockets and threads; rebuild after pickling
        return state

    def path(self, name: str) -> str:
        return f"{self.root}/{name}" if self.remote else os.path.join(self.root, name)

    def display(self, name: str = "") -> str:
        """``path(name)`` safe to show: without credentials (see :func:`redact`)."""
        return self.redact(self.path(name) if name else self.root)

    def redact(self, text: str) -> str:
        """``text`` without this store's credentials."""
        return redact(text, self.storage_options)

    def _inside(self, name: str) -> str:
        """The local path of ``name``, refusing symlinks that lead out of the dataset."""
        path = self.path(name)
        real, root = os.path.realpath(path), os.path.realpath(self.root)
        if os.path.commonpath([real, root]) != root:
            raise DatasetError(f"{path} resolves to {real}, outside the dataset {root}")
        return path

    @contextlib.contextmanager
    def _remote_errors(self, name: str = "") -> Iterator[None]:
        """A store that cannot be reached (wrong endpoint, no credentials, access denied)
        raises a :class:`DatasetError` naming the URL, credentials redacted."""
        try:
            yield
        except (FileNotFoundError, SparkDLError):
            raise
        except Exception as exc:
            if not self.remote:
                raise
            what = "access denied" if isinstance(exc, PermissionError) else "cannot be read"
            detail = self.redact(f"{type(exc).__name__}: {exc}")
            raise DatasetError(f"{self.display(name)}: {what} ({detail})") from None

    def blocking_file(self) -> str | None:
        """A file where the dataset's directory (or one above it, locally) would go: a
        write there would fail only once its first shard is written."""
        if self.remote:
            with self._remote_errors():
                return self.root if self.fs.isfile(self.root) else None
        at = self.root
        while not os.path.exists(at):
            parent = os.path.dirname(at)
            if parent == at:
                return None
            at = parent
        return None if os.path.isdir(at) else at

    def exists(self, name: str = "") -> bool:
        target = self.path(name) if name else self.root
        if not self.remote:
            return os.path.exists(target)
        with self._remote_errors(name):
            return bool(self.fs.exists(target))

    def read_bytes(self, name: str) -> bytes:
        try:
            if self.remote:
                with self._remote_errors(name):
                    return bytes(self.fs.cat_file(self.path(name)))
            with open(self._inside(name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise DatasetError(f"{self.display(name)} does not exist") from None

    def read_array(self, name: str) -> np.ndarray:
        """A file's bytes as a read-only uint8 array (memory-mapped when local)."""
        if self.remote:
            return np.frombuffer(self.read_bytes(name), dtype=np.uint8)
        path = self._inside(name)
        try:
            if os.path.getsize(path) == 0:
                return np.empty(0, dtype=np.uint8)
            return np.memmap(path, dtype=np.uint8, mode="r")
        except FileNotFoundError:
            raise DatasetError(f"{path} does not exist") from None

    def map_file(self, name: str) -> tuple[np.ndarray, os.stat_result]:
        """A local file memory-mapped, with the status of the very file mapped (one open:
        the same inode even if the name is replaced meanwhile)."""
        path = self._inside(name)
        try:
            with open(path, "rb") as f:
                status = os.fstat(f.fileno())
                if status.st_size == 0:
                    return np.empty(0, dtype=np.uint8), status
                return np.memmap(f, dtype=np.uint8, mode="r"), status
        except FileNotFoundError:
            raise DatasetError(f"{path} does not exist") from None

    def write_bytes(self, name: str, data: bytes | memoryview | np.ndarray) -> None:
        """Write a whole file; on local disks readers see either nothing or all of it."""
        payload = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
        if self.remote:
            self.fs.pipe_file(self.path(name), payload)
            return
        path = self.path(name)
        os.replace(_complete_temp(path, payload), path)

    def create_new(self, name: str, data: bytes) -> bool:
        """Write ``name`` only if no file has that name: False when one is there already.

        Locally atomic (a complete temporary file hard-linked into place, which fails on an
        existing name), so two writers racing for one name cannot both succeed. Object
        stores have no such primitive here: there it is a check, then a write.
        """
        if self.remote:
            if self.exists(name):
                return False
            self.fs.pipe_file(self.path(name), data)
            return True
        path = self.path(name)
        temp = _complete_temp(path, data)
        try:
            os.link(temp, path)
        except FileExistsError:
            return False
        finally:
            os.remove(temp)
        return True

    def delete(self, name: str) -> None:
        try:
            if self.remote:
                self.fs.rm_file(self.path(name))
            else:
                os.remove(self.path(name))
        except FileNotFoundError:
            pass

    def listdir(self) -> list[str]:
        """Names of the files directly in the dataset directory."""
        if self.remote:
            with self._remote_errors():
                if not self.fs.exists(self.root):
                    return []
                return sorted(
                    p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)
                )
        if not os.path.isdir(self.root):
            return []
        return sorted(os.listdir(self.root))

    def read_shard(
        self, name: str, nbytes: int, hashes: Mapping[str, str] | None = None
    ) -> np.ndarray:
        """A shard file's bytes for decoding: here a memory map of the file itself.

        ``nbytes`` and ``hashes`` are what the index promises; a store that copies shards
        before serving them (:class:`spark_dl_core.store.cached_store.CachedStore`) checks them.
        """
        return self.read_array(name)

    def prefetch_shards(
        self, items: list[tuple[str, int, Mapping[str, str] | None]], threads: int | None = None
    ) -> bool:
        """Start fetching shards ``(name, nbytes, hashes)`` in the background, in order, on
        ``threads`` download threads; False where shards are read in place (nothing to do).
        """
        return False

    def release_shards(self, names: list[str]) -> None:
        """Drop background fetches of shards no longer wanted."""

    def download_stats(self) -> dict[str, float] | None:
        """Cumulative download telemetry of this process (None: nothing is downloaded)."""
        return None

    def __repr__(self) -> str:
        return f"Store({self.redact(self.url)!r})"
