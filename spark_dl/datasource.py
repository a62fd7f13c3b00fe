"""The ``mds`` Python Data Source: Spark writes and reads MDS datasets.

Bytes are the core's business (:class:`spark_dl_core.ShardWriter`, :class:`Dataset`); this
module only plans Spark's side: each write task encodes its partition's Arrow batches into
shards under a task-attempt-unique prefix and reports them; the driver's ``commit`` merges
the reports, in partition order, into one index (written last, atomically). ``abort`` and
``commit`` both delete every file of this job that the index does not name, so failed and
speculative attempts leave nothing behind; after its index, ``commit`` also vacuums files of
earlier jobs older than the retention (see :mod:`spark_dl_core.maintenance`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import re
import uuid
import warnings
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import DataType, StructField, StructType, UserDefinedType

from spark_dl_core import DatasetSpec, ShardWriter, open_dataset
from spark_dl_core.commit import (
    finish_write,
    normalize_mode,
    plan_write,
    written_schema,
)
from spark_dl_core.errors import DatasetError, EncodingError, SpecError
from spark_dl_core.format.index import ShardInfo
from spark_dl_core.maintenance import DEFAULT_RETENTION_SECONDS, vacuum_store
from spark_dl_core.meta import (
    ColumnPlan,
    ShardRecords,
    plan_columns,
    read_meta,
    schema_from_text,
    schema_to_text,
)
from spark_dl_core.ops.arrow import arrow_schema, batch_to_arrow
from spark_dl_core.store.storage import Store

from .mixture_source import MIXTURE_READ_OPTIONS, MixtureReader, mixture_schema
from .types import conform, spark_arrow_schema, to_spark_schema, utc_timestamps

FORMAT = "mds"
# Lineage column the client adds for a pinned Delta read (see :func:`_canonical_frame`): the
# data file each row came from. Write tasks cut shards at its changes and drop it.
SOURCE_FILE_COLUMN = "__spark_dl_source_file"
_ROW_INDEX_COLUMN = "__spark_dl_row_index"
SPEC_OPTIONS = ("compression", "shard_size", "hashes", "nulls", "columns", "spec")
_READ_ROWS = 8192  # rows per Arrow batch a read task yields (bounded memory)


# --------------------------------------------------------------------------- options

# Every option the source understands (keys arrive lowercased); prefixes take any suffix.
WRITE_OPTIONS = frozenset(
    {
        "path",
        *SPEC_OPTIONS,
        "save_mode",
        "vector_dtype",
        "vacuum_retention",
        "source",
        "canonical_files",
        "delta_schema",
    }
)
READ_OPTIONS = frozenset(
    {"path", "shards_per_partition", "verify_hashes", "allow_unsafe", *MIXTURE_READ_OPTIONS}
)
OPTION_PREFIXES = ("encoding.", "storage.")
# Table properties Spark's catalog adds to a ``CREATE TABLE … USING mds`` table's options
# (its reserved keys): not ours to check; ``location`` is the table's path.
CATALOG_KEYS = frozenset(
    {"owner", "location", "provider", "comment", "external", "is_managed_location", "collation"}
)
MIN_SANE_SHARD_SIZE = 16 << 10  # below this nearly every sample gets a shard file of its own


def validate_options(options: Mapping[str, str], kind: Literal["read", "write"]) -> None:
    """Refuse what would otherwise be silently ignored or misread: unknown option names
    (with the closest known one), booleans other than true/false, ints out of range."""
    import difflib

    known = WRITE_OPTIONS if kind == "write" else READ_OPTIONS
    other = READ_OPTIONS if kind == "write" else WRITE_OPTIONS
    for raw in options:
        key = raw.lower()
        if key in known or key.startswith(OPTION_PREFIXES):
            continue
        if kind == "read" and key in CATALOG_KEYS:
            continue
        close = difflib.get_close_matches(key, sorted(known | other), n=1, cutoff=0.6)
        if key in other:
            hint = f"; {key!r} is a {'read' if kind == 'write' else 'write'} option"
        elif close:
            hint = f"; did you mean {close[0]!r}?"
        else:
            hint = f"; known: {', '.join(sorted(known))}, {OPTION_PREFIXES[0]}<column>, " + (
                f"{OPTION_PREFIXES[1]}<key>"
            )
        raise SpecError(f"unknown {kind} option {raw!r} for format('mds'){hint}")
    lowered = {k.lower(): v for k, v in options.items()}
    for key in ("verify_hashes", "allow_unsafe"):
        if key in lowered:
            bool_option(lowered, key)
    if "shards_per_partition" in lowered:
        int_option(lowered, "shards_per_partition", 1, 1, 1 << 20)
    if lowered.get("vector_dtype", "float64") not in ("float64", "float32"):
        raise SpecError(
            f"option 'vector_dtype' must be float64 or float32, got {lowered['vector_dtype']!r}"
        )
    retention = lowered.get("vacuum_retention", "").strip().lower()
    if retention and retention not in ("off", "none", "false", "-1"):
        try:
            ok = float(retention) >= 0
        except ValueError:
            ok = False
        if not ok:
            raise SpecError(
                "option 'vacuum_retention' must be seconds (0 or more) or 'off', "
                f"got {lowered['vacuum_retention']!r}"
            )


def bool_option(options: Mapping[str, str], key: str, default: bool = False) -> bool:
    """``true`` / ``false`` (any case); anything else is an error naming the option."""
    text = options.get(key)
    if text is None:
        return default
    value = str(text).strip().lower()
    if value not in ("true", "false"):
        raise SpecError(f"option {key!r} must be true or false, got {text!r}")
    return value == "true"


def int_option(options: Mapping[str, str], key: str, default: int, low: int, high: int) -> int:
    """An integer in ``[low, high]``; anything else is an error naming the option."""
    text = options.get(key)
    if text is None:
        return default
    try:
        value = int(str(text).strip())
    except ValueError:
        raise SpecError(f"option {key!r} must be an integer, got {text!r}") from None
    if not low <= value <= high:
        raise SpecError(f"option {key!r} must be between {low} and {high}, got {value}")
    return value


def spec_from_options(options: dict[str, str], schema_names: Sequence[str] = ()) -> DatasetSpec:
    """A :class:`DatasetSpec` from data source options (keys arrive lowercased).

    ``spec`` is a whole spec as JSON; the other keys override its fields. ``columns`` is a
    JSON object (column names keep their case there); ``encoding.<column>`` options are
    matched to ``schema_names`` case-insensitively, since Spark lowercases option keys.
    """
    opts = {k.lower(): v for k, v in options.items()}
    fields: dict[str, Any] = _json_option(opts, "spec", dict) or {}
    for key in ("compression", "shard_size", "nulls"):
        if key in opts:
            fields[key] = opts[key] or None if key == "compression" else opts[key]
    if "shard_size" in fields and str(fields["shard_size"]).isdigit():
        fields["shard_size"] = int(fields["shard_size"])
    if "hashes" in opts:
        text = opts["hashes"].strip()
        fields["hashes"] = (
            _json_option(opts, "hashes", list)
            if text.startswith("[")
            else [h.strip() for h in text.split(",") if h]
        )
    columns = dict(fields.get("columns") or {})
    if opts.get("columns"):
        try:
            columns.update(json.loads(opts["columns"]))
        except json.JSONDecodeError as exc:
            raise SpecError(
                f"option 'columns' must be a JSON object like '{{\"image\": \"jpeg\"}}': {exc}"
            ) from None
    for key, value in opts.items():
        if key.startswith("encoding."):
            columns[_encoding_column(key[len("encoding.") :], schema_names)] = value
    if columns:
        fields["columns"] = columns
    spec = DatasetSpec(**fields)
    if "shard_size" in opts and spec.shard_size < MIN_SANE_SHARD_SIZE:
        warnings.warn(
            f"spark-dl: shard_size={opts['shard_size']} is {spec.shard_size} bytes, below "
            f"{MIN_SANE_SHARD_SIZE >> 10}KiB: nearly every sample gets a shard file of its own "
            "(MDS shards are usually tens of MiB)",
            stacklevel=2,
        )
    return spec


def _encoding_column(name: str, schema_names: Sequence[str]) -> str:
    """The column an ``encoding.<name>`` option means. Spark lowercases option keys, so
    the name is matched case-insensitively; two columns matching it (``a`` and ``A``) are
    refused rather than one picked."""
    matches = [n for n in schema_names if n.lower() == name.lower()]
    if len(matches) > 1:
        raise SpecError(
            f"option 'encoding.{name}' matches columns {matches}: Spark lowercases option "
            "keys, so it cannot say which; give the encodings in the 'spec' option instead "
            f'(JSON keeps the case: {{"columns": {{"{matches[0]}": "..."}}}}) or '
            "the 'columns' option"
        )
    return matches[0] if matches else name


def _has_spec_options(options: dict[str, str]) -> bool:
    return any(k.lower() in SPEC_OPTIONS or k.lower().startswith("encoding.") for k in options)


def _storage_options(options: Mapping[str, str]) -> dict[str, Any]:
    """``storage.<key>`` options, passed to fsspec (``storage.key``, ``storage.secret``,
    ``storage.endpoint_url``…): Spark tasks do not see the client's environment."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key.lower().startswith("storage."):
            out[key[len("storage.") :]] = value
    for key in ("endpoint_url", "region_name"):  # botocore client settings, for s3fs
        if key in out:
            out.setdefault("client_kwargs", {})[key] = out.pop(key)
    return out


