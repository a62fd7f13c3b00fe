"""The compact binary index beside ``index.json``: one Arrow IPC file, columnar per shard.

``index.json`` stays byte-for-byte what Mosaic Streaming writes and reads; at 10^6 shards it
is hundreds of MB of JSON that takes seconds to parse into 10^6 Python objects. The
compact index ``spark_dl.index.arrow`` holds the same per-shard facts as columns (sample
count, raw and stored size, basenames, hashes, compression) plus the column layout once,
and the digest and size of the ``index.json`` it describes. Opening memory-maps it and
builds numpy arrays; a :class:`ShardTable` makes a :class:`ShardInfo` only when one shard
is asked for.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import pyarrow as pa
import xxhash

from ..errors import DatasetError, MetadataError
from .index import FileInfo, ShardInfo, check_basename, column_lists

COMPACT_FILE = "spark_dl.index.arrow"
COMPACT_VERSION = 2
# The file is a header, then the Arrow IPC file: the header's digest is checked before the
# IPC reader sees a byte (a malformed IPC file can crash the process that parses it).
COMPACT_MAGIC = b"SPDLCIX2"
_HEADER = struct.Struct("<8sQ16s")  # magic, IPC length, xxh3-128 of the IPC bytes
ARROW_MAGIC = b"ARROW1"  # a version 1 file: the bare IPC file, no digest
_MAX_COUNT = 1 << 62  # samples or bytes beyond this cannot be real (and overflow sums)
_FIXED_COLUMNS = {
    "samples": pa.int64(),
    "raw_basename": pa.string(),
    "raw_bytes": pa.int64(),
    "zip_basename": pa.string(),
    "zip_bytes": pa.int64(),
    "compression": pa.string(),
    "size_limit": pa.int64(),
    "hashes": pa.string(),
}


def index_digest(data: bytes | memoryview) -> str:
    """Digest of ``index.json``'s bytes (xxh3-128: reading the file costs more than this)."""
    return str(xxhash.xxh3_128_hexdigest(data))


class ShardTable(Sequence[ShardInfo]):
    """Every shard of a dataset as columns; ``table[i]`` is the :class:`ShardInfo` of one.

    ``samples``, ``raw_bytes`` and ``stored_bytes`` are int64 arrays (O(shards), no Python
    object per shard); ``ShardInfo`` objects are made on access (or kept, when the table was
    built from ``index.json``'s parsed list).
    """

    def __init__(
        self,
        samples: np.ndarray,
        raw_bytes: np.ndarray,
        stored_bytes: np.ndarray,
        make: Any,
        infos: list[ShardInfo] | None = None,
    ) -> None:
        self.samples = np.asarray(samples, dtype=np.int64)
        self.raw_bytes = np.asarray(raw_bytes, dtype=np.int64)
        self.stored_bytes = np.asarray(stored_bytes, dtype=np.int64)
        self._make = make
        self._infos = infos

    @classmethod
    def from_infos(cls, infos: list[ShardInfo]) -> ShardTable:
        return cls(
            np.fromiter((s.samples for s in infos), np.int64, len(infos)),
            np.fromiter((s.raw_data.bytes for s in infos), np.int64, len(infos)),
            np.fromiter((s.stored.bytes for s in infos), np.int64, len(infos)),
            infos.__getitem__,
            infos,
        )

    def __len__(self) -> int:
        return len(self.samples)

    @overload
    def __getitem__(self, i: int) -> ShardInfo: ...
    @overload
    def __getitem__(self, i: slice) -> list[ShardInfo]: ...
    def __getitem__(self, i: int | slice) -> ShardInfo | list[ShardInfo]:
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"shard {i} is not in 0..{n - 1}")
        return self._make(i)

    def __iter__(self) -> Iterator[ShardInfo]:
        if self._infos is not None:
            return iter(self._infos)
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def _hash_columns(prefix: str, files: list[FileInfo | None]) -> dict[str, pa.Array]:
    names = sorted({name for f in files if f is not None for name in f.hashes})
    return {
        f"{prefix}_hash_{name}": pa.array(
            [f.hashes.get(name) if f is not None else None for f in files], pa.string()
        )
        for name in names
    }


