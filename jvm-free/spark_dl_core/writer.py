"""Writing MDS datasets from Arrow: shards from record batches, then the index, last.

:class:`ShardWriter` turns a stream of record batches into shard files and index entries;
it is what a Spark task runs on its partition. :func:`write_mds` drives one writer over a
table, a batch iterator or a pandas frame and commits the dataset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .commit import WriteMode, abort_write, finish_write, plan_write, spec_for
from .errors import EncodingError, SpecError
from .format.buffers import U8, Pieces
from .format.compression import parse_compression
from .format.doc_lengths import encode_lengths, lengths_file
from .format.encodings import get_encoding, merge_shapes, uniform_shape
from .format.hashing import STORED_HASH, content_hash, digest
from .format.index import FileInfo, ShardInfo, shard_config, shard_config_bytes
from .format.shard import Layout, assemble_samples, build_shard
from .meta import ColumnPlan, ShardRecords, plan_columns, plans_schema, stored_layout
from .ops.transforms import apply_transforms
from .spec import DatasetSpec
from .store.storage import Store

__all__ = ["ShardWriter", "WriteMode", "WriteResult", "write_mds"]

_TARGET_CHUNK_BYTES = 8 << 20  # encode at most ~8 MiB of input at a time (bounded memory)


def _element_counts(array: pa.Array) -> np.ndarray | None:
    """Per row, the values of a list-of-integers column (a token document's length; null
    rows 0), which ``spark_dl.json`` records per shard so that a packed loader knows a
    shard's tokens without reading it; None for any other type."""
    t = array.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_integer(
        t.value_type
    ):
        return None
    lengths = pc.fill_null(pc.list_value_length(array), 0)
    return np.asarray(lengths.to_numpy(zero_copy_only=False), dtype=np.int64)


def _fill_nulls(array: pa.Array) -> pa.Array:
    """Nulls replaced by the type's zero value (0, "", b"", [], zeros)."""
    t = array.type
    if pa.types.is_fixed_size_list(t):  # of any values: booleans, lists, fixed lists
        values = _fill_nulls(pa.nulls(t.list_size, t.value_type))
        zeros = pa.FixedSizeListArray.from_arrays(values, type=t)[0]
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


SOURCE_BOUNDARY_KEY = b"spark_dl.source_boundary"


def source_boundary(schema: pa.Schema) -> pa.RecordBatch:
    """A zero-row batch marking the end of one source file in a batch stream: the shard in
    progress closes there, so shards never span source files and their layout depends on
    each file alone (what a Spark write of the same Delta version reproduces)."""
    marked = schema.with_metadata({**(schema.metadata or {}), SOURCE_BOUNDARY_KEY: b"1"})
    return pa.RecordBatch.from_pylist([], schema=marked)