def _path(options: Mapping[str, str]) -> str:
    """The dataset's path: the ``path`` option, or a catalog table's ``location``."""
    path = options.get("path") or options.get("location")
    if path and path.startswith("file:/") and not path.startswith("file://"):
        return path[len("file:") :]  # Hadoop's form of a local URI, as the catalog gives it
    if path:
        return path
    if not options:  # what a catalog table declared with columns reads with
        raise DatasetError(
            "the mds data source got no path and no options at all: Spark passes neither "
            "the LOCATION nor the OPTIONS of a table declared with a column list "
            "(CREATE TABLE t (id BIGINT, ...) USING mds ...) to a Python data source; leave "
            "the column list out (CREATE TABLE t USING mds LOCATION '/path': the columns "
            "come from the dataset) or use CREATE TEMPORARY VIEW t USING mds OPTIONS "
            "(path '/path')"
        )
    raise DatasetError("the mds data source needs a path: .save(path) / .load(path)")


# --------------------------------------------------------------------------- vectors


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


# --------------------------------------------------------------------------- writing


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
                store.delete(info.stored.basename)
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
    return {s.stored.basename for s in committed.shards} if committed else set()


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


def _json_option(options: Mapping[str, str], key: str, kind: type) -> Any:
    """Option ``key`` parsed as JSON of type ``kind``, or None when absent."""
    text = options.get(key)
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"option {key!r} must be JSON ({kind.__name__}): {exc}") from None
    if not isinstance(value, kind):
        raise SpecError(f"option {key!r} must be a JSON {kind.__name__}, got {text[:80]!r}")
    return value


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


