"""A pinned table snapshot read in place (no MDS copy), whatever its format: the generic half
of Delta's and Iceberg's in-place datasets, typed on :class:`~.table_files.TableFiles`.

Its shards are the row groups of the snapshot's data files, files in the snapshot's order
(``snapshot.files``), row groups in file order, rows its deletes (deletion vectors, position
deletes) remove left out, row groups left with no row left out. Opening reads Parquet footers
only (row counts per row group); :meth:`InPlaceDataset.load_shard` reads one row group,
finishes it as the export does (delete mask, partition columns, cast to the table schema) and
encodes it into MDS shard bytes in memory with the writer's :class:`~spark_dl_core.writer.
ShardWriter` and the column plans the export would infer: every decode, op, packing and
loader path after that is the MDS code. Converted shards stay in a small per-process LRU,
and on local disk in a machine-wide cache (:mod:`.cache`) that later epochs, DataLoader
workers, other processes and later versions keeping the same data file read instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa

from ...errors import SampleIndexError, ShardError, SparkDLError, SpecError
from ...format.compact import ShardTable
from ...format.index import FileInfo, ShardInfo
from ...format.shard import ShardData
from ...meta import ColumnPlan, plan_columns, stored_layout
from ...ops.transforms import apply_transforms
from ...sources.dataset import Dataset, _list_depth
from ...spec import MAX_SHARD_SIZE, DatasetSpec
from ...store.cache import default_cache_dir
from .cache import Reservation, RowGroupCache
from .filter import kept_digest
from .footer import read_group
from .plan import RowGroupPlanning, _mask, _RowGroup
from .remote import RemoteFiles, default_span_dir, read_through_spans
from .row_subset import RowSubset
from .table_files import TableError, TableFiles, first_line
from .variable_rows import variable_shard

if TYPE_CHECKING:  # pragma: no cover
    from ...store.storage import Store

INPLACE_VERSION = 1
CONVERTED_FORMAT = 1  # bump when a converted row group's bytes change for the same inputs
DEFAULT_CACHED_SHARDS = 4  # converted row groups kept per process (a shuffle window's worth)
DECODE_THREADS = 2  # row groups decoded at once ahead of forked workers (decode_ahead)
# Row groups converted by this process (Parquet decode + MDS encode): tests and telemetry.
conversions = 0


class _MemoryStore:
    """The writer's store, in memory: a converted shard's bytes are kept, not written."""

    def __init__(self) -> None:
        self.files: dict[str, bytes | np.ndarray] = {}

    def write_bytes(self, name: str, data: bytes | np.ndarray) -> None:
        self.files[name] = data  # the writer builds each shard afresh: kept, not copied


class InPlaceDataset(RowGroupPlanning, Dataset):
    """A table snapshot (:class:`~.table_files.TableFiles`) as a dataset: ``len``,
    ``fingerprint``, ``ds[i]``, ``iter_batches``, ``to_torch``… with no export. A table
    format subclasses it (Delta's ``DeltaDataset``, Iceberg's ``IcebergDataset``), naming
    its :attr:`KIND` (in the fingerprint) and how a saved mixture reopens it.

    ``spec``: the encodings (and transforms) the read uses, as an export's spec would;
    ``cached_shards``: converted row groups kept per process. ``forms``: a list column's
    batch form when the footers' guess is wrong: ``"jagged"``, ``"objects"`` or a shape.
    ``cache``: keep converted row groups on local disk for later epochs, workers and
    processes (False for a read-once job); ``cache_dir``: where (default
    ``<tmp>/spark-dl-cache/<hash of the table URI and "#inplace">``). ``span_dir``: where a
    remote table's footers and row groups are fetched to, once per machine (default
    ``<tmp>/spark-dl-cache/<hash of the table URI and "#spans">``; see :mod:`.remote`).
    ``node_cache``: read a local table's files through that span cache too, as a remote
    table's: None (the default) when the table lies on a network or FUSE mount
    (``/Volumes``, NFS), True always, False never (see :func:`.remote.read_through_spans`).
    ``plan_cache``: keep the footers' row-group metadata on local disk, so the next open of
    this or a later version reads one file, not every footer (a directory, default
    ``<tmp>/spark-dl-cache/<hash of the table URI and "#plan">``; False: read every footer).
    """

    KIND = "inplace"  # the fingerprint's kind: each format its own ("delta-inplace")

    def __init__(
        self,
        snapshot: TableFiles,
        spec: DatasetSpec | dict[str, Any] | None = None,
        *,
        allow_unsafe: bool = False,
        cached_shards: int = DEFAULT_CACHED_SHARDS,
        forms: dict[str, str | tuple[int, ...]] | None = None,
        cache: bool = True,
        cache_dir: str | None = None,
        span_dir: str | None = None,
        plan_cache: bool | str = True,
        node_cache: bool | None = None,
    ) -> None:
        # Planning and reading the footers below open files (and filters read row groups):
        # they need this process's state first; it is started clean again at the end.
        self._reset_process_state()
        self.snapshot = snapshot
        self.through_spans = read_through_spans(snapshot, node_cache)
        self.user_spec = spec if isinstance(spec, DatasetSpec) else DatasetSpec(**(spec or {}))
        self.path = snapshot.shown  # TABLE@vN (TABLE@vM..vN: the rows new since version M)
        self.shown = self.path
        self.cache_dir = None
        self.span_dir = span_dir
        self.plan_dir: str | None = None  # the footers' cache (.footers)
        if plan_cache:
            where = plan_cache if isinstance(plan_cache, str) else None
            self.plan_dir = where or default_cache_dir(f"{snapshot.table_uri}#plan")
        self.allow_unsafe = allow_unsafe
        self._accessed = None
        self._cached_shards = max(1, int(cached_shards))
        self._asked_forms = dict(forms or {})
        self._plans = self._plan()
        self.layout = stored_layout(self._plans)
        self.converted_dir = None
        if cache:
            self.converted_dir = cache_dir or default_cache_dir(f"{snapshot.table_uri}#inplace")
        self._filter_keep: list[np.ndarray] = []  # per file, with a filter (.filter)
        self._groups, self._leaf_values = self._read_footers()
        self.shards = ShardTable(
            np.array([g.live for g in self._groups], dtype=np.int64),
            np.array([g.raw_bytes for g in self._groups], dtype=np.int64),
            np.array([g.stored_bytes for g in self._groups], dtype=np.int64),
            self._shard_info,
        )
        self.shard_offsets = np.zeros(len(self._groups) + 1, dtype=np.int64)
        np.cumsum(self.shards.samples, out=self.shard_offsets[1:])
        # A batch's rows before their row group is converted (load_rows), where a whole
        # conversion costs: rows of other sizes (ragged lists, strings). Alike rows are laid
        # into the cache file in one copy, and serving rows first measured no faster there.
        variable = [self.layout.names[i] for i in self.layout.variable]
        self.serves_rows = any(self.forms.get(n, ("",))[0] != "dense" for n in variable)
        self._reset_process_state()  # let go of what planning opened

    # -- per-process state (not pickled: a DataLoader worker starts with its own)

    def _reset_process_state(self) -> None:
        self._pid = os.getpid()
        self._lru: OrderedDict[int, ShardData] = OrderedDict()
        self._lock = threading.Lock()
        self._open_files: OrderedDict[int, Any] = OrderedDict()
        # One reader at a time per open file: pyarrow aborts the process when two threads
        # (a prefetch thread and the main one) read row groups of one ParquetFile at once.
        self._file_locks: dict[int, threading.Lock] = {}
        self._disk_checked: set[int] = set()  # cached row groups hashed in this process
        self._remote: RemoteFiles | None = None
        # Row groups decoded (live rows, as the export has them) and not converted yet: the
        # first batches take their rows from these (load_rows) while the conversion goes on.
        self._decoded: OrderedDict[int, pa.Table] = OrderedDict()
        self._decoding: dict[int, threading.Lock] = {}  # one decoder per row group

    def _own_process(self) -> None:
        """A forked DataLoader worker inherits open files and locks (perhaps held by a
        thread that does not exist there): it starts its own. It keeps the decoded row
        groups (:meth:`decode_ahead`): whole tables, never changed once stored."""
        if getattr(self, "_pid", None) != os.getpid():
            decoded = self._decoded  # set at init and unpickling
            self._reset_process_state()
            if decoded:
                self._decoded.update(decoded)

    def _file_lock(self, file: int) -> threading.Lock:
        with self._lock:
            return self._file_locks.setdefault(file, threading.Lock())

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in (
            "_lru",
            "_lock",
            "_open_files",
            "_file_locks",
            "_accessed",
            "_disk_checked",
            "_remote",
            "_decoded",
            "_decoding",
            "_file_keys",
        ):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._accessed = None
        self._reset_process_state()

    # -- opening: plans from the schema (row groups from the footers: .plan)

    def _plan(self) -> list[ColumnPlan]:
        """The column plans an export of this snapshot with this spec would write."""
        schema = self.snapshot.output_schema
        # not from_pylist: it imports pandas (0.2-0.4 s before the first batch)
        empty = pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)
        after = apply_transforms(empty, self.user_spec.transforms, "write").schema
        return plan_columns(after, self.user_spec)

    # -- facts

    @property
    def plans(self) -> list[ColumnPlan]:
        return self._plans

    @property
    def spec(self) -> dict[str, Any]:
        return self.user_spec.canonical()

    @property
    def source(self) -> dict[str, Any]:
        return self.snapshot.lineage()

    @property
    def lineage(self) -> dict[str, Any]:
        """The snapshot's lineage, as an export of it records in ``spark_dl.json``."""
        return self.snapshot.lineage()

    @cached_property
    def fingerprint(self) -> str:
        """A pure function of the snapshot's content and the read's spec: each data file's
        path relative to the table, size and deleted rows, the row groups' counts, the
        schema and the column plans. A copy of the table at another URI has the same one;
        another version with other files, other deletions or another spec has another."""
        content = {
            "kind": self.KIND,
            "version": INPLACE_VERSION,
            "files": self._file_identities,
            "row_groups": [[g.file, g.group, g.live] for g in self._groups],
            "columns": self._columns_identity,
            "spec": self.user_spec.canonical(),
            **self._mapping_identity,
        }
        if self.snapshot.since is not None:  # new rows since a version: another dataset
            content["since"] = self.snapshot.since
        if self._filter_keep:  # its text, and the rows it keeps in each file
            content["filter"] = [str(self.snapshot.filter), *map(kept_digest, self._filter_keep)]
        return _digest(content)

    @cached_property
    def _file_identities(self) -> list[list[Any]]:
        """Per data file: its path relative to the table, its size, its deleted rows' hash."""
        snap = self.snapshot
        base = snap.table_uri.rstrip("/") + "/"
        sizes = snap._sizes
        files = []
        for i, uri in enumerate(snap.files):
            keep = self._deletion_keep(i)
            deleted = None
            if keep is not None:
                deleted = hashlib.sha256(np.flatnonzero(~keep).astype("<i8").tobytes()).hexdigest()
            relative = uri[len(base) :] if uri.startswith(base) else uri.rsplit("/", 1)[-1]
            files.append([relative, sizes.get(self._file_keys[i]), deleted])
        return files

    @cached_property
    def _columns_identity(self) -> list[list[Any]]:
        return [[p.name, str(p.arrow_type), p.encoding, p.null_mask] for p in self._plans]

    @cached_property
    def _mapping_identity(self) -> dict[str, Any]:
        """Under column mapping, which stored column each logical one reads (absent without
        it, so those fingerprints stay as they were)."""
        snap = self.snapshot
        if snap.column_mapping is None:
            return {}
        return {"mapping": snap.column_mapping.identity(snap.output_schema.names)}

    @cached_property
    def _convert_identity(self) -> dict[str, Any]:
        """What decides a row group's converted bytes besides its file and index."""
        return {
            "format": CONVERTED_FORMAT,
            "columns": self._columns_identity,
            "forms": sorted([k, v[0], list(v[1] or [])] for k, v in self.forms.items()),
            "asked": sorted(self._asked_forms),
            "spec": self.user_spec.canonical(),
            **self._mapping_identity,
        }

    def _cache_key(self, shard: int) -> str:
        """The converted row group's name: a digest of all that decides its bytes, never the
        version (a later version keeping the file reuses it)."""
        g = self._groups[shard]
        content = {
            "file": self._file_identities[g.file],
            "row_group": g.group,
            **self._convert_identity,
        }
        if self._filter_keep:  # the rows a filter keeps in the file
            content["kept"] = kept_digest(self._filter_keep[g.file])
        return _digest(content)[:40]

    @cached_property
    def forms(self) -> dict[str, tuple[str, tuple[int, ...] | None]]:
        """Each variable ndarray column's batch form (see :attr:`Dataset.forms`), from the
        footers: a 1-D list column whose every row group holds exactly ``k`` values per row
        is dense ``(k,)`` (a row group that breaks it after all is refused when loaded);
        other 1-D lists are jagged; deeper lists dense per batch when their values agree."""
        forms: dict[str, tuple[str, tuple[int, ...] | None]] = {}
        for plan in self._plans:
            encoding = self.encoding(plan.name)
            if encoding.size is not None or not encoding.name.startswith("ndarray"):
                continue
            asked = self._asked_forms.get(plan.name)
            if asked is not None:
                forms[plan.name] = _asked_form(plan.name, asked)
                continue
            if _list_depth(plan.arrow_type) != 1:
                forms[plan.name] = ("auto", None)
                continue
            width = _one_width(self._leaf_values.get(plan.name, []))
            forms[plan.name] = ("dense", (width,)) if width else ("jagged", None)
        return forms

    def locate(self, sample: int) -> tuple[str, int]:
        shard = int(np.searchsorted(self.shard_offsets, sample, side="right") - 1)
        return self._shard_name(shard), sample - int(self.shard_offsets[shard])

    def _shard_name(self, shard: int) -> str:
        g = self._groups[shard]
        return f"{self.snapshot.files[g.file]} (row group {g.group})"

    def _shard_info(self, shard: int) -> ShardInfo:
        g = self._groups[shard]
        name = f"{self.snapshot.file_names[g.file]}#rg{g.group}"
        return ShardInfo(
            samples=g.live,
            raw_data=FileInfo(name, g.raw_bytes),
            zip_data=None,
            column_names=list(self.layout.names),
            column_encodings=[e.name for e in self.layout.encodings],
            column_sizes=list(self.layout.sizes),
        )

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.shown!r}: {len(self)} samples, "
            f"{self.num_shards} row groups, columns={self.columns}>"
        )

    # -- shards: one row group, converted once per process while it stays in the LRU

    def stored_bytes(self, shard: int) -> np.ndarray:
        return self.load_shard(shard).raw

    def prefetch_shards(self, shards: list[int], threads: int | None = None) -> bool:
        """Remote tables: queue the row groups not converted on this machine yet, in this
        order (local files are read where they are: False)."""
        remote = self._remote_files()
        if remote is None:
            return False
        disk = self._disk()
        todo = [
            (self._groups[s].file, self._groups[s].group)
            for s in shards
            if disk is None or not os.path.exists(disk.path(self._cache_key(s)))
        ]
        if todo:
            try:
                remote.prefetch(todo, threads)
            except Exception as exc:
                raise self._file_error(todo[0][0], todo[0][1], exc) from None
        return True

    def release_shards(self, shards: list[int]) -> None:
        remote = self._remote_files()
        if remote is not None:
            remote.release([(self._groups[s].file, self._groups[s].group) for s in shards])

    def download_stats(self) -> dict[str, float] | None:
        remote = self._remote_files()
        return None if remote is None else remote.cache.stats()

    def _remote_files(self) -> RemoteFiles | None:
        """This process's reader of the table's remote files (None for a local table)."""
        if not self.through_spans:
            return None
        self._own_process()
        with self._lock:
            if self._remote is None:
                snap = self.snapshot
                stored = [n for n in snap.output_schema.names if n not in snap.partition_columns]
                relative = [f[0] for f in self._file_identities]
                where = self.span_dir or default_span_dir(snap.table_uri)
                self._remote = RemoteFiles(snap, relative, where, stored)
            return self._remote

    def load_shard(
        self,
        shard: int,
        verify_hashes: bool | None = None,
        timings: dict[str, float] | None = None,
    ) -> ShardData:
        """One row group as an MDS shard: from the per-process LRU, else the disk cache
        (size and hash checked once per machine and file; ``verify_hashes=True``: every
        load), else converted (and written to the disk cache)."""
        self._own_process()
        with self._lock:
            found = self._lru.get(shard)
            if found is not None:
                self._lru.move_to_end(shard)
                return found
        started = time.perf_counter()
        data = self._from_disk(shard, verify_hashes)
        if data is None:
            data = self._convert_once(shard, verify_hashes)
        if timings is not None:
            timings["read"] = timings.get("read", 0.0) + time.perf_counter() - started
        with self._lock:
            self._remember(shard, data)
            self._decoded.pop(shard, None)  # read converted (another worker's): not needed
        return data

    def load_rows(
        self,
        shard: int,
        rows: np.ndarray,
        verify_hashes: bool | None = None,
        timings: dict[str, float] | None = None,
        decoded_only: bool = False,
    ) -> ShardData | None:
        """Rows ``rows`` (ascending local indices) of row group ``shard`` for a batch that
        need not wait for the whole row group's conversion: the converted shard when this
        process or the disk cache has it, else those rows taken from the row group's decoded
        table and encoded alone (a :class:`.row_subset.RowSubset`; each row's bytes are the
        whole conversion's). The row group stays decoded until :meth:`load_shard` converts
        it. None with write transforms (they see whole row groups): load the shard; None
        too with ``decoded_only`` for a row group this process does not hold decoded (a
        DataLoader worker among several, which would decode what the others decode)."""
        if self.user_spec.transforms:
            return None
        self._own_process()
        with self._lock:
            found = self._lru.get(shard)
            held = shard in self._decoded
        if found is not None:
            return found
        if decoded_only and not held:
            return None
        started = time.perf_counter()
        # Rows of a row group held decoded come from it (ms), not from its converted file
        # another worker may have cached meanwhile (read and hashed whole: 0.2-0.5 s).
        data = None if held else self._from_disk(shard, verify_hashes)
        if data is not None:
            with self._lock:
                self._remember(shard, data)
        else:
            g = self._groups[shard]
            rows = np.asarray(rows, dtype=np.int64)
            if len(rows) and (int(rows[0]) < 0 or int(rows[-1]) >= g.live):
                raise SampleIndexError(
                    f"{self._shard_name(shard)}: rows up to {int(rows[-1])} asked, it holds "
                    f"{g.live}"
                )
            part = _take(self._decoded_rows(shard), rows)
            raw, shapes = self._encoded(shard, part, _fresh)
            self._check_shapes(g, shapes)
            data = RowSubset(raw, self._shard_name(shard), self.layout, rows, g.live)
        if timings is not None:
            timings["read"] = timings.get("read", 0.0) + time.perf_counter() - started
        return data

    def decode_ahead(self, shards: list[int]) -> list[int]:
        """Decode row groups ``shards`` now, ``DECODE_THREADS`` at a time, and hold them: the
        DataLoader workers forked next inherit the decode, so each takes its first batch's
        rows (:meth:`load_rows`) and converts a row group without decoding it again; before,
        each worker decoded the first window for itself. Skipped: row groups the disk cache
        holds converted, and those past the per-process limit. The row groups held; the
        caller drops them (:meth:`forget_decoded`) once the workers have forked."""
        if self.user_spec.transforms:
            return []
        self._own_process()
        disk = self._disk()
        todo = [
            s
            for s in dict.fromkeys(int(s) for s in shards)
            if disk is None or not os.path.exists(disk.path(self._cache_key(s)))
        ][: self._cached_shards]
        if len(todo) > 1:
            with ThreadPoolExecutor(min(DECODE_THREADS, len(todo))) as pool:
                list(pool.map(self._decoded_rows, todo))
        elif todo:
            self._decoded_rows(todo[0])
        return todo

    def forget_decoded(self) -> None:
        """Drop the row groups :meth:`decode_ahead` held (forked workers keep theirs)."""
        with self._lock:
            self._decoded.clear()

    def _decoded_rows(self, shard: int) -> pa.Table:
        """Row group ``shard``'s live rows as the export has them, decoded once per process
        until converted (:meth:`load_rows` and the conversion share one decode; a thread
        asking for a row group another is decoding waits for it)."""
        with self._lock:
            lock = self._decoding.setdefault(shard, threading.Lock())
        with lock:
            with self._lock:
                found = self._decoded.get(shard)
            if found is not None:
                return found
            g = self._groups[shard]
            table = self._finished(g)
            if table.num_rows != g.live:
                raise self._file_error(
                    g.file,
                    g.group,
                    f"holds {table.num_rows} live rows, its footer and deletion vector said "
                    f"{g.live}",
                )
            with self._lock:
                self._decoded[shard] = table
                while len(self._decoded) > self._cached_shards:  # converted by no one
                    self._decoded.popitem(last=False)
            return table

    def _remember(self, shard: int, data: ShardData) -> None:
        """Keep a converted shard in the per-process LRU (caller holds ``_lock``)."""
        self._lru[shard] = data
        self._lru.move_to_end(shard)
        while len(self._lru) > self._cached_shards:
            self._lru.popitem(last=False)

    def _convert_once(self, shard: int, verify_hashes: bool | None) -> ShardData:
        """Convert ``shard`` (and cache it), unless another process on this machine is
        converting it (DataLoader workers all need the first window's row groups): then
        read what that one caches rather than convert the same row group again."""
        disk = self._disk()
        if disk is None:
            return self._convert(shard)
        key = self._cache_key(shard)
        with disk.claim(key):
            # claimed or waited for, the file may be there now: a process that finished
            # converting between our look at the cache and our claim leaves it to read
            data = self._from_disk(shard, verify_hashes)
            if data is None:
                data = self._convert(shard, disk, key)
                self._disk_checked.add(shard)
        return data

    def _disk(self) -> RowGroupCache | None:
        if self.converted_dir is None:
            return None
        return RowGroupCache(self.converted_dir)

    def _from_disk(self, shard: int, verify_hashes: bool | None) -> ShardData | None:
        """The cached conversion of ``shard``, checked; None when absent or bad (deleted)."""
        disk = self._disk()
        if disk is None:
            return None
        key = self._cache_key(shard)
        verify = shard not in self._disk_checked if verify_hashes is None else verify_hashes
        raw = disk.read(key, verify, noted=verify_hashes is None)
        if raw is None:
            return None
        try:
            data = ShardData(raw, self._shard_name(shard), self.layout, self._groups[shard].live)
        except ShardError:
            disk.drop(key)  # right hash, wrong shard: only a digest collision; convert again
            return None
        self._disk_checked.add(shard)
        return data

    def _convert(self, shard: int, disk: RowGroupCache | None = None, key: str = "") -> ShardData:
        """Row group ``shard`` as a shard, and cached under ``key`` in ``disk`` when given
        (alike rows are laid straight into the cache file's memory map)."""
        global conversions
        conversions += 1
        g = self._groups[shard]
        table = self._decoded_rows(shard)
        room: list[Reservation] = []

        def alloc(nbytes: int) -> np.ndarray:
            held = None if disk is None else disk.reserve(key, nbytes)
            if held is None:
                return np.empty(nbytes, dtype=np.uint8)
            room.append(held)
            return held.payload

        try:
            raw, shapes = self._encoded(shard, table, alloc)
            self._check_shapes(g, shapes)
            data = ShardData(raw, self._shard_name(shard), self.layout, g.live)
        except BaseException:
            for held in room:
                held.abort()
            raise
        finally:
            with self._lock:
                self._decoded.pop(shard, None)
        if room:
            room[0].commit()  # the shard's bytes are already the file's
        elif disk is not None:
            disk.write(key, data.raw)
        return data

    def _encoded(
        self, shard: int, table: pa.Table, alloc: Callable[[int], np.ndarray]
    ) -> tuple[np.ndarray, dict[str, list[int] | None]]:
        """``table`` (rows of row group ``shard``) as one shard's bytes and its arrays'
        shapes, as the writer lays them."""
        from ...writer import ShardWriter

        spec = self.user_spec.model_copy(
            update={"compression": None, "hashes": [], "shard_size": MAX_SHARD_SIZE}
        )
        memory = _MemoryStore()
        writer = ShardWriter(cast("Store", memory), spec, plans=self._plans)
        writer.where = self._shard_name(shard)
        g = self._groups[shard]
        whole = writer.one_shard(table, alloc)  # rows all alike: each column copied into place
        if whole is None and not writer.spec.transforms:  # rows of other sizes: the same
            limit = writer.spec.shard_size
            whole = variable_shard(self._plans, writer._config_bytes, limit, table, alloc)
        if whole is not None:
            raw, shapes = whole
        else:
            for batch in table.to_batches():
                writer.write(batch)
            infos = writer.finish()
            if len(infos) != 1:
                raise self._file_error(
                    g.file,
                    g.group,
                    "is larger than one MDS shard can hold (4 GiB): rewrite the "
                    "table with smaller row groups, or export it",
                )
            shapes = infos[0].shapes or {}
            raw = np.frombuffer(memory.files[infos[0].raw_data.basename], dtype=np.uint8)
        return raw, shapes

    def _check_shapes(self, g: _RowGroup, shapes: dict[str, list[int] | None]) -> None:
        """A column taken as dense from the footers must be dense in every row group."""
        for name, (kind, shape) in self.forms.items():
            if kind != "dense" or name in self._asked_forms:
                continue
            found = shapes.get(name)
            if found is not None and tuple(found) == shape:
                continue
            raise self._file_error(
                g.file,
                g.group,
                f"column {name!r} holds lists of other lengths than {shape}, which the footers "
                f"suggested for every row (read it with snap.dataset(forms={{{name!r}: "
                "'jagged'}))",
            )

    def _finished(self, g: _RowGroup) -> pa.Table:
        """The row group's live rows as the export has them (partition columns, types)."""
        snap = self.snapshot
        out_schema = snap.output_schema
        stored = [n for n in out_schema.names if n not in snap.partition_columns]
        try:
            remote = self._remote_files()
            if remote is not None:  # its span fetched once per machine
                table = remote.read_group(g.file, g.group)
            else:
                pf = self._parquet(g.file)
                columns = snap.file_columns(pf.schema_arrow, stored, snap.files[g.file])
                with self._file_lock(g.file):
                    table = columns.logical(read_group(pf, g.group, columns.read))
        except TableError:
            raise
        except Exception as exc:
            raise self._file_error(g.file, g.group, exc) from None
        if table.num_rows != g.rows:  # the plan's counts (and the mask) are the footer's
            raise self._file_error(
                g.file, g.group, f"holds {table.num_rows} rows, its footer says {g.rows}"
            )
        keep = self._keep_array(g.file)
        if keep is not None:
            table = table.filter(pa.array(_mask(keep, g.start, g.rows)))
        batches = list(snap._finish(table, snap.files[g.file], out_schema, combine=False))
        return pa.Table.from_batches(batches, schema=out_schema)

    def _parquet(self, file: int, cache: bool = True) -> Any:
        """An open Parquet file of the snapshot (a few kept open per process)."""
        import pyarrow.parquet as pq

        self._own_process()
        if cache:
            with self._lock:
                found = self._open_files.get(file)
                if found is not None:
                    self._open_files.move_to_end(file)
                    return found
        snap = self.snapshot
        filesystem, prefix = snap._filesystem()
        pf = pq.ParquetFile(snap._fs_path(snap.files[file], prefix), filesystem=filesystem)
        if cache:
            with self._lock:
                self._open_files[file] = pf
                while len(self._open_files) > 8:
                    self._open_files.popitem(last=False)
        return pf

    def _file_error(self, file: int, group: int | None, why: Any) -> Exception:
        snap = self.snapshot
        where = f"data file {snap.files[file]}"
        if group is not None:
            where += f" (row group {group})"
        text = why if isinstance(why, str) else first_line(why)
        if isinstance(why, FileNotFoundError):
            text = f"is missing ({text}); the snapshot was probably vacuumed"
        elif isinstance(why, SparkDLError):  # a remote span that could not be fetched
            text = f"cannot be fetched: {why}"
        elif not isinstance(why, str):
            text = f"cannot be read as Parquet: {text}"
        return snap.table_error(f"{where} {text}")


