"""The MDS shard file: ``[u32 count] [u32 offsets × (count+1)] [config json] [samples]``.

Each sample is ``[u32 size of each variable-width column] [column values in order]``.
Offsets are absolute positions in the (uncompressed) file. Building and slicing both work
on whole batches of samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SampleIndexError, ShardError
from .buffers import I64, U8, Pieces, gather, gather_fixed, interleave, offsets_from_lengths
from .encodings import Encoding


@dataclass(frozen=True)
class Layout:
    """The columns of a shard in stored order, with each one's fixed size (None: variable)."""

    names: tuple[str, ...]
    encodings: tuple[Encoding, ...]

    @property
    def sizes(self) -> tuple[int | None, ...]:
        return tuple(e.size for e in self.encodings)

    @property
    def variable(self) -> list[int]:
        return [i for i, s in enumerate(self.sizes) if s is None]

    @property
    def row_size(self) -> int | None:
        """Bytes per sample when every column is fixed-width, else None."""
        sizes = self.sizes
        return None if any(s is None for s in sizes) else sum(s or 0 for s in sizes)


def assemble_samples(layout: Layout, columns: list[Pieces], n: int) -> Pieces:
    """Lay the encoded columns out as MDS samples (size header, then each value)."""
    parts: list[Pieces] = []
    variable = layout.variable
    if variable:
        sizes = np.stack([columns[i].lengths(n) for i in variable], axis=1)
        if sizes.size and sizes.max() >= 1 << 32:
            raise ValueError("a value is 4 GiB or larger; MDS sizes are uint32")
        parts.append(Pieces(sizes.astype("<u4").view(U8).reshape(-1), width=4 * len(variable)))
    parts.extend(columns)
    return interleave(parts, n)


def build_shard(samples: Pieces | list[Pieces], n: int, config: bytes) -> np.ndarray:
    """The bytes of one shard file holding ``n`` assembled samples: one :class:`Pieces`, or
    the chunks that hold them in order (each copied once into place, not joined first)."""
    chunks = [samples] if isinstance(samples, Pieces) else samples
    if len(chunks) == 1:
        per_chunk = [chunks[0].lengths(n)]
    else:
        per_chunk = [c.lengths(len(c)) for c in chunks]
    lengths = per_chunk[0] if len(per_chunk) == 1 else np.concatenate(per_chunk)
    header = 4 + 4 * (n + 1) + len(config)
    offsets = offsets_from_lengths(lengths) + header
    if int(offsets[-1]) >= 1 << 32:
        raise ValueError("a shard reached 4 GiB; MDS offsets are uint32 (lower shard_size)")
    out = np.empty(int(offsets[-1]), dtype=U8)
    out[:4] = np.frombuffer(np.uint32(n).tobytes(), dtype=U8)
    out[4 : 4 + 4 * (n + 1)] = offsets.astype("<u4").view(U8)
    out[4 + 4 * (n + 1) : header] = np.frombuffer(config, dtype=U8)
    at = header
    for chunk, sizes in zip(chunks, per_chunk):
        size = int(sizes.sum())
        out[at : at + size] = chunk.data[:size]
        at += size
    return out


