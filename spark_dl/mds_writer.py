"""Spark's side of an MDS write: each task encodes its partition's Arrow batches into shards
under a task-attempt-unique prefix and reports them; the driver's ``commit`` merges the reports
into one index, written last (see :mod:`spark_dl.datasource`)."""

from __future__ import annotations

import dataclasses
import itertools
import uuid
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import DataType, StructType, UserDefinedType

from spark_dl_core import ShardWriter
from spark_dl_core.commit import (
    finish_write,
    normalize_mode,
    plan_write,
    written_schema,
)
from spark_dl_core.errors import EncodingError, SpecError
from spark_dl_core.format.index import ShardInfo
from spark_dl_core.maintenance import DEFAULT_RETENTION_SECONDS, vacuum_store
from spark_dl_core.meta import (
    ColumnPlan,
    ShardRecords,
    plan_columns,
    read_meta,
    schema_from_text,
    shard_files,
)
from spark_dl_core.store.storage import Store

from .mds_options import (
    FORMAT,
    SOURCE_FILE_COLUMN,
    _json_option,
    _path,
    _storage_options,
    spec_from_options,
)
from .types import conform, utc_timestamps


def _is_vector(dt: DataType) -> bool:
    return isinstance(dt, UserDefinedType) and type(dt).__name__ == "VectorUDT"


