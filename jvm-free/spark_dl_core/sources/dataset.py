"""Reading MDS datasets: open, validate, and decode samples batch by batch into numpy."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import (
    ColumnNotFoundError,
    DatasetChangedError,
    DatasetError,
    DecompressionError,
    HashMismatchError,
    SampleIndexError,
    ShardError,
)
from ..format.buffers import (
    Jagged,
    Pieces,
    copy_pieces,
    gather,
    gather_fixed,
    offsets_from_lengths,
)
from ..format.compact import CompactIndex, ShardTable
from ..format.compression import parse_compression
from ..format.encodings import DecodeOptions, Encoding, ImageMode, get_encoding
from ..format.hashing import content_hash, digest, fastest
from ..format.index import INDEX_FILE, ShardInfo
from ..format.shard import Layout, ShardData
from ..meta import (
    ColumnPlan,
    column_names,
    plans_from_meta,
    python_types,
    read_meta,
    stored_layout,
)
from ..shard_source import Batch
from ..store.cache import shard_store
from ..store.indexing import index_fingerprint
from ..store.storage import check_path
from ..versions import Piece, assemble, read_version

# column -> numpy array, or a Jagged batch (token sequences) inside the loaders


class Dataset:
    """An MDS dataset on storage: its shards, columns and fingerprint.

    Written by spark-dl or by Mosaic Streaming's MDSWriter. Use :func:`open_dataset`.
    """

    def __init__(
        self,
        path: str,
        *,
        cache_dir: str | None = None,
        allow_unsafe: bool = False,
        storage_options: dict[str, Any] | None = None,
        version: int | None = None,
    ) -> None:
        check_path(path)
        self.path = str(path)
        # remote stores serve shard files through the local cache (see cache.shard_store)
        self.store = shard_store(self.path, storage_options, cache_dir)
        self.shown = self.store.display()  # the path with any credentials redacted
        self.cache_dir = cache_dir
        self.allow_unsafe = allow_unsafe
        self._compact: CompactIndex | None = None
        # a dataset that follows a Delta table: the table version opened and the shards
        # assembled from others (see spark_dl_core.versions); None / {} otherwise
        self.version: int | None = None
        self._virtual: dict[str, list[Piece]] = {}
        self.shards, self.meta, self._index_text = self._load(version)
        self.layout = self._layout()
        self.shard_offsets = np.zeros(len(self.shards) + 1, dtype=np.int64)
        np.cumsum(self.shards.samples, out=self.shard_offsets[1:])
        self._verified: set[int] = set()  # shards checked once in this process
        self._warned_unverifiable = False
        self._accessed: tuple[int, ShardData] | None = None  # last shard ``ds[...]`` read

    # -- opening

    def _load(self, version: int | None) -> tuple[ShardTable, dict[str, Any] | None, bytes | None]:
        held = read_version(self.store, version)  # a followed table's dataset: its manifest
        if held is not None:
            self.version, self._virtual = held.version, held.virtual
            return ShardTable.from_infos(held.shards), held.meta, held.index_text
        # The compact index when present: per-shard JSON is never parsed on open.
        committed = read_meta(self.store, compact=True, cache_dir=self.cache_dir)
        if committed is None:
            raise DatasetError(self._why_no_index())
        self._compact = committed.compact
        found: Any = committed.shards
        shards = found if isinstance(found, ShardTable) else ShardTable.from_infos(list(found))
        return shards, committed.meta, committed.index_text

    def _why_no_index(self) -> str:
        """Why nothing is committed at this path, in the words a user can act on."""
        store, shown = self.store, self.store.display()
        if os.path.basename(store.root) == INDEX_FILE:
            parent = shown[: -len(INDEX_FILE)].rstrip("/") or "/"
            return f"{shown} names the index file; open the dataset directory {parent}"
        if not store.remote:
            if os.path.isfile(store.root):
                return f"{shown} is a file, not a dataset directory (one holding {INDEX_FILE})"
            if not os.path.exists(store.root):
                return f"{shown} does not exist"
        return f"{store.display(INDEX_FILE)} does not exist: no dataset is committed at {shown}"

    def _layout(self) -> Layout:
        if self._compact is not None and len(self.shards):  # one column layout by construction
            return self._layout_of([self.shards[0]])
        return self._layout_of(self.shards)

    def _layout_of(self, shards: Sequence[ShardInfo]) -> Layout:
        if not shards:
            plans = self.plans
            return stored_layout(plans) if plans else Layout((), ())
        first = shards[0]
        for i, shard in enumerate(shards):
            if (shard.column_names, shard.column_encodings, shard.column_sizes) != (
                first.column_names,
                first.column_encodings,
                first.column_sizes,
            ):
                raise DatasetError(
                    f"{self.shown}: shard {i} ({shard.stored.basename}) has columns "
                    f"{dict(zip(shard.column_names, shard.column_encodings))}, shard 0 has "
                    f"{dict(zip(first.column_names, first.column_encodings))}"
                )
        encodings = []
        for name, enc, size in zip(first.column_names, first.column_encodings, first.column_sizes):
            try:
                encoding = get_encoding(enc)
            except ValueError as exc:
                raise DatasetError(f"{self.shown}: column {name!r}: {exc}") from None
            if encoding.size != size:
                raise DatasetError(
                    f"{self.shown}: column {name!r} ({enc}) lists size {size}, "
                    f"the encoding has {encoding.size}"
                )
            encodings.append(encoding)
        if len(set(first.column_names)) != len(first.column_names):
            raise DatasetError(f"{self.shown}: column names repeat: {first.column_names}")
        return Layout(tuple(first.column_names), tuple(encodings))

    # -- facts

    def __len__(self) -> int:
        return int(self.shard_offsets[-1])

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def columns(self) -> dict[str, str]:
        """Stored columns and their MDS encodings, in stored order."""
        return {n: e.name for n, e in zip(self.layout.names, self.layout.encodings)}

    @cached_property
    def plans(self) -> list[ColumnPlan] | None:
        """Our record of each column's Arrow type and null mask (None for Mosaic datasets)."""
        return plans_from_meta(self.meta) if self.meta else None

    @cached_property
    def fingerprint(self) -> str:
        """Identifies content and spec; for datasets not written by spark-dl, the index."""
        if self.meta and self.meta.get("fingerprint"):
            return str(self.meta["fingerprint"])
        if self._index_text is None and self._compact is not None:
            return self._compact.fingerprint  # computed from index.json when it was built
        return index_fingerprint(self._index_text or b"")

    @property
    def spec(self) -> dict[str, Any] | None:
        return self.meta.get("spec") if self.meta else None

    @property
    def source(self) -> dict[str, Any]:
        return dict(self.meta.get("source") or {}) if self.meta else {}

    def encoding(self, column: str) -> Encoding:
        return self.layout.encodings[self.layout.names.index(column)]

    @cached_property
    def forms(self) -> dict[str, tuple[str, tuple[int, ...] | None]]:
        """How each variable ``ndarray`` column leaves every reader, fixed per dataset.

        ``("dense", shape)``: every shard's ``spark_dl.json`` entry records that one shape
        for the column (Spark's ``array<float>`` of equal lengths): a dense batch.
        ``("jagged", None)``: recorded 1-D lists of numbers otherwise (token sequences):
        values + offsets, a ``torch.nested`` jagged tensor / ``tf.RaggedTensor``.
        ``("objects", None)``: n-D values not all of one shape: a numpy object array.
        Datasets written by other tools record no shapes: their columns are ``("auto",
        None)``, each batch dense when its values share one shape (as Mosaic's reader
        leaves it to the user). Fixed-width and other columns are not listed.
        """
        forms: dict[str, tuple[str, tuple[int, ...] | None]] = {}
        plans = {p.name: p for p in self.plans or []}
        shard_meta = self.meta["shards"] if self.meta else []
        for name, encoding in zip(self.layout.names, self.layout.encodings):
            if encoding.size is not None or not encoding.ndarray:
                continue
            recorded = [(m.get("shapes") or {}).get(name, "?") for m in shard_meta]
            plan = plans.get(name)
            if plan is None:
                forms[name] = ("auto", None)
                continue
            if recorded and all(isinstance(r, list) and r == recorded[0] for r in recorded):
                forms[name] = ("dense", tuple(recorded[0]))
            elif plan is not None and _list_depth(plan.arrow_type) == 1:
                forms[name] = ("jagged", None)
            else:
                forms[name] = ("objects", None)
        return forms

    def _conform(self, name: str, value: Any, file: str) -> Any:
        """Give a decoded variable ndarray column its dataset-wide form (see :attr:`forms`)."""
        form = self.forms.get(name)
        if form is None:
            return value
        kind, shape = form
        n = len(value)
        if kind == "auto":
            return value
        if kind == "dense":
            assert shape is not None
            if n == 0:
                encoding = self.encoding(name)
                dtype = getattr(encoding, "dtype", None) or np.float64
                return np.empty((0, *shape), dtype=np.dtype(dtype).newbyteorder("="))
            if isinstance(value, np.ndarray) and value.dtype != object and value.shape[1:] == shape:
                return value
            raise ShardError(
                file,
                f"column {name!r} is recorded with one shape {shape} in every shard (dense), "
                "but this batch holds arrays of another shape",
            )
        if kind == "jagged":
            if isinstance(value, Jagged):
                return value
            if isinstance(value, np.ndarray) and value.dtype != object and value.ndim == 2:
                return Jagged.from_dense(value)
            if n == 0:
                encoding = self.encoding(name)
                dtype = getattr(encoding, "dtype", None) or np.float64
                return Jagged(np.empty(0, np.dtype(dtype).newbyteorder("=")), np.zeros(1, np.int64))
            raise ShardError(
                file, f"column {name!r} is recorded as 1-D arrays but holds arrays of other rank"
            )
        if isinstance(value, Jagged):
            return value.to_objects()
        if isinstance(value, np.ndarray) and value.dtype != object:
            return _as_objects(list(value))
        return value

    # Columns computed from sample ids rather than stored (a mixture's source column).
    derived: tuple[str, ...] = ()

    def derive(self, name: str, index: np.ndarray) -> np.ndarray:
        raise ColumnNotFoundError(f"{self.shown} has no derived column {name!r}")

    def count_sources(self, ids: np.ndarray) -> np.ndarray | None:
        """Per source of a mixture, how many of global sample ``ids`` it gives (what
        ``loader.stats()`` shows); None for one dataset, which has no sources."""
        return None

    def source_report(self, counts: np.ndarray, epoch: int, consumed: int) -> dict[str, Any]:
        """``loader.stats()``'s view of a mixture at a position: per-source ``counts`` by
        name and the stage; nothing for one dataset."""
        return {}

    def locate(self, sample: int) -> tuple[str, int]:
        """The shard file holding global sample ``sample`` and its index within it."""
        shard = int(np.searchsorted(self.shard_offsets, sample, side="right") - 1)
        file = self.store.display(self.shards[shard].stored.basename)
        return file, sample - int(self.shard_offsets[shard])

    # -- a followed table's version: a run carried on from another (sources/follow_carry.py)

    def position_record(self, epoch: int, consumed: int) -> dict[str, Any] | None:
        if self.version is None:
            return None
        from . import follow_carry

        return follow_carry.record(self, epoch, consumed)

    @property
    def carry_on(self) -> Callable[[Any, bool], tuple[Any, int, int]] | None:
        """Only a followed table's version takes a state of another version (None: the
        loader compares fingerprints as for any dataset)."""
        if self.version is None:
            return None
        from . import follow_carry

        return functools.partial(follow_carry.carry_on, self)

    def row_layout(self) -> Any:
        from . import follow_carry

        return follow_carry.row_layout(self)

    def __repr__(self) -> str:
        return (
            f"<Dataset {self.shown!r}: {len(self)} samples, {self.num_shards} shards, "
            f"columns={self.columns}>"
        )

    # -- shards

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
        if check and verify_hashes is None and not self.store.remote:
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

    # -- decoding

    def _decode_plan(
        self, columns: list[str] | None, images: ImageMode
    ) -> tuple[list[str], DecodeOptions]:
        """The columns to decode (checked to exist and to be safe to decode) and options."""
        names = column_names(columns) or (list(self.layout.names) if columns is None else [])
        missing = [c for c in names if c not in self.layout.names]
        if missing:
            raise ColumnNotFoundError(
                f"{self.shown} has no column(s) {missing}; it has {list(self.layout.names)}"
            )
        options = DecodeOptions(images=images, allow_unsafe=self.allow_unsafe)
        for name in names:
            self.encoding(name).check_safe(name, options)
        return names, options

    def decode(
        self,
        shard: ShardData,
        index: np.ndarray,
        columns: list[str] | None = None,
        images: ImageMode = "bytes",
        jagged: bool = False,
    ) -> Batch:
        """Decode the samples at ``index`` (positions within ``shard``) into numpy arrays.

        Token-sequence columns (form ``jagged``) come back as :class:`Jagged` batches with
        ``jagged=True``, else as object arrays of 1-D arrays.
        """
        names, options = self._decode_plan(columns, images)
        pieces = shard.columns(np.asarray(index, dtype=np.int64), names)
        out: Batch = {}
        for name in names:
            try:
                value = self.encoding(name).decode(pieces[name], len(index), name, options)
            except (ValueError, IndexError) as exc:
                if isinstance(exc, ShardError):
                    raise
                raise ShardError(shard.file, f"column {name!r}: {exc}") from None
            value = self._conform(name, value, shard.file)
            out[name] = value if jagged or not isinstance(value, Jagged) else value.to_objects()
        return out

    def read(
        self,
        indices: np.ndarray,
        columns: list[str] | None = None,
        images: ImageMode = "bytes",
        verify_hashes: bool | None = None,
        loaded: dict[int, ShardData] | None = None,
        jagged: bool = False,
    ) -> Batch:
        """Decode samples by global index, in the order given.

        ``loaded`` keeps decompressed shards between calls; the caller bounds its size.
        """
        columns = column_names(columns)
        indices = np.asarray(indices, dtype=np.int64)
        stored = int(self.shard_offsets[-1])
        if len(indices) and (indices.min() < 0 or indices.max() >= stored):
            raise SampleIndexError(
                f"{self.shown}: sample index out of range for a dataset of {stored} samples"
            )
        shard_of = np.searchsorted(self.shard_offsets, indices, side="right") - 1
        shards = np.unique(shard_of).tolist()
        datas: list[tuple[np.ndarray, ShardData]] = []
        for shard in shards:
            where = np.flatnonzero(shard_of == shard)
            data = loaded.get(shard) if loaded is not None else None
            if data is None:
                data = self.load_shard(shard, verify_hashes)
                if loaded is not None:
                    loaded[shard] = data
            datas.append((where, data))
        if jagged and self.layout.row_size is None:
            direct = self._read_direct(indices, shards, datas, columns, images)
            if direct:
                names = list(self.layout.names) if columns is None else list(columns)
                rest = [c for c in names if c not in direct]
                other = self._read_loaded(indices, shards, datas, rest, images, jagged)
                return {c: direct[c] if c in direct else other[c] for c in names}
        return self._read_loaded(indices, shards, datas, columns, images, jagged)

    def __getitem__(self, key: Any) -> Any:
        """Random access, as a list or Mosaic's and Hugging Face's datasets index.

        ``ds[i]`` (negative counts from the end): one sample as a dict of column -> value;
        ``ds[[i, j]]``, ``ds[a:b]`` or an integer array: a batch dict of column -> array, as
        :meth:`read` returns. ``ds[rows, "col"]`` / ``ds[rows, ["a", "b"]]`` pick columns;
        ``ds["col"]`` is the whole column (every shard is read). A mixture indexes its
        sources' stored samples one after another. Samples go through the
        loaders' path (the store or its remote cache, size and hash checks, decoders);
        the last shard read stays loaded, so neighbouring samples decode without a reload.
        An index outside the dataset is a :class:`SampleIndexError` (an ``IndexError``), an
        unknown column a :class:`ColumnNotFoundError` (a ``KeyError``).
        """
        rows: Any = key
        columns: Any = None
        if isinstance(key, tuple):
            if len(key) != 2:
                raise SampleIndexError(
                    f"{self.shown}: index with ds[rows] or ds[rows, columns], got {len(key)} parts"
                )
            rows, columns = key
        elif isinstance(key, str):
            return self._access(slice(None), [key], key)[key]
        names: list[str] | None = None
        if isinstance(columns, str):
            names = [columns]
        elif isinstance(columns, (list, tuple)) and all(isinstance(c, str) for c in columns):
            names = list(columns)
        elif columns is not None:
            raise ColumnNotFoundError(
                f"{self.shown}: columns are named by a string or a list of strings, got {columns!r}"
            )
        one_column = columns if isinstance(columns, str) else None
        batch = self._access(rows, names, key)
        return batch[one_column] if one_column is not None else batch

    def _access(self, rows: Any, columns: list[str] | None, key: Any) -> Any:
        """``ds[rows, columns]``: a sample dict for an integer ``rows``, else a batch dict."""
        n = int(self.shard_offsets[-1])  # stored samples (a mixture's sources one after another)
        from ..ops.read import random_access_ops

        asked, ops = columns, random_access_ops(self, columns)
        if ops is not None:  # asked names are the ops' outputs: read every stored column
            columns = None
        derived = [c for c in (self.derived if columns is None else columns) if c in self.derived]
        if columns is not None:
            columns = [c for c in columns if c not in self.derived]
            self._decode_plan(columns, "bytes")  # unknown columns: refused before any read
        single = isinstance(rows, (int, np.integer)) and not isinstance(rows, (bool, np.bool_))
        if single:
            indices = np.array([int(rows)], dtype=np.int64)
        elif isinstance(rows, slice):
            picked = range(n)[rows]
            indices = np.arange(picked.start, picked.stop, picked.step, dtype=np.int64)
        else:
            array = np.asarray(rows)
            if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
                raise SampleIndexError(
                    f"{self.shown}: a sample index is an int, a slice or a list of ints, "
                    f"got {key!r}"
                )
            indices = array.astype(np.int64)
        bad = (indices < -n) | (indices >= n)
        if bad.any():
            raise SampleIndexError(
                f"{self.shown}: sample index {int(indices[bad][0])} is out of range for a "
                f"dataset of {n} samples"
            )
        indices = np.where(indices < 0, indices + n, indices)
        if not len(indices):
            names = [*(self.layout.names if columns is None else columns), *derived]
            if ops is not None:
                names = asked if asked is not None else ops.names_after(names)
            return {c: np.empty(0, dtype=object) for c in names}
        loaded: dict[int, ShardData] = {}
        last = int(np.searchsorted(self.shard_offsets, indices[-1], side="right") - 1)
        accessed = getattr(self, "_accessed", None)
        if accessed is not None:
            loaded[accessed[0]] = accessed[1]
        batch = python_types(self.plans, self.read(indices, columns, loaded=loaded))
        self._accessed = (last, loaded[last])
        for name in derived:
            batch[name] = self.derive(name, indices)
        if ops is not None:
            batch = self._after_ops(batch, ops, asked, indices)
        if not single:
            return batch
        return {name: value[0] for name, value in batch.items()}

    def _after_ops(
        self, batch: Batch, ops: Any, asked: list[str] | None, indices: np.ndarray
    ) -> Batch:
        """A random-access batch through the spec's read ops, as a loader hands it out
        (plain numpy, no jagged or image-list wrappers), with the asked columns."""
        out = ops.apply(batch, indices)
        for name, value in out.items():
            if hasattr(value, "to_objects"):  # Jagged, a pipeline's ImageList
                out[name] = value.to_objects()
        return out if asked is None else {name: out[name] for name in asked}

    def _read_loaded(
        self,
        indices: np.ndarray,
        shards: list[int],
        datas: list[tuple[np.ndarray, ShardData]],
        columns: list[str] | None,
        images: ImageMode,
        jagged: bool,
    ) -> Batch:
        """The general decode of samples in loaded shards: per shard, or across shards."""
        if columns is not None and not columns:
            return {}
        if len(datas) > 1 and self.layout.row_size is None:
            # A shuffled batch spans several shards: gather each shard's bytes, put them in
            # the requested order, decode once (not once per shard plus a merge).
            return self._decode_across(indices, datas, columns, images, jagged)
        parts: list[tuple[np.ndarray, Batch]] = []
        for (where, data), shard in zip(datas, shards):
            local = indices[where] - self.shard_offsets[shard]
            parts.append((where, self.decode(data, local, columns, images, jagged)))
        return _merge(parts, len(indices))

    def row_spans(
        self, data: ShardData, columns: list[str]
    ) -> tuple[int, list[tuple[int, int, Any]]] | None:
        """When every row of ``data`` has one layout (fixed-width datasets, and Spark's
        equal-length arrays in a variable layout): the row size and, per column, where its
        values lie in a row and how they decode: an encoding, or for a dense ndarray column
        ``(dtype, shape, header)``, the header bytes every row must carry before its values
        (the reader checks them in the rows it gathers). None otherwise."""
        rows = data.row_matrix
        if rows is None or not len(rows):
            return None
        spans: list[tuple[int, int, Any]] = []
        for name in columns:
            i = data.layout.names.index(name)  # the shard's own layout (mixtures differ)
            at, width = data.row_span(i)
            encoding = self.encoding(name)
            if encoding.size is not None:
                spans.append((at, width, encoding))
                continue
            form = self.forms.get(name)
            header = getattr(encoding, "dense_header", None)
            if form is None or form[0] != "dense" or header is None:
                return None
            assert form[1] is not None
            found = header(rows[0, at : at + width], form[1], name)
            if found is None:
                return None
            head, dtype = found
            spans.append((at + head, width - head, (dtype, form[1], rows[0, at : at + head])))
        return rows.shape[1], spans

    def _read_direct(
        self,
        indices: np.ndarray,
        shards: list[int],
        datas: list[tuple[np.ndarray, ShardData]],
        columns: list[str] | None,
        images: ImageMode,
    ) -> Batch:
        """Token-sequence (form ``jagged``) and fixed-width columns of a variable layout,
        read straight from the shards' bytes: each sample's column positions are found once,
        then each column is copied into its batch buffer in the requested order (one copy
        per byte, no intermediate pieces). Columns this does not fit (strings, n-D arrays,
        other dtypes) are left out of the result, for the general decode."""
        names, options = self._decode_plan(columns, images)
        wanted = [
            name
            for name in names
            if self.encoding(name).size is not None or self.forms.get(name, ("",))[0] == "jagged"
        ]
        if not any(self.encoding(name).size is None for name in wanted):
            return {}  # nothing jagged: the general path is as direct
        n = len(indices)
        located = []
        for shard, (where, data) in zip(shards, datas):
            starts, sizes = data.positions(indices[where] - self.shard_offsets[shard])
            located.append((where, data, starts, sizes))
        out: Batch = {}
        for name in wanted:
            encoding = self.encoding(name)
            if encoding.size is not None:
                block = np.empty((n, encoding.size), dtype=np.uint8)
                for where, data, starts, _ in located:
                    i = data.layout.names.index(name)  # each shard's own layout
                    block[where] = gather_fixed(data.raw, starts[:, i], encoding.size)
                pieces = Pieces(block.reshape(-1), width=encoding.size)
                out[name] = encoding.decode(pieces, n, name, options)
                continue
            value = self._jagged_values(name, located, n)
            if value is not None:
                out[name] = value
        return out

    def _jagged_values(self, name: str, located: list[tuple[Any, ...]], n: int) -> Jagged | None:
        """One token-sequence column of a batch as a :class:`Jagged` (None: values that are
        not 1-D of one dtype, left to the general decode)."""
        spans = getattr(self.encoding(name), "value_spans", None)
        if spans is None:
            return None
        nbytes = np.zeros(n, dtype=np.int64)
        found, dtype = [], None
        for where, data, starts, sizes in located:
            i = data.layout.names.index(name)
            try:
                got = spans(data.raw, starts[:, i], sizes[:, i], name)
            except ValueError as exc:
                raise ShardError(data.file, f"column {name!r}: {exc}") from None
            if got is None or (dtype is not None and got[2] != dtype):
                return None
            dtype = got[2]
            nbytes[where] = got[1]
            found.append((where, data.raw, got[0], got[1]))
        if dtype is None:
            return None
        offsets = offsets_from_lengths(nbytes)
        values = np.empty(int(offsets[-1]), dtype=np.uint8)
        for where, raw, starts_, lengths in found:
            copy_pieces(values, offsets[where], raw, starts_, lengths)
        native = values.view(dtype).astype(dtype.newbyteorder("="), copy=False)
        return Jagged(native, offsets // dtype.itemsize)

    def _decode_across(
        self,
        indices: np.ndarray,
        datas: list[tuple[np.ndarray, ShardData]],
        columns: list[str] | None,
        images: ImageMode,
        jagged: bool,
    ) -> Batch:
        names, options = self._decode_plan(columns, images)
        n = len(indices)
        order = np.concatenate([where for where, _ in datas])
        inverse = np.empty(n, dtype=np.int64)
        inverse[order] = np.arange(n)
        parts = []
        for where, data in datas:
            shard = int(np.searchsorted(self.shard_offsets, indices[where[0]], side="right") - 1)
            parts.append(data.columns(indices[where] - self.shard_offsets[shard], names))
        files = ", ".join(data.file for _, data in datas)
        out: Batch = {}
        for name in names:
            pieces = _take_pieces(_concat_pieces([p[name] for p in parts]), inverse, n)
            try:
                value = self.encoding(name).decode(pieces, n, name, options)
            except (ValueError, IndexError) as exc:
                if isinstance(exc, ShardError):
                    raise
                raise ShardError(files, f"column {name!r}: {exc}") from None
            value = self._conform(name, value, files)
            out[name] = value if jagged or not isinstance(value, Jagged) else value.to_objects()
        return out

    # The loading methods below hand over to spark_dl_core.loaders.loading, a room above this one
    # (orders, readers, loader settings, framework adapters) that installs itself when the
    # package is imported (install_loading); this room imports none of those.

    def iter_batches(self, batch_size: int = 1024, **settings: Any) -> Iterator[Batch]:
        """Batches (dicts of numpy arrays) of one rank's share of one epoch.

        Keywords are :class:`~spark_dl_core.loaders.settings.LoaderSettings` fields
        (``shuffle``, ``seed``, ``epoch``, ``rank``, ``world_size``, ``columns``,
        ``transforms``, ``pack``...), or ``settings=`` a ``LoaderSettings``; ``state=`` (a
        loader's ``state_dict()``) continues after the samples it records as consumed. The
        global order depends only on (fingerprint, seed, epoch, shuffle settings); see
        :mod:`spark_dl_core.order` and :func:`spark_dl_core.loaders.loading.iter_batches`.
        """
        return _loading.iter_batches(self, batch_size, **settings)

    def sample_order(self, batch_size: int = 1024, **settings: Any) -> Any:
        """One rank's batches of global sample indices for an epoch, lazily (an
        :class:`~spark_dl_core.order.EpochPlan`): the very order every loader reads.
        ``len(order)`` batches; ``order[k]`` is an int64 array, computed when asked
        (O(shards) memory, no shard read). See :func:`spark_dl_core.loaders.loading.sample_order`.
        """
        return _loading.sample_order(self, batch_size, **settings)

    def to_arrow(self, columns: list[str] | None = None, *, batch_size: int = 65536) -> pa.Table:
        """The whole dataset (or some columns) as an Arrow table with the recorded types."""
        return _loading.to_arrow(self, columns, batch_size=batch_size)

    def to_torch(self, batch_size: int = 256, **settings: Any) -> Any:
        """A PyTorch loader over this dataset (see :mod:`spark_dl_core.loaders.torch_loader`).

        Keywords are :class:`~spark_dl_core.loaders.settings.LoaderSettings` fields, or
        ``settings=`` a ``LoaderSettings``.
        """
        return _loading.to_framework("torch", self, batch_size, **settings)

    def to_tf(self, batch_size: int = 256, **settings: Any) -> Any:
        """A ``tf.data.Dataset`` over this dataset (see
        :mod:`spark_dl_core.loaders.tf_loader.loader`); ``state=`` resumes from a loader state."""
        return _loading.to_framework("tf", self, batch_size, **settings)


# Dataset's loading methods' implementation (spark_dl_core.loaders.loading): see install_loading.
_loading: Any = None


def install_loading(functions: Any) -> None:
    """Give :class:`Dataset`'s loading methods their implementation.
    ``spark_dl_core.loaders.loading`` (a room above this one) calls it when the package is
    imported, so the dataset room reaches no orders, readers or frameworks itself."""
    global _loading
    _loading = functions


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


def _merge(parts: list[tuple[np.ndarray, Batch]], n: int) -> Batch:
    """Put per-shard decoded pieces back into the requested order.

    Every part of a column has the same form (see ``Dataset.forms``): dense arrays are
    concatenated, jagged batches joined by offsets, object arrays concatenated.
    """
    if len(parts) == 1 and np.array_equal(parts[0][0], np.arange(n)):
        return parts[0][1]
    out: Batch = {}
    if not parts:
        return out
    order = np.concatenate([where for where, _ in parts])
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.arange(n)
    for name in parts[0][1]:
        values = [batch[name] for _, batch in parts]
        if all(isinstance(v, Jagged) for v in values):
            out[name] = Jagged.concat(values).take(inverse)
            continue
        values = [v.to_objects() if isinstance(v, Jagged) else v for v in values]
        if any(v.dtype == object for v in values) or len({v.shape[1:] for v in values}) > 1:
            merged = _as_objects([x for v in values for x in list(v)])
        else:
            merged = np.concatenate(values)
        out[name] = merged[inverse]
    return out


def _concat_pieces(parts: list[Pieces]) -> Pieces:
    """The values of several shards' pieces back to back (each part's data is compact)."""
    if all(p.width is not None for p in parts) and len({p.width for p in parts}) == 1:
        return Pieces(np.concatenate([p.data for p in parts]), width=parts[0].width)
    datas, lengths = [], []
    for p in parts:
        n = len(p)
        if p.offsets is not None:
            datas.append(p.data[int(p.offsets[0]) : int(p.offsets[-1])])
        else:
            datas.append(p.data[: n * (p.width or 0)])
        lengths.append(p.lengths(n))
    return Pieces(np.concatenate(datas), offsets=offsets_from_lengths(np.concatenate(lengths)))


def _take_pieces(pieces: Pieces, order: np.ndarray, n: int) -> Pieces:
    """Pieces reordered: result position ``k`` holds input value ``order[k]``."""
    if pieces.width is not None:
        width = pieces.width
        return Pieces(pieces.data.reshape(n, width)[order].reshape(-1), width=width)
    data, offsets = gather(pieces.data, pieces.starts(n)[order], pieces.lengths(n)[order])
    return Pieces(data, offsets=offsets)


def _list_depth(t: pa.DataType) -> int:
    depth = 0
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t, depth = t.value_type, depth + 1
    return depth


def _as_objects(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def open_dataset(
    path: str | os.PathLike[str],
    *,
    cache_dir: str | None = None,
    allow_unsafe: bool = False,
    storage_options: dict[str, Any] | None = None,
    version: int | None = None,
) -> Dataset:
    """Open an MDS dataset (ours or Mosaic's) at a local path or fsspec URL.

    A dataset that follows a Delta table (``write_mds(..., mode="update")``) opens at the
    latest table version it holds; ``version`` opens another version it still holds.

    Everything after the path is keyword-only, so ``open_dataset(a, b)`` is a
    ``TypeError`` rather than ``b`` silently taken as the cache directory.
    ``allow_unsafe`` permits decoding ``pkl`` columns, which runs code from the dataset.
    ``cache_dir`` is where shards of remote datasets are kept locally.
    """
    return Dataset(
        path if not isinstance(path, os.PathLike) else os.fspath(path),
        cache_dir=cache_dir,
        allow_unsafe=allow_unsafe,
        storage_options=storage_options,
        version=version,
    )
