"""Reading a planned epoch: shards loaded ahead by a thread, batches gathered and decoded.

The plan (which global samples form which batch) comes from :mod:`spark_dl_core.order`;
this module only turns those index arrays into decoded batches within a memory budget.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

# ``np.unique`` (numpy 2.x) imports ``numpy.ma`` on first use, ~45 ms: imported here, in the
# process that builds loaders, so DataLoader workers forked for every pass inherit it.
import numpy.ma

from ..errors import SpecError
from ..meta import python_types
from ..ops.read import VIEWED_KINDS, ReadOps

try:  # the C plan of a batch (csrc/shuffle.c); numpy where the extension is not built
    from ..order._shuffle import shards_of as _shards_of
except ImportError:
    _shards_of = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from ..format.shard import ShardData
    from ..shard_source import Batch, ShardSource

DEFAULT_PREFETCH_BYTES = 256 << 20  # one default window (4 shards of 64 MiB) read ahead
# How far ahead batches are planned (their shards queued for loading): enough samples to
# see a window's shards coming, a few MiB of index arrays at most.
LOOKAHEAD_SAMPLES = 1 << 18
MAX_AHEAD_BATCHES = 1024
# Threads that decode a batch's row groups at once when it takes rows before their whole
# shards (a table read in place with empty caches): the consumer and one helper.
ROW_THREADS = 2
# Decoded columns whose pipelines read their clips' bytes as views of the shard's memory.


class ShardOf:
    """Sample id -> shard for one dataset's shard offsets, by a bucket table: each bucket of
    ids (about the median shard's length) holds the first shard it meets, and an id moves on
    past the few shard starts inside its bucket by compares (two or three vectorized steps
    against a binary search per id: about 5x faster). Offsets too uneven for a small table
    use the binary search. Same answer as ``searchsorted(offsets, id, "right") - 1``."""

    MAX_BUCKETS = 1 << 20
    MAX_STEPS = 4

    def __init__(self, offsets: np.ndarray) -> None:
        self.offsets = offsets
        self._flat = np.ascontiguousarray(offsets, dtype=np.int64)  # what shards_of reads
        self._seen: np.ndarray | None = None  # shards_of's marks (all zero between calls)
        self.table: np.ndarray | None = None
        self.shift, self.steps = 0, 0
        sizes = np.diff(offsets)
        if not len(sizes) or int(offsets[-1]) < 1:
            return
        shift = max(int(np.median(sizes)), 1).bit_length() - 1
        buckets = ((int(offsets[-1]) - 1) >> shift) + 1
        if buckets > self.MAX_BUCKETS:
            return
        inside = np.bincount(offsets[1:-1] >> shift, minlength=buckets) if len(sizes) > 1 else [0]
        steps = int(np.max(inside))
        if steps <= self.MAX_STEPS:
            starts = np.arange(buckets, dtype=np.int64) << shift
            shard = np.searchsorted(offsets, starts, side="right") - 1
            self.table, self.shift, self.steps = shard.astype(np.int32), shift, steps

    def plan(self, index: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """Each id's shard (int32) and the distinct shards, ascending: what the reader plans a
        batch by, in one pass in C (``order._shuffle.shards_of``), else
        :meth:`__call__` and :func:`_distinct`. An id outside the dataset raises IndexError."""
        if _shards_of is None or not len(index):
            shard_of = self(index)
            return shard_of, _distinct(shard_of)
        if self._seen is None:
            self._seen = np.zeros(len(self.offsets) - 1, dtype=np.uint8)
        out = np.empty(len(index), dtype=np.int32)
        index = np.ascontiguousarray(index, dtype=np.int64)
        needs = _shards_of(index, self._flat, self.table, self.shift, out, self._seen)
        return out, needs

    def __call__(self, index: np.ndarray) -> np.ndarray:
        if self.table is None or not len(index) or int(index.min()) < 0:
            return (np.searchsorted(self.offsets, index, side="right") - 1).astype(np.int32)
        shard = self.table[index >> self.shift]  # IndexError past the table
        end = len(self.offsets) - 1
        for _ in range(self.steps):
            shard += index >= self.offsets[np.minimum(shard + 1, end)]
        return shard


def _distinct(shard_of: np.ndarray) -> list[int]:
    """A batch's shards, ascending: counted when they lie in a narrow range (a batch reads a
    window's few shards; several times faster than ``np.unique``'s hashing), else unique."""
    if not len(shard_of):
        return []
    first, last = int(shard_of.min()), int(shard_of.max())
    if last - first >= 4 * len(shard_of) + 64:
        return np.unique(shard_of).tolist()
    return (np.flatnonzero(np.bincount(shard_of - first)) + first).tolist()


def _batch_len(batches: Sequence[np.ndarray], k: int) -> int:
    """Samples in batch ``k``: from a lazy plan's arithmetic when it has it (asking its
    ids could compute a whole shuffle window's order before the first batch)."""
    count = getattr(batches, "batch_len", None)
    return int(count(k)) if count is not None else len(batches[k])