# --------------------------------------------------------------------------- reading


class ShardGroup(InputPartition):
    """A read partition: some consecutive shards, named so a changed dataset is noticed."""

    def __init__(self, shards: list[int], basenames: list[str]) -> None:
        super().__init__(shards)
        self.shards = shards
        self.basenames = basenames


class MDSReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.path = _path(options)
        self.storage_options = _storage_options(options)
        self.shards_per_partition = int_option(options, "shards_per_partition", 1, 1, 1 << 20)
        # unset: each shard checked once (the core's default); true: every hash; false: none
        self.verify = bool_option(options, "verify_hashes") if "verify_hashes" in options else None
        self.allow_unsafe = bool_option(options, "allow_unsafe")
        self.columns, self.names = _asked_columns(self.path, self._open(), schema)
        self.nullable = [f.nullable for f in schema.fields]

    def _open(self) -> Any:
        return open_dataset(
            self.path, allow_unsafe=self.allow_unsafe, storage_options=self.storage_options
        )

    def partitions(self) -> Sequence[InputPartition]:
        ds = self._open()
        n = ds.num_shards
        step = self.shards_per_partition
        groups = [list(range(i, min(n, i + step))) for i in range(0, n, step)]
        return [ShardGroup(g, [ds.shards[i].stored.basename for i in g]) for g in groups] or [
            ShardGroup([], [])
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ShardGroup)
        if not partition.shards:
            return
        ds = self._open()
        names = [ds.shards[i].stored.basename for i in partition.shards]
        if names != partition.basenames:
            raise DatasetError(f"{self.path} changed while it was being read; read it again")
        schema = spark_arrow_schema(arrow_schema(ds, self.columns))
        if self.names is not None:  # the asked schema's spelling of each name
            schema = pa.schema(
                [
                    f.with_name(n).with_nullable(null)
                    for f, n, null in zip(schema, self.names, self.nullable)
                ]
            )
        stored = None
        if self.columns is not None:
            masks = {p.name: p.null_mask for p in ds.plans or [] if p.null_mask}
            stored = [*self.columns, *(masks[c] for c in self.columns if c in masks)]
        for i in partition.shards:
            data = ds.load_shard(i, verify_hashes=self.verify)
            n = ds.shards[i].samples
            for start in range(0, n, _READ_ROWS):
                index = np.arange(start, min(n, start + _READ_ROWS))
                decoded = ds.decode(data, index, columns=stored)
                batch = batch_to_arrow(ds, decoded, columns=self.columns)
                if self.names is not None:
                    batch = batch.rename_columns(self.names)
                yield conform(batch, schema)


