"""Delta data files on an object store (``s3://``, any fsspec URL), read in place.

Why each mechanism:

- *One filesystem from the table's options*: ``open_delta``'s ``storage_options`` are
  ``deltalake``'s (object_store keys such as ``AWS_ENDPOINT_URL``); the Parquet reads go
  through fsspec with the same endpoint and credentials (:func:`fsspec_options`), never
  through a default client that would reach another endpoint.
- *One listing at open*: every data file of the snapshot is checked present with the size
  its add action records, with a few LIST calls for the whole table rather than a HEAD per
  file; a missing or truncated file is refused naming table, version and file.
- *Byte ranges through the store's shard cache*: a footer (the file's last 64 KiB, or its
  exact length when longer) and a row group's column chunks are each one *span*, fetched
  once per machine into a :class:`~spark_dl_core.store.cache.ShardCache` directory (the
  same download threads, plan-order prefetch, retries with backoff, byte limit and
  cross-process locks as MDS shards) and checked against the size the Delta log records.
  Spans are named by content (the file's path relative to the table, its size, the byte
  range): Delta never rewrites a data file, so a later version keeping it reuses them.
- *Footer tails sized alike in every process*: the tail a footer is fetched with is guessed
  from the first footer read (:meth:`RemoteFiles._tail_guess`), and that guess is part of
  the span's name; the first footer's length is kept in the span directory
  (:data:`LAYOUT`), so another reader of the table (a DataLoader worker, the next open)
  guesses the same tails and finds the footers on disk rather than fetching them again.
- *Memory-mapped spans*: a row group is parsed from its span on local disk, so memory holds
  only the row groups being converted, bounded by the loader's shuffle window and
  prefetch budget, not by the table.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import ShardError
from ...store.cache import ShardCache
from ...store.cached_store import cache_for
from ...store.network import network_mount
from ...store.storage import Store, is_remote
from .footer import read_group
from .table_files import file_key, first_line

# A footer is read with one GET of the file's tail, as long as a guess of its length. The
# first file's guess is FOOTER_PROBE; the others' follow its footer (twice its length, scaled
# by file size, in TAIL_ALIGN steps, at most FOOTER_TAIL): every node reads every footer, so
# a fixed 64 KiB tail of files whose footers are 2 KiB cost 4% of a table of 1.6 MB files
# per node. A footer longer than its guess costs one more GET of exactly its length.
FOOTER_PROBE = 16 << 10
FOOTER_TAIL = 64 << 10
TAIL_ALIGN = 4 << 10
FOOTER_THREADS = 32
PAD = 1 << 10  # past a column chunk's end: old writers' readers read a little beyond
# In a span directory: the footer the tails were sized from (its length, its file's size,
# the file fetched with FOOTER_PROBE), so every reader names the same footer spans.
LAYOUT = ".footer-layout"

_S3_KEYS = {
    "access_key_id": "key",
    "secret_access_key": "secret",
    "session_token": "token",
    "token": "token",
}
_S3_CLIENT = {
    "endpoint_url": "endpoint_url",
    "endpoint": "endpoint_url",
    "region": "region_name",
}


def fsspec_options(uri: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """fsspec options for ``uri`` from ``deltalake`` storage options: S3's object_store keys
    (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``… any case, ``aws_`` optional) become s3fs's;
    other schemes' options pass as they are (adlfs/gcsfs share most key names)."""
    options = dict(storage_options or {})
    if uri.split("://", 1)[0] not in ("s3", "s3a"):
        return options
    out: dict[str, Any] = {}
    client: dict[str, Any] = {}
    for key, value in options.items():
        name = key.lower().removeprefix("aws_")
        if name in _S3_KEYS:
            out[_S3_KEYS[name]] = value
        elif name in _S3_CLIENT:
            client[_S3_CLIENT[name]] = value
        elif name in ("client_kwargs", "config_kwargs", "key", "secret", "anon"):
            out[key] = value  # already fsspec's
    if client:
        out["client_kwargs"] = {**client, **dict(out.get("client_kwargs") or {})}
    return out


