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

from ..errors import ColumnNotFoundError, SpecError
from ..format.buffers import Jagged
from ..meta import python_types

if TYPE_CHECKING:
    from ..format.shard import ShardData
    from ..sources.dataset import Batch, Dataset

DEFAULT_PREFETCH_BYTES = 256 << 20  # one default window (4 shards of 64 MiB) read ahead
# How far ahead batches are planned (their shards queued for loading): enough samples to
# see a window's shards coming, a few MiB of index arrays at most.
LOOKAHEAD_SAMPLES = 1 << 18
MAX_AHEAD_BATCHES = 1024
# Decoded columns whose pipelines read their clips' bytes as views of the shard's memory.
VIEWED_KINDS = ("audio", "video")


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
        dataset: Dataset,
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
        typical = len(batches[min(len(batches) - 1, 8)]) if len(batches) else 1
        self.ahead = max(2, min(MAX_AHEAD_BATCHES, LOOKAHEAD_SAMPLES // max(1, typical)))
        self.planned: dict[int, tuple[np.ndarray, np.ndarray, list[int]]] = {}
        self.next_plan = 0
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
        # Telemetry: seconds reading / decompressing (prefetch thread) and decoding.
        self.times = dict.fromkeys(("read", "decompress", "decode", "transform"), 0.0)
        self.spans: Any = None  # a telemetry.Spans when tracing
        # Remote datasets: shards queued for download ahead of their load, in planned order
        # (within ``prefetch_bytes`` of stored bytes beyond the current batch's shards).
        self.download_threads = download_threads
        self.hinted: set[int] = set()
        self._remote = True  # until the dataset says its shards are read in place
        self._net0: dict[str, float] | None = None

    def _plan_until(self, end: int) -> None:
        """Plan batches up to ``end`` (exclusive): their shards join the load queue."""
        offsets = self.dataset.shard_offsets
        end = min(end, len(self.batches))
        while self.next_plan < end:
            j = self.next_plan
            index = np.asarray(self.batches[j], dtype=np.int64)
            shard_of = (
                (np.searchsorted(offsets, index, side="right") - 1).astype(np.int32)
                if len(index)
                else np.empty(0, np.int32)
            )
            needs = np.unique(shard_of).tolist()
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
        shard, first_use = self.queue[0]
        if first_use <= self.current:
            return True
        return self._ahead_bytes() + self._size(shard) <= self.budget

    def _take(self) -> int:
        """Claim the next queued shard for loading (caller holds ``cond``)."""
        shard, first_use = self.queue.popleft()
        self.first_use[shard] = first_use
        return shard

    def _load(self, shard: int, who: str) -> None:
        """Load a claimed shard (without ``cond``) and publish it."""
        started = time.perf_counter()
        data = self.dataset.load_shard(shard, self.verify, self.times)
        if self.spans is not None:
            self.spans.add("load shard", started, time.perf_counter(), who, shard=shard)
        with self.cond:
            self.loaded[shard] = data
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

    def __iter__(self) -> Iterator[Batch]:
        if not len(self.batches):
            return
        self._net0 = self.dataset.download_stats()
        # The lookahead grows from here: a quick first batch. Remote shards are downloaded
        # in planned order, so there the whole lookahead is planned at once (a few ms):
        # later windows download while the first one does.
        self._plan_until(2 if self._net0 is None else self.ahead)
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
                    self._await_shards(needs)
                    shards = {s: self.loaded[s] for s in needs}
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
                            del self.refs[s]
                            del self.loaded[s]
                            del self.first_use[s]
                            self._row_plans.pop(s, None)
                            self.pending.discard(s)
                            self.hinted.discard(s)
                            self._wake()
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
        from ..format.buffers import Pieces
        from ..format.encodings import DecodeOptions

        row, spans = rows_plan
        n = len(index)
        need = n * sum(width for _, _, width, _ in spans)
        buffer = np.empty(need, dtype=np.uint8) if out is None else out[:need]
        single_column = len(spans) == 1 and spans[0][2] == row
        if single_column:  # the rows are the column: gather straight into the output
            rows = buffer.reshape(n, row)
        else:  # gather whole rows (fast, contiguous) into reused scratch, then split
            if self._scratch.size < n * row:
                self._scratch = np.empty(n * row, dtype=np.uint8)
            rows = self._scratch[: n * row].reshape(n, row)
        shard_of = self.planned[j][1]
        for s, data in shards.items():
            local = index - ds.shard_offsets[s]
            if len(shards) == 1:
                data.gather_rows(local, rows)
            else:
                where = np.flatnonzero(shard_of == s)
                part = np.empty((len(where), row), dtype=np.uint8)
                data.gather_rows(local[where], part)
                rows[where] = part
        for _name, at, _width, how in spans:
            if isinstance(how, tuple) and len(how[2]):  # every row repeats the header?
                header = rows[:, at - len(how[2]) : at]
                if not np.array_equal(header, np.broadcast_to(how[2], header.shape)):
                    return ds.read(  # another shape in some row: the general decode says so
                        index, self.columns, self.images, self.verify, dict(shards), True
                    )
        if not single_column:
            at_out = 0
            for _name, at, width, _how in spans:  # column-major: each column contiguous
                block = buffer[at_out : at_out + n * width].reshape(n, width)
                np.copyto(block, rows[:, at : at + width])
                at_out += n * width
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


class EncodedImages:
    """A column on its way to the device: encoded bytes plus their plan.

    DataLoader workers send this (``device="cuda"``) for pipelines that decode on a device
    (``on_device``: images); the main process decodes the whole batch in one call on the
    GPU and applies the same plan (:meth:`ImagePipeline.run_torch`). The images lie back to
    back in one buffer (``data``, split at ``offsets``): made by the workers' allocator, in
    shared memory, so a batch's bytes reach the main process without being pickled.
    """

    __slots__ = ("data", "offsets", "pipeline", "plan")

    def __init__(self, pipeline: Any, data: Any, offsets: np.ndarray, plan: Any) -> None:
        self.pipeline, self.data, self.offsets, self.plan = pipeline, data, offsets, plan

    @classmethod
    def pack(
        cls, pipeline: Any, raws: list[Any], plan: Any, alloc: Callable[..., np.ndarray]
    ) -> EncodedImages:
        """``raws`` copied back to back into one buffer from ``alloc``."""
        sizes = np.array([len(raw) for raw in raws], dtype=np.int64)
        offsets = np.zeros(len(raws) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        data = alloc((int(offsets[-1]),))
        for raw, at, size in zip(raws, offsets[:-1].tolist(), sizes.tolist()):
            data[at : at + size] = np.frombuffer(raw, dtype=np.uint8)
        return cls(pipeline, data, offsets, plan)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def raws(self) -> list[Any]:
        """Each image's bytes: views of ``data`` (a numpy array or a torch tensor)."""
        at = self.offsets.tolist()
        return [self.data[at[i] : at[i + 1]] for i in range(len(self))]

    def rows(self, start: int, stop: int) -> EncodedImages:
        first, last = int(self.offsets[start]), int(self.offsets[stop])
        offsets = self.offsets[start : stop + 1] - first
        return EncodedImages(
            self.pipeline, self.data[first:last], offsets, self.plan.rows(start, stop)
        )

    def with_data(self, data: Any) -> EncodedImages:
        """The same images over another form of the buffer (a torch tensor, for transport)."""
        return EncodedImages(self.pipeline, data, self.offsets, self.plan)

    def to_device(self, device: str) -> Any:
        return self.pipeline.run_torch(self.raws, self.plan, device)


class ReadOps:
    """Read-time transforms of one loader: the spec's ``"at": "read"`` ones, then the
    loader's own ``transforms=``, checked against the dataset's columns before any data is
    read. Decoded columns (image, audio, video...) run the pipelines their decode ops start,
    found through the op registry (:func:`~spark_dl_core.ops.transforms.compile_read_ops`);
    ``normalize`` on numeric columns runs on numpy; other ops go through Arrow.
    """

    def __init__(
        self,
        dataset: Dataset,
        transforms: Any,
        columns: list[str] | None,
        *,
        seed: int = 0,
        epoch: int = 0,
        device: str | None = None,
        spec: bool = True,
    ) -> None:
        from ..ops.transforms import parse_transforms
        from .arrow import read_transforms

        self.dataset = dataset
        recorded = read_transforms(dataset) if spec else []
        self.transforms = recorded + parse_transforms(transforms)
        self.pipelines: dict[str, Any] = {}  # decoded column -> its ColumnPipeline
        self.others: list[Any] = []
        self.device = device
        # Makes decoded image batches (uint8, by shape); DataLoader workers allocate them in
        # shared memory (see torch_loader), so they reach the main process uncopied.
        self.alloc: Callable[[tuple[int, ...]], np.ndarray] = _empty_bytes
        names = columns if columns is not None else list(dataset.layout.names)
        _check_columns_setting(dataset, names)
        if not self.transforms:
            return
        from ..ops.transforms import augment_key, compile_read_ops

        kinds = {n: dataset.columns.get(n, "?") for n in names}
        self.pipelines, self.others = compile_read_ops(self.transforms, kinds)
        self.key = augment_key(dataset.fingerprint, seed, epoch)

    def __bool__(self) -> bool:
        return bool(self.transforms)

    def names_after(self, names: list[str]) -> list[str]:
        """The column names a batch with columns ``names`` has after these ops."""
        for op in self.transforms:
            names = op.columns_after(names)
        return names

    @property
    def transformed(self) -> set[str]:
        """Columns a pipeline (image, audio, video) turns into dense decoded batches."""
        return set(self.pipelines)

    def apply(self, batch: Batch, index: np.ndarray) -> Batch:
        """Run the ops on one decoded batch whose samples have global indices ``index``."""
        if not self.transforms:
            return batch
        from ..ops.transforms import Normalize

        on_device = self.device is not None  # the loader's check_device: a torch device
        for name, pipeline in self.pipelines.items():
            viewed = getattr(pipeline, "kind", "") in VIEWED_KINDS  # memoryviews: as they are
            raws = list(batch[name]) if viewed else [bytes(r) for r in batch[name]]

            def where(i: int, message: str, name: str = name) -> str:
                return self._where(name, int(index[i]), message)

            if on_device and pipeline.on_device:  # decoded in the main process, on the device
                plan = pipeline.plan(raws, self.key, index, where)
                batch[name] = EncodedImages.pack(pipeline, raws, plan, self.alloc)
            else:
                batch[name] = pipeline.run(raws, self.key, index, where, self.alloc)
        arrow_ops: list[Any] = []
        for op in self.others:
            if isinstance(op, Normalize) and not arrow_ops:
                batch[op.column] = _normalize(batch[op.column], op)
            else:
                arrow_ops.append(op)
        if arrow_ops:
            batch = self._through_arrow(batch, arrow_ops)
        return batch

    def _where(self, column: str, sample: int, message: str) -> str:
        file, local = self.dataset.locate(sample)
        return f"column {column!r}, shard {file!r}, sample {local} (global {sample}): {message}"

    def _through_arrow(self, batch: Batch, ops: list[Any]) -> Batch:
        import pyarrow as pa

        from ..ops.transforms import apply_transforms
        from .arrow import arrow_to_numpy, numpy_to_arrow

        arrays, names = [], []
        for name, value in batch.items():
            if isinstance(value, np.ndarray) and value.dtype == object:
                arrays.append(pa.array(list(value)))
            else:
                arrays.append(numpy_to_arrow(value, _arrow_type_of(value)))
            names.append(name)
        record = pa.RecordBatch.from_arrays(arrays, names=names)
        for op in ops:
            record = apply_transforms(record, [op.model_copy(update={"at": "read"})], "read")
        return {n: arrow_to_numpy(record.column(n)) for n in record.schema.names}


def random_access_ops(dataset: Dataset, asked: list[str] | None) -> ReadOps | None:
    """The spec's read-time ops as ``ds[i]`` runs them, so random access gives what the
    loaders give: seeded ops with seed 0 and epoch 0 (a loader's first epoch at its default
    seed draws the same for that sample). ``asked`` are output names (after renames); ops
    that only change columns not asked are left out (no image decoded for ``ds["label"]``).
    None when the spec has no read ops."""
    from .arrow import read_transforms

    ops = read_transforms(dataset)
    if not ops:
        return None
    if asked is not None:
        out = [*dataset.layout.names, *dataset.derived]
        for op in ops:
            out = op.columns_after(out)
        missing = [c for c in asked if c not in out]
        if missing:
            raise ColumnNotFoundError(
                f"{dataset.shown} has no column(s) {missing} after its read-time ops; it has {out}"
            )
        ops = _ops_reaching(ops, set(asked))
    return ReadOps(dataset, ops, None, spec=False)


def _ops_reaching(ops: list[Any], wanted: set[str] | None) -> list[Any]:
    """The ops whose effect can reach the columns ``wanted`` at the end (walked backwards:
    an op on one column that is not wanted is dropped; renames map names back; an op that
    makes new columns from others, such as ``python``, keeps every op before it)."""
    from ..ops.transforms import Drop, PythonTransform, Rename, Select

    kept = []
    for op in reversed(ops):
        column = getattr(op, "column", None)
        if column is not None and not isinstance(op, PythonTransform):
            written = getattr(op, "output", None) or column
            if wanted is not None:
                if written not in wanted:
                    continue
                wanted.add(column)
        elif isinstance(op, Rename) and wanted is not None:
            back = {new: old for old, new in op.mapping.items()}
            wanted = {back.get(name, name) for name in wanted}
        elif not isinstance(op, (Select, Drop)):
            wanted = None
        kept.append(op)
    return kept[::-1]


def _check_columns_setting(dataset: Dataset, names: list[str]) -> None:
    """The loader's ``columns=`` setting, checked against the dataset when it is built."""
    stored = list(dataset.layout.names)
    missing = [c for c in names if c not in stored]
    if missing:
        raise ColumnNotFoundError(
            f"setting columns=: {dataset.shown} has no column(s) {missing}; it has {stored}"
        )
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        raise SpecError(f"setting columns= names column {twice[0]!r} more than once")


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


def _empty_bytes(shape: tuple[int, ...]) -> np.ndarray:
    return np.empty(shape, dtype=np.uint8)


def _arrow_type_of(value: Any) -> Any:
    import pyarrow as pa

    if isinstance(value, Jagged):
        return pa.list_(pa.from_numpy_dtype(value.values.dtype))
    out = pa.from_numpy_dtype(value.dtype)
    for dim in reversed(value.shape[1:]):
        out = pa.list_(out, dim)
    return out


def _normalize(value: Any, op: Any) -> Any:
    """``(x - mean) / std`` as float32 on a numeric column (dense or jagged)."""
    mean, std = np.float32(op.mean), np.float32(op.std)
    if isinstance(value, Jagged):
        return Jagged((value.values.astype(np.float32) - mean) / std, value.offsets)
    return (np.asarray(value).astype(np.float32) - mean) / std
