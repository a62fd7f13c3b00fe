"""Reading a planned epoch: shards loaded ahead by a thread, batches gathered and decoded.

The plan (which global samples form which batch) comes from :mod:`spark_dl_core.order`;
this module only turns those index arrays into decoded batches within a memory budget.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .dataset import Batch, Dataset
    from .format.shard import ShardData

DEFAULT_PREFETCH_BYTES = 256 << 20  # one default window (4 shards of 64 MiB) read ahead


class BatchReader:
    """Decodes a fixed list of batches, keeping only the shards they still need in memory.

    A background thread loads (reads, downloads, decompresses) shards in order of first use,
    ahead of the decoder, while the bytes held stay under ``prefetch_bytes`` (it may exceed
    the budget only by the shards the current batch itself needs). A shard is dropped right
    after the last batch that uses it. Fixed-width datasets are decoded with one row gather
    per shard into a single ``(batch, row)`` byte matrix, then one view/copy per column.
    """

    def __init__(
        self,
        dataset: Dataset,
        batches: list[np.ndarray],
        *,
        prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
        columns: list[str] | None = None,
        images: Any = "bytes",
        verify_hashes: bool | None = None,
    ) -> None:
        self.dataset, self.batches = dataset, batches
        self.columns, self.images, self.verify = columns, images, verify_hashes
        self.budget = max(0, int(prefetch_bytes))
        offsets = dataset.shard_offsets
        # Shard of each sample, int32: held for the whole pass, so ~4 bytes per sample.
        self.shards_of = [
            (np.searchsorted(offsets, b, side="right") - 1).astype(np.int32)
            if len(b)
            else np.empty(0, np.int32)
            for b in batches
        ]
        self.needs = [np.unique(s).tolist() for s in self.shards_of]
        self.last_use: dict[int, int] = {}
        self.first_use: dict[int, int] = {}
        for j, shards in enumerate(self.needs):
            for s in shards:
                self.first_use.setdefault(s, j)
                self.last_use[s] = j
        self.load_order = sorted(self.first_use, key=lambda s: (self.first_use[s], s))
        self.loaded: dict[int, ShardData] = {}
        self.held = 0
        self.current = 0
        self.error: BaseException | None = None
        self.stop = False
        self.cond = threading.Condition()
        self.fixed = self._fixed_layout()
        # Where fixed-width batch ``j`` of ``n`` bytes is decoded to (None: a fresh buffer);
        # DataLoader workers point it at reusable shared-memory slabs.
        self.out_for: Callable[[int, int], np.ndarray | None] | None = None
        self._scratch = np.empty(0, dtype=np.uint8)

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

    def _size(self, shard: int) -> int:
        return int(self.dataset.shards[shard].raw_data.bytes)

    def _prefetch(self) -> None:
        try:
            for shard in self.load_order:
                size = self._size(shard)
                with self.cond:
                    while not self.stop and not (
                        self.held == 0
                        or self.held + size <= self.budget
                        or self.first_use[shard] <= self.current
                    ):
                        self.cond.wait()
                    if self.stop:
                        return
                    self.held += size
                data = self.dataset.load_shard(shard, self.verify)
                with self.cond:
                    self.loaded[shard] = data
                    self.cond.notify_all()
        except BaseException as exc:  # handed to the consumer, re-raised there
            with self.cond:
                self.error = exc
                self.cond.notify_all()

    def __iter__(self) -> Iterator[Batch]:
        if not self.batches:
            return
        thread = threading.Thread(target=self._prefetch, name="spark-dl-prefetch", daemon=True)
        thread.start()
        try:
            for j, index in enumerate(self.batches):
                with self.cond:
                    self.current = j
                    self.cond.notify_all()
                    while self.error is None and not all(s in self.loaded for s in self.needs[j]):
                        self.cond.wait()
                    if self.error is not None:
                        raise self.error
                    shards = {s: self.loaded[s] for s in self.needs[j]}
                out = None
                if self.out_for is not None and self.fixed is not None:
                    out = self.out_for(j, self.fixed_bytes(len(index)) or 0)
                yield self._decode(j, index, shards, out)
                with self.cond:
                    for s in self.needs[j]:
                        if self.last_use[s] == j:
                            del self.loaded[s]
                            self.held -= self._size(s)
                    self.cond.notify_all()
        finally:
            with self.cond:
                self.stop = True
                self.loaded.clear()
                self.cond.notify_all()

    def fixed_bytes(self, n: int) -> int | None:
        """Bytes :meth:`_decode` needs in an ``out`` buffer for ``n`` rows (None: not fixed)."""
        if self.fixed is None:
            return None
        return n * sum(width for _, _, width in self.fixed)

    def _decode(
        self,
        j: int,
        index: np.ndarray,
        shards: dict[int, ShardData],
        out: np.ndarray | None = None,
    ) -> Batch:
        """Decode batch ``j``. Fixed-width columns are gathered straight into column blocks of
        ``out`` (or a fresh buffer): one copy per byte, the decoded arrays are views of it.
        """
        ds = self.dataset
        if self.fixed is None:
            return ds.read(index, self.columns, self.images, self.verify, loaded=dict(shards))
        from .format.buffers import Pieces
        from .format.encodings import DecodeOptions

        n, row = len(index), ds.layout.row_size or 0
        need = self.fixed_bytes(n) or 0
        buffer = np.empty(need, dtype=np.uint8) if out is None else out[:need]
        single_column = len(self.fixed) == 1 and self.fixed[0][2] == row
        if single_column:  # the rows are the column: gather straight into the output
            rows = buffer.reshape(n, row)
        else:  # gather whole rows (fast, contiguous) into reused scratch, then split
            if self._scratch.size < n * row:
                self._scratch = np.empty(n * row, dtype=np.uint8)
            rows = self._scratch[: n * row].reshape(n, row)
        shard_of = self.shards_of[j]
        for s, data in shards.items():
            matrix = data.raw[int(data.offsets[0]) : int(data.offsets[-1])].reshape(data.count, row)
            local = index - ds.shard_offsets[s]
            if len(shards) == 1:
                np.take(matrix, local, axis=0, out=rows)
            else:
                where = np.flatnonzero(shard_of == s)
                rows[where] = matrix[local[where]]
        if not single_column:
            at_out = 0
            for _name, at, width in self.fixed:  # column-major: each column contiguous
                block = buffer[at_out : at_out + n * width].reshape(n, width)
                np.copyto(block, rows[:, at : at + width])
                at_out += n * width
        options = DecodeOptions(images=self.images, allow_unsafe=ds.allow_unsafe)
        decoded: Batch = {}
        at_out = 0
        for name, _at, width in self.fixed:
            piece = Pieces(buffer[at_out : at_out + n * width], width=width)
            decoded[name] = ds.encoding(name).decode(piece, n, name, options)
            at_out += n * width
        return decoded