class BatchReader:
    """Decodes a sequence of batches, keeping only the shards they still need in memory.

    ``batches`` is anything with ``len()`` and ``[j]`` → int64 global sample ids (a lazy
    :class:`~spark_dl_core.order.EpochPlan` included); batches are planned a bounded
    lookahead at a time. A background thread loads (reads, downloads, decompresses) shards in
    order of first planned use, ahead of the decoder: shards the current batch needs (its
    shuffle window) always, and shards first needed later while their bytes stay within
    ``prefetch_bytes``, so the next window is ready when the decoder crosses into it. A
    consumer waiting for shards loads the next one itself rather than sleep (two loads at
    once on the first window). A shard is dropped once no planned batch still needs it.
    Fixed-width datasets are decoded with one row gather per shard into a single
    ``(batch, row)`` byte matrix, then one view/copy per column.
    """

    def __init__(
        self,
        dataset: ShardSource,
        batches: Sequence[np.ndarray],
        *,
        prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
        columns: list[str] | None = None,
        images: Any = "bytes",
        verify_hashes: bool | None = None,
        transforms: Any = None,
        device: str | None = None,
        seed: int = 0,
        epoch: int = 0,
        jagged: bool = False,
        spec_ops: bool = True,
        download_threads: int | None = None,
    ) -> None:
        self.dataset, self.batches = dataset, batches
        # Derived columns (a mixture's source column) are computed from ids, not decoded.
        derived = dataset.derived
        self.derived = [n for n in derived if columns is None or n in columns]
        if columns is not None and derived:
            columns = [c for c in columns if c not in derived]
        self.columns, self.images, self.verify = columns, images, verify_hashes
        self.jagged = jagged
        self.ops = ReadOps(
            dataset, transforms, columns, seed=seed, epoch=epoch, device=device, spec=spec_ops
        )
        if self.ops.pipelines and images != "bytes":
            raise SpecError(
                f"images={images!r} decodes image columns per sample; with image_decode "
                "in transforms leave images='bytes'"
            )
        # Audio / video columns reach their decoders as views of the shard's memory (the
        # decoders read only what they need: a WAV window, a video's first frames), not as
        # gathered copies; the other columns decode as usual.
        pipelines = self.ops.pipelines.items()
        self.views = [
            n
            for n, p in pipelines
            if getattr(p, "kind", "") in VIEWED_KINDS and n in dataset.layout.names
        ]
        self.read_columns = columns
        if self.views:
            names = columns if columns is not None else list(dataset.layout.names)
            self.read_columns = [n for n in names if n not in self.views]
        self.budget = max(0, int(prefetch_bytes))
        # ``batches`` may be lazy (an EpochPlan): only ``ahead`` batches at a time are planned
        # (index, shard of each sample, shards needed), so what is held stays bounded
        # whatever the epoch's length.
        typical = _batch_len(batches, min(len(batches) - 1, 8)) if len(batches) else 1
        self.ahead = max(2, min(MAX_AHEAD_BATCHES, LOOKAHEAD_SAMPLES // max(1, typical)))
        self.planned: dict[int, tuple[np.ndarray, np.ndarray, list[int]]] = {}
        self.next_plan = 0
        self._shard_of: ShardOf | None = None
        self.refs: dict[int, int] = {}  # shard -> planned, unconsumed batches needing it
        self.queue: deque[tuple[int, int]] = deque()  # (shard, first planned use) to load
        self.pending: set[int] = set()  # queued, loading or loaded
        self.planning_done = False
        self.prefetch_waits = False  # the prefetch thread sleeps on ``cond``
        self.loaded: dict[int, ShardData] = {}
        self.first_use: dict[int, int] = {}  # shard (loaded or loading) -> first planned batch
        self.current = 0
        self.error: BaseException | None = None
        self.stop = False
        self.cond = threading.Condition()
        self.fixed = self._fixed_layout()
        self.out_widths = self._out_widths()
        # Per loaded shard: its row layout for the requested columns (Dataset.row_spans).
        self._row_plans: dict[int, Any] = {}
        # Where fixed-width batch ``j`` of ``n`` bytes is decoded to (None: a fresh buffer);
        # DataLoader workers point it at reusable shared-memory slabs.
        self.out_for: Callable[[int, int], np.ndarray | None] | None = None
        self._scratch = np.empty(0, dtype=np.uint8)
        self._grouped = np.empty(0, dtype=np.uint8)  # rows grouped by shard (_gather_by_shard)
        # Telemetry: seconds reading / decompressing (prefetch thread) and decoding.
        self.times = dict.fromkeys(("read", "decompress", "decode", "transform"), 0.0)
        self.spans: Any = None  # a telemetry.Spans when tracing
        # Remote datasets: shards queued for download ahead of their load, in planned order
        # (within ``prefetch_bytes`` of stored bytes beyond the current batch's shards).
        self.download_threads = download_threads
        self.hinted: set[int] = set()
        self.touched: set[int] = set()  # distinct shards loaded this pass (telemetry)
        self._remote = True  # until the dataset says its shards are read in place
        self._net0: dict[str, float] | None = None
        # Serve a batch rows of shards not loaded yet (load_rows); a DataLoader worker
        # among several turns it off (the torch loader says why).
        self.rows_first = dataset.serves_rows
        # Only from shards this process holds decoded (a DataLoader worker among several:
        # the decode was done once before they forked, and is not to be done in each).
        self.rows_decoded_only = False
        # Shards served by rows (load_rows) and not loaded whole yet; those no batch needs
        # any more are loaded at the pass's end, so a whole pass leaves them converted.
        self.by_rows: set[int] = set()
        self.unloaded: set[int] = set()
        self.in_flight = 0  # shard loads under way
        self.rows_wanted = False  # the consumer is loading rows: the prefetch thread waits

    def _plan_until(self, end: int) -> None:
        """Plan batches up to ``end`` (exclusive): their shards join the load queue."""
        offsets = np.asarray(self.dataset.shard_offsets, dtype=np.int64)
        if self._shard_of is None or self._shard_of.offsets is not offsets:
            self._shard_of = ShardOf(offsets)
        end = min(end, len(self.batches))
        while self.next_plan < end:
            j = self.next_plan
            index = np.asarray(self.batches[j], dtype=np.int64)
            shard_of, needs = self._shard_of.plan(index)
            with self.cond:
                self.planned[j] = (index, shard_of, needs)
                queued = False
                for s in needs:
                    self.refs[s] = self.refs.get(s, 0) + 1
                    if s not in self.pending:
                        self.pending.add(s)
                        self.queue.append((s, j))
                        queued = True
                self.next_plan = j + 1
                self.planning_done = self.next_plan >= len(self.batches)
                if queued:
                    self._hint()
                if queued or self.planning_done:
                    self._wake()

    def _fixed_layout(self) -> list[tuple[str, int, int]] | None:
        layout = self.dataset.layout
        if layout.row_size is None:
            return None
        names = self.columns if self.columns is not None else list(layout.names)
        at = np.cumsum([0, *(s or 0 for s in layout.sizes)]).tolist()
        out = []
        for name in names:
            if name not in layout.names:
                return None  # let Dataset.decode raise its error naming the columns
            i = layout.names.index(name)
            out.append((name, int(at[i]), int(layout.sizes[i] or 0)))
        return out

    def _out_widths(self) -> list[int] | None:
        """Decoded bytes per sample of each requested column, when all are fixed-width or
        dense ndarrays of a known dtype (what a row gather can produce), else None."""
        ds = self.dataset
        names = self.columns if self.columns is not None else list(ds.layout.names)
        widths = []
        for name in names:
            if name not in ds.layout.names:
                return None
            encoding = ds.encoding(name)
            if encoding.size is not None:
                widths.append(encoding.size)
                continue
            form, dtype = ds.forms.get(name), getattr(encoding, "dtype", None)
            if form is None or form[0] != "dense" or form[1] is None or dtype is None:
                return None
            widths.append(int(np.prod(form[1], dtype=np.int64)) * np.dtype(dtype).itemsize)
        return widths

    def _rows_for(self, shards: dict[int, ShardData]) -> tuple[int, list[Any]] | None:
        """The one row layout of a batch's shards: ``(row size, [(name, at, width, how)])``
        with ``how`` an encoding or a dense ``(dtype, shape)``; None when the shards are not
        row matrices of one layout (then the general decode runs)."""
        if self.out_widths is None:
            return None
        ds = self.dataset
        if self.fixed is not None:
            row = ds.layout.row_size or 0
            return row, [(name, at, width, ds.encoding(name)) for name, at, width in self.fixed]
        names = self.columns if self.columns is not None else list(ds.layout.names)
        found = None
        for s, data in shards.items():
            if data.row_matrix is None:  # ragged rows, or a shard's rows alone (load_rows)
                return None
            if s not in self._row_plans:
                self._row_plans[s] = ds.row_spans(data, names)
            plan = self._row_plans[s]
            if plan is None or (found is not None and not _same_rows(plan, found)):
                return None
            found = plan
        if found is None:
            return None
        row, spans = found
        return row, [(name, *span) for name, span in zip(names, spans)]

    def _hint(self) -> None:
        """Queue downloads of the shards next in line (caller holds ``cond``): every shard
        the current batch needs, then later ones while their stored bytes fit the budget."""
        if not self._remote or self.stop:
            return
        stored = self.dataset.shards.stored_bytes
        ahead, new = 0, []
        for shard, first_use in self.queue:
            if first_use > self.current:
                ahead += int(stored[shard])
                if ahead > self.budget:
                    break
            if shard not in self.hinted:
                self.hinted.add(shard)
                new.append(shard)
        if new:
            self._remote = self.dataset.prefetch_shards(new, self.download_threads)

    def _net(self) -> None:
        """Download telemetry since this pass began, into ``times`` (remote datasets)."""
        if self._net0 is None:
            return
        now = self.dataset.download_stats() or {}
        for key, start in self._net0.items():
            self.times[key] = now.get(key, start) - start

    def _size(self, shard: int) -> int:
        return int(self.dataset.shards.raw_bytes[shard])

    def _wake(self) -> None:
        """Wake the prefetch thread (caller holds ``cond``) only when it waits: a needless
        wake-up costs a GIL hand-over per batch."""
        if self.prefetch_waits:
            self.cond.notify_all()

    def _wait_prefetch(self) -> None:
        self.prefetch_waits = True
        try:
            self.cond.wait()
        finally:
            self.prefetch_waits = False

    @property
    def held(self) -> int:
        """Bytes of shards loaded or loading."""
        return sum(self._size(s) for s in self.first_use)

    def _ahead_bytes(self) -> int:
        """Bytes of shards loaded (or loading) that no batch up to the current one needs."""
        return sum(self._size(s) for s, use in self.first_use.items() if use > self.current)

    def _may_load_next(self) -> bool:
        """Whether the next queued shard may be loaded now (caller holds ``cond``):
        always when the current batch needs it, else within the read-ahead budget."""
        if self.rows_wanted:  # the current batch's row groups are being decoded: not now
            return False
        shard, first_use = self.queue[0]
        if first_use <= self.current:
            return True
        return self._ahead_bytes() + self._size(shard) <= self.budget

    def _take(self) -> int:
        """Claim the next queued shard for loading (caller holds ``cond``)."""
        shard, first_use = self.queue.popleft()
        self.first_use[shard] = first_use
        self.in_flight += 1
        return shard

    def _load(self, shard: int, who: str) -> None:
        """Load a claimed shard (without ``cond``) and publish it."""
        started = time.perf_counter()
        try:
            data = self.dataset.load_shard(shard, self.verify, self.times)
        except BaseException:
            with self.cond:
                self.in_flight -= 1
                self.cond.notify_all()
            raise
        if self.spans is not None:
            self.spans.add("load shard", started, time.perf_counter(), who, shard=shard)
        with self.cond:
            self.in_flight -= 1
            self.by_rows.discard(shard)
            self.unloaded.discard(shard)
            if shard in self.first_use:  # else no batch needs it any more (served by rows)
                self.loaded[shard] = data
                self.touched.add(shard)
                self.times["shards_touched"] = float(len(self.touched))
            self.cond.notify_all()

    def _prefetch(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.stop and not self.queue and not self.planning_done:
                        self._wait_prefetch()
                    if self.stop or not self.queue:
                        return
                    while not self.stop and self.queue and not self._may_load_next():
                        self._wait_prefetch()
                    if self.stop:
                        return
                    if not self.queue:  # the consumer took it meanwhile
                        continue
                    shard = self._take()
                self._load(shard, "prefetch")
        except BaseException as exc:  # handed to the consumer, re-raised there
            with self.cond:
                self.error = exc
                self.cond.notify_all()

    def _await_shards(self, needs: list[int]) -> None:
        """Block until every shard in ``needs`` is loaded (caller holds ``cond``). Rather
        than sleep, the consumer loads the next shard the current batch needs itself."""
        while self.error is None and not all(s in self.loaded for s in needs):
            if self.queue and self.queue[0][1] <= self.current:
                shard = self._take()
                self.cond.release()
                try:
                    self._load(shard, "decode")
                finally:
                    self.cond.acquire()
                continue
            self.cond.wait()
        if self.error is not None:
            raise self.error

    def _batch_shards(self, j: int) -> dict[int, ShardData]:
        """Batch ``j``'s shards (the current batch). A shard not loaded yet comes as just
        this batch's rows when the dataset serves them sooner than the whole shard (a table
        read in place with empty caches: rows taken from its decoded row group), so the
        first batches need not wait for whole row groups to be converted. Those row groups
        are decoded by ``ROW_THREADS`` threads at once, and the prefetch thread starts no
        load meanwhile: it converts them once the batch has its rows."""
        index, shard_of, needs = self.planned[j]
        parts: dict[int, ShardData] = {}
        with self.cond:
            missing = [s for s in needs if s not in self.loaded]
            claimed = set(self.first_use)
            rows_first = bool(missing) and self.rows_first and self.error is None
            if self.rows_wanted != rows_first:
                self.rows_wanted = rows_first
                self._wake()
        if rows_first:
            offsets = self.dataset.shard_offsets
            asks = []
            # Those no loader has claimed first: the prefetch thread is on the others.
            for s in sorted(missing, key=lambda s: s in claimed):
                local = index if len(needs) == 1 else index[shard_of == s]
                asks.append((s, np.unique(local - offsets[s])))
            try:
                parts = self._rows_at_once(asks)
            finally:
                with self.cond:
                    self.rows_wanted = False
                    self._wake()
        with self.cond:
            self.by_rows.update(parts)
            self._await_shards([s for s in needs if s not in parts])
            return {s: parts[s] if s in parts else self.loaded[s] for s in needs}

    def _rows_at_once(self, asks: list[tuple[int, np.ndarray]]) -> dict[int, ShardData]:
        """``dataset.load_rows`` of each ``(shard, rows)`` in ``asks`` (in that order),
        on this thread and up to ``ROW_THREADS - 1`` helpers; a shard loaded whole
        meanwhile is left out, and so is one the dataset does not serve by rows."""
        parts: dict[int, ShardData] = {}
        errors: list[BaseException] = []
        todo = deque(asks)

        def work() -> None:
            while not errors:
                with self.cond:
                    if not todo:
                        return
                    shard, rows = todo.popleft()
                    if shard in self.loaded:
                        continue
                started = time.perf_counter()
                try:
                    part = self.dataset.load_rows(
                        shard, rows, self.verify, self.times, self.rows_decoded_only
                    )
                except BaseException as exc:  # raised on the consumer's thread
                    errors.append(exc)
                    return
                if part is None:
                    continue
                if self.spans is not None:
                    self.spans.add("load rows", started, time.perf_counter(), "decode", shard=shard)
                with self.cond:
                    parts[shard] = part

        helpers = [
            threading.Thread(target=work, name="spark-dl-rows", daemon=True)
            for _ in range(min(ROW_THREADS, len(asks)) - 1)
        ]
        for helper in helpers:
            helper.start()
        work()
        for helper in helpers:
            helper.join()
        if errors:
            raise errors[0]
        return parts

    def _drop(self, shard: int) -> None:
        """Forget a shard no planned batch needs (caller holds ``cond``): loaded, loading
        (its load is then not kept) or still queued (served by rows only)."""
        del self.refs[shard]
        if shard in self.by_rows:
            self.by_rows.discard(shard)
            if shard not in self.first_use:  # its whole load is not under way: at the end
                self.unloaded.add(shard)
        self.loaded.pop(shard, None)
        self.first_use.pop(shard, None)
        self._row_plans.pop(shard, None)
        self.pending.discard(shard)
        self.hinted.discard(shard)
        if any(s == shard for s, _ in self.queue):
            self.queue = deque(item for item in self.queue if item[0] != shard)
        self._wake()

    def _load_unloaded(self) -> None:
        """At a whole pass's end: load the shards served only by rows (a table read in
        place converts and caches them), so the next pass reads each whole, not decoded
        again; and waits for loads under way, raising their errors. A pass left early leaves
        them to the prefetch thread's loads in flight."""
        while True:
            with self.cond:
                while self.in_flight and self.error is None:
                    self.cond.wait()
                if self.error is not None:
                    raise self.error
                if not self.unloaded:
                    return
                shard = min(self.unloaded)
                self.unloaded.discard(shard)
            self.dataset.load_shard(shard, self.verify, self.times)

    def __iter__(self) -> Iterator[Batch]:
        if not len(self.batches):
            return
        self._net0 = self.dataset.download_stats()
        # The lookahead grows from here: a quick first batch. Remote shards are downloaded
        # in planned order, so there the whole lookahead is planned at once (a few ms):
        # later windows download while the first one does.
        self._plan_until(2 if self._net0 is None else self.ahead)
        # The first batch's row groups are decoded by ROW_THREADS threads before the
        # prefetch thread starts a load (_batch_shards), not by one more.
        self.rows_wanted = self.rows_first
        thread = threading.Thread(target=self._prefetch, name="spark-dl-prefetch", daemon=True)
        thread.start()
        try:
            for j in range(len(self.batches)):
                self._plan_until(j + min(self.ahead, 2 + 2 * j))
                with self.cond:
                    self.current = j
                    self._hint()
                    self._wake()
                    index, _, needs = self.planned[j]
                shards = self._batch_shards(j)
                out = None
                if self.out_for is not None and self.out_widths is not None:
                    out = self.out_for(j, self.fixed_bytes(len(index)) or 0)
                started = time.perf_counter()
                decoded = python_types(self.dataset.plans, self._decode(j, index, shards, out))
                if self.views:
                    decoded = self._with_views(j, index, shards, decoded)
                for name in self.derived:
                    decoded[name] = self.dataset.derive(name, index)
                decoded = self.ops.apply(decoded, index)
                if not self.jagged:  # plain numpy: token sequences, images as object arrays
                    for name, value in decoded.items():
                        if hasattr(value, "to_objects"):  # Jagged, a pipeline's ImageList
                            decoded[name] = value.to_objects()
                ended = time.perf_counter()
                self.times["decode"] += ended - started
                self._net()
                if self.spans is not None:
                    self.spans.add("decode", started, ended, "decode", batch=j)
                yield decoded
                with self.cond:
                    del self.planned[j]
                    for s in needs:
                        self.refs[s] -= 1
                        if not self.refs[s]:  # no planned batch needs it: drop it
                            self._drop(s)
            self._load_unloaded()
        finally:
            with self.cond:
                self.stop = True
                self.loaded.clear()
                self.first_use.clear()
                self.cond.notify_all()
                idle = self.prefetch_waits
                hinted, self.hinted = sorted(self.hinted), set()
            if hinted and self._remote:  # downloads queued for batches no one will read
                self.dataset.release_shards(hinted)
            if idle:  # it ends as soon as it wakes: then nothing holds the dataset any more
                thread.join()

    def _with_views(
        self, j: int, index: np.ndarray, shards: dict[int, ShardData], decoded: Batch
    ) -> Batch:
        """``decoded`` plus the view columns: per sample a memoryview of its bytes in the
        shard (bounds checked by :meth:`ShardData.positions`), in the requested order."""
        shard_of, offsets = self.planned[j][1], self.dataset.shard_offsets
        views: dict[str, list[Any]] = {name: [None] * len(index) for name in self.views}
        for s, data in shards.items():
            where = np.flatnonzero(shard_of == s) if len(shards) > 1 else np.arange(len(index))
            starts, sizes = data.positions(index[where] - offsets[s])
            memory = memoryview(data.raw.data)
            for name, found in views.items():
                i = data.layout.names.index(name)  # each shard's own layout (mixtures)
                for k, at, size in zip(where.tolist(), starts[:, i].tolist(), sizes[:, i].tolist()):
                    found[k] = memory[at : at + size]
        names = self.columns if self.columns is not None else list(self.dataset.layout.names)
        out: Batch = {}
        for name in names:
            if name in views or name in decoded:
                out[name] = views[name] if name in views else decoded[name]
        return out

    def fixed_bytes(self, n: int) -> int | None:
        """Bytes :meth:`_decode` needs in an ``out`` buffer for ``n`` rows (None: not fixed)."""
        if self.out_widths is None:
            return None
        return n * sum(self.out_widths)

    def _gather_by_shard(
        self,
        index: np.ndarray,
        shard_of: np.ndarray,
        shards: dict[int, ShardData],
        rows: np.ndarray,
    ) -> None:
        """The rows of a batch spanning several shards, into ``rows`` in batch order: one
        stable sort groups them by shard (a radix sort on the few shard numbers), each
        shard's rows are gathered into consecutive scratch rows, and one scatter puts them
        in place (a stratified mixture's batch spans both sources' windows: a mask, a gather
        and a scatter per shard cost more there)."""
        first = int(shard_of.min())
        rel = shard_of - first
        span = int(rel.max()) + 1
        narrow = np.uint8 if span <= 1 << 8 else np.uint16 if span <= 1 << 16 else np.int32
        order = np.argsort(rel.astype(narrow, copy=False), kind="stable")
        n, width = rows.shape
        if self._grouped.size < n * width:
            self._grouped = np.empty(n * width, dtype=np.uint8)
        grouped = self._grouped[: n * width].reshape(n, width)
        local = index[order] - self.dataset.shard_offsets[shard_of[order]]
        at = 0
        for k, count in enumerate(np.bincount(rel, minlength=span).tolist()):
            if count:
                shards[first + k].gather_rows(local[at : at + count], grouped[at : at + count])
                at += count
        rows[order] = grouped

    def _decode(
        self,
        j: int,
        index: np.ndarray,
        shards: dict[int, ShardData],
        out: np.ndarray | None = None,
    ) -> Batch:
        """Decode batch ``j``. When its shards are row matrices of one layout (fixed-width
        datasets, equal-length arrays) columns are gathered straight into column blocks of
        ``out`` (or a fresh buffer): one copy per byte, the decoded arrays are views of it.
        """
        ds = self.dataset
        rows_plan = self._rows_for(shards)
        if rows_plan is None:
            return ds.read(
                index, self.read_columns, self.images, self.verify, loaded=dict(shards), jagged=True
            )
        row, spans = rows_plan
        n = len(index)
        need = n * sum(width for _, _, width, _ in spans)
        buffer = np.empty(need, dtype=np.uint8) if out is None else out[:need]
        gathered = self._gather_columns(j, index, shards, row, spans, buffer)
        if gathered is None:
            gathered = self._gather_split(j, index, shards, row, spans, buffer)
        if gathered >= 0:  # another shape in some row: the general decode says so
            return ds.read(index, self.columns, self.images, self.verify, dict(shards), True)
        return self._decoded(spans, buffer, n)

    def _gather_columns(
        self,
        j: int,
        index: np.ndarray,
        shards: dict[int, ShardData],
        row: int,
        spans: list[Any],
        buffer: np.ndarray,
    ) -> int | None:
        """Batch ``j``'s columns gathered into ``buffer`` in one pass (the C extension):
        -1, the first row whose array header differs, or None (no extension: nothing done)."""
        from ..format.buffers import gather_columns

        offsets = self.dataset.shard_offsets
        cut = [(at, width, _header(how)) for _name, at, width, how in spans]
        needs = sorted(shards)
        mats = [shards[s].row_matrix for s in needs]
        if not all(m is not None and m.flags.c_contiguous for m in mats):
            return None
        if len(needs) == 1:
            return gather_columns(buffer, mats, None, index - offsets[needs[0]], row, cut)
        shard_of = self.planned[j][1]
        first, span = needs[0], needs[-1] - needs[0] + 1
        if span <= 1 << 12:
            lookup = np.zeros(span, dtype=np.int32)
            lookup[np.asarray(needs) - first] = np.arange(len(needs), dtype=np.int32)
            which = lookup[shard_of - first]
        else:
            which = np.searchsorted(np.asarray(needs), shard_of).astype(np.int32)
        return gather_columns(buffer, mats, which, index - offsets[shard_of], row, cut)

    def _gather_split(
        self,
        j: int,
        index: np.ndarray,
        shards: dict[int, ShardData],
        row: int,
        spans: list[Any],
        buffer: np.ndarray,
    ) -> int:
        """:meth:`_gather_columns` in numpy: whole rows gathered, headers checked, split."""
        ds = self.dataset
        n = len(index)
        single_column = len(spans) == 1 and spans[0][2] == row
        if single_column:  # the rows are the column: gather straight into the output
            rows = buffer.reshape(n, row)
        else:  # gather whole rows (fast, contiguous) into reused scratch, then split
            if self._scratch.size < n * row:
                self._scratch = np.empty(n * row, dtype=np.uint8)
            rows = self._scratch[: n * row].reshape(n, row)
        if len(shards) == 1:
            [(s, data)] = shards.items()
            data.gather_rows(index - ds.shard_offsets[s], rows)
        else:
            self._gather_by_shard(index, self.planned[j][1], shards, rows)
        for _name, at, _width, how in spans:
            if isinstance(how, tuple) and len(how[2]):  # every row repeats the header?
                header = rows[:, at - len(how[2]) : at]
                if not np.array_equal(header, np.broadcast_to(how[2], header.shape)):
                    return 0  # another shape in some row: the general decode says so
        if not single_column:
            at_out = 0
            for _name, at, width, _how in spans:  # column-major: each column contiguous
                block = buffer[at_out : at_out + n * width].reshape(n, width)
                np.copyto(block, rows[:, at : at + width])
                at_out += n * width
        return -1

    def _decoded(self, spans: list[Any], buffer: np.ndarray, n: int) -> Batch:
        """The batch's columns from their blocks in ``buffer`` (views, no copy)."""
        from ..format.buffers import Pieces
        from ..format.encodings import DecodeOptions

        ds = self.dataset
        options = DecodeOptions(images=self.images, allow_unsafe=ds.allow_unsafe)
        decoded: Batch = {}
        at_out = 0
        for name, _at, width, how in spans:
            block = buffer[at_out : at_out + n * width]
            if isinstance(how, tuple):  # equal-length ndarray values past their header
                dtype, shape, _header = how
                native = dtype.newbyteorder("=")
                decoded[name] = block.view(dtype).reshape((n, *shape)).astype(native, copy=False)
            else:
                decoded[name] = how.decode(Pieces(block, width=width), n, name, options)
            at_out += n * width
        return decoded


def _header(how: Any) -> bytes:
    """The bytes every row repeats before a dense array column's values (b"" for others)."""
    return np.asarray(how[2], dtype=np.uint8).tobytes() if isinstance(how, tuple) else b""


def _same_rows(a: tuple[int, list[Any]], b: tuple[int, list[Any]]) -> bool:
    """Whether two shards' row layouts (``Dataset.row_spans``) are the same."""
    if a[0] != b[0] or len(a[1]) != len(b[1]):
        return False
    for (at, width, how), (at2, width2, how2) in zip(a[1], b[1]):
        if (at, width) != (at2, width2) or isinstance(how, tuple) != isinstance(how2, tuple):
            return False
        if isinstance(how, tuple):
            if how[:2] != how2[:2] or not np.array_equal(how[2], how2[2]):
                return False
        elif how is not how2:
            return False
    return True
