"""Writing MDS datasets from Arrow: shards from record batches, then the index, last.

:class:`ShardWriter` turns a stream of record batches into shard files and index entries;
it is what a Spark task runs on its partition. :func:`write_mds` drives one writer over a
table, a batch iterator or a pandas frame and commits the dataset.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import json
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import __version__
from .errors import DatasetError, EncodingError, SpecError
from .format.buffers import I64, Pieces
from .format.compression import parse_compression
from .format.encodings import get_encoding, infer_encoding
from .format.hashing import content_hash, digest
from .format.index import (
    INDEX_FILE,
    META_FILE,
    PREVIOUS_META_FILE,
    FileInfo,
    ShardInfo,
    index_text,
    parse_index,
    shard_config_bytes,
)
from .format.shard import Layout, assemble_samples, build_shard
from .spec import NULL_SUFFIX, DatasetSpec
from .storage import Store
from .transforms import apply_transforms

WriteMode = Literal["error", "overwrite", "append", "ignore"]
_TARGET_CHUNK_BYTES = 8 << 20  # encode at most ~8 MiB of input at a time (bounded memory)


@dataclass(frozen=True)
class ColumnPlan:
    """What one stored column is: its name, Arrow type, encoding and null mask, if any."""

    name: str
    arrow_type: pa.DataType
    encoding: str
    null_mask: str | None = None  # name of the companion "<name>__isnull" column
    nullable: bool = True  # as the source schema declared it


def plan_columns(schema: pa.Schema, spec: DatasetSpec) -> list[ColumnPlan]:
    """Choose each column's encoding: the spec's, else one inferred from its Arrow type."""
    unknown = set(spec.columns) - set(schema.names)
    if unknown:
        raise SpecError(
            f"spec names column(s) {sorted(unknown)} that the data lacks (columns: {schema.names})"
        )
    plans = []
    for f in schema:
        encoding = spec.columns.get(f.name) or infer_encoding(f)
        mask = None
        if spec.nulls == "mask" and f.nullable and encoding not in ("json", "pkl"):
            mask = f.name + NULL_SUFFIX
            if mask in schema.names:
                raise SpecError(f"column {mask!r} collides with the null mask of {f.name!r}")
        plans.append(ColumnPlan(f.name, f.type, encoding, mask, f.nullable))
    return plans


def stored_layout(plans: list[ColumnPlan]) -> Layout:
    names: list[str] = []
    encodings = []
    for p in plans:
        names.append(p.name)
        encodings.append(get_encoding(p.encoding))
        if p.null_mask:
            names.append(p.null_mask)
            encodings.append(get_encoding("uint8"))
    return Layout(tuple(names), tuple(encodings))


def _fill_nulls(array: pa.Array) -> pa.Array:
    """Nulls replaced by the type's zero value (0, "", b"", [], zeros)."""
    t = array.type
    if pa.types.is_fixed_size_list(t):
        zeros = pa.array([[0] * t.list_size], type=t)[0]
        return pc.if_else(pc.is_null(array), zeros, array)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pc.if_else(pc.is_null(array), pa.scalar([], type=t), array)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pc.fill_null(array, "")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pc.fill_null(array, pa.scalar(b"", type=t))
    if pa.types.is_decimal(t):
        return pc.fill_null(array, pa.scalar(0, type=t))
    if pa.types.is_temporal(t):
        storage = pa.int32() if t.bit_width == 32 else pa.int64()
        return pc.fill_null(array.view(storage), 0).view(t)
    return pc.fill_null(array, pa.scalar(0, type=t) if not pa.types.is_boolean(t) else False)


def _slice(pieces: Pieces, start: int, stop: int) -> Pieces:
    if pieces.offsets is None:
        w = pieces.width or 0
        return Pieces(pieces.data[start * w : stop * w], width=w)
    offsets = pieces.offsets[start : stop + 1]
    return Pieces(pieces.data[int(offsets[0]) : int(offsets[-1])], offsets=offsets - offsets[0])


def _concat(chunks: list[Pieces]) -> Pieces:
    if len(chunks) == 1:
        return chunks[0]
    data = np.concatenate([c.data for c in chunks])
    if all(c.offsets is None and c.width == chunks[0].width for c in chunks):
        return Pieces(data, width=chunks[0].width)
    lengths = np.concatenate([c.lengths(len(c)) for c in chunks])
    offsets = np.zeros(len(lengths) + 1, dtype=I64)
    np.cumsum(lengths, out=offsets[1:])
    return Pieces(data, offsets=offsets)


