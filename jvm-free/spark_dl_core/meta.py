"""Our metadata beside ``index.json``: column plans, ``spark_dl.json``, the fingerprint.

``spark_dl.json`` records what MDS cannot: each column's Arrow type and null mask, the
spec, lineage, per-shard content hashes (the fingerprint's input) and per-shard hashes of
the stored files (checked on first read). :func:`read_meta` is the only reader of it: every
reader and writer goes through it, so all of them see the same committed dataset, also
after a commit torn between its metadata writes (see :mod:`spark_dl_core.commit`).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as _dt
import functools
import hashlib
import json
import warnings
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
import pyarrow as pa
import xxhash
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ._version import __version__
from .errors import (
    DatasetError,
    EncodingError,
    MetadataError,
    NotOurDatasetError,
    SparkDLError,
    SpecError,
)
from .format.buffers import Jagged
from .format.compact import COMPACT_FILE, index_digest
from .format.encodings import (
    get_encoding,
    infer_encoding,
    json_loses_types,
    json_value_as_py,
)
from .format.index import (
    INDEX_FILE,
    META_FILE,
    PREVIOUS_META_FILE,
    FileInfo,
    ShardInfo,
    check_basename,
    index_text,
    parse_index,
)
from .format.shard import Layout
from .ops.transforms import check_transforms
from .spec import NULL_SUFFIX, DatasetSpec
from .store.indexing import read_compact
from .store.storage import Store

META_FORMAT = "spark-dl"


@dataclass(frozen=True)
class ColumnPlan:
    """What one stored column is: its name, Arrow type, encoding and null mask, if any."""

    name: str
    arrow_type: pa.DataType
    encoding: str
    null_mask: str | None = None  # name of the companion "<name>__isnull" column
    nullable: bool = True  # as the source schema declared it


def check_unique_columns(names: list[str], what: str) -> None:
    """Refuse two columns of one name (Arrow allows them; a dataset's columns are keys)."""
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SpecError(
            f"{what} has column {twice[0]!r} {names.count(twice[0])} times; column names "
            "must be unique (rename or drop the others before writing)"
        )


def plan_columns(schema: pa.Schema, spec: DatasetSpec) -> list[ColumnPlan]:
    """Choose each column's encoding: the spec's, else one inferred from its Arrow type."""
    check_unique_columns(schema.names, "the data")
    check_transforms(spec.transforms, schema.names, "read")  # recorded read ops must apply
    unknown = set(spec.columns) - set(schema.names)
    if unknown:
        raise SpecError(
            f"spec names column(s) {sorted(unknown)} that the data lacks (columns: {schema.names})"
        )
    plans = []
    for f in schema:
        encoding = spec.columns.get(f.name) or infer_encoding(f)
        mask = None
        if spec.nulls == "mask" and f.nullable and not get_encoding(encoding).holds_nulls:
            mask = f.name + NULL_SUFFIX
            if mask in schema.names:
                raise SpecError(f"column {mask!r} collides with the null mask of {f.name!r}")
        plans.append(ColumnPlan(f.name, f.type, encoding, mask, f.nullable))
    return plans


def column_names(value: Any, setting: str = "columns") -> list[str] | None:
    """A ``columns=`` argument as a list of names: a list or tuple of names, one name as a
    string (never its letters), None for all; anything else is refused naming the type."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        bad = [c for c in value if not isinstance(c, str)]
        if not bad:
            return list(value)
        raise SpecError(f"{setting}: column names are strings, got {bad[0]!r} in {value!r}")
    raise SpecError(
        f"{setting} must be a list or tuple of column names (or one name), "
        f"not {type(value).__name__}"
    )


def plans_schema(plans: list[ColumnPlan]) -> pa.Schema:
    """The Arrow schema the plans store (before null masks are added)."""
    return pa.schema([pa.field(p.name, p.arrow_type, nullable=p.nullable) for p in plans])


def stored_layout(plans: list[ColumnPlan]) -> Layout:
    """The MDS columns the plans produce: each column, then its null mask if it has one."""
    names: list[str] = []
    encodings = []
    for p in plans:
        names.append(p.name)
        encodings.append(get_encoding(p.encoding))
        if p.null_mask:
            names.append(p.null_mask)
            encodings.append(get_encoding("uint8"))
    return Layout(tuple(names), tuple(encodings))


def schema_to_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_text(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def plans_from_meta(meta: dict[str, Any]) -> list[ColumnPlan]:
    schema = schema_from_text(meta["arrow_schema"])
    cols = meta["columns"]
    return [
        ColumnPlan(
            f.name, f.type, cols[f.name]["encoding"], cols[f.name].get("null_mask"), f.nullable
        )
        for f in schema
    ]


def fingerprint(spec: DatasetSpec, plans: list[ColumnPlan], content_hashes: list[str]) -> str:
    """Changes iff the stored content or the spec changes (not with lineage or time).

    The stored-file hashes are left out on purpose: they follow from content and spec, and
    leaving them out keeps the fingerprints of datasets written before they existed.
    """
    return _fingerprint(spec.canonical(), plans, content_hashes)


def _fingerprint(spec: dict[str, Any], plans: list[ColumnPlan], content_hashes: list[str]) -> str:
    payload = {
        "spec": spec,
        "columns": [[p.name, str(p.arrow_type), p.encoding, p.null_mask] for p in plans],
        "shards": content_hashes,
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class ShardRecords:
    """Index entries plus what our metadata records per shard, kept in step."""

    shards: list[ShardInfo]
    content_hashes: list[str]  # xxh3-128 of each raw (uncompressed) shard
    stored_hashes: list[dict[str, str]]  # {algorithm: hex} of each stored file ({} if unknown)

    @classmethod
    def empty(cls) -> ShardRecords:
        return cls([], [], [])

    def __add__(self, other: ShardRecords) -> ShardRecords:
        return ShardRecords(
            self.shards + other.shards,
            self.content_hashes + other.content_hashes,
            self.stored_hashes + other.stored_hashes,
        )

    @classmethod
    def from_meta(cls, shards: list[ShardInfo], meta: dict[str, Any]) -> ShardRecords:
        """A committed dataset's records (``meta`` must describe ``shards``), with each
        shard's recorded shapes, so an append keeps them (and dense columns stay dense)."""
        entries = meta["shards"]
        return cls(
            [
                dataclasses.replace(
                    info,
                    shapes=m.get("shapes") or info.shapes,
                    values=m.get("values"),
                    lengths=lengths_info(m),
                )
                for info, m in zip(shards, entries)
            ],
            [str(m["content_hash"]) for m in entries],
            [dict(m.get("stored_hashes") or {}) for m in entries],
        )


def lengths_info(entry: dict[str, Any]) -> FileInfo | None:
    """The lengths file a ``spark_dl.json`` shard entry names (None: not recorded)."""
    got = entry.get("lengths")
    if not got:
        return None
    return FileInfo(str(got["basename"]), int(got["bytes"]), dict(got.get("hashes") or {}))


def shard_files(committed: Committed) -> set[str]:
    """Every file a committed dataset's shards have on storage: the shards and, where our
    metadata names them, their lengths files."""
    names = {s.stored.basename for s in committed.shards}
    if committed.meta is not None:
        names.update(f.basename for m in committed.meta["shards"] if (f := lengths_info(m)))
    return names


def build_meta(
    spec: DatasetSpec,
    plans: list[ColumnPlan],
    records: ShardRecords,
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The content of ``spark_dl.json`` for a dataset of ``records``."""
    shards = []
    for info, content, stored in zip(records.shards, records.content_hashes, records.stored_hashes):
        entry: dict[str, Any] = {
            "basename": info.stored.basename,
            "samples": info.samples,
            "content_hash": content,
        }
        if stored:
            entry["stored_hashes"] = dict(stored)
        if info.shapes:  # each variable ndarray column's one shape (readers pick dense)
            entry["shapes"] = info.shapes
        if info.values:  # each list-of-integers column's values (a packed loader's tokens)
            entry["values"] = dict(info.values)
        if info.lengths is not None:  # and each row's, in a file beside the shard
            entry["lengths"] = info.lengths.to_json()
        shards.append(entry)
    return {
        "format": META_FORMAT,
        "format_version": 1,
        "writer": f"spark-dl-core {__version__}",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "spec": spec.canonical(),
        "arrow_schema": schema_to_text(plans_schema(plans)),
        "columns": {
            p.name: {
                "encoding": p.encoding,
                "arrow_type": str(p.arrow_type),
                "null_mask": p.null_mask,
            }
            for p in plans
        },
        "shards": shards,
        "num_samples": sum(s.samples for s in records.shards),
        "fingerprint": fingerprint(spec, plans, records.content_hashes),
        "source": source or {},
        # the index.json this metadata goes with: a reader checks it before trusting either
        "index_digest": index_digest(index_text(records.shards).encode()),
    }


def _meta_digest(meta: dict[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != "digest"}
    return str(xxhash.xxh3_128_hexdigest(json.dumps(body, sort_keys=True).encode()))


def meta_bytes(meta: dict[str, Any]) -> bytes:
    """``spark_dl.json``'s bytes, sealed with a digest of the content (``meta`` gets it too),
    checked by :func:`read_meta` before any value is used."""
    meta["digest"] = _meta_digest(meta)
    return json.dumps(meta, indent=1, sort_keys=True).encode()


# --------------------------------------------------------------------------- the model

_Count = Annotated[int, Field(ge=0, lt=1 << 62)]
_Dim = Annotated[int, Field(ge=0, lt=1 << 31)]


class _Strict(BaseModel):
    # strict: "5" is not 5; extra fields (from newer writers) are kept and sealed by the digest
    model_config = ConfigDict(strict=True, extra="allow")


class _LengthsEntry(_Strict):
    basename: str
    bytes: _Count
    hashes: dict[str, str] = Field(default_factory=dict)


class _ShardEntry(_Strict):
    basename: str
    samples: _Count
    content_hash: str
    stored_hashes: dict[str, str] | None = None
    shapes: dict[str, Annotated[list[_Dim], Field(max_length=32)] | None] | None = None
    values: dict[str, _Count] | None = None  # absent in files written before it existed
    lengths: _LengthsEntry | None = None  # the values' per-row lengths file (since 0.x: absent)


class _ColumnEntry(_Strict):
    encoding: str
    arrow_type: str = ""
    null_mask: str | None = None


class MetaFile(_Strict):
    """The fields of ``spark_dl.json`` and their types, as :func:`read_meta` checks them."""

    format: Literal["spark-dl"]
    format_version: Literal[1]
    writer: str = ""
    created: str = ""
    spec: dict[str, Any]
    arrow_schema: str
    columns: dict[str, _ColumnEntry]
    shards: list[_ShardEntry]
    num_samples: _Count
    fingerprint: str
    source: dict[str, Any] = Field(default_factory=dict)
    index_digest: str | None = None  # absent in files written before it existed
    digest: str | None = None


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def _check_meta(meta: Any, shown: str) -> dict[str, Any]:
    """Every check of ``spark_dl.json``'s content, each failure a MetadataError naming
    the file and the field; the parsed dict is returned unchanged."""
    if not isinstance(meta, dict):
        raise MetadataError(shown, f"expected an object, got {type(meta).__name__}")
    if "digest" in meta and meta["digest"] != _meta_digest(meta):
        raise MetadataError(shown, "does not match the file's content (corrupted)", "digest")
    try:
        model = MetaFile.model_validate(meta)
    except ValidationError as exc:
        err = exc.errors()[0]
        message = str(err.get("msg", "invalid"))
        raise MetadataError(shown, message, _field(err.get("loc", ()))) from None
    try:
        DatasetSpec(**model.spec)
    except (SparkDLError, TypeError, ValueError) as exc:
        raise MetadataError(shown, str(exc), "spec") from None
    try:
        plans = plans_from_meta(meta)
    except (binascii.Error, ValueError, OSError, KeyError, pa.ArrowException) as exc:
        raise MetadataError(
            shown, f"does not describe the columns ({exc})", "arrow_schema"
        ) from None
    if sorted(p.name for p in plans) != sorted(model.columns):
        raise MetadataError(shown, "names other columns than arrow_schema", "columns")
    for p in plans:
        try:
            get_encoding(p.encoding)
        except (SparkDLError, ValueError) as exc:
            raise MetadataError(shown, str(exc), f"columns.{p.name}.encoding") from None
    hashes = [m.content_hash for m in model.shards]
    if _fingerprint(meta["spec"], plans, hashes) != model.fingerprint:
        raise MetadataError(shown, "does not match the spec, columns and shards", "fingerprint")
    if model.num_samples != sum(m.samples for m in model.shards):
        raise MetadataError(shown, "is not the sum of the shards' samples", "num_samples")
    for i, m in enumerate(model.shards):
        if m.lengths is None:
            continue
        where = f"shards.{i}.lengths"
        if not m.values:
            raise MetadataError(shown, "names a lengths file but no columns of values", where)
        try:
            check_basename(m.lengths.basename, f"{shown} {where}")
        except DatasetError as exc:
            raise MetadataError(shown, str(exc), f"{where}.basename") from None
    return meta


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Committed:
    """The dataset a store holds: its index entries, our metadata (None for a dataset
    another writer made) and the index's text, read as one consistent state."""

    shards: list[ShardInfo]
    meta: dict[str, Any] | None
    index_text: bytes | None  # None: read from the compact index, index.json not parsed
    meta_file: str | None  # which file the metadata came from (the fallback after a tear)
    compact: Any = None  # the CompactIndex the shards came from (read_meta(compact=True))

    @property
    def records(self) -> ShardRecords:
        """Our per-shard records; only for datasets with our metadata."""
        if self.meta is None:
            raise NotOurDatasetError("per-shard records need spark_dl.json")
        return ShardRecords.from_meta(self.shards, self.meta)


def _meta_file(store: Store, name: str) -> dict[str, Any] | None:
    if not store.exists(name):
        return None
    shown = store.display(name)
    try:
        meta = json.loads(store.read_bytes(name))
    except (ValueError, RecursionError) as exc:
        raise MetadataError(shown, f"not valid JSON ({exc})") from None
    return _check_meta(meta, shown)


def _basenames(shards: list[ShardInfo]) -> list[str]:
    return [s.stored.basename for s in shards]


def _describes(meta: dict[str, Any], names: Any, index_id: str) -> bool:
    """Whether ``meta`` is the metadata of the index read (its digest ``index_id``)."""
    if meta.get("index_digest") is not None:
        return bool(meta["index_digest"] == index_id)
    return [m["basename"] for m in meta["shards"]] == names()


def _check_samples(meta: dict[str, Any], shards: Any, shown: str) -> None:
    counts = shards.samples if hasattr(shards, "samples") else [s.samples for s in shards]
    recorded = np.fromiter((m["samples"] for m in meta["shards"]), np.int64, len(meta["shards"]))
    if len(recorded) != len(counts) or not np.array_equal(recorded, np.asarray(counts)):
        raise MetadataError(shown, "sample counts differ from the index's", "shards")


def _compact_if_any(store: Store, cache_dir: str | None) -> Any:
    """The compact index when one is there and sound (None otherwise), without warnings."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return read_compact(store, cache_dir) if store.exists(COMPACT_FILE) else None
    except DatasetError:
        return None


def read_meta(
    store: Store, compact: bool = False, cache_dir: str | None = None
) -> Committed | None:
    """The committed dataset at ``store``, or None when it has no ``index.json``.

    ``spark_dl.json`` counts only if it describes the index read: the index digest it
    records matches (older files: it lists exactly the index's shards). A commit writes
    it before the index and keeps the replaced one as ``spark_dl.prev.json`` until the
    index lands; a reader that finds the new metadata beside the old index (a torn commit)
    uses the previous file instead. An overwrite racing between our two reads is retried.
    ``compact``: take the shards from the compact index when there is one (see
    :mod:`spark_dl_core.store.indexing`; ``shards`` is then a lazy ShardTable). A damaged compact
    index is passed over with a warning only when ``index.json`` matches the digest our
    metadata records; otherwise its :class:`MetadataError` is raised. Every file is checked
    before its values are used; each failure is a :class:`MetadataError` naming the file.
    """
    error: DatasetError | None = None
    compact_shown = store.display(COMPACT_FILE)
    for _ in range(3):
        if not store.exists(INDEX_FILE):
            return None
        damaged: MetadataError | None = None
        found = None
        if compact:
            try:
                found = read_compact(store, cache_dir)
            except MetadataError as exc:
                if exc.file != compact_shown:
                    raise
                damaged = exc
        text: bytes | None = None
        if found is not None:
            shards: Any = found.shards
            names = found.basenames
            index_id = found.index_digest
        else:
            text = store.read_bytes(INDEX_FILE)
            shards = parse_index(text, store.display(INDEX_FILE))
            names = functools.partial(_basenames, shards)
            index_id = index_digest(text)
        chosen: tuple[dict[str, Any], str] | None = None
        try:
            current = _meta_file(store, META_FILE)
        except DatasetError as exc:  # a damaged file still has the fallback below
            current, error = None, exc
        if current is not None and _describes(current, names, index_id):
            chosen = (current, META_FILE)
        elif current is not None or error is not None:
            previous = _meta_file(store, PREVIOUS_META_FILE)
            if previous is not None and _describes(previous, names, index_id):
                chosen = (previous, PREVIOUS_META_FILE)
            elif error is not None:
                raise error
            else:
                continue
        meta, meta_file = chosen if chosen else (None, None)
        if damaged is not None:
            if meta is None or meta.get("index_digest") is None:
                raise MetadataError(
                    damaged.file,
                    f"{damaged.detail}; index.json cannot be "
                    f"checked without spark_dl.json's index digest. Rebuild it with "
                    f"`spark-dl index {store.display()}` (or delete it to read index.json)",
                    damaged.field,
                )
            warnings.warn(
                f"{damaged}; reading index.json, which matches spark_dl.json. Rebuild it "
                f"with `spark-dl index {store.display()}`",
                UserWarning,
                stacklevel=2,
            )
        if meta is None and found is None and damaged is None and not compact:
            found = _compact_if_any(store, cache_dir)  # does it record spark_dl.json?
        if found is not None and found.meta_fingerprint is not None:
            if meta is None:
                raise MetadataError(
                    store.display(META_FILE),
                    "is missing; the compact index records the dataset's spark-dl metadata",
                )
            if meta.get("fingerprint") != found.meta_fingerprint:
                raise MetadataError(
                    store.display(str(meta_file)),
                    f"differs from the one the compact index records ({found.meta_fingerprint})",
                    "fingerprint",
                )
        if meta is not None:
            _check_samples(meta, shards, store.display(str(meta_file)))
        return Committed(shards, meta, text, meta_file, found if compact else None)
    raise MetadataError(
        store.display(META_FILE), "does not describe index.json", field="index_digest"
    )


# ------------------------------------------------------- decoded values, recorded types


def python_types(plans: list[ColumnPlan] | None, batch: dict[str, Any]) -> dict[str, Any]:
    """A decoded batch with the recorded Python types where the stored bytes lose them:
    booleans (stored as uint8) as numpy ``bool_``; inside lists, structs and maps (stored
    as JSON), map keys that are not strings as their values, empty maps as ``{}``, and
    bytes, decimals, dates, times and timestamps (stored as text) as Arrow's ``as_py``
    gives them. Every reader of decoded samples (the batch reader, ``ds[i]``) passes its
    batches through this."""
    for plan in plans or []:
        value = batch.get(plan.name)
        if value is None:
            continue
        if _leaf(plan.arrow_type) == pa.bool_():
            batch[plan.name] = _as_bool(value)
        elif (
            json_loses_types(plan.arrow_type)
            and isinstance(value, np.ndarray)
            and value.dtype == object
        ):
            out = np.empty(len(value), dtype=object)
            try:
                out[:] = [json_value_as_py(v, plan.arrow_type) for v in value]
            except UnicodeEncodeError:
                raise EncodingError(
                    plan.name, "a stored bytes value holds a character above U+00FF"
                ) from None
            except (ValueError, ArithmeticError) as exc:  # pyarrow's ArrowInvalid is one
                raise EncodingError(
                    plan.name, f"a stored value is not of its type {plan.arrow_type}: {exc}"
                ) from None
            batch[plan.name] = out
    return batch


def _leaf(t: pa.DataType) -> pa.DataType:
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return t


def _as_bool(value: Any) -> Any:
    if isinstance(value, Jagged):
        return Jagged(_as_bool(value.values), value.offsets)
    if isinstance(value, np.ndarray) and value.dtype == np.uint8:
        return value.view(np.bool_)
    if isinstance(value, np.ndarray) and value.dtype == object:
        out = np.empty(len(value), dtype=object)
        out[:] = [_as_bool(v) for v in value]
        return out
    return value