def is_source_boundary(batch: pa.RecordBatch) -> bool:
    return batch.num_rows == 0 and SOURCE_BOUNDARY_KEY in (batch.schema.metadata or {})


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
    stored_hashes: list[dict[str, str]] = field(default_factory=list)
    rows: int = 0
    where: str = ""  # where the rows come from, for errors ("partition 3"); "" for a whole write

    def __post_init__(self) -> None:
        self._codec = parse_compression(self.spec.compression)
        self._pending: list[Pieces] = []
        self._pending_count = 0
        self._pending_shapes: dict[str, list[int] | None] | None = None
        self._pending_values: dict[str, int] = {}
        self._pending_lengths: dict[str, list[np.ndarray]] = {}
        self._layout: Layout | None = None
        if self.plans is not None:
            self._set_plans(self.plans)

    def _set_plans(self, plans: list[ColumnPlan]) -> None:
        self.plans = plans
        self._layout = stored_layout(plans)
        self._config: dict[str, Any] = shard_config(
            column_names=list(self._layout.names),
            column_encodings=[e.name for e in self._layout.encodings],
            column_sizes=list(self._layout.sizes),
            compression=self.spec.compression,
            hashes=list(self.spec.hashes),
            size_limit=self.spec.shard_size,
        )
        self._config_bytes = shard_config_bytes(self._config)
        self._pending_bytes = 8 + len(self._config_bytes)

    @property
    def records(self) -> ShardRecords:
        """The shards written so far with what ``spark_dl.json`` records for each."""
        return ShardRecords(list(self.shards), list(self.content_hashes), list(self.stored_hashes))

    def start(self, schema: pa.Schema) -> None:
        """Fix the columns from the input ``schema`` (so an empty input still has them)."""
        if self.plans is None:
            empty = pa.RecordBatch.from_pylist([], schema=schema)
            self._set_plans(
                plan_columns(
                    apply_transforms(empty, self.spec.transforms, "write").schema, self.spec
                )
            )

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Encode one batch; full shards are written out as they fill."""
        if isinstance(batch, pa.Table):
            for b in batch.to_batches():
                self.write(b)
            return
        if is_source_boundary(batch):  # the shard in progress ends with its source file
            self.flush()
            return
        try:
            batch = apply_transforms(batch, self.spec.transforms, "write")
        except EncodingError as exc:  # a write op's bad value: say where it came from
            if exc.row is None:
                raise
            raise type(exc)(exc.column, f"{exc.detail} (at {self._row_at(exc.row)})") from None
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
        self._chunk_shapes: dict[str, list[int] | None] = {}
        self._chunk_values: dict[str, np.ndarray] = {}
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
                elif not get_encoding(plan.encoding).holds_nulls:
                    first = int(np.flatnonzero(pc.is_null(array).to_numpy(zero_copy_only=False))[0])
                    raise EncodingError(
                        plan.name,
                        f"{array.null_count} null value(s) in this batch, first at "
                        f"{self._row_at(first)}; MDS has no nulls: fill them, or write with "
                        "nulls='mask'",
                    )
            encoding = get_encoding(plan.encoding)
            try:
                if mask is not None:
                    columns.append(encoding.encode_masked(array, plan.name, mask))
                else:
                    columns.append(encoding.encode(array, plan.name))
            except EncodingError as exc:
                if exc.row is None:
                    raise
                raise type(exc)(  # its class kept: a reader may act on it (ArrayNullsError)
                    plan.name, f"{exc.detail} (at {self._row_at(exc.row)})"
                ) from None
            if encoding.size is None and encoding.ndarray:
                self._chunk_shapes[plan.name] = uniform_shape(array, plan.name)
                counts = _element_counts(array)
                if counts is not None:
                    self._chunk_values[plan.name] = counts
            if plan.null_mask:
                flags = mask if mask is not None else np.zeros(n, dtype=np.uint8)
                columns.append(Pieces(flags, width=1))
        samples = assemble_samples(self._layout, columns, n)
        self._add(samples, n)
        self.rows += n

    def one_shard(
        self, table: pa.Table, alloc: Callable[[int], np.ndarray] | None = None
    ) -> tuple[np.ndarray, dict[str, list[int] | None]] | None:
        """All of ``table`` as one uncompressed shard's bytes, and its arrays' shapes, when
        every sample has the same layout (fixed-width columns, arrays of one shape...): each
        column's bytes are copied once, straight into place, rather than assembled per
        chunk and then joined. The bytes are those :meth:`write` then :meth:`finish` give.
        ``alloc(nbytes)`` gives the uint8 buffer they are laid in (e.g. a file's memory map,
        so that caching them copies nothing); a new array by default.
        None when that does not apply (nulls, samples of other sizes, more than one shard,
        write ops, compression): then write it."""
        assert self.plans is not None and self._layout is not None
        n = table.num_rows
        if not n or self.spec.transforms or self._codec is not None:
            return None
        parts: list[tuple[int, list[np.ndarray]]] = []
        shapes: dict[str, list[int] | None] = {}
        try:
            self._check_schema(table.schema)
            for batch in table.to_batches():
                blocks = self._row_blocks(batch, shapes)
                if blocks is None:
                    return None
                parts.append((batch.num_rows, blocks))
        except (EncodingError, SpecError):  # write() says where, and why
            return None
        widths = [[b.shape[1] for b in blocks] for _, blocks in parts]
        if any(w != widths[0] for w in widths):
            return None
        row = sum(widths[0])
        head = 4 + 4 * (n + 1) + len(self._config_bytes)
        if 8 + len(self._config_bytes) + n * (row + 4) > self.spec.shard_size:
            return None
        if head + n * row >= 1 << 32:
            return None
        return _rows_shard(parts, n, row, self._config_bytes, alloc), shapes

    def _row_blocks(
        self, batch: pa.RecordBatch, shapes: dict[str, list[int] | None]
    ) -> list[np.ndarray] | None:
        """One batch's samples as blocks laid side by side (the size header of variable
        columns first, then each column), or None when its samples differ in layout."""
        assert self.plans is not None
        sizes: list[int] = []
        blocks: list[np.ndarray] = []
        for plan in self.plans:
            array = batch.column(plan.name)
            if pa.types.is_dictionary(array.type):
                array = array.dictionary_decode()
            if array.null_count:
                return None
            encoding = get_encoding(plan.encoding)
            rows = encoding.encode_rows(array, plan.name)
            if rows is None:
                return None
            if encoding.size is None:
                sizes.append(sum(b.shape[1] for b in rows))
                if encoding.ndarray:
                    shape = uniform_shape(array, plan.name)
                    same = shapes.get(plan.name, shape) == shape
                    shapes[plan.name] = shape if same else None
            blocks.extend(rows)
            if plan.null_mask:
                blocks.append(np.zeros((1, 1), dtype=U8))
        if sizes:
            blocks.insert(0, np.asarray(sizes, dtype="<u4").view(U8).reshape(1, -1))
        return blocks

    def _row_at(self, row: int) -> str:
        """Where row ``row`` of the chunk being written lies in this writer's input."""
        row += self.rows
        return f"row {row} of {self.where}" if self.where else f"row {row} of the data written"

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
                self._pending_shapes = merge_shapes(self._pending_shapes, self._chunk_shapes)
                for name, counts in self._chunk_values.items():
                    piece = counts[start : start + fits]
                    total = self._pending_values.get(name, 0) + int(piece.sum())
                    self._pending_values[name] = total
                    self._pending_lengths.setdefault(name, []).append(piece)
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
        raw = build_shard(self._pending, n, self._config_bytes)
        raw_name = f"{self.prefix}.{len(self.shards):05}.mds"
        raw_info = FileInfo(raw_name, len(raw), {h: digest(h, raw) for h in self.spec.hashes})
        zip_info = None
        stored: bytes | np.ndarray = raw
        if self._codec is not None:
            stored = packed = self._codec.compress(raw)
            zip_name = f"{raw_name}.{self._codec.extension}"
            zip_info = FileInfo(
                zip_name, len(packed), {h: digest(h, packed) for h in self.spec.hashes}
            )
            self.store.write_bytes(zip_name, packed)
        else:
            self.store.write_bytes(raw_name, raw)
        lengths = None
        if self._pending_lengths:  # each row's values of list-of-integers columns, beside it
            columns = {c: np.concatenate(p) for c, p in self._pending_lengths.items()}
            data, lengths = encode_lengths(lengths_file(raw_name), columns)
            self.store.write_bytes(lengths.basename, data)
        self.content_hashes.append(content_hash(raw))
        self.stored_hashes.append({STORED_HASH: digest(STORED_HASH, stored)})
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
                shapes=self._pending_shapes,
                values=dict(self._pending_values) or None,
                lengths=lengths,
            )
        )
        self._pending_shapes = None
        self._pending_values = {}
        self._pending_lengths = {}
        self._pending = []
        self._pending_count = 0
        self._pending_bytes = 8 + len(self._config_bytes)

    def finish(self) -> list[ShardInfo]:
        self.flush()
        return self.shards


