"""The ``ndarray`` encodings: numpy arrays per sample, of one fixed shape (``ndarray:DTYPE:SHAPE``)
or each with its own (Mosaic's variable ``ndarray``), from Arrow lists of any depth.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ArrayNullsError, EncodingError
from .buffers import (
    I64,
    U8,
    Jagged,
    Pieces,
    gather,
    gather_fixed,
    interleave,
    offsets_from_lengths,
)
from .encoding_base import DecodeOptions, Encoding, _cast_checked, _np_values, _object_array

# Mosaic's dtype and shape-width codes (one byte each in per-sample headers).
_DTYPE_CODES = {
    "uint8": 8,
    "int8": 9,
    "uint16": 16,
    "int16": 17,
    "float16": 18,
    "uint32": 32,
    "int32": 33,
    "float32": 34,
    "uint64": 64,
    "int64": 65,
    "float64": 66,
}
_CODE_DTYPES = {code: np.dtype(name) for name, code in _DTYPE_CODES.items()}
_SHAPE_DTYPES: list[np.dtype[Any]] = [np.dtype(f"<u{2**i}") for i in range(4)]


def _nested(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _nested_values(array: pa.Array, column: str) -> tuple[pa.Array, np.ndarray]:
    """Flatten nested lists into leaf values and a ``(n, ndim)`` shape per sample.

    Each sample must be rectangular (every inner list of one sample equally long).
    """

    n = len(array)
    owner = np.arange(n, dtype=I64)  # the sample each element at this depth belongs to
    dims: list[np.ndarray] = []
    level: pa.Array = array
    while _nested(level.type):
        if level.null_count:
            raise _array_nulls(column, level, owner)
        lengths = pc.list_value_length(level).to_numpy(zero_copy_only=False).astype(I64)
        dim = np.zeros(n, dtype=I64)
        if level is array:  # the top level: one list per sample, its length is the dim
            dim = lengths
        elif len(lengths):
            lo = np.full(n, np.iinfo(np.int64).max, dtype=I64)
            hi = np.full(n, -1, dtype=I64)
            np.minimum.at(lo, owner, lengths)
            np.maximum.at(hi, owner, lengths)
            has = hi >= 0
            if np.any(lo[has] != hi[has]):
                row = int(np.flatnonzero(has & (lo != hi))[0])
                raise EncodingError(
                    column, f"row {row} is ragged below the top level; store it as 'json'"
                )
            dim[has] = hi[has]
        dims.append(dim)
        level = level.flatten()
        if _nested(level.type) or level.null_count:  # the leaves' owners only for an error
            owner = np.repeat(owner, lengths)
    if level.null_count:
        raise _array_nulls(column, level, owner)
    return level, np.stack(dims, axis=1) if dims else np.zeros((n, 0), dtype=I64)


def _array_nulls(column: str, level: pa.Array, owner: np.ndarray) -> ArrayNullsError:
    """Nulls inside arrays: the error names the first row holding one and what to do."""
    first = int(np.flatnonzero(pc.is_null(level).to_numpy(zero_copy_only=False))[0])
    return ArrayNullsError(
        column,
        "an array holds null elements and MDS arrays have none: fill them with a value, "
        f"or store the column as json (columns={{{column!r}: 'json'}}), which keeps them",
        int(owner[first]),
    )


class NDArrayEncoding(Encoding):
    """Numeric arrays: ``ndarray``, ``ndarray:DTYPE``, ``ndarray:DTYPE:D1,D2,...``.

    Layout per sample: [dtype code, if not fixed] [ndim<<2 | shape width, shape, if not
    fixed] [values]. Fixed dtype and shape make a fixed-width column.
    """

    numeric = True
    ndarray = True

    def __init__(self, dtype: str | None = None, shape: tuple[int, ...] | None = None) -> None:
        if dtype is not None and dtype not in _DTYPE_CODES:
            raise ValueError(f"ndarray dtype {dtype!r} is not one of {sorted(_DTYPE_CODES)}")
        if shape is not None and (not shape or any(d < 1 for d in shape)):
            raise ValueError(f"ndarray shape {shape} must have dimensions >= 1")
        self.dtype = np.dtype(dtype).newbyteorder("<") if dtype else None
        self.shape = shape
        self.name = "ndarray" + (f":{dtype}" if dtype else "")
        if shape is not None:
            if dtype is None:
                raise ValueError("a fixed ndarray shape needs a fixed dtype too")
            self.name += ":" + ",".join(map(str, shape))
            self.size = int(np.prod(shape)) * self.dtype.itemsize  # type: ignore[union-attr]

    @classmethod
    def parse(cls, config: str) -> NDArrayEncoding:
        parts = config.split(":") if config else []
        if len(parts) > 2 or (parts and not parts[0]):
            raise ValueError(f"malformed ndarray encoding 'ndarray:{config}'")
        shape = None
        if len(parts) == 2:
            try:
                shape = tuple(int(d) for d in parts[1].split(","))
            except ValueError:
                raise ValueError(f"malformed ndarray shape in 'ndarray:{config}'") from None
        return cls(parts[0] if parts else None, shape)

    # -- encode

    def _values(
        self, array: pa.Array, column: str, null: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The leaf values (contiguous, in the stored dtype) and each sample's shape.

        ``null`` (nonzero where a row was null, written with nulls='mask'): those rows'
        values are left out, and only the other rows must have a fixed encoding's shape."""
        leaves, shapes = _nested_values(array, column)
        t = leaves.type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
            raise EncodingError(column, f"array elements of type {t} cannot be stored as ndarray")
        values = _np_values(leaves)
        if shapes.shape[1] == 0:
            raise EncodingError(column, "scalars need a scalar encoding, not ndarray")
        counts = np.prod(shapes, axis=1)
        if null is not None:  # the values of the rows that hold some
            values = values[np.repeat(null == 0, counts)]
            counts = np.where(null == 0, counts, 0)
        dtype = self.dtype if self.dtype is not None else values.dtype.newbyteorder("<")
        if dtype.name not in _DTYPE_CODES:
            raise EncodingError(column, f"element dtype {dtype} has no ndarray code")
        try:
            values = np.ascontiguousarray(_cast_checked(values, dtype, column))
        except EncodingError as exc:  # its row is a value's place: name the value's row
            if exc.row is None:
                raise
            row = int(np.searchsorted(np.cumsum(counts), exc.row, side="right"))
            raise EncodingError(column, exc.detail, row) from None
        if self.shape is not None:
            wrong = np.any(shapes != np.asarray(self.shape, dtype=I64), axis=1)
            if null is not None:
                wrong &= null == 0
            bad = np.flatnonzero(wrong)
            if len(bad):
                raise EncodingError(
                    column,
                    f"an array of shape {tuple(shapes[bad[0]].tolist())} where encoding "
                    f"{self.name!r} needs {self.shape}",
                    int(bad[0]),
                )
        return values, shapes

    def _headers(self, dtype: np.dtype[Any], shapes: np.ndarray) -> list[Pieces]:
        """Each sample's header parts: the dtype code (unless fixed), the shape."""
        parts = []
        if self.dtype is None:
            code = _DTYPE_CODES[dtype.name]
            parts.append(Pieces(np.full(len(shapes), code, dtype=U8), width=1))
        parts.append(self._shape_headers(shapes))
        return parts

    def encode(self, array: pa.Array, column: str) -> Pieces:
        values, shapes = self._values(array, column)
        if self.shape is not None:
            return Pieces(values.view(U8).reshape(-1), width=self.size)
        counts = np.prod(shapes, axis=1)
        nbytes = counts * values.dtype.itemsize
        value_part = Pieces(values.view(U8), offsets=offsets_from_lengths(nbytes))
        return interleave([*self._headers(values.dtype, shapes), value_part], len(array))

    def encode_masked(self, array: pa.Array, column: str, null: np.ndarray) -> Pieces:
        """A fixed shape: each null row zeros of that shape (whatever the writer filled it
        with: an empty list, zeros), the other rows their values, which must be of that
        shape. Variable: as :meth:`encode` (a null row is what the writer filled it with)."""
        if self.shape is None:
            return self.encode(array, column)
        values, _ = self._values(array, column, null)
        assert self.size is not None
        out = np.zeros((len(array), self.size), dtype=U8)
        out[null == 0] = values.view(U8).reshape(-1, self.size)
        return Pieces(out.reshape(-1), width=self.size)

    def encode_rows(self, array: pa.Array, column: str) -> list[np.ndarray] | None:
        """Arrays of one shape: the header every sample shares, then the values as an
        ``(n, width)`` view of the Arrow buffer (nothing copied here)."""
        n = len(array)
        values, shapes = self._values(array, column)
        if n == 0 or not np.all(shapes == shapes[0]):
            return None
        width = int(np.prod(shapes[0])) * values.dtype.itemsize
        rows = values.view(U8).reshape(n, width)
        if self.shape is not None:
            return [rows]
        header = interleave(self._headers(values.dtype, shapes[:1]), 1).data
        return [header.reshape(1, -1), rows]

    @staticmethod
    def _shape_headers(shapes: np.ndarray) -> Pieces:
        n, ndim = shapes.shape
        if ndim >= 64:
            raise ValueError(f"arrays have {ndim} axes; at most 63 fit the header")
        biggest = shapes.max(axis=1) if n else np.zeros(0, dtype=I64)
        code = (
            (biggest >= 1 << 8).astype(np.int64)
            + (biggest >= 1 << 16).astype(np.int64)
            + (biggest >= 1 << 32).astype(np.int64)
        )
        lengths = 1 + ndim * (1 << code)
        if n and int(code.min()) == int(code.max()):  # one header width (the usual case)
            c, width = int(code[0]), int(lengths[0])
            block = np.empty((n, width), dtype=U8)
            block[:, 0] = (ndim << 2) | c
            block[:, 1:] = shapes.astype(_SHAPE_DTYPES[c]).view(U8).reshape(n, -1)
            return Pieces(block.reshape(-1), offsets=np.arange(n + 1, dtype=I64) * width)
        offsets = offsets_from_lengths(lengths)
        out = np.empty(int(offsets[-1]), dtype=U8)
        for c in np.unique(code).tolist():
            rows = np.flatnonzero(code == c)
            width = 1 + ndim * (1 << c)
            block = np.empty((len(rows), width), dtype=U8)
            block[:, 0] = (ndim << 2) | c
            block[:, 1:] = shapes[rows].astype(_SHAPE_DTYPES[c]).view(U8).reshape(len(rows), -1)
            out[(offsets[rows][:, None] + np.arange(width)).reshape(-1)] = block.reshape(-1)
        return Pieces(out, offsets=offsets)

    # -- decode

    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> Any:
        """Fixed: one view. Variable: dense when the batch shares one shape, a :class:`Jagged`
        batch for ragged 1-D values, an object array for ragged n-D values. Which of these a
        reader hands out is fixed per column by the dataset (see ``Dataset.forms``)."""
        if self.size is not None:
            assert self.dtype is not None and self.shape is not None
            flat = pieces.data[: n * self.size].view(self.dtype)
            return flat.reshape((n, *self.shape)).astype(self.dtype.newbyteorder("="), copy=False)
        if n == 0:
            return np.empty(0, dtype=object)
        data = pieces.data
        starts, lengths = pieces.starts(n), pieces.lengths(n)
        head = 0 if self.dtype is not None else 1
        if lengths.min() < head + 1:
            raise EncodingError(column, "an ndarray value is shorter than its header")
        if head:
            codes = data[starts]
            if not np.all(codes == codes[0]):  # mixed dtypes (other writers): per sample
                return self._decode_each(data, starts, lengths, column)
            dtype = self._value_dtype(int(codes[0]), column)
        else:
            dtype = self._value_dtype(None, column)
        uniform = self._decode_rows(data, starts, lengths, head, dtype, column)
        if uniform is not None:
            return uniform
        headers = data[starts + head].astype(I64)
        ndims = headers >> 2
        ndim = int(ndims[0])
        if not np.all(ndims == ndim):
            return self._decode_each(data, starts, lengths, column)
        shapes = np.zeros((n, ndim), dtype=I64)
        widths = np.left_shift(1, headers & 3)
        for code in np.unique(headers & 3).tolist():  # at most four shape widths
            rows = np.flatnonzero((headers & 3) == code)
            width = 1 << code
            at = starts[rows] + head + 1
            if np.any(lengths[rows] < head + 1 + ndim * width):
                raise EncodingError(column, "an ndarray shape header is truncated")
            raw = gather_fixed(data, at, ndim * width)
            shapes[rows] = raw.view(_SHAPE_DTYPES[code]).reshape(len(rows), ndim)
        body = starts + head + 1 + ndim * widths
        nbytes = lengths - (body - starts)
        counts = np.prod(shapes, axis=1) if ndim else np.ones(n, dtype=I64)
        if np.any(counts * dtype.itemsize != nbytes):
            row = int(np.flatnonzero(counts * dtype.itemsize != nbytes)[0])
            shape = tuple(shapes[row].tolist())
            raise EncodingError(column, f"ndarray values do not match their shape {shape}")
        native = dtype.newbyteorder("=")
        if np.all(shapes == shapes[0]):
            shape = tuple(int(d) for d in shapes[0])
            if int(nbytes[0]) == 0:
                return np.empty((n, *shape), dtype=native)
            block = gather_fixed(data, body, int(nbytes[0]))
            return block.view(dtype).reshape((n, *shape)).astype(native, copy=False)
        values, _ = gather(data, body, nbytes)
        flat = values.view(dtype).astype(native, copy=False)
        jagged = Jagged(flat, offsets_from_lengths(counts))
        if ndim == 1:
            return jagged
        out = jagged.to_objects()
        for i in range(n):
            out[i] = out[i].reshape(tuple(shapes[i].tolist()))
        return out

    def dense_header(
        self, value: np.ndarray, shape: tuple[int, ...], column: str
    ) -> tuple[int, np.dtype] | None:
        """For one stored value (bytes, header included) of the given ``shape``: the header's
        length and the values' dtype, so equal values in a row matrix can be viewed as a
        dense block past the header. None when the value is not of that shape."""
        head = 0 if self.dtype is not None else 1
        if self.size is not None or len(value) < head + 1:
            return None
        dtype = self._value_dtype(int(value[0]) if head else None, column)
        code, ndim = int(value[head]) & 3, int(value[head]) >> 2
        at = head + 1 + (ndim << code)
        if ndim != len(shape) or len(value) < at:
            return None
        stored = tuple(int(d) for d in value[head + 1 : at].view(_SHAPE_DTYPES[code]))
        if stored != tuple(shape) or len(value) - at != int(np.prod(shape)) * dtype.itemsize:
            return None
        return at, dtype

    def value_spans(
        self, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, column: str
    ) -> tuple[np.ndarray, np.ndarray, np.dtype] | None:
        """For 1-D values of one dtype (token sequences): where each sample's values lie in
        ``data`` (byte starts and byte lengths, headers skipped) and their dtype, so a reader
        copies them straight into a batch. None for anything else (fixed width, n-D values,
        mixed dtypes): those take :meth:`decode`."""
        n = len(starts)
        if self.size is not None or n == 0:
            return None
        head = 0 if self.dtype is not None else 1
        if lengths.min() < head + 1:
            raise EncodingError(column, "an ndarray value is shorter than its header")
        if head:
            codes = data[starts]
            if not np.all(codes == codes[0]):
                return None
            dtype = self._value_dtype(int(codes[0]), column)
        else:
            dtype = self._value_dtype(None, column)
        headers = data[starts + head].astype(I64)
        if np.any(headers >> 2 != 1):
            return None
        codes = headers & 3
        widths = np.left_shift(1, codes)
        if np.any(lengths < head + 1 + widths):
            raise EncodingError(column, "an ndarray shape header is truncated")
        counts = np.empty(n, dtype=I64)
        for code in np.unique(codes).tolist():
            rows = np.flatnonzero(codes == code)
            shape = gather_fixed(data, starts[rows] + head + 1, 1 << code)
            counts[rows] = shape.view(_SHAPE_DTYPES[code]).reshape(-1)
        nbytes = lengths - (head + 1 + widths)
        if np.any(counts * dtype.itemsize != nbytes):
            raise EncodingError(column, "ndarray values do not match their shape")
        return starts + head + 1 + widths, nbytes, dtype

    def _decode_rows(
        self,
        data: np.ndarray,
        starts: np.ndarray,
        lengths: np.ndarray,
        head: int,
        dtype: np.dtype,
        column: str,
    ) -> np.ndarray | None:
        """Back-to-back values of one length and one header (Spark's equal-length arrays):
        a ``(n, length)`` byte matrix, its value block viewed as a dense array, no gather."""
        n, length = len(starts), int(lengths[0])
        first = int(starts[0])
        if np.any(lengths != length) or np.any(starts != first + length * np.arange(n)):
            return None
        rows = data[first : first + n * length].reshape(n, length)
        header = rows[:, head]
        if np.any(header != header[0]):
            return None
        code, ndim = int(header[0]) & 3, int(header[0]) >> 2
        width = ndim << code
        at = head + 1 + width
        if length < at:
            raise EncodingError(column, "an ndarray shape header is truncated")
        shape_bytes = rows[:, head + 1 : at]
        if np.any(shape_bytes != shape_bytes[0]):
            return None
        shape = tuple(int(d) for d in shape_bytes[0].view(_SHAPE_DTYPES[code]))
        if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != length - at:
            raise EncodingError(column, f"ndarray values do not match their shape {shape}")
        if length == at:  # empty arrays
            return np.empty((n, *shape), dtype=dtype.newbyteorder("="))
        values = np.ascontiguousarray(rows[:, at:]).view(dtype)  # one copy, aligned
        return values.reshape((n, *shape)).astype(dtype.newbyteorder("="), copy=False)

    def _decode_each(
        self, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, column: str
    ) -> np.ndarray:
        """Samples of mixed dtype or rank (never written by spark-dl): one at a time."""
        return _object_array(
            [self._decode_one(bytes(data[s : s + m]), column) for s, m in zip(starts, lengths)]
        )

    def _value_dtype(self, code: int | None, column: str) -> np.dtype:
        if code is None:
            assert self.dtype is not None
            return self.dtype
        if code not in _CODE_DTYPES:
            raise EncodingError(column, f"unknown ndarray dtype code {code}")
        return _CODE_DTYPES[code].newbyteorder("<")

    def _decode_one(self, raw: bytes, column: str) -> np.ndarray:
        at = 0
        if self.dtype is None:
            dtype = self._value_dtype(raw[0], column)
            at = 1
        else:
            dtype = self.dtype
        header = raw[at]
        at += 1
        ndim, width = header >> 2, 1 << (header & 3)
        if at + ndim * width > len(raw):
            raise EncodingError(column, "an ndarray shape header is truncated")
        shape = tuple(int(d) for d in np.frombuffer(raw, _SHAPE_DTYPES[header & 3], ndim, at))
        at += ndim * width
        if float(np.prod(np.asarray(shape, dtype=np.float64))) * dtype.itemsize != len(raw) - at:
            raise EncodingError(column, f"ndarray values do not match their shape {shape}")
        return np.frombuffer(raw, dtype, offset=at).reshape(shape).astype(dtype.newbyteorder("="))

    def arrow_type(self) -> pa.DataType:
        value = pa.from_numpy_dtype(self.dtype.newbyteorder("=")) if self.dtype else pa.float64()
        if self.shape is None:
            return pa.list_(value)
        out: pa.DataType = value
        for dim in reversed(self.shape):
            out = pa.list_(out, dim)
        return out