def _take(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """``table``'s rows at ascending ``rows``, taken batch by batch: a take on the whole
    chunked table first joins its chunks (a copy of the row group, 0.3 s for 500k rows of
    ragged lists here)."""
    batches, start = [], 0
    for batch in table.to_batches():
        end = start + batch.num_rows
        lo, hi = np.searchsorted(rows, [start, end])
        if hi > lo:
            batches.append(batch.take(pa.array(rows[lo:hi] - start)))
        start = end
    return pa.Table.from_batches(batches, schema=table.schema)


def _fresh(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, dtype=np.uint8)


def _digest(content: Any) -> str:
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _asked_form(name: str, asked: str | tuple[int, ...]) -> tuple[str, tuple[int, ...] | None]:
    if asked in ("jagged", "objects", "auto"):
        return str(asked), None
    if isinstance(asked, (tuple, list)) and all(isinstance(d, int) and d >= 0 for d in asked):
        return "dense", tuple(asked)
    raise SpecError(
        f"forms[{name!r}]={asked!r}: 'jagged', 'objects', 'auto' or a shape tuple of ints"
    )


def _one_width(counts: list[tuple[int, int]]) -> int | None:
    """``k`` when every row group holds exactly ``k`` leaf values per row (k >= 1)."""
    width: int | None = None
    for rows, values in counts:
        if rows == 0:
            continue
        if values < 0 or values % rows:
            return None
        k = values // rows
        if k < 1 or (width is not None and k != width):
            return None
        width = k
    return width
