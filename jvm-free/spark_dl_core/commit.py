"""The one save-mode policy and the one commit, for every writer (core, Spark, CLI).

A write is planned against the dataset committed at its path (:func:`plan_write`: refuse it,
skip it, append to it after checking for drift, or replace it), its shards are written
under names no reader looks at, and it becomes visible in :func:`finish_write`, which looks
at the path again (another job may have committed meanwhile) and calls
:func:`commit_dataset`. :func:`abort_write` deletes what a failed write left.

The commit point is ``index.json``: ``spark_dl.json`` is written first, and the metadata of
the dataset being replaced stays as ``spark_dl.prev.json`` until the index has landed, so a
commit torn in between leaves the previous dataset readable (:func:`meta.read_meta`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import pyarrow as pa

from .errors import (
    DatasetExistsError,
    FollowError,
    NotOurDatasetError,
    SchemaDriftError,
    SpecError,
)
from .format.index import META_FILE, PREVIOUS_META_FILE, index_text
from .meta import (
    ColumnPlan,
    Committed,
    ShardRecords,
    build_meta,
    check_unique_columns,
    meta_bytes,
    plans_from_meta,
    read_meta,
    shard_files,
)
from .ops.transforms import apply_transforms
from .spec import DatasetSpec, planned_spec
from .store.indexing import commit_index
from .store.storage import Store
from .versions import held_versions

WriteMode = Literal["error", "overwrite", "append", "ignore"]
WRITE_MODES: tuple[WriteMode, ...] = ("error", "overwrite", "append", "ignore")
# Spark's names for the same modes (DataFrameWriter.mode accepts all of these).
MODE_ALIASES: dict[str, WriteMode] = {
    "errorifexists": "error",
    "default": "error",
    **{m: m for m in WRITE_MODES},
}


def normalize_mode(mode: str | None, default: WriteMode = "error") -> WriteMode:
    """``mode`` as one of :data:`WRITE_MODES` (Spark's aliases accepted, any case)."""
    if mode is None:
        return default
    key = str(mode).strip().lower()
    if key not in MODE_ALIASES:
        raise SpecError(
            f"save mode {mode!r}: expected one of {sorted(MODE_ALIASES)}",
        )
    return MODE_ALIASES[key]


def new_prefix() -> str:
    """A shard-name prefix no earlier write used: old files stay until the new index lands."""
    return f"shard-{uuid.uuid4().hex[:12]}"


# --------------------------------------------------------------------------- drift


def same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Equal, or timestamps that differ only in the zone's name (``UTC`` / ``Etc/UTC``)."""
    if a == b:
        return True
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b):
        return a.unit == b.unit and (a.tz is None) == (b.tz is None)
    return False


def written_schema(schema: pa.Schema, spec: DatasetSpec) -> pa.Schema:
    """The schema shards store for input ``schema``: after the spec's write transforms."""
    if not spec.transforms:
        return schema
    empty = pa.RecordBatch.from_pylist([], schema=schema)
    return apply_transforms(empty, spec.transforms, "write").schema


def check_spec_drift(
    shown: str, dataset_spec: DatasetSpec, given: DatasetSpec, plans: list[ColumnPlan]
) -> None:
    """Refuse an append whose spec sets a field to something else than the dataset has.

    Only fields the caller set count (``model_fields_set``): an append that names no
    compression keeps the dataset's, one that names another is refused.
    """
    for key in sorted(given.model_fields_set - {"columns"}):
        mine, theirs = getattr(given, key), getattr(dataset_spec, key)
        if mine != theirs:
            raise SchemaDriftError(
                f"append to {shown}: {key}={mine!r} differs from the dataset's {theirs!r}",
                field=key,
            )
    encodings = {p.name: p.encoding for p in plans}
    for name, enc in given.columns.items():
        if encodings.get(name, enc) != enc:
            raise SchemaDriftError(
                f"append to {shown}: column {name!r} encoding {enc!r} differs from "
                f"the dataset's {encodings[name]!r}",
                column=name,
                field="columns",
            )


