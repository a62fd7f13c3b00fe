"""Loading a dataset's shards: stored bytes from the store (or its remote cache), size and
hash checks (once per process, and for local files once per machine), decompression, and a
followed table's version's shards assembled from the pieces of others."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import (
    DatasetChangedError,
    DatasetError,
    DecompressionError,
    HashMismatchError,
    ShardError,
)
from ..format.compact import ShardTable
from ..format.compression import parse_compression
from ..format.hashing import content_hash, digest, fastest
from ..format.shard import Layout, ShardData
from ..meta import read_meta
from ..store.storage import Store
from ..versions import Piece, assemble


class ShardLoading:
    """Mixin of :class:`~.mds.MdsDataset`: its shards read, checked and decompressed.

    The dataset sets these attributes when it opens (a mixture or a table read in place
    overrides the loading methods instead)."""

    store: Store
    shown: str
    cache_dir: str | None
    meta: dict[str, Any] | None
    shards: ShardTable
    layout: Layout
    _virtual: dict[str, list[Piece]]  # a followed version's shards assembled from others
    _verified: set[int]  # shards checked once in this process
    _warned_unverifiable: bool

    def stored_bytes(self, shard: int) -> np.ndarray:
        """The stored (possibly compressed) file of one shard, from the store's shard source
        (a memory map locally; the local cache for remote stores)."""
        info = self.shards[shard].stored
        return self.store.read_shard(info.basename, info.bytes, info.hashes)

    def prefetch_shards(self, shards: list[int], threads: int | None = None) -> bool:
        """Start downloading these shards of a remote dataset in the background, in this
        order (False for a local dataset: shards are read in place)."""
        items: list[tuple[str, int, Mapping[str, str] | None]] = []
        for shard in shards:
            info = self.shards[shard].stored
            items.append((info.basename, info.bytes, info.hashes))
        return self.store.prefetch_shards(items, threads)

    def release_shards(self, shards: list[int]) -> None:
        """Forget background downloads of these shards (a reader that stops early)."""
        self.store.release_shards([self.shards[s].stored.basename for s in shards])

    def download_stats(self) -> dict[str, float] | None:
        """This process's cumulative download telemetry (None for a local dataset)."""
        return self.store.download_stats()

    def load_shard(
        self,
        shard: int,
        verify_hashes: bool | None = None,
        timings: dict[str, float] | None = None,
    ) -> ShardData:
        """One shard decompressed, size-checked and hash-verified.

        ``verify_hashes``: None (default) checks each shard once per process, the first
        time it is read, with the fastest hash recorded for it (index, else spark_dl.json);
        True checks every recorded hash on every load; False checks none.
        ``timings`` (loader telemetry) accumulates seconds under "read" and "decompress".
        A shard gone or different because the dataset was overwritten (or vacuumed) since
        it was opened raises :class:`DatasetChangedError`: reopen it.
        """
        try:
            return self._load_shard(shard, verify_hashes, timings)
        except DatasetError as exc:
            changed = self._changed_error(shard)
            if changed is None:
                raise
            raise changed from exc

    def _changed_error(self, shard: int) -> DatasetChangedError | None:
        """Why shard ``shard`` cannot be read when the dataset committed at the path is no
        longer the one opened (an overwrite or a vacuum since); None when it is the same."""
        try:
            now = read_meta(self.store, compact=True, cache_dir=self.cache_dir)
        except Exception:
            return None  # the metadata cannot be read either: the first error says more
        if now is not None:
            found: Any = now.shards
            names = [s.stored.basename for s in found]
            if names == [s.stored.basename for s in self.shards] and now.meta == self.meta:
                return None
        return DatasetChangedError(
            f"{self.shown} changed since it was opened (overwritten, or its old shards "
            f"vacuumed): shard {self.shards[shard].stored.basename} of the dataset as "
            "opened is gone or different; open it again with open_dataset"
        )

    def _load_shard(
        self, shard: int, verify_hashes: bool | None, timings: dict[str, float] | None
    ) -> ShardData:
        info = self.shards[shard]
        stored = info.stored
        where = self.store.display(stored.basename)
        if stored.basename in self._virtual:
            return self._load_virtual(shard, where)
        started = time.perf_counter()
        check = shard not in self._verified if verify_hashes is None else verify_hashes
        record = None
        if check and verify_hashes is None and self.store.in_place:
            data, status = self.store.map_file(stored.basename)
            record = self._verified_record(shard, status)
            if record is not None and os.path.exists(record):
                check, record = False, None  # this very file passed on this machine
                self._verified.add(shard)
        else:
            data = self.stored_bytes(shard)
        if len(data) != stored.bytes:
            raise ShardError(where, f"has {len(data)} bytes, the index says {stored.bytes}")
        full = verify_hashes is True
        checked = check and self._verify_stored(shard, where, data, full)
        if info.zip_data is not None:
            codec = parse_compression(info.compression)
            if codec is None:
                raise ShardError(where, "is compressed but its index entry names no compression")
            if not stored.basename.endswith("." + codec.extension):
                raise ShardError(
                    where, f"does not end in .{codec.extension} as {info.compression} needs"
                )
            read = time.perf_counter()
            try:
                raw = np.frombuffer(codec.decompress(data, info.raw_data.bytes), dtype=np.uint8)
            except DecompressionError as exc:
                raise ShardError(where, str(exc)) from None
            if timings is not None:
                timings["read"] += read - started
                timings["decompress"] += time.perf_counter() - read
                started = -1.0
            if check and full and info.raw_data.hashes:
                self._verify(where, info.raw_data.hashes, raw)
                checked = True
        else:
            raw = data
        if check and not checked:
            checked = self._verify_content(shard, where, raw)
        if check:
            self._verified.add(shard)
        if checked and record is not None:
            _remember_verified(record)
        if timings is not None and started >= 0:
            timings["read"] += time.perf_counter() - started
        return ShardData(raw, where, self.layout, info.samples)

    def _load_virtual(self, shard: int, where: str) -> ShardData:
        """A shard of a followed table's version whose file lost rows to a deletion vector:
        the live samples of shards on disk under one header, as a fresh export wrote them,
        checked against the content hash the version records."""
        codec = parse_compression(self.meta["spec"].get("compression") if self.meta else None)

        def raw_of(name: str, stored_bytes: int, raw_bytes: int) -> np.ndarray:
            data = self.store.read_shard(name, stored_bytes, None)
            if codec is None:
                return data
            try:
                return np.frombuffer(codec.decompress(data, raw_bytes), dtype=np.uint8)
            except DecompressionError as exc:
                raise ShardError(self.store.display(name), str(exc)) from None

        info = self.shards[shard]
        raw = assemble(self._virtual[info.stored.basename], raw_of)
        if shard not in self._verified:
            self._verify_content(shard, where, raw)
            self._verified.add(shard)
        return ShardData(raw, where, self.layout, info.samples)

    def _verify_stored(self, shard: int, where: str, data: np.ndarray, full: bool) -> bool:
        """Check the stored file against the index's hashes, else spark_dl.json's."""
        hashes = self.shards[shard].stored.hashes
        recorded_in = "the index"
        if not hashes and self.meta is not None:
            hashes = self.meta["shards"][shard].get("stored_hashes") or {}
            recorded_in = "spark_dl.json"
        if not hashes:
            return False
        if not full:
            name = fastest(hashes)
            assert name is not None
            hashes = {name: hashes[name]}
        self._verify(where, hashes, data, recorded_in)
        return True

    def _verified_record(self, shard: int, status: os.stat_result) -> str | None:
        """Where the machine-wide note that this local shard file passed its hash check
        lives: named by the file's identity (path, device, inode, size, modification and
        change times: any rewrite changes the change time) and the hashes it was checked
        against. None for a file changed in the last seconds (timestamps are coarse: a
        rewrite within the same tick would look unchanged) or no private note directory."""
        if time.time() - status.st_ctime < _SETTLED_S:
            return None
        directory = _verified_dir()
        if directory is None:
            return None
        info = self.shards[shard]
        recorded = self.meta["shards"][shard] if self.meta else {}
        identity = [
            os.path.realpath(self.store.path(info.stored.basename)),
            status.st_dev,
            status.st_ino,
            status.st_size,
            status.st_mtime_ns,
            status.st_ctime_ns,
            dict(info.stored.hashes or {}),
            dict(info.raw_data.hashes or {}),
            recorded.get("stored_hashes"),
            recorded.get("content_hash"),
        ]
        key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
        return os.path.join(directory, key[:40])

    def _verify_content(self, shard: int, where: str, raw: np.ndarray) -> bool:
        """Datasets with no per-file hash: spark_dl.json's content hash of the raw shard;
        Mosaic's without any: say once that corruption goes undetected. True when checked."""
        expected = self.meta["shards"][shard].get("content_hash") if self.meta else None
        if expected:
            actual = content_hash(raw)
            if actual != expected:
                raise HashMismatchError(
                    where, f"content hash is {actual}, spark_dl.json says {expected}"
                )
            return True
        if not self._warned_unverifiable:
            self._warned_unverifiable = True
            warnings.warn(
                f"{self.shown} records no hashes for its shards (written by another MDS "
                "writer without hashes): corrupted shards cannot be detected",
                stacklevel=3,
            )
        return False

    @staticmethod
    def _verify(
        where: str, hashes: dict[str, str], data: np.ndarray, recorded_in: str = "the index"
    ) -> None:
        for name, expected in hashes.items():
            try:
                actual = digest(name, data)
            except ValueError as exc:
                raise ShardError(where, str(exc)) from None
            if actual != expected:
                raise HashMismatchError(where, f"{name} is {actual}, {recorded_in} says {expected}")


# A local shard file passes its hash check once per machine, not once per process: a
# DataLoader worker forked for each pass would otherwise hash every shard it touches again.
# Notes (empty files named by the file's identity, see Dataset._verified_record) live in a
# directory only this user can write; a file must have been left unchanged this long before
# its note is written.
_SETTLED_S = 2.0


def _verified_dir() -> str | None:
    """This user's private directory of verified-shard notes (None if it is not private)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    directory = os.path.join(tempfile.gettempdir(), f"spark-dl-verified-{uid}")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        status = os.stat(directory)
    except OSError:
        return None
    if status.st_uid != uid or status.st_mode & 0o077:
        return None  # another user could forge notes here
    return directory


def _remember_verified(record: str) -> None:
    with contextlib.suppress(OSError):  # only a note: the next process verifies again
        os.close(os.open(record, os.O_CREAT | os.O_WRONLY, 0o600))