def vectors_to_arrays(array: pa.Array, dtype: str) -> pa.Array:
    """Spark ML vectors (Arrow struct<type,size,indices,values>) as dense float lists."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    n = len(array)
    kind = array.field("type").to_numpy(zero_copy_only=False)
    size = array.field("size").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    values = array.field("values")
    indices = array.field("indices")
    val_len = values.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    dense_len = np.where(kind == 1, val_len, size).astype(np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(dense_len, out=offsets[1:])
    out = np.zeros(int(offsets[-1]), dtype=dtype)
    flat_vals = values.flatten().to_numpy(zero_copy_only=False)
    val_off = values.offsets.to_numpy()
    dense = np.flatnonzero(kind == 1)
    if len(dense):
        starts = np.repeat(offsets[dense], val_len[dense])
        src_starts = np.repeat(val_off[dense], val_len[dense])
        within = np.arange(int(val_len[dense].sum())) - np.repeat(
            np.cumsum(val_len[dense]) - val_len[dense], val_len[dense]
        )
        out[starts + within] = flat_vals[src_starts + within]
    sparse = np.flatnonzero(kind == 0)
    if len(sparse):
        flat_idx = indices.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
        idx_off = indices.offsets.to_numpy()
        counts = idx_off[sparse + 1] - idx_off[sparse]
        src = np.concatenate([np.arange(idx_off[i], idx_off[i + 1]) for i in sparse])
        out[np.repeat(offsets[sparse], counts) + flat_idx[src]] = flat_vals[src]
    result = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(out))
    if array.null_count:
        result = pa.ListArray.from_arrays(
            pa.array(offsets.astype(np.int32)), pa.array(out), mask=array.is_null()
        )
    return result


def _convert_vectors(batch: pa.RecordBatch, vectors: dict[str, str]) -> pa.RecordBatch:
    if not vectors:
        return batch
    arrays, fields = [], []
    for f, col in zip(batch.schema, batch.columns):
        if f.name in vectors:
            col = vectors_to_arrays(col, vectors[f.name])
            f = pa.field(f.name, col.type, nullable=f.nullable)
        arrays.append(col)
        fields.append(f)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def writer_arrow_schema(schema: StructType, vectors: dict[str, str]) -> pa.Schema:
    """The Arrow schema write tasks see, after ML vectors become float lists."""
    plain = StructType([f for f in schema.fields if f.name not in vectors])
    converted = to_arrow_schema(plain, timezone="UTC")
    fields = []
    for f in schema.fields:
        if f.name in vectors:
            fields.append(
                pa.field(f.name, pa.list_(pa.from_numpy_dtype(np.dtype(vectors[f.name]))))
            )
        else:
            fields.append(converted.field(f.name))
    return pa.schema(fields)


@dataclass
class MDSCommitMessage(WriterCommitMessage):
    """What one write task produced: its shards, their content hashes and column plans."""

    partition: int
    shards: list[ShardInfo] = field(default_factory=list)
    content_hashes: list[str] = field(default_factory=list)
    plans: list[ColumnPlan] | None = None
    stored_hashes: list[dict[str, str]] = field(default_factory=list)
    files: list[str] | None = None  # per shard, its source data file (canonical writes)


class MDSWriter(DataSourceArrowWriter):
    """Plans on the driver, encodes on executors, commits once on the driver.

    The save-mode decisions (refuse, skip, append after drift checks, replace) are the
    core's (:mod:`spark_dl_core.commit`), the same as for ``write_mds``.
    """

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        self.path = _path(options)
        self.storage_options = _storage_options(options)
        self.mode = (
            "overwrite" if overwrite else normalize_mode(options.get("save_mode") or "append")
        )
        self.token = uuid.uuid4().hex[:10]
        self.options_retention = options.get("vacuum_retention")
        self.ordered = SOURCE_FILE_COLUMN in schema.names
        if self.ordered:
            schema = StructType([f for f in schema.fields if f.name != SOURCE_FILE_COLUMN])
        self.canonical_files = _json_option(options, "canonical_files", list) or []
        self.source = _json_option(options, "source", dict)
        dtype = options.get("vector_dtype", "float64")
        self.vectors = {f.name: dtype for f in schema.fields if _is_vector(f.dataType)}
        self.arrow_schema = writer_arrow_schema(schema, self.vectors)
        self.delta_fields = _delta_fields(options, self.arrow_schema)
        if self.delta_fields:
            self.arrow_schema = pa.schema(
                [self.delta_fields.get(f.name, f) for f in self.arrow_schema]
            )
        given = spec_from_options(options, schema.names)
        plan = plan_write(
            Store(self.path, self.storage_options), self.mode, given, schema=self.arrow_schema
        )
        self.skip = plan.skip
        self.spec = plan.spec
        self.append_plans: list[ColumnPlan] | None = plan.plans
        self.plans = self.append_plans or plan_columns(
            written_schema(self.arrow_schema, self.spec), self.spec
        )
        self._plan = dataclasses.replace(plan, existing=None)  # tasks need none of it

    def write(self, iterator: Iterator[pa.RecordBatch]) -> MDSCommitMessage:
        """Runs on an executor: encode this partition into shards of its own prefix."""
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx else 0
        attempt = ctx.attemptNumber() if ctx else 0
        if self.skip:
            for _ in iterator:
                pass
            return MDSCommitMessage(partition)
        prefix = f"shard-{self.token}-p{partition:05}-a{attempt}-{uuid.uuid4().hex[:6]}"
        store = Store(self.path, self.storage_options)
        writer = ShardWriter(
            store, self.spec, prefix=prefix, plans=self.append_plans, where=f"partition {partition}"
        )
        files: list[str] = []  # source file of each shard written so far (ordered writes)
        current: str | None = None
        try:
            for whole in iterator:
                for name, batch in _file_runs(whole) if self.ordered else [(None, whole)]:
                    if name != current:  # a shard never spans two source files
                        writer.flush()
                        files += [current or ""] * (len(writer.shards) - len(files))
                        current = name
                    batch = utc_timestamps(_convert_vectors(batch, self.vectors))
                    if self.delta_fields:
                        batch = _with_fields(batch, self.delta_fields)
                    if self.append_plans is not None:
                        batch = _align(batch, self.append_plans)
                    writer.write(batch)
            writer.finish()
            files += [current or ""] * (len(writer.shards) - len(files))
        except BaseException:
            for info in writer.shards:
                for name in info.files():
                    store.delete(name)
            raise
        return MDSCommitMessage(
            partition,
            writer.shards,
            writer.content_hashes,
            writer.plans,
            writer.stored_hashes,
            files=files if self.ordered else None,
        )

    def commit(self, messages: list[MDSCommitMessage | None]) -> None:  # type: ignore[override]
        """Runs on the driver: one index for the whole job, then stray files go."""
        store = Store(self.path, self.storage_options)
        if self.skip:
            self._cleanup(store, keep=set())
            return
        taken: dict[int, MDSCommitMessage] = {}
        for m in messages:  # exactly one attempt per partition, should two ever report
            if m is not None:
                taken.setdefault(m.partition, m)
        done = [taken[p] for p in sorted(taken)]
        written = ShardRecords.empty()
        # the column types tasks actually saw (the driver's are derived from Spark's schema)
        plans = next((m.plans for m in done if m.plans and m.shards), self.plans)
        for m in done:
            if m.plans is not None and m.shards:
                _check_plans(store.display(), plans, m.plans)
        written = _canonical_shards(done, self.canonical_files)
        source = {**(self.source or {}), "writer": "spark", "format": FORMAT, "job": self.token}
        try:
            outcome = finish_write(self._plan, plans, written, source)
        finally:
            self._cleanup(store, keep=set())  # keeps nothing of this job but what is indexed
        if outcome.meta is not None:
            self._sweep(store)

    def _sweep(self, store: Store) -> None:
        """Leftovers of earlier failed jobs go too, if older than the retention (option
        ``vacuum_retention``, seconds, default 3600; ``off`` disables): a younger file may
        belong to another write in flight. Best effort: the commit has already succeeded."""
        setting = (self.options_retention or "").strip().lower()
        if setting in ("off", "none", "false", "-1"):
            return
        try:
            retention = float(setting) if setting else DEFAULT_RETENTION_SECONDS
            vacuum_store(store, retention_seconds=retention)
        except Exception as exc:  # never fail a committed job over cleanup
            warnings.warn(
                f"spark-dl: cleanup after commit at {store.display()}: {exc}", stacklevel=2
            )

    def abort(self, messages: list[MDSCommitMessage | None]) -> None:  # type: ignore[override]
        """Runs on the driver after a failed job: every file this job wrote goes."""
        self._cleanup(Store(self.path, self.storage_options), keep=set())

    def _cleanup(self, store: Store, keep: set[str]) -> None:
        """Delete this job's files that the committed index does not name."""
        mine = f"shard-{self.token}-"
        names = [n for n in store.listdir() if n.startswith(mine) and n not in keep]
        if not names:
            return
        indexed = _indexed_names(store)
        for name in names:
            if name not in indexed:
                store.delete(name)