def _asked_columns(
    path: str, ds: Any, asked: StructType
) -> tuple[list[str] | None, list[str] | None]:
    """The stored columns a user-given read schema (``.schema("id long")``) selects, and its
    spelling of their names; ``(None, None)`` for the dataset's own schema. A column the
    dataset lacks, or a type other than the stored one, is refused naming it."""
    full = to_spark_schema(arrow_schema(ds))
    if [(f.name, f.dataType) for f in asked.fields] == [(f.name, f.dataType) for f in full]:
        return None, None
    by_name = {f.name: f for f in full.fields}
    by_lower = {f.name.lower(): f for f in full.fields}
    columns = []
    for f in asked.fields:
        stored = by_name.get(f.name) or by_lower.get(f.name.lower())
        if stored is None:
            raise SpecError(
                f"{path}: the read schema asks for column {f.name!r}, which the dataset "
                f"does not have (columns: {full.names})"
            )
        if stored.dataType.simpleString() != f.dataType.simpleString():
            raise SpecError(
                f"{path}: the read schema gives column {f.name!r} type "
                f"{f.dataType.simpleString()}, the dataset stores "
                f"{stored.dataType.simpleString()}: leave .schema() out or use that type"
            )
        columns.append(stored.name)
    return columns, [f.name for f in asked.fields]


TABLE_OPTIONS_KEY = "spark_dl.table_options"  # field metadata carrying a catalog table's options


def _with_table_options(schema: StructType, options: Mapping[str, str]) -> StructType:
    """``schema`` with a catalog table's read options (path included, ``storage.*`` keys
    left out: they may be secrets) in its first field's metadata. Spark stores the schema
    in the catalog and hands it to every later reader, but passes those readers no options
    at all, so this is how a ``CREATE TABLE t USING mds LOCATION '…'`` table finds its data."""
    if not schema.fields:
        return schema
    kept = {
        k.lower(): v
        for k, v in options.items()
        if k.lower() not in CATALOG_KEYS and not k.lower().startswith("storage.")
    }
    kept["path"] = _path(options)
    first = schema.fields[0]
    meta = {**(first.metadata or {}), TABLE_OPTIONS_KEY: json.dumps(kept, sort_keys=True)}
    fields = [StructField(first.name, first.dataType, first.nullable, meta), *schema.fields[1:]]
    return StructType(fields)


def _unprefixed(options: Mapping[str, str]) -> dict[str, str]:
    """Options with keys lowercased and a catalog table's ``option.`` prefix (how Spark
    hands over ``CREATE TABLE … OPTIONS (…)``) taken off."""
    out = {k.lower(): v for k, v in options.items()}
    if "provider" in out:
        for key in [k for k in out if k.startswith("option.")]:
            out.setdefault(key[len("option.") :], out.pop(key))
    return out


def _reader_options(options: Mapping[str, str], schema: StructType) -> dict[str, str]:
    """The options a reader runs with: its own, or (a catalog table's read, which gets
    none) those its table's schema carries (see :func:`_with_table_options`)."""
    if options or not schema.fields:
        return dict(options)
    carried = (schema.fields[0].metadata or {}).get(TABLE_OPTIONS_KEY)
    return dict(json.loads(carried)) if carried else {}


