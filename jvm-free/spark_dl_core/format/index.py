"""``index.json`` (Mosaic's, field for field) and ``spark_dl.json`` (ours, beside it)."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from ..errors import DatasetError, MetadataError

INDEX_FILE = "index.json"
META_FILE = "spark_dl.json"
# The metadata of the dataset being replaced, kept until the new index lands, so a commit
# torn between the two metadata writes still leaves the old dataset readable.
PREVIOUS_META_FILE = "spark_dl.prev.json"
INDEX_VERSION = 2


@dataclass(frozen=True)
class FileInfo:
    basename: str
    bytes: int
    hashes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"basename": self.basename, "bytes": self.bytes, "hashes": dict(self.hashes)}


@dataclass(frozen=True)
class ShardInfo:
    """One entry of ``index.json``'s ``shards`` list, as Mosaic's MDSWriter writes it."""

    samples: int
    raw_data: FileInfo
    zip_data: FileInfo | None
    column_names: list[str]
    column_encodings: list[str]
    column_sizes: list[int | None]
    compression: str | None = None
    hashes: list[str] = field(default_factory=list)
    size_limit: int | None = None
    # spark_dl.json only (never index.json): the one shape of each variable ndarray column's
    # values in this shard, None where they differ; readers choose dense output from it.
    shapes: dict[str, list[int] | None] | None = field(default=None, compare=False)
    # spark_dl.json only: each list-of-integers column's values in this shard (its token
    # documents' total length), so a packed loader counts rows without reading the shard.
    values: dict[str, int] | None = field(default=None, compare=False)
    # spark_dl.json only: the file beside the shard holding each of those columns' per-row
    # lengths (:mod:`.doc_lengths`), so a packed loader plans ``bin`` rows without the shard.
    lengths: FileInfo | None = field(default=None, compare=False)

    def config(self) -> dict[str, Any]:
        """The writer configuration Mosaic embeds in every shard and repeats in the index."""
        return shard_config(
            self.column_names,
            self.column_encodings,
            self.column_sizes,
            self.compression,
            self.hashes,
            self.size_limit,
        )

    def to_json(self) -> dict[str, Any]:
        out = self.config()
        out["raw_data"] = self.raw_data.to_json()
        out["samples"] = self.samples
        out["zip_data"] = self.zip_data.to_json() if self.zip_data else None
        return out

    @property
    def stored(self) -> FileInfo:
        """The file actually on storage (compressed if compression was used)."""
        return self.zip_data or self.raw_data

    def files(self) -> list[str]:
        """Every file of this shard on storage: the shard, and its lengths file if any (what a
        commit keeps, an overwrite replaces and an aborted write deletes)."""
        return [self.stored.basename] + ([self.lengths.basename] if self.lengths else [])


def shard_config(
    column_names: list[str],
    column_encodings: list[str],
    column_sizes: list[int | None],
    compression: str | None,
    hashes: list[str],
    size_limit: int | None,
) -> dict[str, Any]:
    """The one definition of a shard's writer configuration (in the shard and the index)."""
    return {
        "column_encodings": column_encodings,
        "column_names": column_names,
        "column_sizes": column_sizes,
        "compression": compression,
        "format": "mds",
        "hashes": hashes,
        "size_limit": size_limit,
        "version": INDEX_VERSION,
    }


def shard_config_bytes(config: dict[str, Any]) -> bytes:
    return json.dumps(config, sort_keys=True).encode()


def index_text(shards: list[ShardInfo]) -> str:
    return json.dumps(
        {"shards": [s.to_json() for s in shards], "version": INDEX_VERSION}, sort_keys=True
    )


def check_basename(name: object, where: str) -> str:
    """A shard path must stay inside the dataset: relative, no '..', no scheme."""
    if not isinstance(name, str) or not name:
        raise DatasetError(f"{where}: shard basename {name!r} is not a file name")
    normal = posixpath.normpath(name)
    if (
        name.startswith(("/", "\\"))
        or "\\" in name
        or ":" in name
        or normal.startswith("..")
        or "/../" in f"/{name}/"
        or normal != name
    ):
        raise DatasetError(f"{where}: shard basename {name!r} points outside the dataset")
    return name


_MAX_INT = 1 << 62  # counts and sizes beyond this are not real (and overflow int64 sums)


