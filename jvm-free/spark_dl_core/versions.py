"""The versions a dataset that follows a table holds: one sealed manifest per version.

A followed dataset (see :mod:`spark_dl_core.tables.parquet.follow`; a Delta table's
versions, an Iceberg table's snapshots by sequence number) keeps, beside its shards,
``_follow/v<version>.json`` for each table version it was updated to. A manifest is
self-contained: the ``spark_dl.json`` and ``index.json`` of that version, the data files it
was built from (each with its shards and deletion vector), and, for files whose deletion
vector changed after their shards were written, *virtual shards*: the shards a fresh export
would cut from the rows still live, each a list of runs of samples of shards on disk,
assembled in memory when read. Creating the manifest is the version's commit point, and it
is created only if absent (:meth:`Store.create_new`): two updaters cannot both commit it.

This module reads, checks and writes manifests and assembles virtual shards; nothing here
knows Delta. Every manifest is checked (digest, fields, its metadata and index) before a
value of it is used.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from .errors import DatasetError, FollowError, MetadataError, SpecError
from .format.buffers import I64, Pieces, offsets_from_lengths
from .format.compact import index_digest
from .format.index import ShardInfo, parse_index
from .format.shard import build_shard
from .meta import _check_meta
from .store.storage import Store

FOLLOW_DIR = "_follow"
FOLLOW_FORMAT = "spark-dl-follow"
_NAME = re.compile(r"^v(\d{20})\.json$")

# a virtual shard's piece: (stored basename of a shard on disk, its stored and raw sizes,
# the first sample taken and the one after the last)
Piece = tuple[str, int, int, int, int]


def manifest_name(version: int) -> str:
    return f"{FOLLOW_DIR}/v{version:020d}.json"


def held_versions(store: Store) -> list[int]:
    """The table versions the dataset at ``store`` holds, oldest first ([] if not followed)."""
    sub = Store(store.path(FOLLOW_DIR), store.storage_options)
    found = (_NAME.match(name) for name in sub.listdir())
    return sorted(int(m.group(1)) for m in found if m)


def is_followed(store: Store) -> bool:
    return bool(held_versions(store))


def _digest(manifest: dict[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k != "digest"}
    return str(xxhash.xxh3_128_hexdigest(json.dumps(body, sort_keys=True).encode()))


def write_version(store: Store, manifest: dict[str, Any]) -> bool:
    """Commit one version's manifest, sealed; False when that version is already held."""
    manifest["format"] = FOLLOW_FORMAT
    manifest["digest"] = _digest(manifest)
    data = json.dumps(manifest, sort_keys=True).encode()
    return store.create_new(manifest_name(int(manifest["version"])), data)


def drop_version(store: Store, version: int) -> None:
    store.delete(manifest_name(version))


@dataclass(frozen=True)
class HeldVersion:
    """One held version, checked: its manifest, metadata, index entries and virtual shards."""

    version: int
    manifest: dict[str, Any]
    meta: dict[str, Any]
    shards: list[ShardInfo]
    index_text: bytes
    virtual: dict[str, list[Piece]]

    @property
    def table(self) -> str:
        return str(self.manifest["table"])

    @property
    def files(self) -> list[dict[str, Any]]:
        return list(self.manifest["files"])