def check_schema_drift(shown: str, plans: list[ColumnPlan], schema: pa.Schema) -> None:
    """Refuse appended data whose columns (names, types, order) differ from the dataset's."""
    stored = {p.name: p for p in plans}
    for name in [*stored, *schema.names]:
        if name not in schema.names:
            raise SchemaDriftError(
                f"append to {shown}: column {name!r} is missing from the data", column=name
            )
        if name not in stored:
            raise SchemaDriftError(
                f"append to {shown}: column {name!r} is not in the dataset", column=name
            )
        got = schema.field(name).type
        if not same_type(stored[name].arrow_type, got):
            raise SchemaDriftError(
                f"append to {shown}: column {name!r} has type {got}, "
                f"the dataset stores {stored[name].arrow_type}",
                column=name,
            )
    if list(stored) != list(schema.names):
        raise SchemaDriftError(
            f"append to {shown}: columns are in order {schema.names}, "
            f"the dataset stores {list(stored)}"
        )


# --------------------------------------------------------------------------- plan


@dataclass
class WritePlan:
    """What a write will do, decided before any shard is written."""

    store: Store
    mode: WriteMode
    spec: DatasetSpec  # the spec shards are written with (the dataset's, on append)
    existing: Committed | None
    skip: bool = False  # mode "ignore" and a dataset is there: write nothing
    plans: list[ColumnPlan] | None = None  # fixed columns (append), else from the data
    source: dict[str, Any] | None = None  # lineage kept from the dataset (append)
    fresh: bool = False  # nothing at all at the path yet (plain shard names are safe)

    @property
    def appending(self) -> bool:
        return self.mode == "append" and self.existing is not None

    def shard_prefix(self) -> str:
        return "shard" if self.fresh else new_prefix()


def plan_write(
    store: Store,
    mode: str | None,
    spec: DatasetSpec | None,
    *,
    schema: pa.Schema | None = None,
) -> WritePlan:
    """Decide a write at ``store``: refuse (error), skip (ignore), append or replace.

    ``spec`` is what the caller asked for (None: the default spec, or the dataset's on
    append); on append, fields it sets must equal the dataset's and ``schema`` (the
    input's, when known) must match the stored columns, else :class:`SchemaDriftError`.
    """
    chosen = normalize_mode(mode)
    shown = store.display()
    blocking = store.blocking_file()
    if blocking is not None:
        raise SpecError(
            f"cannot write a dataset at {shown}: {store.redact(blocking)} is a file, and a "
            "dataset is a directory; give a directory path (new or holding a dataset)"
        )
    if schema is not None:
        check_unique_columns(schema.names, f"the data written to {shown}")
    held = held_versions(store)
    if held:  # its root index may be absent or older than what open_dataset reads
        raise FollowError(
            f"{shown} follows a Delta table (it holds versions {held}): a {chosen!r} write "
            "would not be what open_dataset reads there; update it with mode='update' from "
            "the table, or write to another path",
            path=shown,
            held=held,
        )
    existing = read_meta(store)
    given = spec if spec is not None else DatasetSpec()
    if existing is not None and chosen == "error":
        raise DatasetExistsError(
            f"an MDS dataset already exists at {shown}; "
            "write with mode 'overwrite' (replace it) or 'append'"
        )
    if existing is not None and chosen == "ignore":
        return WritePlan(store, chosen, given, existing, skip=True)
    given = planned_spec(given, schema)
    if existing is None:
        return WritePlan(store, chosen, given, None, fresh=not store.listdir())
    if chosen == "overwrite":
        return WritePlan(store, chosen, given, existing)
    if existing.meta is None:
        raise NotOurDatasetError(
            f"{shown} was not written by spark-dl (no spark_dl.json); cannot append"
        )
    dataset_spec = DatasetSpec(**existing.meta["spec"])
    plans = plans_from_meta(existing.meta)
    check_spec_drift(shown, dataset_spec, given, plans)
    if schema is not None:
        check_schema_drift(shown, plans, written_schema(schema, dataset_spec))
    source = existing.meta.get("source") or None
    return WritePlan(store, chosen, dataset_spec, existing, plans=plans, source=source)


