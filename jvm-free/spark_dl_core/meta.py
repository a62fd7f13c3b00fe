"""Our metadata beside ``index.json``: column plans, ``spark_dl.json``, the fingerprint.

``spark_dl.json`` records what MDS cannot: each column's Arrow type and null mask, the
spec, lineage, per-shard content hashes (the fingerprint's input) and per-shard hashes of
the stored files (checked on first read). :func:`read_meta` is the only reader of it: every
reader and writer goes through it, so all of them see the same committed dataset, also
after a commit torn between its metadata writes (see :mod:`spark_dl_core.commit`).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ._version import __version__
from .errors import DatasetError, NotOurDatasetError, SpecError
from .format.encodings import get_encoding, infer_encoding
from .format.index import INDEX_FILE, META_FILE, PREVIOUS_META_FILE, ShardInfo, parse_index
from .format.shard import Layout
from .indexing import read_compact
from .spec import NULL_SUFFIX, DatasetSpec
from .storage import Store
from .transforms import check_transforms

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
        if spec.nulls == "mask" and f.nullable and encoding not in ("json", "pkl"):
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
    payload = {
        "spec": spec.canonical(),
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
                dataclasses.replace(info, shapes=m["shapes"]) if m.get("shapes") else info
                for info, m in zip(shards, entries)
            ],
            [str(m["content_hash"]) for m in entries],
            [dict(m.get("stored_hashes") or {}) for m in entries],
        )


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
    }


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
    try:
        meta = json.loads(store.read_bytes(name))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{store.display(name)}: not valid JSON ({exc})") from None
    if (
        not isinstance(meta, dict)
        or meta.get("format") != META_FORMAT
        or not isinstance(meta.get("shards"), list)
        or not all(isinstance(m, dict) and "basename" in m for m in meta["shards"])
    ):
        raise DatasetError(f"{store.display(name)}: not a spark-dl metadata file")
    return meta


def _basenames(shards: list[ShardInfo]) -> list[str]:
    return [s.stored.basename for s in shards]


def _describes(meta: dict[str, Any], names: list[str]) -> bool:
    return [m["basename"] for m in meta["shards"]] == names


def read_meta(
    store: Store, compact: bool = False, cache_dir: str | None = None
) -> Committed | None:
    """The committed dataset at ``store``, or None when it has no ``index.json``.

    ``spark_dl.json`` counts only if it lists exactly the index's shards. A commit writes
    it before the index and keeps the replaced one as ``spark_dl.prev.json`` until the
    index lands; a reader that finds the new metadata beside the old index (a torn commit)
    uses the previous file instead. An overwrite racing between our two reads is retried.
    ``compact``: take the shards from the compact index when there is one (see
    :mod:`spark_dl_core.indexing`; ``shards`` is then a lazy ShardTable).
    """
    error: DatasetError | None = None
    for _ in range(3):
        if not store.exists(INDEX_FILE):
            return None
        found = read_compact(store, cache_dir) if compact else None
        text: bytes | None = None
        if found is not None:
            shards: Any = found.shards
            names = found.basenames
        else:
            text = store.read_bytes(INDEX_FILE)
            shards = parse_index(text, store.display(INDEX_FILE))
            names = functools.partial(_basenames, shards)
        try:
            current = _meta_file(store, META_FILE)
        except DatasetError as exc:  # a damaged file still has the fallback below
            current, error = None, exc
        else:
            if current is None:
                return Committed(shards, None, text, None, found)
            if _describes(current, names()):
                return Committed(shards, current, text, META_FILE, found)
        previous = _meta_file(store, PREVIOUS_META_FILE)
        if previous is not None and _describes(previous, names()):
            return Committed(shards, previous, text, PREVIOUS_META_FILE, found)
        if error is not None:
            raise error
    raise DatasetError(f"{store.display()}: spark_dl.json does not match index.json")
