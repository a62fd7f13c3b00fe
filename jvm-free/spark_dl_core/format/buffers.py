"""Vectorized byte shuffling shared by encoders and decoders.

Everything here works on whole batches: numpy index arithmetic instead of a Python loop
per sample. Buffers are 1-D ``uint8`` arrays; offsets are ``int64``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

try:  # the optional C extension: many range copies in one call, GIL released
    from . import _buffers
except ImportError:  # pragma: no cover - built where a compiler is (see jvm-free/setup.py)
    _buffers = None  # type: ignore[assignment]

U8 = np.dtype(np.uint8)
I64 = np.dtype(np.int64)


@dataclass
class Pieces:
    """One value per sample: either fixed ``width`` bytes each, or bytes between offsets.

    ``data`` holds the values back to back. For fixed-width pieces ``offsets`` is None and
    ``len(data) == n * width``.
    """

    data: np.ndarray
    offsets: np.ndarray | None = None
    width: int | None = None

    def __post_init__(self) -> None:
        if (self.offsets is None) == (self.width is None):
            raise ValueError("Pieces need exactly one of offsets or width")

    def __len__(self) -> int:
        if self.offsets is not None:
            return len(self.offsets) - 1
        assert self.width is not None
        return len(self.data) // self.width if self.width else 0

    def lengths(self, n: int) -> np.ndarray:
        if self.offsets is not None:
            return np.diff(self.offsets)
        return np.full(n, self.width, dtype=I64)

    def starts(self, n: int) -> np.ndarray:
        if self.offsets is not None:
            return self.offsets[:-1]
        assert self.width is not None
        return np.arange(n, dtype=I64) * self.width


def offsets_from_lengths(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=I64)
    np.cumsum(lengths, out=out[1:])
    return out


def gather(
    buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Copy ``buf[starts[i]:starts[i]+lengths[i]]`` for every i into one contiguous buffer.

    Returns the buffer and the ``n + 1`` offsets of the pieces inside it.
    """
    lengths = lengths.astype(I64, copy=False)
    offsets = offsets_from_lengths(lengths)
    total = int(offsets[-1])
    if total == 0:
        return np.empty(0, dtype=U8), offsets
    out = np.empty(total, dtype=U8)
    copy_pieces(out, offsets[:-1], buf, starts, lengths)
    return out, offsets


def copy_pieces(
    out: np.ndarray,
    at: np.ndarray,
    buf: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
) -> None:
    """``out[at[i]:at[i]+lengths[i]] = buf[starts[i]:starts[i]+lengths[i]]`` for every i.

    Lets a reader put pieces of several sources (shards) straight where they belong in one
    output, one copy per byte.
    """
    lengths = lengths.astype(I64, copy=False)
    if not len(lengths):
        return
    if _buffers is not None and out.flags.c_contiguous and buf.flags.c_contiguous:
        _buffers.copy_ranges(
            out,
            np.ascontiguousarray(at, dtype=I64),
            buf,
            np.ascontiguousarray(starts, dtype=I64),
            np.ascontiguousarray(lengths),
        )
        return
    if lengths.min() >= 256:  # long pieces: slice copies beat building a per-byte index
        for src, length, dst in zip(starts.tolist(), lengths.tolist(), at.tolist()):
            out[dst : dst + length] = buf[src : src + length]
        return
    total = int(lengths.sum())
    firsts = offsets_from_lengths(lengths)[:-1]
    inner = np.arange(total, dtype=I64) - np.repeat(firsts, lengths)
    out[np.repeat(at.astype(I64, copy=False), lengths) + inner] = buf[
        np.repeat(starts.astype(I64, copy=False), lengths) + inner
    ]