class ShardData:
    """A decompressed shard in memory, validated, sliceable by sample indices."""

    def __init__(self, raw: np.ndarray, file: str, layout: Layout, samples: int) -> None:
        # A plain ndarray view: slicing an np.memmap costs Python time per slice.
        raw = raw.view(np.ndarray) if isinstance(raw, np.memmap) else raw
        self.raw, self.file, self.layout = raw, file, layout
        if len(raw) < 8:
            raise ShardError(file, f"is {len(raw)} bytes, too short to be an MDS shard")
        count = int(raw[:4].view("<u4")[0])
        if count != samples:
            raise ShardError(file, f"holds {count} samples, its index entry says {samples}")
        if 4 + 4 * (count + 1) > len(raw):
            raise ShardError(file, "is truncated inside its offset table")
        offsets = raw[4 : 4 + 4 * (count + 1)].view("<u4").astype(I64)
        lengths = np.diff(offsets)
        if offsets[0] < 4 + 4 * (count + 1) or np.any(lengths < 0):
            raise ShardError(file, "has a corrupted offset table")
        if offsets[-1] != len(raw):
            raise ShardError(
                file, f"offsets end at byte {int(offsets[-1])} but the file has {len(raw)} bytes"
            )
        self.offsets = offsets
        self.count = count
        self._rows: np.ndarray | None = None
        # Byte position and width of each column within a row, when all rows are alike.
        self._at: list[int] = []
        self._widths: list[int] = []
        row = layout.row_size
        if row is not None and count:
            if np.any(lengths != row):
                raise ShardError(file, f"samples are not all {row} bytes as its columns imply")
            self._set_rows(row, [s or 0 for s in layout.sizes], 0)
        elif count:
            self._uniform_variable(lengths)

    def _set_rows(self, row: int, widths: list[int], head: int) -> None:
        offsets = self.offsets
        self._rows = self.raw[int(offsets[0]) : int(offsets[-1])].reshape(self.count, row)
        self._widths = widths
        self._at = (head + np.cumsum([0, *widths[:-1]])).astype(int).tolist()

    def _uniform_variable(self, lengths: np.ndarray) -> None:
        """Variable-width columns whose every sample has the same sizes (Spark's equal-length
        ``array<float>``) make a row matrix too: they take the fixed-width gather."""
        if np.any(lengths != lengths[0]):
            return
        variable = self.layout.variable
        head = 4 * len(variable)
        if int(lengths[0]) < head:
            return  # reported as corrupt when read
        # Equal lengths: each size header is a strided uint32 column of the rows (no
        # per-byte index: a 500k-row shard is checked in a few ms, not tens).
        start, row = int(self.offsets[0]), int(lengths[0])
        widths = [s or 0 for s in self.layout.sizes]
        for j, i in enumerate(variable):
            sizes = np.ndarray((self.count,), "<u4", self.raw, offset=start + 4 * j, strides=(row,))
            if np.any(sizes != sizes[0]):
                return
            widths[i] = int(sizes[0])
        if head + sum(widths) != int(lengths[0]):
            return
        self._set_rows(int(lengths[0]), widths, head)

    def gather_rows(self, local: np.ndarray, out: np.ndarray) -> None:
        """Copy whole rows ``local`` into ``out`` (``(len(local), row)`` bytes): the one
        fixed-width gather, used by :meth:`columns` and the batch reader."""
        assert self._rows is not None
        np.take(self._rows, local, axis=0, out=out)

    def _row_block(self, index: np.ndarray) -> tuple[np.ndarray, bool]:
        """The rows at ``index`` and whether they are a view of the shard: a view when they
        are one ascending run (a scan reads them so; no gather), else a gathered copy."""
        assert self._rows is not None
        n = len(index)
        if n and int(index[-1]) - int(index[0]) == n - 1 and bool(np.all(np.diff(index) == 1)):
            return self._rows[int(index[0]) : int(index[0]) + n], True
        rows = np.empty((n, self._rows.shape[1]), dtype=U8)
        self.gather_rows(index, rows)
        return rows, False

    def row_span(self, i: int) -> tuple[int, int]:
        """Byte position and width of column ``i`` within a row (needs :attr:`row_matrix`)."""
        return self._at[i], self._widths[i]

    @property
    def row_matrix(self) -> np.ndarray | None:
        """``(count, row)`` bytes when every row has the same layout, else None."""
        return self._rows

    def columns(self, index: np.ndarray, names: list[str]) -> dict[str, Pieces]:
        """The stored bytes of ``names`` for the samples at ``index``, in that order."""
        layout = self.layout
        wanted = [layout.names.index(n) for n in names]
        if len(index) and (index.min() < 0 or index.max() >= self.count):
            raise SampleIndexError(f"sample index out of range for shard {self.file!r}")
        if self._rows is not None:
            rows, view = self._row_block(index)
            out: dict[str, Pieces] = {}
            n = len(index)
            for i in wanted:
                at, width = self._at[i], self._widths[i]
                part = rows[:, at : at + width]  # copied from a view: columns own their bytes
                block = (np.array(part) if view else np.ascontiguousarray(part)).reshape(-1)
                if layout.sizes[i] is None:  # variable column, equal sizes in this shard
                    offsets = np.arange(n + 1, dtype=I64) * width
                    out[layout.names[i]] = Pieces(block, offsets=offsets)
                else:
                    out[layout.names[i]] = Pieces(block, width=width)
            return out
        return self._columns_variable(index, wanted)

    def positions(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each column's bytes lie in :attr:`raw` for the samples at ``index``:
        ``(starts, sizes)``, each ``(len(index), columns)``. Nothing is copied."""
        layout, raw = self.layout, self.raw
        if len(index) and (index.min() < 0 or index.max() >= self.count):
            raise SampleIndexError(f"sample index out of range for shard {self.file!r}")
        starts = self.offsets[index]
        ends = self.offsets[index + 1]
        variable = layout.variable
        head = 4 * len(variable)
        if len(index) and int((ends - starts).min()) < head:
            raise ShardError(self.file, "a sample is shorter than its size header")
        sizes = np.empty((len(index), len(layout.names)), dtype=I64)
        if variable:
            header = gather_fixed(raw, starts, head).view("<u4").reshape(len(index), -1)
            sizes[:, variable] = header
        for i, size in enumerate(layout.sizes):
            if size is not None:
                sizes[:, i] = size
        positions = starts[:, None] + head + np.cumsum(sizes, axis=1) - sizes
        if np.any(positions[:, -1] + sizes[:, -1] != ends) if len(index) else False:
            raise ShardError(self.file, "a sample's column sizes do not add up to its length")
        return positions, sizes

    def _columns_variable(self, index: np.ndarray, wanted: list[int]) -> dict[str, Pieces]:
        layout, raw = self.layout, self.raw
        positions, sizes = self.positions(index)
        out: dict[str, Pieces] = {}
        for i in wanted:
            size = layout.sizes[i]
            if size is not None:
                block = gather_fixed(raw, positions[:, i], size)
                out[layout.names[i]] = Pieces(block.reshape(-1), width=size)
            else:
                data, offsets = gather(raw, positions[:, i], sizes[:, i])
                out[layout.names[i]] = Pieces(data, offsets=offsets)
        return out