def _rows_shard(
    parts: list[tuple[int, list[np.ndarray]]],
    n: int,
    row: int,
    config: bytes,
    alloc: Callable[[int], np.ndarray] | None = None,
) -> np.ndarray:
    """The bytes of one shard of ``n`` samples of ``row`` bytes each, filled from each
    batch's blocks (``(rows, width)`` arrays, or one ``(1, width)`` row they all share),
    in a buffer from ``alloc`` (a new array by default)."""
    head = 4 + 4 * (n + 1) + len(config)
    out = np.empty(head + n * row, dtype=U8) if alloc is None else alloc(head + n * row)
    out[:4] = np.frombuffer(np.uint32(n).tobytes(), dtype=U8)
    offsets = np.arange(n + 1, dtype=np.int64) * row + head
    out[4 : 4 + 4 * (n + 1)] = offsets.astype("<u4").view(U8)
    out[4 + 4 * (n + 1) : head] = np.frombuffer(config, dtype=U8)
    rows = out[head:].reshape(n, row)
    start = 0
    for count, blocks in parts:
        at = 0
        for block in blocks:
            width = block.shape[1]
            if width:
                rows[start : start + count, at : at + width] = block
            at += width
        start += count
    return out


# --------------------------------------------------------------------------- write_mds

DataLike = Any  # pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch] | pandas.DataFrame


def _as_batches(data: DataLike) -> tuple[pa.Schema | None, Iterator[pa.RecordBatch]]:
    """The input's schema (None if it cannot be known without batches) and its batches.

    Tables, readers and frames know their schema even with zero rows, so an empty one
    writes an empty dataset; a bare iterator's schema comes from its first batch. A list
    of dicts is rows, as ``pa.Table.from_pylist`` reads them.
    """
    whole = _whole(data)
    if whole is not None:
        return whole
    if isinstance(data, list) and data and all(isinstance(row, Mapping) for row in data):
        try:
            return _as_batches(pa.Table.from_pylist(data))
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise SpecError(f"write_mds: the list of dicts is not a table of rows: {exc}") from None
    if isinstance(data, Iterable) and not isinstance(data, (str, bytes, Mapping)):
        items = iter(data)
        for item in items:
            schema, first = _item(item)
            if schema is None:
                continue
            return schema, _chain(first, items)
        return None, iter(())
    raise SpecError(
        f"write_mds takes a pyarrow Table/RecordBatch/RecordBatchReader, an iterable of "
        f"RecordBatches, a pandas DataFrame or a list of dicts (rows), not "
        f"{type(data).__name__}"
    )