# --------------------------------------------------------------------------- commit


@dataclass
class Outcome:
    """What :func:`finish_write` made visible (``meta`` is None when nothing was written)."""

    meta: dict[str, Any] | None
    records: ShardRecords = field(default_factory=ShardRecords.empty)


def finish_write(
    plan: WritePlan,
    plans: list[ColumnPlan],
    written: ShardRecords,
    source: dict[str, Any] | None = None,
) -> Outcome:
    """Commit ``written`` as ``plan`` says, after looking at the path once more.

    A dataset that appeared since :func:`plan_write` fails an ``error`` write and is left
    alone by ``ignore``; an append goes after whatever is committed now. The new shards are
    deleted whenever they are not committed.
    """
    store = plan.store
    current = read_meta(store)
    new_names = [name for s in written.shards for name in s.files()]
    if plan.skip or (current is not None and plan.mode == "ignore"):
        abort_write(store, new_names)
        return Outcome(current.meta if current else None)
    if current is not None and plan.mode == "error":
        abort_write(store, new_names)
        raise DatasetExistsError(f"an MDS dataset appeared at {store.display()} during the write")
    records = written
    replaced: list[str] = []
    lineage = source or plan.source
    if current is not None and plan.mode == "append":
        if current.meta is None:
            abort_write(store, new_names)
            raise NotOurDatasetError(
                f"{store.display()} was not written by spark-dl (no spark_dl.json); cannot append"
            )
        records = current.records + written
        if not lineage:
            lineage = current.meta.get("source") or None
    elif current is not None:
        replaced = sorted(shard_files(current))
    meta = commit_dataset(store, plan.spec, plans, records, lineage, replaced, current=current)
    return Outcome(meta, records)


def abort_write(store: Store, names: Iterable[str]) -> None:
    """Delete files a write made that no index will name (never raises for missing ones)."""
    for name in names:
        store.delete(name)


def commit_dataset(
    store: Store,
    spec: DatasetSpec,
    plans: list[ColumnPlan],
    records: ShardRecords,
    source: dict[str, Any] | None = None,
    replaced: Iterable[str] = (),
    *,
    current: Committed | None = None,
) -> dict[str, Any]:
    """Make a dataset visible: ``spark_dl.json``, then ``index.json`` (the commit point).

    The metadata of the dataset now committed (``current``, read if not given) is kept as
    ``spark_dl.prev.json`` until the index lands. Files in ``replaced`` (an overwritten
    dataset's shards) are deleted afterwards. ``source`` is lineage for ``spark_dl.json``.
    """
    if current is None:
        current = read_meta(store)
    meta = build_meta(spec, plans, records, source)
    if current is not None and current.meta is not None:
        previous = json.dumps(current.meta, indent=1, sort_keys=True).encode()
        store.write_bytes(PREVIOUS_META_FILE, previous)
    store.write_bytes(META_FILE, meta_bytes(meta))
    # index.json, then its compact index (which records this metadata's fingerprint)
    commit_index(store, index_text(records.shards).encode(), meta["fingerprint"])
    store.delete(PREVIOUS_META_FILE)  # committed: the fallback is no longer needed
    keep = {name for s in records.shards for name in s.files()}
    for name in replaced:
        if name not in keep:
            store.delete(name)
    return meta


def spec_for(spec: DatasetSpec | dict[str, Any] | None) -> DatasetSpec | None:
    """A caller's spec argument as a :class:`DatasetSpec` (None stays None)."""
    if spec is None or isinstance(spec, DatasetSpec):
        return spec
    return DatasetSpec(**cast(dict[str, Any], spec))