@dataclass
class ShardWriter:
    """Encodes record batches into size-limited shard files in ``store``.

    Shard files are named ``{prefix}.{n:05}.mds[.{compression}]``. Nothing is visible to
    readers until someone writes an index naming the returned :class:`ShardInfo` entries.
    """

    store: Store
    spec: DatasetSpec
    prefix: str = "shard"
    plans: list[ColumnPlan] | None = None
    shards: list[ShardInfo] = field(default_factory=list)
    content_hashes: list[str] = field(default_factory=list)
    rows: int = 0

    def __post_init__(self) -> None:
        self._codec = parse_compression(self.spec.compression)
        self._pending: list[Pieces] = []
        self._pending_count = 0
        self._layout: Layout | None = None
        if self.plans is not None:
            self._set_plans(self.plans)

    def _set_plans(self, plans: list[ColumnPlan]) -> None:
        self.plans = plans
        self._layout = stored_layout(plans)
        self._config: dict[str, Any] = {
            "column_encodings": [e.name for e in self._layout.encodings],
            "column_names": list(self._layout.names),
            "column_sizes": list(self._layout.sizes),
            "compression": self.spec.compression,
            "format": "mds",
            "hashes": list(self.spec.hashes),
            "size_limit": self.spec.shard_size,
            "version": 2,
        }
        self._config_bytes = shard_config_bytes(self._config)
        self._pending_bytes = 8 + len(self._config_bytes)

    @property
    def layout(self) -> Layout | None:
        return self._layout

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Encode one batch; full shards are written out as they fill."""
        if isinstance(batch, pa.Table):
            for b in batch.to_batches():
                self.write(b)
            return
        batch = apply_transforms(batch, self.spec.transforms, "write")
        if self.plans is None:
            self._set_plans(plan_columns(batch.schema, self.spec))
        self._check_schema(batch.schema)
        if batch.num_rows == 0:
            return
        per_row = max(1, batch.nbytes // batch.num_rows)
        step = max(1, _TARGET_CHUNK_BYTES // per_row)
        for start in range(0, batch.num_rows, step):
            self._write_chunk(batch.slice(start, step))

    def _check_schema(self, schema: pa.Schema) -> None:
        assert self.plans is not None
        expected = [(p.name, p.arrow_type) for p in self.plans]
        got = [(f.name, f.type) for f in schema]
        if got == expected:
            return
        names = [p.name for p in self.plans]
        for name, t in got:
            if name not in names:
                raise SpecError(f"column {name!r} is not in the dataset's schema {names}")
            want = self.plans[names.index(name)].arrow_type
            if t != want:
                raise SpecError(f"column {name!r} has type {t}, the dataset stores {want}")
        missing = [n for n in names if n not in schema.names]
        if missing:
            raise SpecError(f"column(s) {missing} are missing from the data")
        raise SpecError(f"columns are in order {schema.names}, the dataset stores {names}")

    def _write_chunk(self, batch: pa.RecordBatch) -> None:
        assert self.plans is not None and self._layout is not None
        n = batch.num_rows
        columns: list[Pieces] = []
        for plan in self.plans:
            array = batch.column(plan.name)
            if isinstance(array, pa.ChunkedArray):
                array = array.combine_chunks()
            if pa.types.is_dictionary(array.type):
                array = array.dictionary_decode()
            mask = None
            if array.null_count:
                if plan.null_mask:
                    mask = pc.is_null(array).to_numpy(zero_copy_only=False).astype(np.uint8)
                    array = _fill_nulls(array)
                elif plan.encoding != "json":
                    first = int(np.flatnonzero(pc.is_null(array).to_numpy(zero_copy_only=False))[0])
                    raise EncodingError(
                        plan.name,
                        f"{array.null_count} null value(s), first at row {self.rows + first}; "
                        "MDS has no nulls: fill them, or write with nulls='mask'",
                    )
            columns.append(get_encoding(plan.encoding).encode(array, plan.name))
            if plan.null_mask:
                flags = mask if mask is not None else np.zeros(n, dtype=np.uint8)
                columns.append(Pieces(flags, width=1))
        samples = assemble_samples(self._layout, columns, n)
        self._add(samples, n)
        self.rows += n

    def _add(self, samples: Pieces, n: int) -> None:
        limit = self.spec.shard_size
        cost = samples.lengths(n) + 4
        start = 0
        while start < n:
            cumulative = np.cumsum(cost[start:])
            fits = int(np.searchsorted(cumulative, limit - self._pending_bytes, side="right"))
            if fits == 0 and self._pending_count == 0:
                fits = 1  # a sample bigger than the limit gets a shard of its own
            if fits:
                self._pending.append(_slice(samples, start, start + fits))
                self._pending_count += fits
                self._pending_bytes += int(cumulative[fits - 1])
                start += fits
            if start < n:
                self.flush()

    def flush(self) -> None:
        """Write the pending samples as one shard (no-op when none are pending)."""
        if not self._pending_count:
            return
        n = self._pending_count
        samples = _concat(self._pending)
        raw = build_shard(samples, n, self._config_bytes)
        raw_name = f"{self.prefix}.{len(self.shards):05}.mds"
        raw_info = FileInfo(raw_name, len(raw), {h: digest(h, raw) for h in self.spec.hashes})
        zip_info = None
        if self._codec is not None:
            packed = self._codec.compress(raw)
            zip_name = f"{raw_name}.{self._codec.extension}"
            zip_info = FileInfo(
                zip_name, len(packed), {h: digest(h, packed) for h in self.spec.hashes}
            )
            self.store.write_bytes(zip_name, packed)
        else:
            self.store.write_bytes(raw_name, raw)
        self.content_hashes.append(content_hash(raw))
        self.shards.append(
            ShardInfo(
                samples=n,
                raw_data=raw_info,
                zip_data=zip_info,
                column_names=self._config["column_names"],
                column_encodings=self._config["column_encodings"],
                column_sizes=self._config["column_sizes"],
                compression=self.spec.compression,
                hashes=list(self.spec.hashes),
                size_limit=self.spec.shard_size,
            )
        )
        self._pending = []
        self._pending_count = 0
        self._pending_bytes = 8 + len(self._config_bytes)

    def finish(self) -> list[ShardInfo]:
        self.flush()
        return self.shards


# --------------------------------------------------------------------------- dataset metadata


def schema_to_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_text(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def fingerprint(spec: DatasetSpec, plans: list[ColumnPlan], content_hashes: list[str]) -> str:
    """Changes iff the stored content or the spec changes (not with lineage or time)."""
    payload = {
        "spec": spec.canonical(),
        "columns": [[p.name, str(p.arrow_type), p.encoding, p.null_mask] for p in plans],
        "shards": content_hashes,
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def build_meta(
    spec: DatasetSpec,
    plans: list[ColumnPlan],
    shards: list[ShardInfo],
    content_hashes: list[str],
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    schema = pa.schema([pa.field(p.name, p.arrow_type, nullable=p.nullable) for p in plans])
    return {
        "format": "spark-dl",
        "format_version": 1,
        "writer": f"spark-dl-core {__version__}",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "spec": spec.canonical(),
        "arrow_schema": schema_to_text(schema),
        "columns": {
            p.name: {
                "encoding": p.encoding,
                "arrow_type": str(p.arrow_type),
                "null_mask": p.null_mask,
            }
            for p in plans
        },
        "shards": [
            {"basename": s.stored.basename, "samples": s.samples, "content_hash": h}
            for s, h in zip(shards, content_hashes)
        ],
        "num_samples": sum(s.samples for s in shards),
        "fingerprint": fingerprint(spec, plans, content_hashes),
        "source": source or {},
    }


def plans_from_meta(meta: dict[str, Any]) -> list[ColumnPlan]:
    schema = schema_from_text(meta["arrow_schema"])
    cols = meta["columns"]
    return [
        ColumnPlan(
            f.name, f.type, cols[f.name]["encoding"], cols[f.name].get("null_mask"), f.nullable
        )
        for f in schema
    ]


def commit_dataset(
    store: Store,
    spec: DatasetSpec,
    plans: list[ColumnPlan],
    shards: list[ShardInfo],
    content_hashes: list[str],
    source: dict[str, Any] | None = None,
    replaced: Iterable[str] = (),
) -> dict[str, Any]:
    """Make a dataset visible: ``spark_dl.json``, then ``index.json`` (the commit point).

    Files listed in ``replaced`` (an overwritten dataset's shards) are deleted afterwards.
    """
    meta = build_meta(spec, plans, shards, content_hashes, source)
    if store.exists(META_FILE):
        store.write_bytes(PREVIOUS_META_FILE, store.read_bytes(META_FILE))
    store.write_bytes(META_FILE, json.dumps(meta, indent=1, sort_keys=True).encode())
    store.write_bytes(INDEX_FILE, index_text(shards).encode())
    store.delete(PREVIOUS_META_FILE)  # committed: the fallback is no longer needed
    keep = {s.stored.basename for s in shards}
    for name in replaced:
        if name not in keep:
            store.delete(name)
    return meta


def load_existing(store: Store) -> tuple[list[ShardInfo], dict[str, Any] | None] | None:
    """The committed dataset at ``store``: its shards and our metadata, or None if absent."""
    if not store.exists(INDEX_FILE):
        return None
    shards = parse_index(store.read_bytes(INDEX_FILE), store.path(INDEX_FILE))
    meta = json.loads(store.read_bytes(META_FILE)) if store.exists(META_FILE) else None
    return shards, meta


def new_prefix() -> str:
    """A shard-name prefix no earlier write used: old files stay until the new index lands."""
    return f"shard-{uuid.uuid4().hex[:12]}"


# --------------------------------------------------------------------------- write_mds

DataLike = Any  # pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch] | pandas.DataFrame


def _batches(data: DataLike) -> Iterator[pa.RecordBatch]:
    if isinstance(data, pa.Table):
        yield from data.to_batches()
    elif isinstance(data, pa.RecordBatch):
        yield data
    elif isinstance(data, pa.RecordBatchReader):
        yield from data
    elif type(data).__module__.startswith("pandas"):
        yield from pa.Table.from_pandas(data, preserve_index=False).to_batches()
    elif isinstance(data, Iterable):
        for item in data:
            yield from _batches(item)
    else:
        raise TypeError(
            f"write_mds takes a pyarrow Table/RecordBatch, an iterable of RecordBatches or a "
            f"pandas DataFrame, not {type(data).__name__}"
        )


@dataclass(frozen=True)
class WriteResult:
    path: str
    num_samples: int
    shards: int
    fingerprint: str
    meta: dict[str, Any]


def write_mds(
    data: DataLike,
    path: str,
    spec: DatasetSpec | dict[str, Any] | None = None,
    *,
    mode: WriteMode = "overwrite",
    source: dict[str, Any] | None = None,
    progress: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> WriteResult:
    """Write ``data`` as an MDS dataset at ``path`` (local directory or fsspec URL).

    ``mode``: ``overwrite`` replaces an existing dataset only once the new one is complete;
    ``append`` adds shards after checking the columns match; ``error`` refuses an existing
    dataset; ``ignore`` leaves it alone. ``source`` is lineage recorded in spark_dl.json.
    """
    spec = spec if isinstance(spec, DatasetSpec) else DatasetSpec(**(spec or {}))
    store = Store(path, storage_options)
    existing = load_existing(store)
    if existing is not None and mode == "error":
        raise DatasetError(f"a dataset already exists at {path}; use mode='overwrite' or 'append'")
    if existing is not None and mode == "ignore":
        meta = existing[1] or {}
        return WriteResult(
            path,
            sum(s.samples for s in existing[0]),
            len(existing[0]),
            meta.get("fingerprint", ""),
            meta,
        )
    fresh = existing is None and not store.listdir()
    writer = ShardWriter(store, spec, prefix="shard" if fresh else new_prefix())
    old_shards: list[ShardInfo] = []
    old_hashes: list[str] = []
    if existing is not None and mode == "append":
        old_shards, old_meta = existing
        if old_meta is None:
            raise DatasetError(
                f"{path} was not written by spark-dl; append needs its spark_dl.json"
            )
        writer.plans = plans_from_meta(old_meta)
        writer._set_plans(writer.plans)
        old_hashes = [s["content_hash"] for s in old_meta["shards"]]
        source = source or old_meta.get("source")
    bar = _progress(progress, path)
    try:
        for batch in _batches(data):
            writer.write(batch)
            if bar is not None:
                bar.update(batch.num_rows)
        shards = writer.finish()
    except BaseException:
        for info in writer.shards:  # nothing half-written stays behind
            store.delete(info.stored.basename)
        raise
    finally:
        if bar is not None:
            bar.close()
    if writer.plans is None:
        raise SpecError("write_mds got no record batches, so the schema is unknown")
    replaced = [s.stored.basename for s in existing[0]] if existing and mode == "overwrite" else []
    meta = commit_dataset(
        store,
        spec,
        writer.plans,
        old_shards + shards,
        old_hashes + writer.content_hashes,
        source,
        replaced,
    )
    return WriteResult(
        path, meta["num_samples"], len(old_shards) + len(shards), meta["fingerprint"], meta
    )


def _progress(enabled: bool, path: str) -> Any:
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - optional extra
        return None
    return tqdm(desc=f"write {path}", unit=" rows", unit_scale=True)