def _whole(data: Any) -> tuple[pa.Schema | None, Iterator[pa.RecordBatch]] | None:
    """Inputs that carry their schema: tables, batches, readers, pandas frames."""
    if isinstance(data, pa.Table):
        return data.schema, iter(data.to_batches())
    if isinstance(data, pa.RecordBatch):
        return data.schema, iter([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.schema, iter(data)
    if type(data).__module__.startswith("pandas") and hasattr(data, "columns"):
        return _as_batches(pa.Table.from_pandas(data, preserve_index=False))
    return None


def _item(item: Any) -> tuple[pa.Schema | None, Iterator[pa.RecordBatch]]:
    """One item of an iterable input: a batch, table, reader or frame, nothing else."""
    whole = _whole(item)
    if whole is None:
        rows = "; a list of dicts is read as rows" if isinstance(item, Mapping) else ""
        raise SpecError(
            f"write_mds: an iterable input must yield pyarrow RecordBatches or Tables (or "
            f"pandas DataFrames), got {type(item).__name__}{rows}"
        )
    return whole


def _chain(first: Iterator[pa.RecordBatch], rest: Iterator[Any]) -> Iterator[pa.RecordBatch]:
    yield from first
    for item in rest:
        yield from _item(item)[1]


def _conform(batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Appended batches cast to the stored types where they differ only in a zone's name."""
    for batch in batches:
        if batch.schema.equals(schema):
            yield batch
        else:
            yield from pa.Table.from_batches([batch]).select(schema.names).cast(schema).to_batches()


@dataclass(frozen=True)
class WriteResult:
    path: str
    num_samples: int
    shards: int
    fingerprint: str
    meta: dict[str, Any]
    skipped: bool = False  # mode "ignore" found a dataset and wrote nothing (facts are its)


def write_mds(
    data: DataLike,
    path: str,
    spec: DatasetSpec | dict[str, Any] | None = None,
    *,
    mode: WriteMode = "error",
    source: dict[str, Any] | None = None,
    progress: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> WriteResult:
    """Write ``data`` as an MDS dataset at ``path`` (local directory or fsspec URL).

    ``mode`` (as Spark's save modes): ``error`` (the default) refuses an existing dataset;
    ``overwrite`` replaces it, only once the new one is complete; ``append`` adds shards
    after refusing drift (columns, types, or spec fields that differ from the dataset's);
    ``ignore`` leaves it alone. ``source`` is lineage recorded in spark_dl.json. A table
    with zero rows writes an empty dataset; an empty iterator (no schema) is refused.
    """
    store = Store(path, storage_options)
    shown = store.display()
    schema, batches = _as_batches(data)
    plan = plan_write(store, mode, spec_for(spec), schema=schema)
    if plan.skip:
        assert plan.existing is not None
        meta = plan.existing.meta or {}
        return WriteResult(
            path,
            sum(s.samples for s in plan.existing.shards),
            len(plan.existing.shards),
            meta.get("fingerprint", ""),
            meta,
            skipped=True,
        )
    if schema is None and not plan.appending:
        raise SpecError(
            f"write_mds to {shown}: got no record batches, so the schema is unknown; "
            "pass a pyarrow Table or RecordBatchReader (they carry a schema even when empty)"
        )
    writer = ShardWriter(store, plan.spec, prefix=plan.shard_prefix(), plans=plan.plans)
    if plan.plans is not None:
        batches = _conform(batches, plans_schema(plan.plans))
    elif schema is not None:
        writer.start(schema)
    bar = _progress(progress, shown)
    try:
        for batch in batches:
            writer.write(batch)
            if bar is not None:
                bar.update(batch.num_rows)
        writer.finish()
    except BaseException:
        abort_write(store, [name for info in writer.shards for name in info.files()])
        raise  # nothing half-written stays behind
    finally:
        if bar is not None:
            bar.close()
    assert writer.plans is not None
    outcome = finish_write(plan, writer.plans, writer.records, source)
    meta = outcome.meta or {}
    return WriteResult(
        path,
        meta.get("num_samples", 0),
        len(outcome.records.shards),
        meta.get("fingerprint", ""),
        meta,
    )


def _progress(enabled: bool, path: str) -> Any:
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - optional extra
        return None
    return tqdm(desc=f"write {path}", unit=" rows", unit_scale=True)