def _count(value: Any) -> TypeGuard[int]:
    """A JSON integer in range (``true`` is not 1 here)."""
    return type(value) is int and 0 <= value < _MAX_INT


def column_lists(
    names: Any, encodings: Any, sizes: Any
) -> tuple[list[str], list[str], list[int | None]] | None:
    """Column names, encodings and sizes as read from JSON (a shard's in ``index.json``, the
    compact index's config), or None unless they are three lists of one length, names and
    encodings strings, each size None (variable) or a count. One check, so both indexes
    accept the same columns."""
    if (
        isinstance(names, list)
        and isinstance(encodings, list)
        and isinstance(sizes, list)
        and len(names) == len(encodings) == len(sizes)
        and all(isinstance(n, str) for n in names + encodings)
        and all(z is None or _count(z) for z in sizes)
    ):
        return names, encodings, sizes
    return None


def _file_info(obj: Any, source: str, where: str) -> FileInfo:
    if not isinstance(obj, dict):
        raise MetadataError(source, f"expected an object, got {type(obj).__name__}", where)
    size = obj.get("bytes")
    hashes = obj.get("hashes") or {}
    if not _count(size):
        raise MetadataError(source, f"malformed size {size!r}", f"{where}.bytes")
    if not isinstance(hashes, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in hashes.items()
    ):
        raise MetadataError(source, f"malformed hashes {hashes!r}", f"{where}.hashes")
    return FileInfo(check_basename(obj.get("basename"), f"{source} {where}"), size, dict(hashes))


def parse_index(text: str | bytes, source: str) -> list[ShardInfo]:
    """Validate and parse an ``index.json``; errors (:class:`MetadataError`) name ``source``
    and the field (``shards[3].samples``), and every value is type- and range-checked
    before it is used."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise MetadataError(source, f"not valid JSON ({exc})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("shards"), list):
        raise MetadataError(source, "no 'shards' list; is this an MDS dataset?", "shards")
    if obj.get("version") != INDEX_VERSION or type(obj.get("version")) is not int:
        raise MetadataError(source, f"index version {obj.get('version')!r}, expected 2", "version")
    shards = []
    for i, entry in enumerate(obj["shards"]):
        where = f"shards[{i}]"
        if not isinstance(entry, dict):
            raise MetadataError(source, "expected an object", where)
        if entry.get("format") != "mds":
            raise MetadataError(source, f"{entry.get('format')!r} is not 'mds'", f"{where}.format")
        columns = column_lists(
            entry.get("column_names"), entry.get("column_encodings"), entry.get("column_sizes")
        )
        if columns is None:
            raise MetadataError(
                source, "column_names/encodings/sizes are malformed", f"{where}.column_names"
            )
        names, encodings, sizes = columns
        samples = entry.get("samples")
        if not _count(samples):
            raise MetadataError(source, f"malformed sample count {samples!r}", f"{where}.samples")
        raw_info = _file_info(entry.get("raw_data"), source, f"{where}.raw_data")
        if 4 * (samples + 2) > raw_info.bytes:
            raise MetadataError(
                source,
                f"{samples} samples cannot fit in a shard of {raw_info.bytes} bytes",
                f"{where}.samples",
            )
        zip_entry = entry.get("zip_data")
        compression, hashes, limit = (
            entry.get("compression"),
            entry.get("hashes") or [],
            entry.get("size_limit"),
        )
        if not (compression is None or isinstance(compression, str)):
            raise MetadataError(source, f"malformed {compression!r}", f"{where}.compression")
        if not isinstance(hashes, list) or not all(isinstance(h, str) for h in hashes):
            raise MetadataError(source, f"malformed {hashes!r}", f"{where}.hashes")
        if not (limit is None or _count(limit)):
            raise MetadataError(source, f"malformed {limit!r}", f"{where}.size_limit")
        shards.append(
            ShardInfo(
                samples=samples,
                raw_data=raw_info,
                zip_data=_file_info(zip_entry, source, f"{where}.zip_data") if zip_entry else None,
                column_names=list(names),
                column_encodings=list(encodings),
                column_sizes=sizes,
                compression=compression,
                hashes=list(hashes),
                size_limit=limit,
            )
        )
    return shards