def _indexed_names(store: Store) -> set[str]:
    committed = read_meta(store)
    return shard_files(committed) if committed else set()


def _file_runs(batch: pa.RecordBatch) -> Iterator[tuple[str, pa.RecordBatch]]:
    """``batch`` (sorted by source file) split where the file changes, file column dropped."""
    names = batch.column(SOURCE_FILE_COLUMN).to_numpy(zero_copy_only=False)
    rest = batch.drop_columns([SOURCE_FILE_COLUMN])
    if len(names) == 0:
        return
    cuts = [0, *(np.flatnonzero(names[1:] != names[:-1]) + 1).tolist(), len(names)]
    for a, b in itertools.pairwise(cuts):
        yield str(names[a]), rest.slice(a, b - a)


def _canonical_shards(done: list[MDSCommitMessage], canonical_files: list[str]) -> ShardRecords:
    """The tasks' shards in dataset order: partition order, or for a canonical write
    (pinned Delta read) by (file's place in the snapshot, piece within the file), which no
    partitioning can change."""
    entries: list[tuple[tuple[int, str, int, int], ShardInfo, str, dict[str, str]]] = []
    place = {name: i for i, name in enumerate(canonical_files)}
    for m in done:
        stored = m.stored_hashes or [{} for _ in m.shards]
        pieces: dict[str, int] = {}
        for i, shard in enumerate(m.shards):
            if m.files is None:
                key = (-1, "", m.partition, i)
            else:
                name = m.files[i]
                piece = pieces[name] = pieces.get(name, -1) + 1
                key = (place.get(name, len(place)), name, piece, 0)
            entries.append((key, shard, m.content_hashes[i], stored[i]))
    entries.sort(key=lambda e: e[0])
    return ShardRecords([e[1] for e in entries], [e[2] for e in entries], [e[3] for e in entries])