def version_number(value: Any, call: str) -> int | None:
    """A table version given as an argument (``call`` names the call, e.g.
    ``open_delta('t')``): an int, or its digits in a string (``"3"``, as Spark's
    ``versionAsOf`` takes it); None stays None. Anything else is a :class:`SpecError` naming
    the argument and the accepted forms."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise SpecError(
        f"{call}: version={value!r} is not a table version; give a whole number >= 0 (an "
        "int such as 3, or its digits as a string such as '3')"
    )


def read_version(store: Store, version: int | None = None) -> HeldVersion | None:
    """Version ``version`` of the followed dataset at ``store`` (None: the latest held);
    None when the dataset follows no table. A version not held is a :class:`FollowError`
    naming the versions held."""
    held = held_versions(store)
    if not held:
        if version is None:
            return None
        raise FollowError(
            f"{store.display()} does not follow a Delta table (no {FOLLOW_DIR}/ versions), so "
            f"it has no version {version}; open it without version=",
            path=store.display(),
            asked=version,
        )
    chosen = held[-1] if version is None else version
    if chosen not in held:
        raise FollowError(
            f"{store.display()} holds table versions {held}, not {chosen} (never updated to "
            "it, or vacuumed): open one of those with version=, or leave version= out for "
            "the latest",
            path=store.display(),
            held=held,
            asked=chosen,
        )
    return _parse(store, chosen)


def _parse(store: Store, version: int) -> HeldVersion:
    name = manifest_name(version)
    shown = store.display(name)
    try:
        manifest = json.loads(store.read_bytes(name))
    except (ValueError, RecursionError) as exc:
        raise MetadataError(shown, f"not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FOLLOW_FORMAT:
        raise MetadataError(shown, f"is not a {FOLLOW_FORMAT} manifest", "format")
    if manifest.get("digest") != _digest(manifest):
        raise MetadataError(shown, "does not match the file's content (corrupted)", "digest")
    for key, kind in (("version", int), ("table", str), ("files", list), ("index", str)):
        if not isinstance(manifest.get(key), kind):
            raise MetadataError(shown, f"expected {kind.__name__}", key)
    if manifest["version"] != version:
        raise MetadataError(shown, f"names version {manifest['version']}", "version")
    meta = _check_meta(manifest.get("meta"), shown)
    text = manifest["index"].encode()
    if meta.get("index_digest") != index_digest(text):
        raise MetadataError(shown, "its metadata does not describe its index", "index")
    shards = parse_index(text, shown)
    if [s.samples for s in shards] != [m["samples"] for m in meta["shards"]]:
        raise MetadataError(shown, "sample counts differ from the index's", "meta.shards")
    virtual = _virtual(manifest.get("virtual", {}), shown)
    return HeldVersion(version, manifest, meta, shards, text, virtual)


def _virtual(value: Any, shown: str) -> dict[str, list[Piece]]:
    if not isinstance(value, dict):
        raise MetadataError(shown, "expected an object", "virtual")
    out: dict[str, list[Piece]] = {}
    for name, pieces in value.items():
        ok = isinstance(pieces, list) and all(
            isinstance(p, list)
            and len(p) == 5
            and isinstance(p[0], str)
            and all(isinstance(x, int) and x >= 0 for x in p[1:])
            and p[3] <= p[4]
            for p in pieces
        )
        if not ok:
            raise MetadataError(
                shown, "a piece is not [basename, stored, raw, start, stop]", f"virtual.{name}"
            )
        out[name] = [(str(p[0]), int(p[1]), int(p[2]), int(p[3]), int(p[4])) for p in pieces]
    return out


def physical_names(manifest: dict[str, Any]) -> set[str]:
    """The shard files on disk one manifest needs (virtual shards are built from these)."""
    names: set[str] = set()
    for entry in manifest.get("files", []):
        names.update(str(n) for n in entry.get("shards", []))
    return names


def all_physical_names(store: Store) -> set[str]:
    """Every shard file some held version needs (what a vacuum must keep)."""
    names: set[str] = set()
    for version in held_versions(store):
        names |= physical_names(_parse(store, version).manifest)
    return names


# --------------------------------------------------------------------------- virtual shards


def sample_spans(raw: np.ndarray, where: str) -> tuple[np.ndarray, bytes]:
    """A raw shard's sample offsets (n + 1, into ``raw``) and its column config bytes."""
    if len(raw) < 8:
        raise DatasetError(f"{where}: too short to be an MDS shard")
    n = int(raw[:4].view("<u4")[0])
    head = 4 + 4 * (n + 1)
    if head > len(raw):
        raise DatasetError(f"{where}: truncated inside its offset table")
    offsets = raw[4:head].view("<u4").astype(I64)
    if offsets[0] < head or offsets[-1] > len(raw) or np.any(np.diff(offsets) < 0):
        raise DatasetError(f"{where}: offsets out of order or past the end")
    return offsets, raw[head : int(offsets[0])].tobytes()


def _runs(
    pieces: list[Piece], raw_of: Callable[[str, int, int], np.ndarray]
) -> tuple[list[np.ndarray], np.ndarray, bytes]:
    """A virtual shard's sample bytes as runs of the shards on disk (views, not copies), the
    samples' lengths, and the column config its header repeats."""
    data: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    config = b""
    spans: dict[str, tuple[np.ndarray, bytes]] = {}
    for name, stored_bytes, raw_bytes, start, stop in pieces:
        raw = raw_of(name, stored_bytes, raw_bytes)
        if name not in spans:  # one parse per shard on disk, however many runs it gives
            spans[name] = sample_spans(raw, name)
        offsets, config = spans[name]
        if stop > len(offsets) - 1:
            raise DatasetError(f"{name}: a virtual shard needs samples {start}..{stop}")
        data.append(raw[int(offsets[start]) : int(offsets[stop])])
        lengths.append(np.diff(offsets[start : stop + 1]))
    return data, (np.concatenate(lengths) if lengths else np.empty(0, I64)), config


def assemble(pieces: list[Piece], raw_of: Callable[[str, int, int], np.ndarray]) -> np.ndarray:
    """A virtual shard's bytes: the pieces' samples, in order, under one MDS header (what a
    fresh export writes for those samples). ``raw_of(basename, stored_bytes, raw_bytes)``
    gives a shard on disk, decompressed."""
    data, lengths, config = _runs(pieces, raw_of)
    joined = np.concatenate(data) if data else np.empty(0, np.uint8)
    return build_shard(Pieces(joined, offsets=offsets_from_lengths(lengths)), len(lengths), config)


def assembled_hash(
    pieces: list[Piece], raw_of: Callable[[str, int, int], np.ndarray]
) -> tuple[str, int]:
    """The content hash and size of :func:`assemble`'s bytes, streamed over the runs without
    building the shard (an update records them; readers assemble it when they load it)."""
    data, lengths, config = _runs(pieces, raw_of)
    n = len(lengths)
    head = 4 + 4 * (n + 1) + len(config)
    offsets = offsets_from_lengths(lengths) + head
    if int(offsets[-1]) >= 1 << 32:
        raise ValueError("a shard reached 4 GiB; MDS offsets are uint32 (lower shard_size)")
    hasher = xxhash.xxh3_128()
    hasher.update(np.uint32(n).tobytes())
    hasher.update(offsets.astype("<u4").tobytes())
    hasher.update(config)
    for run in data:
        hasher.update(np.ascontiguousarray(run).data)
    return hasher.hexdigest(), int(offsets[-1])