def table_store(uri: str, storage_options: Mapping[str, Any] | None) -> Store:
    """The fsspec store of a remote table (its data files' root)."""
    return Store(uri, fsspec_options(uri, storage_options))


def remote_filesystem(uri: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """A pyarrow filesystem over the table's fsspec filesystem, and the URI prefix its paths
    drop (``s3://``)."""
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    fs = table_store(uri, storage_options).fs
    return PyFileSystem(FSSpecHandler(fs)), uri.split("://", 1)[0] + "://"


def check_remote_files(snap: Any, fail: Callable[[str], Exception], log: str) -> None:
    """Every data file of ``snap`` present with its logged size: one recursive listing of
    the table (a LIST per 1000 objects), not one request per file. ``fail(message)``: the
    snapshot's error; ``log``: what recorded the sizes (``"the Delta log"``)."""
    if not snap.files:
        return
    store = table_store(snap.table_uri, snap.storage_options)
    prefix = snap.table_uri.split("://", 1)[0] + "://"
    root = snap.table_uri[len(prefix) :].rstrip("/")
    try:
        found = store.fs.find(root, detail=True)
    except Exception as exc:
        raise fail(f"its data files cannot be listed: {store.redact(first_line(exc))}") from None
    sizes = {path.rstrip("/"): int(info.get("size") or 0) for path, info in found.items()}
    for uri in snap.files:
        path = file_key(uri)[len(prefix) :]
        logged = snap.file_size(uri)
        size = sizes.get(path)
        problem = None
        if size is None:
            problem = "is missing; the snapshot was probably vacuumed"
        elif logged is not None and size != logged:
            problem = f"has {size} bytes on the store, {log} says {logged} (truncated?)"
        if problem:
            raise fail(f"data file {uri} {problem}")


class _SpanStore:
    """What a :class:`ShardCache` asks of a store, for spans of remote files."""

    def __init__(self, store: Store) -> None:
        self.inner = store
        # span name -> (path on the filesystem, first byte, the file's logged size, shown)
        self.spans: dict[str, tuple[str, int, int, str]] = {}
        self._lock = threading.Lock()

    @property
    def fs(self) -> Any:
        return self.inner.fs

    def path(self, name: str) -> str:
        return name  # the cache hands it back to _SpanCache._range

    def display(self, name: str) -> str:
        found = self.spans.get(name)
        return found[3] if found else name

    def redact(self, text: str) -> str:
        return self.inner.redact(text)


class _SpanCache(ShardCache):
    """A shard cache whose "shards" are byte ranges of the table's data files; not fsynced
    (a span that does not parse is fetched again: :meth:`RemoteFiles._parsed`)."""

    store: _SpanStore
    durable = False

    def _range(self, remote: str, start: int, end: int, last: bool) -> bytes:
        path, first, _, _ = self.store.spans[remote]
        return bytes(self.store.fs.cat_file(path, start=first + start, end=first + end))

    def _check_size(self, remote: str, shown: str, nbytes: int) -> None:
        """After a short read: a file of another size than the log's is an error."""
        path, _, logged, _ = self.store.spans[remote]
        try:
            size = int(self.store.fs.size(path))
        except FileNotFoundError:
            raise ShardError(shown, "does not exist on the store") from None
        except Exception:
            return  # the probe failed too: the retry loop decides
        if size != logged:
            raise ShardError(shown, f"has {size} bytes, the Delta log says {logged}")


class _SpanFile(io.RawIOBase):
    """A data file of which only ``data`` (at ``offset``) is here: what the Parquet reader
    reads of one row group, with the footer given apart. A read outside it is an error."""

    def __init__(self, data: np.ndarray, offset: int, size: int, name: str) -> None:
        super().__init__()
        self.data, self.offset, self.size, self.name_ = data, offset, size, name
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else self.pos + pos if whence == 1 else self.size + pos
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> memoryview:
        """A view of the span's memory, not a copy: the Parquet reader takes any buffer,
        and a copy of every row group's chunks was ~5% of a cold epoch's CPU (the span
        file is never rewritten in place, so the view stays the bytes read)."""
        n = self.size - self.pos if n is None or n < 0 else n
        start = self.pos - self.offset
        if start < 0 or start + n > len(self.data):
            raise OSError(
                f"{self.name_}: a read of bytes {self.pos}..{self.pos + n} outside the "
                "row group's column chunks"
            )
        self.pos += n
        return self.data[start : start + n].data


def _footer_length(tail: np.ndarray) -> int:
    """The footer length a file's tail records (after checking the magic)."""
    if len(tail) < 12 or tail[-4:].tobytes() != b"PAR1":
        raise OSError("has no Parquet footer at its end (not a Parquet file, or encrypted)")
    return int.from_bytes(tail[-8:-4].tobytes(), "little")


def _footer(tail: np.ndarray, length: int) -> Any:
    """The metadata in the last ``length + 8`` bytes of ``tail``."""
    import pyarrow.parquet as pq

    if _footer_length(tail) != length:
        raise OSError("its footer changed between two reads")
    body = pa.py_buffer(b"PAR1" + tail[-(length + 8) :].tobytes())
    return pq.read_metadata(pa.BufferReader(body))


def span_name(relative: str, size: int | None, start: int, end: int) -> str:
    """A span's file name in the cache: a digest of its content identity."""
    text = f"{relative}\0{size}\0{start}\0{end}"
    return hashlib.sha256(text.encode()).hexdigest()[:40] + ".span"


class RemoteFiles:
    """The remote data files of one snapshot, for one process: footers and row groups
    through a span cache in ``directory`` (one per machine and table)."""

    def __init__(self, snap: Any, relative: list[str], directory: str, columns: list[str]) -> None:
        self.snap = snap
        self.relative = relative
        self.columns = columns  # the stored columns a row group is read with
        self._metas: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._tails: dict[int, int] = {}  # per file: the tail bytes its footer is read with
        self._learnt: tuple[int, int] | None = None  # a footer's length and its file's size
        self._probed: tuple[str, int] | None = None  # the file read with FOOTER_PROBE
        prefix = _scheme_prefix(snap.table_uri)
        self.paths = [file_key(u)[len(prefix) :] for u in snap.files]
        self.sizes = [int(snap.file_size(u) or 0) for u in snap.files]
        self._layout = os.path.join(directory, LAYOUT)
        self._load_layout()
        store = _SpanStore(table_store(snap.table_uri, snap.storage_options))
        # one cache per process and directory (other datasets of the table share it)
        self.cache: _SpanCache = cache_for(  # type: ignore[assignment]
            directory, lambda: _SpanCache(store, directory, hashes={})
        )

    def _span(self, file: int, start: int, end: int, what: str) -> str:
        name = span_name(self.relative[file], self.sizes[file], start, end)
        shown = f"{self.snap.files[file]} ({what}, bytes {start}..{end})"
        self.cache.store.spans[name] = (self.paths[file], start, self.sizes[file], shown)
        return name

    # -- footers

    def _tail(self, file: int) -> tuple[str, int, int]:
        """The span holding ``file``'s footer as guessed: fixed per file once chosen (the
        span's name, shared by a node's processes, depends on it)."""
        with self._lock:
            guess = self._tails.get(file)
            if guess is None:
                guess = self._tails[file] = self._tail_guess(file)
        end = self.sizes[file]
        start = max(0, end - guess)
        return self._span(file, start, end, "footer"), start, end

    def _tail_guess(self, file: int) -> int:
        """Tail bytes to fetch for ``file``'s footer: :data:`FOOTER_PROBE` until a footer
        was read (and for the file that footer came from), then twice that footer scaled by
        file size, rounded up to :data:`TAIL_ALIGN` (one table's files come from like
        writers)."""
        if self._learnt is None or self._probed == (self.relative[file], self.sizes[file]):
            return FOOTER_PROBE
        length, size = self._learnt
        scale = max(1.0, self.sizes[file] / max(1, size))
        want = int(2 * (length + 8) * scale) + 1
        return min(FOOTER_TAIL, -(-want // TAIL_ALIGN) * TAIL_ALIGN)

    @contextlib.contextmanager
    def footers(self, files: list[int] | None = None) -> Iterator[None]:
        """While footers are read: the tails of ``files`` (default: all) queued, on at
        least :data:`FOOTER_THREADS` threads (small GETs: their round trips, not the link,
        bound them)."""
        threads = self.cache.threads
        self.cache.set_threads(max(threads, FOOTER_THREADS))
        try:
            which = list(range(len(self.paths)) if files is None else files)
            if which and self._learnt is None:
                self._meta(which[0])  # its length sizes the other tails
            self.prefetch_footers(which[1:])
            yield
        finally:
            self.cache.set_threads(threads)

    def prefetch_footers(self, files: list[int] | None = None) -> None:
        """Queue the footer tails of ``files`` (default: all), in file order (the threads
        fetch them at once)."""
        which = range(len(self.paths)) if files is None else files
        self.cache.prefetch(
            [(name, end - start, None) for name, start, end in map(self._tail, which)]
        )

    def footer(self, file: int) -> Any:
        """The file's Parquet metadata (its tail fetched once per machine; a footer longer
        than the tail is fetched as its own span)."""
        name, start, end = self._tail(file)
        length = self._parsed(name, end - start, _footer_length)
        with self._lock:
            if self._learnt is None:
                self._learnt = (length, end)
                if self._tails.get(file) == FOOTER_PROBE:
                    self._probed = (self.relative[file], end)
                    self._save_layout()
        if length + 8 > end - start:
            if length + 12 > end:
                raise OSError(f"its footer length {length} exceeds the file's {end} bytes")
            start = end - length - 8
            name = self._span(file, start, end, "footer")
        return self._parsed(name, end - start, lambda tail: _footer(tail, length))

    def _load_layout(self) -> None:
        """The footer layout another reader of this directory learnt, if any (one that does
        not read is ignored: the tails are only guesses, any guess reads right)."""
        try:
            with open(self._layout, encoding="utf-8") as f:
                found = json.load(f)
            learnt = (int(found["length"]), int(found["size"]))
            probed = (str(found["probed"]), int(found["size"]))
        except (OSError, ValueError, KeyError, TypeError):
            return
        self._learnt, self._probed = learnt, probed

    def _save_layout(self) -> None:
        """Publish the layout learnt here unless a reader published one first (written
        whole, then linked into place: never a partial file, never replaced)."""
        if self._learnt is None or self._probed is None or os.path.exists(self._layout):
            return
        length, size = self._learnt
        temp = f"{self._layout}.{os.getpid()}.{threading.get_ident()}"
        with contextlib.suppress(OSError):
            with open(temp, "w", encoding="utf-8") as f:
                json.dump({"length": length, "size": size, "probed": self._probed[0]}, f)
            with contextlib.suppress(FileExistsError):
                os.link(temp, self._layout)
        with contextlib.suppress(OSError):
            os.remove(temp)

    def _parsed(self, name: str, nbytes: int, parse: Any) -> Any:
        """``parse`` of a span's bytes. Spans are not fsynced (thousands of small files): one
        that does not parse is fetched once more before the error stands, in case a power
        loss tore it on this disk."""
        try:
            return parse(self.cache.fetch(name, nbytes))
        except ShardError:
            raise
        except Exception:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self.cache.directory, name))
            return parse(self.cache.fetch(name, nbytes))

    def _meta(self, file: int) -> Any:
        """The file's footer, kept parsed for the last 64 files this process read."""
        with self._lock:
            found = self._metas.get(file)
        if found is None:
            found = self.footer(file)
            with self._lock:
                self._metas[file] = found
                while len(self._metas) > 64:
                    self._metas.pop(next(iter(self._metas)))
        return found

    # -- row groups

    def _present(self, meta: Any, file: int) -> tuple[Any, list[int]]:
        """How the wanted columns read from this file (its physical names under column
        mapping: ``FileColumns``), and the indexes of their leaf columns."""
        columns = self.snap.file_columns(
            meta.schema.to_arrow_schema(), self.columns, self.snap.files[file]
        )
        schema = meta.schema
        wanted = set(columns.read)
        leaves = [i for i in range(len(schema)) if schema.column(i).path.split(".")[0] in wanted]
        return columns, leaves

    def group_range(self, file: int, group: int) -> tuple[int, int]:
        """Bytes ``[start, end)`` of row group ``group`` holding the wanted columns."""
        meta = self._meta(file)
        return self.chunk_range(meta, group, self._present(meta, file)[1])

    def read_group(self, file: int, group: int) -> pa.Table:
        """The row group's wanted columns under their logical names, from its span (fetched,
        or waited for)."""
        meta = self._meta(file)
        columns, leaves = self._present(meta, file)
        rng = self.chunk_range(meta, group, leaves)
        return columns.logical(self._read_span(file, group, rng, meta, columns.read))

    def chunk_range(self, meta: Any, group: int, leaves: list[int]) -> tuple[int, int]:
        """Bytes ``[start, end)`` holding the row group's column chunks ``leaves``."""
        rg = meta.row_group(group)
        starts, ends = [], []
        for i in leaves:
            col = rg.column(i)
            first = col.data_page_offset
            if col.has_dictionary_page and 0 < col.dictionary_page_offset < first:
                first = col.dictionary_page_offset
            starts.append(first)
            ends.append(first + col.total_compressed_size)
        return (min(starts), max(ends)) if starts else (4, 4)

    def _group_span(self, file: int, group: int, rng: tuple[int, int]) -> tuple[str, int, int]:
        start, end = rng[0], min(rng[1] + PAD, self.sizes[file])
        return self._span(file, start, end, f"row group {group}"), start, end

    def prefetch(self, groups: list[tuple[int, int]], threads: int | None) -> None:
        """Queue row groups ``(file, group)`` in the order they will be read."""
        if threads is not None and threads != self.cache.threads:
            self.cache.set_threads(threads)
        spans = [self._group_span(f, g, self.group_range(f, g)) for f, g in groups]
        self.cache.prefetch([(name, end - start, None) for name, start, end in spans])

    def release(self, groups: list[tuple[int, int]]) -> None:
        names = [self._group_span(f, g, self.group_range(f, g))[0] for f, g in groups]
        self.cache.release(names)

    def _read_span(
        self, file: int, group: int, rng: tuple[int, int], meta: Any, columns: list[str]
    ) -> pa.Table:
        """Row group ``group``'s ``columns`` from its span (fetched, or waited for)."""
        import pyarrow.parquet as pq

        name, start, end = self._group_span(file, group, rng)
        shown = self.snap.files[file]

        def parse(data: np.ndarray) -> pa.Table:
            source = pa.PythonFile(_SpanFile(data, start, self.sizes[file], shown))
            return read_group(pq.ParquetFile(source, metadata=meta), group, columns)

        return self._parsed(name, end - start, parse)


def is_remote_table(snap: Any) -> bool:
    """Whether the snapshot's files are on an object store (read through spans)."""
    return is_remote(snap.table_uri) and not snap.table_uri.startswith("file:")


def _scheme_prefix(uri: str) -> str:
    """What a remote URI's paths drop for its fsspec filesystem (``s3://``); ``""`` for a
    local table, whose files are plain paths (:func:`file_key`)."""
    if "://" not in uri or uri.startswith("file:"):
        return ""
    return uri.split("://", 1)[0] + "://"


def read_through_spans(snap: Any, node_cache: bool | None) -> bool:
    """Whether a snapshot's files are read through the span cache (in plan order, only the
    row groups a rank reads, kept on the node's disk) rather than where they lie: always on
    an object store; for a local path, when it lies on a network or FUSE mount
    (``/Volumes``, NFS, s3fs: :func:`~spark_dl_core.store.network.network_mount`) with
    ``node_cache`` None (the default), or whenever ``node_cache`` is True."""
    if is_remote_table(snap):
        return True
    if node_cache is not None:
        return bool(node_cache)
    return network_mount(file_key(snap.table_uri)) is not None


def default_span_dir(table_uri: str) -> str:
    """``<tmp>/spark-dl-cache/<hash of the table URI and "#spans">``: one per machine."""
    from ...store.cache import default_cache_dir

    return default_cache_dir(f"{table_uri}#spans")


__all__ = [
    "RemoteFiles",
    "check_remote_files",
    "default_span_dir",
    "fsspec_options",
    "is_remote_table",
    "read_through_spans",
    "remote_filesystem",
]