def _delta_fields(options: Mapping[str, str], schema: pa.Schema) -> dict[str, pa.Field]:
    """The Delta log's fields (option ``delta_schema``, set by the client for a pinned read)
    for the columns whose type equals the written one but for nullability: Spark reads
    Parquet as all-nullable, the table's NOT NULL columns and fields are not."""
    text = options.get("delta_schema")
    if not text:
        return {}
    try:
        delta = schema_from_text(text)
    except Exception as exc:
        raise SpecError(f"option 'delta_schema' is not a serialized Arrow schema: {exc}") from None
    out = {}
    for f in delta:
        if f.name in schema.names and _loose(f.type) == _loose(schema.field(f.name).type):
            out[f.name] = f
    return out


def _loose(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field nullable: types compared regardless of nullability."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _loose(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(t.key_type, pa.field(t.item_field.name, _loose(t.item_type)))
    if pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _loose(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(pa.field(t.value_field.name, _loose(t.value_type)))
    return t


def _with_fields(batch: pa.RecordBatch, fields: dict[str, pa.Field]) -> pa.RecordBatch:
    """``batch`` with the Delta log's fields for the columns in ``fields`` (same values).

    A value that breaks the log's NOT NULL is refused, naming the column and field."""
    arrays, out = [], []
    for f, col in zip(batch.schema, batch.columns):
        given = fields.get(f.name)
        if given is not None:
            _check_not_null(col, given, f.name)
            f, col = given, col if col.type == given.type else _relabelled(col, given.type)
        arrays.append(col)
        out.append(f)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(out))


def _check_not_null(array: pa.Array, f: pa.Field, where: str) -> None:
    """Nulls where ``f`` (or a field inside it) is NOT NULL, under valid parents only
    (a null struct's children are null in Spark's Arrow, and mean nothing)."""
    if not f.nullable and array.null_count:
        raise EncodingError(where, "null value(s) where the Delta table's log says NOT NULL")
    if pa.types.is_struct(f.type):
        valid = pc.is_valid(array) if array.null_count else None
        for i, child_field in enumerate(f.type):
            child = array.field(i)
            _check_not_null(
                child if valid is None else child.filter(valid),
                child_field,
                f"{where}.{child_field.name}",
            )
    elif pa.types.is_list(f.type) or pa.types.is_large_list(f.type):
        _check_not_null(array.flatten(), f.type.value_field, f"{where}[]")


def _relabelled(array: pa.Array, type_: pa.DataType) -> pa.Array:
    """``array`` as ``type_``, a type that differs only in nested nullability: the same
    buffers, handed over through the C data interface. (A cast or view refuses the nulls
    Spark leaves in the children of null structs.)"""
    _, capsule = array.__arrow_c_array__()
    return pa.Array._import_from_c_capsule(pa.field("", type_).__arrow_c_schema__(), capsule)


def _align(batch: pa.RecordBatch, plans: list[ColumnPlan]) -> pa.RecordBatch:
    """Cast equivalent types (e.g. a timestamp's zone name) to the dataset's."""
    schema = pa.schema([pa.field(p.name, p.arrow_type, nullable=p.nullable) for p in plans])
    if batch.schema.equals(schema):
        return batch
    return conform(batch.select([p.name for p in plans]), schema)


def _check_plans(path: str, want: list[ColumnPlan], got: list[ColumnPlan]) -> None:
    for a, b in zip(want, got):
        if (a.name, a.encoding) != (b.name, b.encoding):
            raise SpecError(
                f"write to {path}: a task encoded column {b.name!r} as {b.encoding!r}, "
                f"expected {a.encoding!r}"
            )