class MDSDataSource(DataSource):
    """``format("mds")``: MDS datasets (spark-dl's or Mosaic Streaming's) as Spark tables."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        options = _unprefixed(self.options)
        validate_options(options, "read")
        if "mixture" in options:  # a saved mixture: one epoch's rows (mixture_source)
            schema = mixture_schema(options)
        else:
            ds = open_dataset(_path(options), storage_options=_storage_options(options))
            schema = to_spark_schema(arrow_schema(ds))
        if "provider" in options:  # a catalog table being created
            schema = _with_table_options(schema, options)
        return schema

    def reader(self, schema: StructType) -> DataSourceReader:
        options = _reader_options(self.options, schema)
        validate_options(options, "read")
        if "mixture" in options:
            return MixtureReader(options, schema)
        return MDSReader(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> MDSWriter:
        validate_options(self.options, "write")
        return MDSWriter(dict(self.options), schema, overwrite)


# --------------------------------------------------------------------------- save modes


def _wrap_writer_class(cls: Any) -> None:
    """Record format/mode/path options on ``cls`` and give ``save`` Spark's default modes.

    PySpark rejects every save mode but append and overwrite for Python data sources, so
    a plain ``df.write.format("mds").save(path)`` would fail. For ``mds`` only, error and
    ignore are decided here, on the client, from the dataset at ``path``; the write then
    runs as append with option ``save_mode`` set, and the driver's commit checks again
    (a dataset that appeared meanwhile fails an ``error`` write, nothing is replaced).
    """
    if getattr(cls, "_spark_dl_wrapped", False):
        return
    orig_mode, orig_format, orig_option, orig_save = cls.mode, cls.format, cls.option, cls.save
    orig_options = cls.options

    def mode(self: Any, saveMode: str | None) -> Any:
        if saveMode is not None:
            self._spark_dl_mode = saveMode
        return orig_mode(self, saveMode)

    def format(self: Any, source: str) -> Any:
        self._spark_dl_format = source
        return orig_format(self, source)

    def option(self: Any, key: str, value: Any) -> Any:
        if value is not None:
            recorded = self.__dict__.setdefault("_spark_dl_options", {})
            recorded[key.lower()] = str(value)
        return orig_option(self, key, value)

    def options(self: Any, **opts: Any) -> Any:
        recorded = self.__dict__.setdefault("_spark_dl_options", {})
        recorded.update({k.lower(): str(v) for k, v in opts.items() if v is not None})
        return orig_options(self, **opts)

    def save(
        self: Any,
        path: str | None = None,
        format: str | None = None,
        mode: str | None = None,
        partitionBy: Any = None,
        **options: Any,
    ) -> None:
        fmt = format or getattr(self, "_spark_dl_format", None)
        if fmt is None or fmt.lower() != FORMAT:
            return orig_save(self, path, format, mode, partitionBy, **options)
        chosen = normalize_mode(mode or getattr(self, "_spark_dl_mode", None))
        recorded = {**getattr(self, "_spark_dl_options", {}), **options}
        extra: dict[str, str] = {}
        spark_mode = chosen
        if chosen in ("error", "ignore"):
            target = path or recorded.get("path")
            if not target:
                raise DatasetError("the mds data source needs a path: .save(path)")
            # the core's policy: error raises DatasetExistsError, ignore plans a skip
            if plan_write(Store(target, _storage_options(recorded)), chosen, None).skip:
                return None
            extra["save_mode"] = chosen
            spark_mode = "append"
        writer = _lineage_writer(self, recorded, extra)
        if writer is None:
            for key, value in extra.items():
                orig_option(self, key, value)
            writer = self
        with _explain_unregistered():
            return orig_save(writer, path, format, spark_mode, partitionBy, **options)

    def _lineage_writer(self: Any, recorded: dict[str, str], extra: dict[str, str]) -> Any:
        """Lineage (option ``source``) and canonical order for a pinned Delta read.

        Returns a writer over the canonically ordered DataFrame, or None to write ``self``
        as it is (``extra`` then gains the ``source`` option when lineage is known).
        """
        frame = _written_frame(self)
        if frame is None:
            return None
        from .delta import canonical_files, delta_fields, source_option

        if "source" not in recorded:
            found = source_option(frame)
            if found is not None:
                extra["source"] = found
        if "delta_schema" not in recorded:
            fields = delta_fields(frame)
            if fields is not None:
                extra["delta_schema"] = schema_to_text(fields)
        files = canonical_files(frame)
        if not files or "canonical_files" in recorded:
            return None
        ordered = _canonical_frame(frame)
        if ordered is None:
            return None
        writer = orig_format(ordered.write, FORMAT)
        return orig_options(writer, **recorded, **extra, canonical_files=json.dumps(list(files)))

    wrapped = {"mode": mode, "format": format, "option": option, "options": options, "save": save}
    for name, fn in wrapped.items():
        fn.__doc__ = getattr(cls, name).__doc__
        fn.__name__ = name
        setattr(cls, name, fn)
    cls._spark_dl_wrapped = True


NOT_REGISTERED = (
    "the 'mds' data source is not registered on this Spark session: Spark finds it by "
    "itself only where spark-dl is installed for the Python that Spark runs (its "
    "pyspark_spark_dl module); otherwise call spark_dl.register(spark) once the session exists"
)

# Sessions this process registered the source on (``register_source`` is then a no-op).
_REGISTERED: weakref.WeakSet[Any] = weakref.WeakSet()


def register_source(spark: Any, *, force: bool = False) -> Any:
    """Register the ``mds`` source on ``spark`` (classic or Connect) unless the session has
    it already: an installed spark-dl is registered by PySpark's discovery hook
    (``pyspark_spark_dl``), and registering again makes Spark WARN that it replaced a
    registered source. ``force=True`` registers regardless (new code after a reload)."""
    if force or (spark not in _REGISTERED and not _session_has_source(spark)):
        spark.dataSource.register(MDSDataSource)
    with contextlib.suppress(TypeError):  # a session type without weak references
        _REGISTERED.add(spark)
    return spark


def _session_has_source(spark: Any) -> bool:
    """Whether a classic session already knows ``mds`` (discovered or registered); a Spark
    Connect client cannot ask, so there the source is registered (the server logs it)."""
    try:
        manager = spark._jsparkSession.sessionState().dataSourceManager()
        return bool(manager.dataSourceExists(FORMAT))
    except Exception:  # Spark Connect (no JVM here), or a Spark without the manager
        return False


@contextlib.contextmanager
def _explain_unregistered() -> Iterator[None]:
    """Spark's bare DATA_SOURCE_NOT_FOUND for ``mds`` becomes an error saying what to do."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        unknown = "DATA_SOURCE_NOT_FOUND" in text or "DATA_SOURCE_NOT_EXIST" in text
        if unknown and re.search(r"\bmds\b", text[:2000], re.IGNORECASE):
            raise DatasetError(NOT_REGISTERED) from exc
        raise