def gather_fixed(buf: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """``(n, width)`` matrix of the ``width`` bytes at each start."""
    if width == 0:
        return np.empty((len(starts), 0), dtype=U8)
    return buf[starts.astype(I64, copy=False)[:, None] + np.arange(width, dtype=I64)]


def one_width(part: Pieces, n: int) -> tuple[np.ndarray, int] | None:
    """The bytes of a part whose ``n`` values all have one width, and that width; None
    when their widths differ."""
    if part.offsets is None:
        width = int(part.width or 0)
        return part.data[: n * width], width
    offsets = part.offsets[: n + 1]
    if n == 0:
        return part.data[:0], 0
    first, width = int(offsets[0]), int(offsets[1] - offsets[0])
    if int(offsets[-1]) - first != n * width or not np.all(np.diff(offsets) == width):
        return None
    return part.data[first : first + n * width], width


def interleave(parts: list[Pieces], n: int) -> Pieces:
    """Concatenate, sample by sample, one piece of each part: the MDS sample layout.
    Parts whose values are all one width each (fixed columns, and equal-length arrays such
    as Spark's ``array<float>``) are laid out with one strided copy per part, not a copy
    per value; the result keeps offsets when any part had them."""
    uniform = [one_width(p, n) for p in parts]
    if all(u is not None for u in uniform):
        found = cast("list[tuple[np.ndarray, int]]", uniform)
        row = sum(width for _, width in found)
        out = np.empty((n, row), dtype=U8)
        at = 0
        for data, width in found:
            if width:
                out[:, at : at + width] = data.reshape(n, width)
            at += width
        if all(p.offsets is None for p in parts):
            return Pieces(out.reshape(-1), width=row)
        return Pieces(out.reshape(-1), offsets=np.arange(n + 1, dtype=I64) * row)
    source = np.concatenate([p.data for p in parts]) if len(parts) > 1 else parts[0].data
    bases = np.cumsum([0] + [len(p.data) for p in parts[:-1]])
    starts = np.stack([p.starts(n) + base for p, base in zip(parts, bases)], axis=1)
    lengths = np.stack([p.lengths(n) for p in parts], axis=1)
    data, _ = gather(source, starts.reshape(-1), lengths.reshape(-1))
    return Pieces(data, offsets=offsets_from_lengths(lengths.sum(axis=1)))


@dataclass(frozen=True)
class Jagged:
    """A batch of variable-length 1-D arrays: one values buffer and ``n + 1`` offsets.

    The batch form of token sequences: ``values[offsets[i]:offsets[i + 1]]`` is sample i.
    It maps without copies onto ``torch.nested`` jagged tensors, ``tf.RaggedTensor`` row
    splits and Arrow list arrays; numpy users get :meth:`to_objects`.
    """

    values: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @classmethod
    def from_dense(cls, dense: np.ndarray) -> Jagged:
        """Equal-length rows ``(n, L)`` as a jagged batch (a view, no copy)."""
        n, length = dense.shape[0], int(np.prod(dense.shape[1:], dtype=np.int64))
        return cls(dense.reshape(-1), np.arange(n + 1, dtype=I64) * length)

    def take(self, index: np.ndarray) -> Jagged:
        """Samples at ``index`` in that order, as one new values buffer."""
        index = np.asarray(index, dtype=I64)
        itemsize = self.values.dtype.itemsize
        raw = np.ascontiguousarray(self.values).view(U8)
        data, offsets = gather(raw, self.offsets[index] * itemsize, self.lengths[index] * itemsize)
        return Jagged(data.view(self.values.dtype), offsets // itemsize)

    @staticmethod
    def concat(parts: list[Jagged]) -> Jagged:
        values = np.concatenate([p.values[p.offsets[0] : p.offsets[-1]] for p in parts])
        lengths = np.concatenate([p.lengths for p in parts])
        return Jagged(values, offsets_from_lengths(lengths))

    def to_objects(self) -> np.ndarray:
        """A numpy object array of per-sample views (the plain-numpy form)."""
        first = int(self.offsets[0]) if len(self.offsets) else 0
        pieces = np.split(self.values[first : int(self.offsets[-1])], self.offsets[1:-1] - first)
        out = np.empty(len(self), dtype=object)
        for i, piece in enumerate(pieces[: len(self)]):
            out[i] = piece
        return out


@dataclass(frozen=True)
class ImageList:
    """Images of different sizes in one buffer: ``flat`` holds them back to back, each
    ``shapes[i]`` = ``(h, w, c)``. Crosses process boundaries as one buffer; torch users
    get a list of ``[H, W, C]`` tensors (views of one tensor), numpy users an object array.
    """

    flat: np.ndarray
    shapes: np.ndarray

    def __len__(self) -> int:
        return len(self.shapes)

    def offsets(self) -> np.ndarray:
        sizes = np.prod(self.shapes, axis=1) if len(self.shapes) else np.zeros(0, np.int64)
        return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def to_objects(self) -> np.ndarray:
        offsets = self.offsets()
        out = np.empty(len(self), dtype=object)
        for i, shape in enumerate(self.shapes.tolist()):
            out[i] = self.flat[offsets[i] : offsets[i + 1]].reshape(shape)
        return out

    def rows(self, start: int, stop: int) -> ImageList:
        offsets = self.offsets()
        flat = self.flat[offsets[start] : offsets[stop]]
        return ImageList(flat, self.shapes[start:stop])


def gather_columns(
    out: np.ndarray,
    mats: list[np.ndarray | None],
    which: np.ndarray | None,
    local: np.ndarray,
    row: int,
    spans: list[tuple[int, int, bytes]],
) -> int | None:
    """Rows ``local`` of the row matrices ``mats`` (``which`` names each row's matrix; None:
    all from ``mats[0]``) gathered straight into ``out`` as one block per ``(at, width,
    header)`` span, blocks back to back: one copy per byte where numpy needs a sort by
    matrix, a gather per matrix, a scatter and a split. Each row's ``header`` bytes just
    before ``at`` are checked. Returns -1, the first row whose header differs (``out`` then
    holds a partial batch), or None without the C extension (nothing done)."""
    if _buffers is None:
        return None
    return int(
        _buffers.gather_columns(
            out,
            mats,
            None if which is None else np.ascontiguousarray(which, dtype=np.int32),
            np.ascontiguousarray(local, dtype=I64),
            row,
            spans,
        )
    )