def build_compact(
    shards: Sequence[ShardInfo],
    index_bytes: bytes,
    fingerprint: str,
    meta_fingerprint: str | None = None,
) -> bytes:
    """The compact index of ``shards`` (as listed in ``index_bytes``, index.json's text)."""
    first = shards[0] if len(shards) else None
    for i, s in enumerate(shards):
        assert first is not None
        if (s.column_names, s.column_encodings, s.column_sizes) != (
            first.column_names,
            first.column_encodings,
            first.column_sizes,
        ):
            raise DatasetError(f"shard {i} ({s.stored.basename}) has other columns than shard 0")
    zips = [s.zip_data for s in shards]
    columns: dict[str, pa.Array] = {
        "samples": pa.array([s.samples for s in shards], pa.int64()),
        "raw_basename": pa.array([s.raw_data.basename for s in shards], pa.string()),
        "raw_bytes": pa.array([s.raw_data.bytes for s in shards], pa.int64()),
        "zip_basename": pa.array([z.basename if z else None for z in zips], pa.string()),
        "zip_bytes": pa.array([z.bytes if z else -1 for z in zips], pa.int64()),  # -1: none
        "compression": pa.array([s.compression for s in shards], pa.string()),
        "size_limit": pa.array([s.size_limit for s in shards], pa.int64()),
        "hashes": pa.array([json.dumps(s.hashes) for s in shards], pa.string()),
        **_hash_columns("raw", [s.raw_data for s in shards]),
        **_hash_columns("zip", list(zips)),
    }
    config = {
        "names": first.column_names if first else [],
        "encodings": first.column_encodings if first else [],
        "sizes": first.column_sizes if first else [],
    }
    return compact_from_columns(columns, config, index_bytes, fingerprint, meta_fingerprint)