def _wrap_reader_class(cls: Any) -> None:
    """``spark.read.format("mds").load(...)`` on a session without the source: explained.
    (Spark Connect resolves lazily; there the first action raises Spark's own error.)"""
    if getattr(cls, "_spark_dl_wrapped", False):
        return
    orig_load = cls.load

    def load(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _explain_unregistered():
            return orig_load(self, *args, **kwargs)

    load.__doc__ = orig_load.__doc__
    load.__name__ = "load"
    cls.load = load
    cls._spark_dl_wrapped = True


def _written_frame(writer: Any) -> Any:
    """The DataFrame a (classic or Connect) ``DataFrameWriter`` writes, or None."""
    df = getattr(writer, "_df", None)
    if df is None:
        return None
    if hasattr(df, "schema"):  # classic: the DataFrame itself
        return df
    spark = getattr(writer, "_spark", None)
    if spark is None:
        return None
    from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame

    return ConnectDataFrame(df, spark)  # Connect: the writer holds the plan


def _canonical_frame(df: Any) -> Any:
    """``df`` with every data file's rows in one partition, in file row order, and a
    column naming the file: what lets each task cut shards at file boundaries and the
    commit order them by the snapshot's file order, whatever Spark's file splitting and
    packing did (``maxPartitionBytes``, parallelism). None when rows cannot name their
    file (the plan does not read files directly)."""
    from pyspark.sql import functions as F

    try:
        keyed = df.withColumn(SOURCE_FILE_COLUMN, F.col("_metadata.file_name")).withColumn(
            _ROW_INDEX_COLUMN, F.col("_metadata.row_index")
        )
        keyed.schema  # noqa: B018 - resolve now: a plan without file metadata fails here
    except Exception as exc:
        warnings.warn(
            f"spark-dl: rows of this pinned Delta read cannot name their data file ({exc}); "
            "writing in Spark's partition order, which depends on parallelism",
            stacklevel=4,
        )
        return None
    return (
        keyed.repartition(F.col(SOURCE_FILE_COLUMN))
        .sortWithinPartitions(SOURCE_FILE_COLUMN, _ROW_INDEX_COLUMN)
        .drop(_ROW_INDEX_COLUMN)
    )


def install_save_modes() -> None:
    """Apply :func:`_wrap_writer_class` to the classic and Spark Connect writers."""
    from pyspark.sql.readwriter import DataFrameReader, DataFrameWriter

    _wrap_writer_class(DataFrameWriter)
    _wrap_reader_class(DataFrameReader)
    try:
        from pyspark.sql.connect.readwriter import DataFrameReader as ConnectReader
        from pyspark.sql.connect.readwriter import DataFrameWriter as ConnectWriter
    except ImportError:  # Connect's extra dependencies (grpc) are not installed
        return
    _wrap_writer_class(ConnectWriter)
    _wrap_reader_class(ConnectReader)
