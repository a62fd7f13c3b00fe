"""The order of samples in an epoch, each rank's and worker's share of it, and resume state.

Three rules make runs reproducible and elastic:

1. The *global order* of an epoch is a pure function of (dataset fingerprint, seed, epoch,
   shuffle, shuffle window); it never looks at world size or worker count.
2. The remaining order (after ``consumed`` samples) is cut into *global batches* of
   ``batch_size``; global batch ``g`` goes to rank ``g % world_size``. Within a rank, its
   ``j``-th batch goes to DataLoader worker ``j % num_workers``, which is exactly the order
   in which ``torch.utils.data.DataLoader`` hands worker outputs back, so a rank's batch
   sequence does not depend on the number of workers either.
3. Resume state is "how many samples of the global order are consumed". Data-parallel
   training steps all ranks together, so after ``k`` steps on each of ``W`` ranks the first
   ``k * W`` global batches are consumed, whatever ``W`` was; a restart at any other world
   size deals the rest afresh: none seen twice, none lost.

Shuffling is two-level (as in Mosaic Streaming's block shuffles): shards are permuted, then
samples are permuted within *windows* of ``shuffle_window`` consecutive shards of that
permutation. A reader only ever needs the shards of one window (plus prefetch) in memory:
memory ~ ``shuffle_window x shard size`` per reader, while shuffle quality grows with the
window (:func:`shuffle_quality` measures it).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import SpecError

if TYPE_CHECKING:
    from .dataset import Batch, Dataset
    from .format.shard import ShardData

DEFAULT_WINDOW = 4
DEFAULT_PREFETCH_BYTES = 256 << 20  # one default window (4 shards of 64 MiB) read ahead


def _rng(fingerprint: str, seed: int, epoch: int) -> np.random.Generator:
    key = hashlib.sha256(f"spark-dl:{fingerprint}:{seed}:{epoch}".encode()).digest()
    return np.random.Generator(np.random.PCG64(np.frombuffer(key, dtype=np.uint32)))


def global_order(
    shard_sizes: np.ndarray,
    fingerprint: str,
    seed: int,
    epoch: int,
    shuffle: bool,
    window: int = DEFAULT_WINDOW,
) -> np.ndarray:
    """Every sample index once: shards permuted, then samples permuted within windows of
    ``window`` consecutive shards of that permutation. Pure function of its arguments."""
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    total = int(offsets[-1])
    if not shuffle:
        return np.arange(total, dtype=np.int64)
    if window < 1:
        raise SpecError(f"shuffle_window must be >= 1 shard, got {window}")
    rng = _rng(fingerprint, seed, epoch)
    shards = rng.permutation(len(sizes))
    pieces = []
    for start in range(0, len(shards), window):
        group = shards[start : start + window]
        members = np.concatenate(
            [np.arange(offsets[s], offsets[s + 1], dtype=np.int64) for s in group]
        )
        pieces.append(members[rng.permutation(len(members))])
    return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class LoaderState:
    """Where an epoch stands, independent of world size: enough to resume exactly.

    ``consumed`` counts samples of the global order already delivered (all ranks together).
    """

    fingerprint: str
    seed: int
    epoch: int
    shuffle: bool
    shuffle_window: int
    batch_size: int
    drop_last: bool
    consumed: int
    version: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> LoaderState:
        missing = {f for f in cls.__dataclass_fields__ if f != "version"} - set(state)
        if missing:
            raise SpecError(f"loader state lacks {sorted(missing)}; was it made by spark-dl?")
        return cls(**{k: state[k] for k in cls.__dataclass_fields__ if k in state})

    def check(self, dataset: Dataset, **settings: Any) -> None:
        """Raise if this state belongs to another dataset or other order settings."""
        if self.fingerprint != dataset.fingerprint:
            raise SpecError(
                f"loader state is for dataset {self.fingerprint[:16]}…, but {dataset.path} has "
                f"fingerprint {dataset.fingerprint[:16]}…: resuming would mix up samples"
            )
        for name, value in settings.items():
            if getattr(self, name) != value:
                raise SpecError(
                    f"loader state was saved with {name}={getattr(self, name)!r}, the loader "
                    f"has {name}={value!r}; pass the same value to resume exactly"
                )
        if not 0 <= self.consumed <= len(dataset):
            raise SpecError(f"loader state consumed={self.consumed} is outside 0..{len(dataset)}")


def resolve_window(window: int | None) -> int:
    return DEFAULT_WINDOW if window is None else int(window)


@dataclass
class EpochPlan:
    """One rank's batches of one epoch (from ``consumed`` on), as global sample indices.

    ``batches[j]`` is the rank-local batch ``j``. With ``drop_last`` the incomplete final
    global batch is dropped and the tail is cut to a whole number of rounds, so every rank
    gets the same number of steps (DDP needs that); without it, ranks differ by at most one
    batch and the last batch may be short (no padding, no repeated samples).
    """

    batches: list[np.ndarray]
    batch_size: int
    consumed: int
    world_size: int
    total: int

    @classmethod
    def build(
        cls,
        dataset: Dataset,
        *,
        batch_size: int,
        shuffle: bool,
        seed: int,
        epoch: int,
        rank: int,
        world_size: int,
        drop_last: bool,
        shuffle_window: int | None,
        consumed: int = 0,
    ) -> EpochPlan:
        if batch_size < 1:
            raise SpecError(f"batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise SpecError(f"rank {rank} is not in 0..{world_size - 1}")
        sizes = np.array([s.samples for s in dataset.shards], dtype=np.int64)
        order = global_order(
            sizes, dataset.fingerprint, seed, epoch, shuffle, resolve_window(shuffle_window)
        )
        return cls.from_order(order, batch_size, rank, world_size, drop_last, consumed)

    @classmethod
    def from_order(
        cls,
        order: np.ndarray,
        batch_size: int,
        rank: int,
        world_size: int,
        drop_last: bool,
        consumed: int = 0,
    ) -> EpochPlan:
        rest = order[min(consumed, len(order)) :]
        if drop_last:
            n_batches = len(rest) // batch_size
            n_batches -= n_batches % world_size
        else:
            n_batches = -(-len(rest) // batch_size)
        batches = [
            rest[g * batch_size : (g + 1) * batch_size] for g in range(rank, n_batches, world_size)
        ]
        return cls(batches, batch_size, consumed, world_size, len(order))

    def __len__(self) -> int:
        return len(self.batches)

    def consumed_after(self, steps: int) -> int:
        """Global samples consumed once every rank has taken ``steps`` batches of this plan."""
        return min(self.total, self.consumed + steps * self.world_size * self.batch_size)

    def worker_batches(self, worker: int, num_workers: int, start: int = 0) -> list[int]:
        """Rank-local batch numbers (from ``start``) that DataLoader worker ``worker`` makes."""
        return [j for j in range(start, len(self.batches)) if (j - start) % num_workers == worker]

    def iter_batches(
        self,
        dataset: Dataset,
        which: list[int] | None = None,
        *,
        prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
        **read: Any,
    ) -> Iterator[Batch]:
        """Decode the batches numbered ``which`` (all by default), in that order."""
        selected = [self.batches[j] for j in (range(len(self)) if which is None else which)]
        yield from BatchReader(dataset, selected, prefetch_bytes=prefetch_bytes, **read)

    def batches_from(self, dataset: Dataset, *, start: int = 0, **read: Any) -> Iterator[Batch]:
        yield from self.iter_batches(dataset, list(range(start, len(self))), **read)


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
        verify_hashes: bool = False,
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


# --------------------------------------------------------------------------- quality


def shuffle_quality(order: np.ndarray, shard_sizes: np.ndarray | None = None) -> dict[str, float]:
    """How well ``order`` (a permutation of 0..n-1) hides the source order.

    - ``position_correlation``: Pearson correlation of output position and source index
      (1.0 unshuffled, ~0 for a uniform shuffle).
    - ``adjacent_neighbours``: fraction of consecutive outputs that were source neighbours
      (|a - b| == 1): 1.0 unshuffled, ~2/n for a uniform shuffle.
    - ``mean_step``: mean |source distance| of consecutive outputs over n / 3 (its value
      for a uniform shuffle), so 1.0 means "as spread as uniform".
    - ``same_shard_adjacent`` (with ``shard_sizes``): fraction of consecutive outputs from
      the same shard: ~1/window for a windowed shuffle, ~1/num_shards for a uniform one.
      This is the figure the window trades against memory.
    """
    order = np.asarray(order, dtype=np.int64)
    n = len(order)
    if n < 3:
        return {"position_correlation": 1.0, "adjacent_neighbours": 1.0, "mean_step": 0.0}
    position = np.arange(n, dtype=np.float64)
    corr = float(np.corrcoef(position, order.astype(np.float64))[0, 1])
    steps = np.abs(np.diff(order))
    out = {
        "position_correlation": corr,
        "adjacent_neighbours": float(np.mean(steps == 1)),
        "mean_step": float(steps.mean() / (n / 3)),
    }
    if shard_sizes is not None:
        offsets = np.concatenate([[0], np.cumsum(shard_sizes)])
        shard = np.searchsorted(offsets, order, side="right") - 1
        out["same_shard_adjacent"] = float(np.mean(shard[1:] == shard[:-1]))
    return out