def compact_from_columns(
    columns: dict[str, pa.Array],
    config: dict[str, Any],
    index_bytes: bytes,
    fingerprint: str,
    meta_fingerprint: str | None = None,
) -> bytes:
    """The compact index file from its columns (see :func:`build_compact` for their names)
    and the column layout ``config`` (``names``, ``encodings``, ``sizes``).

    ``meta_fingerprint``: the fingerprint ``spark_dl.json`` recorded when the index was
    built (None: the dataset had none), so a reader can tell a removed one from none.
    """
    meta = {
        "version": COMPACT_VERSION,
        "index_digest": index_digest(index_bytes),
        "index_bytes": len(index_bytes),
        "fingerprint": fingerprint,
        "meta_fingerprint": meta_fingerprint,
        "columns": config,
    }
    schema = pa.schema(
        [pa.field(n, a.type) for n, a in columns.items()],
        metadata={"spark_dl": json.dumps(meta, sort_keys=True)},
    )
    table = pa.Table.from_arrays(list(columns.values()), schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(table)
    ipc = sink.getvalue()
    header = _HEADER.pack(COMPACT_MAGIC, ipc.size, xxhash.xxh3_128_digest(memoryview(ipc)))
    return header + ipc.to_pybytes()


def _int64s(table: pa.Table, name: str, source: str) -> np.ndarray:
    """An int64 column without nulls as numpy, straight from the Arrow buffers (pyarrow's
    ``to_numpy`` imports pandas on first use: a second of start-up on a training node)."""
    column = table.column(name)
    if column.null_count:
        raise MetadataError(source, "has nulls", field=name)
    parts = [
        np.frombuffer(c.buffers()[1], dtype="<i8", count=len(c), offset=c.offset * 8)
        for c in column.chunks
        if len(c)
    ]
    return np.concatenate(parts).astype(np.int64) if parts else np.empty(0, np.int64)


def verified_payload(data: Any, source: str) -> pa.Buffer | None:
    """The Arrow IPC bytes of a compact index file, after its header's digest is checked
    (None: a version 1 file, which carries no digest and is not parsed at all)."""
    buffer = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    if buffer.size >= len(ARROW_MAGIC) and buffer[: len(ARROW_MAGIC)].to_pybytes() == ARROW_MAGIC:
        return None
    if buffer.size < _HEADER.size:
        raise MetadataError(source, f"truncated: {buffer.size} bytes, no compact index header")
    magic, length, digest = _HEADER.unpack(buffer[: _HEADER.size].to_pybytes())
    if magic != COMPACT_MAGIC:
        raise MetadataError(source, f"not a spark-dl compact index (starts with {magic!r})")
    payload = buffer.slice(_HEADER.size)
    if length != payload.size:
        raise MetadataError(source, f"header says {length} bytes follow, {payload.size} do")
    if xxhash.xxh3_128_digest(memoryview(payload)) != digest:
        raise MetadataError(source, "digest does not match its bytes (the file is corrupted)")
    return payload


def _config(meta: dict[str, Any], source: str) -> tuple[list[str], list[str], list[Any]]:
    cols = meta.get("columns")
    if not isinstance(cols, dict):
        raise MetadataError(source, "not an object", field="columns")
    columns = column_lists(cols.get("names"), cols.get("encodings"), cols.get("sizes"))
    if columns is None:
        raise MetadataError(source, "names/encodings/sizes are malformed", field="columns")
    return columns


class CompactIndex:
    """A parsed compact index: the shard table and what it says about ``index.json``.

    Construct it from the bytes of a version 2 file (see :func:`verified_payload`): the
    digest is checked first, then the IPC file is read and validated in full, its columns
    and types checked, and counts and sizes bounded before anything is sized by them.
    """

    def __init__(self, data: Any, source: str) -> None:
        payload = verified_payload(data, source)
        if payload is None:
            raise MetadataError(source, "version 1 (no digest); rebuild it")
        try:
            reader = pa.ipc.open_file(pa.BufferReader(payload))
            table = reader.read_all()
            table.validate(full=True)
            meta = json.loads((reader.schema.metadata or {})[b"spark_dl"])
        except (pa.ArrowInvalid, KeyError, ValueError, OSError, RecursionError) as exc:
            raise MetadataError(source, f"not a spark-dl compact index ({exc})") from None
        if not isinstance(meta, dict) or meta.get("version") != COMPACT_VERSION:
            version = meta.get("version") if isinstance(meta, dict) else meta
            raise MetadataError(source, f"compact index version {version!r}", field="version")
        for name, kind in [
            ("index_digest", str),
            ("index_bytes", int),
            ("fingerprint", str),
        ]:
            if type(meta.get(name)) is not kind:
                raise MetadataError(source, f"expected {kind.__name__}", field=name)
        if not (meta.get("meta_fingerprint") is None or type(meta["meta_fingerprint"]) is str):
            raise MetadataError(source, "expected a string or null", field="meta_fingerprint")
        for field in table.schema:
            want = _FIXED_COLUMNS.get(field.name)
            if want is None and field.name.startswith(("raw_hash_", "zip_hash_")):
                want = pa.string()
            if want is None or field.type != want:
                raise MetadataError(source, f"unexpected column of type {field.type}", field.name)
        if len(set(table.column_names)) != len(table.column_names):
            raise MetadataError(source, f"column names repeat: {table.column_names}")
        missing = sorted(set(_FIXED_COLUMNS) - set(table.column_names))
        if missing:
            raise MetadataError(source, "compact index lacks the column", field=missing[0])
        self.source = source
        self.index_digest = str(meta["index_digest"])
        self.index_bytes = int(meta["index_bytes"])
        self.fingerprint = str(meta["fingerprint"])
        self.meta_fingerprint: str | None = meta.get("meta_fingerprint")
        self.column_names, self.column_encodings, self.column_sizes = _config(meta, source)
        self.table = table
        for name in ("raw_basename", "hashes"):
            if table.column(name).null_count:
                raise MetadataError(source, "has nulls", field=name)
        samples = _int64s(table, "samples", source)
        raw = _int64s(table, "raw_bytes", source)
        zipped = _int64s(table, "zip_bytes", source)
        stored = np.where(zipped < 0, raw, zipped)
        if len(samples):
            bad = (
                (samples < 0)
                | (samples > raw // 4 - 2)
                | (raw >= _MAX_COUNT)
                | (zipped < -1)
                | (zipped >= _MAX_COUNT)
            )
            if bad.any() or int(samples.max()) * len(samples) >= _MAX_COUNT:
                first = int(np.flatnonzero(bad)[0]) if bad.any() else 0
                raise MetadataError(f"{source} shard {first}", "sample count or size out of range")
        self.shards = ShardTable(samples, raw, stored, self._info)

    def _value(self, name: str, i: int) -> Any:
        return self.table.column(name)[i].as_py()

    def _file(self, prefix: str, i: int) -> FileInfo | None:
        basename = self._value(f"{prefix}_basename", i)
        if basename is None:
            return None
        where = f"{self.source} shard {i}"
        hashes = {
            name[len(prefix) + 6 :]: value
            for name in self.table.column_names
            if name.startswith(f"{prefix}_hash_") and (value := self._value(name, i)) is not None
        }
        size = int(self._value(f"{prefix}_bytes", i))
        if size < 0:
            raise DatasetError(f"{where}: negative size {size} for {basename!r}")
        return FileInfo(check_basename(basename, where), size, hashes)

    def _info(self, i: int) -> ShardInfo:
        raw = self._file("raw", i)
        assert raw is not None
        return ShardInfo(
            samples=int(self.shards.samples[i]),
            raw_data=raw,
            zip_data=self._file("zip", i),
            column_names=list(self.column_names),
            column_encodings=list(self.column_encodings),
            column_sizes=list(self.column_sizes),
            compression=self._value("compression", i),
            hashes=self._hash_names(i),
            size_limit=self._value("size_limit", i),
        )

    def _hash_names(self, i: int) -> list[str]:
        try:
            names = json.loads(self._value("hashes", i))
        except (ValueError, RecursionError):
            names = None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise MetadataError(f"{self.source} shard {i}", "not a list of names", "hashes")
        return names

    def basenames(self) -> list[str]:
        """Stored file names of every shard (compressed name where compressed)."""
        zipped = self.table.column("zip_basename")
        raw = self.table.column("raw_basename")
        return [z if z is not None else r for z, r in zip(zipped.to_pylist(), raw.to_pylist())]

    def disagreement(self, shards: Sequence[ShardInfo]) -> str | None:
        """Where this compact index and ``index.json``'s parsed shards differ (None: agree)."""
        if len(shards) != len(self.shards):
            return f"index.json lists {len(shards)} shards, the compact index {len(self.shards)}"
        for i, s in enumerate(shards):
            mine = self.shards[i]
            for what, a, b in [
                ("sample count", s.samples, mine.samples),
                ("basename", s.stored.basename, mine.stored.basename),
                ("size", s.stored.bytes, mine.stored.bytes),
                ("raw size", s.raw_data.bytes, mine.raw_data.bytes),
            ]:
                if a != b:
                    return (
                        f"shard {i} ({s.stored.basename}): index.json has {what} {a!r}, "
                        f"the compact index {b!r}"
                    )
        return None


def index_fingerprint(index_bytes: bytes) -> str:
    """The fingerprint of a dataset without spark-dl metadata: its canonical index."""
    import hashlib

    try:
        canonical = json.dumps(json.loads(index_bytes), sort_keys=True).encode()
    except ValueError:
        canonical = bytes(index_bytes)
    return "index-" + hashlib.sha256(canonical).hexdigest()
