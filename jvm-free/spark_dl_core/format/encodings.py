"""MDS column encodings: Arrow arrays in, per-sample bytes out, numpy batches back.

Names and byte layouts follow Mosaic Streaming's MDS format, so each side reads the other's
datasets. Every encoder takes a whole Arrow array and every decoder a whole batch; Python
runs per sample only where the value itself is a Python object (json, Decimal, pickle,
decoded images).
"""

from __future__ import annotations

import io
import json
import pickle
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import EncodingError, UnsafeEncodingError, optional_import
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

ImageMode = Literal["bytes", "numpy", "pil"]


@dataclass(frozen=True)
class DecodeOptions:
    """How to hand back values that have more than one useful form."""

    images: ImageMode = "bytes"
    allow_unsafe: bool = False


# --------------------------------------------------------------------------- helpers


def _np_values(array: pa.Array) -> np.ndarray:
    """Numpy values of a null-free primitive Arrow array (temporal types as integers)."""
    t = array.type
    if pa.types.is_boolean(t):
        return np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.uint8)
    if pa.types.is_temporal(t):
        width = t.bit_width
        array = array.view(pa.int32() if width == 32 else pa.int64())
    return array.to_numpy(zero_copy_only=False)


def _cast_checked(values: np.ndarray, dtype: np.dtype, column: str) -> np.ndarray:
    """Cast to ``dtype``, refusing values that do not fit rather than wrapping them."""
    if values.dtype == dtype:
        return values
    if dtype.kind in "iu":
        if values.dtype.kind == "f":
            if values.size and not np.all(np.isfinite(values) & (values == np.round(values))):
                raise EncodingError(column, f"non-integral floats cannot be stored as {dtype}")
        elif values.dtype.kind not in "iub":
            raise EncodingError(column, f"{values.dtype} values cannot be stored as {dtype}")
        if values.size:
            info = np.iinfo(dtype)
            lo, hi = values.min(), values.max()
            if lo < info.min or hi > info.max:
                bad = lo if lo < info.min else hi
                row = int(np.flatnonzero(values == bad)[0]) if values.ndim == 1 else None
                raise EncodingError(
                    column, f"value {bad} does not fit {dtype} ({info.min}..{info.max})", row
                )
    elif dtype.kind == "f" and values.dtype.kind not in "iubf":
        raise EncodingError(column, f"{values.dtype} values cannot be stored as {dtype}")
    return values.astype(dtype)


def _binary_pieces(array: pa.Array) -> Pieces:
    """Pieces over a string/binary Arrow array (large or not), without copying values."""
    if not pa.types.is_large_binary(array.type):
        array = array.cast(pa.large_binary())
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[
        array.offset : array.offset + len(array) + 1
    ]
    data = np.frombuffer(buffers[2], dtype=U8) if buffers[2] is not None else np.empty(0, dtype=U8)
    first = int(offsets[0]) if len(offsets) else 0
    last = int(offsets[-1]) if len(offsets) else 0
    return Pieces(data[first:last], offsets=offsets - first)


def _pieces_from_bytes(values: list[bytes]) -> Pieces:
    lengths = np.fromiter((len(v) for v in values), dtype=I64, count=len(values))
    data = np.frombuffer(b"".join(values), dtype=U8)
    return Pieces(data, offsets=offsets_from_lengths(lengths))


def _binary_array(pieces: Pieces, string: bool, column: str) -> pa.Array:
    assert pieces.offsets is not None
    n = len(pieces.offsets) - 1
    arr = pa.Array.from_buffers(
        pa.large_string() if string else pa.large_binary(),
        n,
        [None, pa.py_buffer(pieces.offsets.astype(I64)), pa.py_buffer(pieces.data)],
    )
    if string:
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid as exc:
            raise EncodingError(column, f"stored text is not valid UTF-8: {exc}") from None
    return arr


def _object_array(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _u32(data: bytes | np.ndarray, at: int, count: int, column: str) -> np.ndarray:
    end = at + 4 * count
    if count < 0 or end > len(data):
        raise EncodingError(column, "value is truncated (a size header runs past its end)")
    return np.frombuffer(bytes(data[at:end]), dtype="<u4")


# --------------------------------------------------------------------------- base class


class Encoding(ABC):
    """One MDS encoding: its name in the index, its fixed size if any, and its codecs."""

    name: str = ""
    size: int | None = None  # bytes per value when fixed, else None
    safe: bool = True  # False: decoding runs code (pickle)
    # Facts other rooms ask instead of testing names:
    numeric: bool = False  # values are numbers (normalize applies; dense tensors)
    ndarray: bool = False  # each value is a numpy array (fixed or variable shape)
    strings: bool = False  # each value is one str or bytes (tf.string)
    holds_nulls: bool = False  # a null is a value of its own (json, pkl): no mask column

    @abstractmethod
    def encode(self, array: pa.Array, column: str) -> Pieces:
        """Per-sample bytes of a null-free Arrow array."""

    @abstractmethod
    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> np.ndarray:
        """A numpy batch from ``n`` encoded values."""

    @abstractmethod
    def arrow_type(self) -> pa.DataType:
        """The natural Arrow type of decoded values (used when no schema was recorded)."""

    def check_safe(self, column: str, options: DecodeOptions) -> None:
        if not self.safe and not options.allow_unsafe:
            raise UnsafeEncodingError(
                f"column {column!r} uses the {self.name!r} encoding, which runs code when "
                "read; open the dataset with allow_unsafe=True only if you trust its writer"
            )

    def __repr__(self) -> str:
        return f"<encoding {self.name}>"


# --------------------------------------------------------------------------- scalars


class ScalarEncoding(Encoding):
    """Fixed-width little-endian numbers: int8..int64, uint8..uint64, float16..64, int."""

    numeric = True

    def __init__(self, name: str, dtype: str) -> None:
        self.name = name
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.size = self.dtype.itemsize

    def encode(self, array: pa.Array, column: str) -> Pieces:
        t = array.type
        if not (
            pa.types.is_integer(t)
            or pa.types.is_floating(t)
            or pa.types.is_boolean(t)
            or pa.types.is_temporal(t)
        ):
            raise EncodingError(column, f"Arrow type {t} cannot be stored as {self.name!r}")
        values = _cast_checked(_np_values(array), self.dtype, column)
        return Pieces(np.ascontiguousarray(values).view(U8).reshape(-1), width=self.size)

    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> np.ndarray:
        return (
            pieces.data[: n * self.dtype.itemsize]
            .view(self.dtype)
            .astype(self.dtype.newbyteorder("="), copy=False)
        )

    def arrow_type(self) -> pa.DataType:
        return pa.from_numpy_dtype(self.dtype.newbyteorder("="))


# --------------------------------------------------------------------------- text and bytes


class BytesEncoding(Encoding):
    name = "bytes"
    strings = True

    def encode(self, array: pa.Array, column: str) -> Pieces:
        if not (
            pa.types.is_binary(array.type)
            or pa.types.is_large_binary(array.type)
            or pa.types.is_fixed_size_binary(array.type)
            or pa.types.is_string(array.type)
            or pa.types.is_large_string(array.type)
        ):
            raise EncodingError(column, f"Arrow type {array.type} cannot be stored as 'bytes'")
        return _binary_pieces(array)

    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> np.ndarray:
        return _binary_array(pieces, False, column).to_numpy(zero_copy_only=False)

    def arrow_type(self) -> pa.DataType:
        return pa.binary()


class StrEncoding(Encoding):
    name = "str"
    strings = True

    def encode(self, array: pa.Array, column: str) -> Pieces:
        if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
            try:
                array = array.cast(pa.large_string())
                array.validate(full=True)
            except pa.ArrowInvalid as exc:
                raise EncodingError(column, f"binary values are not valid UTF-8: {exc}") from None
        elif not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
            raise EncodingError(column, f"Arrow type {array.type} cannot be stored as 'str'")
        return _binary_pieces(array)

    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> np.ndarray:
        return _binary_array(pieces, True, column).to_numpy(zero_copy_only=False)

    def arrow_type(self) -> pa.DataType:
        return pa.string()


class StrNumberEncoding(Encoding):
    """Numbers as their decimal text: str_int, str_float, str_decimal."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.numeric = name != "str_decimal"  # decimals read back as text

    def encode(self, array: pa.Array, column: str) -> Pieces:
        t = array.type
        if self.name == "str_int" and pa.types.is_integer(t):
            return _binary_pieces(pc.cast(array, pa.large_string()))
        if self.name == "str_float" and (pa.types.is_floating(t) or pa.types.is_integer(t)):
            texts = [repr(float(v)) for v in array.to_pylist()]
        elif self.name == "str_decimal" and (
            pa.types.is_decimal(t) or pa.types.is_integer(t) or pa.types.is_string(t)
        ):
            try:
                texts = [str(Decimal(v)) for v in array.to_pylist()]
            except ArithmeticError as exc:
                raise EncodingError(column, f"not a decimal number: {exc}") from None
        else:
            raise EncodingError(column, f"Arrow type {t} cannot be stored as {self.name!r}")
        return _pieces_from_bytes([s.encode() for s in texts])

    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> np.ndarray:
        text = _binary_array(pieces, True, column)
        try:
            if self.name == "str_int":
                try:
                    return pc.cast(text, pa.int64()).to_numpy()
                except pa.ArrowInvalid:  # beyond int64: keep Python ints
                    return _object_array([int(s) for s in text.to_pylist()])
            if self.name == "str_float":
                return pc.cast(text, pa.float64()).to_numpy()
            return _object_array([Decimal(s) for s in text.to_pylist()])
        except (ValueError, ArithmeticError, pa.ArrowInvalid) as exc:
            raise EncodingError(column, f"stored text is not a {self.name} value: {exc}") from None

    def arrow_type(self) -> pa.DataType:
        return {"str_int": pa.int64(), "str_float": pa.float64()}.get(self.name, pa.string())


def _jsonable(value: Any) -> Any:
    """Arrow's Python values made JSON-ready: maps (already dicts) keyed by text, decimals
    and dates as text."""
    if isinstance(value, dict):
        return {json_key_text(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def json_key_text(key: Any) -> str:
    """A map key as a JSON object key: strings as they are, other keys as their JSON text
    (``1``, ``true``, dates and decimals as text); :func:`map_key_from_text` inverts it with
    the map's recorded key type."""
    if isinstance(key, str):
        return key
    value = _jsonable(key)
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def is_binary_type(t: pa.DataType) -> bool:
    """Whether values of ``t`` are bytes (what JSON stores as text, one char per byte)."""
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)


def bytes_from_json_text(text: str) -> bytes:
    """Bytes stored inside a ``json`` value: :func:`_jsonable` writes each byte as the
    character of that code point (latin-1), so this gives back the very bytes.

    UnicodeEncodeError: the text holds a character above U+00FF (not written from bytes).
    """
    return text.encode("latin-1")


def map_key_from_text(text: Any, key_type: pa.DataType) -> Any:
    """The Python value of a map key stored by :func:`json_key_text` (as Arrow's
    ``as_py`` gives it); keys already typed pass through."""
    if (
        not isinstance(text, str)
        or pa.types.is_string(key_type)
        or pa.types.is_large_string(key_type)
    ):
        return text
    if is_binary_type(key_type):
        return bytes_from_json_text(text)
    if (
        pa.types.is_integer(key_type)
        or pa.types.is_floating(key_type)
        or pa.types.is_boolean(key_type)
    ):
        return json.loads(text)
    if (
        pa.types.is_struct(key_type)
        or pa.types.is_list(key_type)
        or pa.types.is_large_list(key_type)
    ):
        return json.loads(text)
    return pa.array([text]).cast(key_type)[0].as_py()  # dates, timestamps, decimals


def _map_rows(array: pa.Array, column: str) -> list[Any]:
    """Python values with maps as dicts; a map with a key twice is refused (a JSON object,
    and every reader's dict, would keep only the last value)."""
    try:
        return array.to_pylist(maps_as_pydicts="strict")
    except KeyError:
        for row in range(len(array)):
            try:
                array[row].as_py(maps_as_pydicts="strict")
            except KeyError as exc:
                found = re.search(r"duplicate key was (.*)\)", str(exc.args[0]))
                key = found.group(1) if found else "a key"
                raise EncodingError(
                    column,
                    f"a map holds the key {key} twice; a map is stored as a JSON "
                    "object (one value per key): make its keys unique",
                    row,
                ) from None
        raise


class JsonEncoding(Encoding):
    """Python's JSON, as Mosaic's ``json`` encoding writes it: non-finite floats are the
    tokens ``NaN``, ``Infinity``, ``-Infinity`` (which ``json.loads`` reads back), and a
    float's shortest repr round-trips exactly (``-0.0`` included)."""

    holds_nulls = True

    name = "json"

    def encode(self, array: pa.Array, column: str) -> Pieces:
        texts = []
        for row, value in enumerate(_map_rows(array, column)):
            try:
                texts.append(json.dumps(_jsonable(value)).encode())
            except (TypeError, ValueError) as exc:
                raise EncodingError(column, f"value is not JSON-serializable: {exc}", row) from None
        return _pieces_from_bytes(texts)

    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> np.ndarray:
        if n == 0:
            return np.empty(0, dtype=object)
        _binary_array(pieces, True, column)  # UTF-8 check
        try:
            values = json.loads(_json_list_text(pieces, n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            values = None
        if not isinstance(values, list) or len(values) != n:
            # One value was not a complete JSON text: find it (rare, error path only).
            texts = _binary_array(pieces, True, column).to_pylist()
            for row, text in enumerate(texts):
                try:
                    json.loads(text)
                except json.JSONDecodeError as exc:
                    raise EncodingError(
                        column, f"stored value {row} is not valid JSON: {exc}"
                    ) from None
            raise EncodingError(column, "stored values are not one JSON value each")
        return _object_array(values)

    def arrow_type(self) -> pa.DataType:
        return pa.string()


def _json_list_text(pieces: Pieces, n: int) -> bytes:
    """``[v0,v1,...]`` from n JSON texts, by one scatter: one ``json.loads`` per batch."""
    assert pieces.offsets is not None
    offsets = pieces.offsets - pieces.offsets[0]
    total = int(offsets[-1])
    out = np.full(total + n + 1, ord(","), dtype=U8)
    out[0], out[-1] = ord("["), ord("]")
    lengths = np.diff(offsets)
    shift = np.repeat(np.arange(1, n + 1, dtype=I64), lengths)
    first = int(pieces.offsets[0])
    out[np.arange(total, dtype=I64) + shift] = pieces.data[first : first + total]
    return out.tobytes()


class PickleEncoding(Encoding):
    name = "pkl"
    safe = False
    holds_nulls = True

    def encode(self, array: pa.Array, column: str) -> Pieces:
        return _pieces_from_bytes([pickle.dumps(v) for v in array.to_pylist()])

    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> np.ndarray:
        self.check_safe(column, options)
        raw = _binary_array(pieces, False, column).to_pylist()
        return _object_array([pickle.loads(b) for b in raw])

    def arrow_type(self) -> pa.DataType:
        return pa.binary()


# --------------------------------------------------------------------------- ndarray

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


def _nested_values(array: pa.Array, column: str) -> tuple[pa.Array, np.ndarray]:
    """Flatten nested lists into leaf values and a ``(n, ndim)`` shape per sample.

    Each sample must be rectangular (every inner list of one sample equally long).
    """

    n = len(array)
    owner = np.arange(n, dtype=I64)  # the sample each element at this depth belongs to
    dims: list[np.ndarray] = []
    level: pa.Array = array
    while (
        pa.types.is_list(level.type)
        or pa.types.is_large_list(level.type)
        or (pa.types.is_fixed_size_list(level.type))
    ):
        if level.null_count:
            raise _array_nulls(column, level, owner)
        lengths = pc.list_value_length(level).to_numpy(zero_copy_only=False).astype(I64)
        dim = np.zeros(n, dtype=I64)
        if len(lengths):
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
        owner = np.repeat(owner, lengths)
        level = level.flatten()
    if level.null_count:
        raise _array_nulls(column, level, owner)
    return level, np.stack(dims, axis=1) if dims else np.zeros((n, 0), dtype=I64)


def _array_nulls(column: str, level: pa.Array, owner: np.ndarray) -> EncodingError:
    """Nulls inside arrays: the error names the first row holding one and what to do."""
    first = int(np.flatnonzero(pc.is_null(level).to_numpy(zero_copy_only=False))[0])
    return EncodingError(
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

    def encode(self, array: pa.Array, column: str) -> Pieces:
        leaves, shapes = _nested_values(array, column)
        t = leaves.type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
            raise EncodingError(column, f"array elements of type {t} cannot be stored as ndarray")
        values = _np_values(leaves)
        dtype = self.dtype if self.dtype is not None else values.dtype.newbyteorder("<")
        if dtype.name not in _DTYPE_CODES:
            raise EncodingError(column, f"element dtype {dtype} has no ndarray code")
        values = np.ascontiguousarray(_cast_checked(values, dtype, column))
        n = len(array)
        if shapes.shape[1] == 0:
            raise EncodingError(column, "scalars need a scalar encoding, not ndarray")
        if self.shape is not None:
            bad = np.flatnonzero(np.any(shapes != np.asarray(self.shape, dtype=I64), axis=1))
            if len(bad):
                raise EncodingError(
                    column,
                    f"row {int(bad[0])} has shape {tuple(shapes[bad[0]].tolist())}, "
                    f"encoding {self.name!r} needs {self.shape}",
                )
            return Pieces(values.view(U8).reshape(-1), width=self.size)
        counts = np.prod(shapes, axis=1)
        value_part = Pieces(values.view(U8), offsets=offsets_from_lengths(counts * dtype.itemsize))
        parts = []
        if self.dtype is None:
            parts.append(Pieces(np.full(n, _DTYPE_CODES[dtype.name], dtype=U8), width=1))
        parts.append(self._shape_headers(shapes))
        parts.append(value_part)
        return interleave(parts, n)

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


# --------------------------------------------------------------------------- images

_SIGNATURES = {"jpeg": b"\xff\xd8", "png": b"\x89PNG\r\n\x1a\n"}


def _pil() -> Any:
    return optional_import("PIL.Image", "decoding images")


def _decode_image(kind: str, raw: bytes, mode: ImageMode, column: str) -> Any:
    if mode == "bytes":
        return raw
    image_module = _pil()
    try:
        if kind == "pil":
            if len(raw) < 12:
                raise ValueError("pil header is truncated")
            width, height, mode_size = np.frombuffer(raw, "<u4", 3)
            image_mode = raw[12 : 12 + int(mode_size)].decode()
            image = image_module.frombytes(
                image_mode, (int(width), int(height)), raw[12 + int(mode_size) :]
            )
        else:
            image = image_module.open(io.BytesIO(raw))
            image.load()
    except Exception as exc:
        raise EncodingError(column, f"stored {kind} image does not decode: {exc}") from None
    return image if mode == "pil" else np.asarray(image)


def _stack_if_uniform(values: list[Any]) -> np.ndarray:
    if values and all(isinstance(v, np.ndarray) for v in values):
        first = values[0]
        if all(v.shape == first.shape and v.dtype == first.dtype for v in values):
            return np.stack(values)
    return _object_array(values)


class ImageEncoding(Encoding):
    """jpeg / png (encoded files) and pil (raw pixels behind a small header).

    Values are written as the bytes given (as Mosaic writes bytes passed to any encoding);
    jpeg and png values are checked for their file signature.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def encode(self, array: pa.Array, column: str) -> Pieces:
        if not (pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):
            raise EncodingError(
                column, f"{self.name!r} columns take encoded image bytes, not {array.type}"
            )
        pieces = _binary_pieces(array)
        _check_signatures(self.name, pieces, column)
        return pieces

    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> np.ndarray:
        raw = _binary_array(pieces, False, column).to_pylist()
        values = [_decode_image(self.name, r, options.images, column) for r in raw]
        return _stack_if_uniform(values) if options.images == "numpy" else _object_array(values)

    def arrow_type(self) -> pa.DataType:
        return pa.binary()


def _check_signatures(
    kind: str, pieces: Pieces, column: str, owner: np.ndarray | None = None
) -> None:
    """Each value starts with ``kind``'s signature; the error names the row (``owner``: the
    row of each value, where a row holds several images)."""
    signature = _SIGNATURES.get(kind)
    if signature is None or pieces.offsets is None:
        return
    starts, lengths = pieces.offsets[:-1], np.diff(pieces.offsets)

    def row(value: int) -> int:
        return int(value if owner is None else owner[value])

    short = np.flatnonzero(lengths < len(signature))
    if len(short):
        size = int(lengths[short[0]])
        raise EncodingError(
            column, f"a value of {size} byte(s) is too short to be a {kind} file", row(short[0])
        )
    head = pieces.data[starts[:, None] + np.arange(len(signature))]
    bad = np.flatnonzero(np.any(head != np.frombuffer(signature, dtype=U8), axis=1))
    if len(bad):
        raise EncodingError(column, f"not a {kind} file (bad signature)", row(bad[0]))


class ImageListEncoding(Encoding):
    """list[jpeg] / list[png] / list[pil] and jpeg_array: several images per sample.

    list[...]: [u32 0] [u32 count] [u32 sizes...] [images]; jpeg_array drops the leading 0.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.kind = "jpeg" if name in ("jpeg_array", "jpegarray") else name[5:-1]
        self.placeholder = name.startswith("list[")

    def encode(self, array: pa.Array, column: str) -> Pieces:
        t = array.type
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not (
            pa.types.is_binary(t.value_type) or pa.types.is_large_binary(t.value_type)
        ):
            raise EncodingError(column, f"{self.name!r} columns take list<binary>, not {t}")
        n = len(array)
        counts = pc.list_value_length(array).to_numpy(zero_copy_only=False).astype(I64)
        images = _binary_pieces(array.flatten())
        _check_signatures(self.kind, images, column, np.repeat(np.arange(n), counts))
        assert images.offsets is not None
        sizes = np.diff(images.offsets).astype("<u4")
        first = offsets_from_lengths(counts)
        head_words = 2 if self.placeholder else 1
        head = np.zeros((n, head_words), dtype="<u4")
        head[:, -1] = counts
        parts = [
            Pieces(head.view(U8).reshape(-1), width=4 * head_words),
            Pieces(sizes.view(U8), offsets=first * 4),
            Pieces(images.data, offsets=images.offsets[first]),
        ]
        return interleave(parts, n)

    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> np.ndarray:
        raw = _binary_array(pieces, False, column).to_pylist()
        out = []
        for value in raw:
            at = 4 if self.placeholder else 0
            count = int(_u32(value, at, 1, column)[0])
            sizes = _u32(value, at + 4, count, column).astype(I64)
            ends = at + 4 + 4 * count + np.cumsum(sizes)
            if count and int(ends[-1]) != len(value):
                raise EncodingError(column, "image sizes do not add up to the stored value")
            begins = np.concatenate([[at + 4 + 4 * count], ends[:-1]]).astype(I64)
            out.append(
                [
                    _decode_image(self.kind, value[b:e], options.images, column)
                    for b, e in zip(begins.tolist(), ends.tolist())
                ]
            )
        return _object_array(out)

    def arrow_type(self) -> pa.DataType:
        return pa.list_(pa.binary())


# --------------------------------------------------------------------------- registry

_SCALARS = {
    "int": "int64",
    **{name: name for name in _DTYPE_CODES},
}
# Encodings whose values are numbers: the scalars and the numbers stored as text
# (each encoding also says so itself: ``get_encoding(name).numeric``).
NUMERIC_ENCODINGS = frozenset(_SCALARS) | {"str_int", "str_float"}


def _registry() -> dict[str, Callable[[], Encoding]]:
    """Every encoding name an index may use, mapped to its constructor: the one list.

    ``ndarray:DTYPE[:SHAPE]`` names are parameters of ``ndarray`` and parsed on lookup.
    """
    table: dict[str, Callable[[], Encoding]] = {}
    for name, dtype in _SCALARS.items():
        table[name] = partial(ScalarEncoding, name, dtype)
    table.update(bytes=BytesEncoding, str=StrEncoding, json=JsonEncoding, pkl=PickleEncoding)
    for name in ("str_int", "str_float", "str_decimal"):
        table[name] = partial(StrNumberEncoding, name)
    for name in ("jpeg", "png", "pil"):
        table[name] = partial(ImageEncoding, name)
    # "jpegarray" is how some Mosaic versions spell "jpeg_array": both are read.
    for name in ("list[jpeg]", "list[png]", "list[pil]", "jpeg_array", "jpegarray"):
        table[name] = partial(ImageListEncoding, name)
    table["ndarray"] = NDArrayEncoding
    return table


_REGISTRY = _registry()


def get_encoding(name: str) -> Encoding:
    """The encoding an index names; ValueError for names MDS does not define."""
    make = _REGISTRY.get(name)
    if make is not None:
        return make()
    if name.startswith("ndarray:"):
        return NDArrayEncoding.parse(name[len("ndarray:") :])
    raise ValueError(f"unknown MDS encoding {name!r}; known: {encoding_names()}")


def encoding_names() -> list[str]:
    """The names :func:`get_encoding` accepts (``ndarray`` also takes ``:DTYPE[:SHAPE]``)."""
    return sorted(_REGISTRY)


def uniform_shape(array: pa.Array, column: str) -> list[int] | None:
    """The one shape of every nested-list value in ``array`` (None: they differ).

    ``array`` is null-free (the writer fills nulls before encoding).
    """
    if len(array) == 0:
        return None
    shapes = _nested_values(array, column)[1]
    if np.all(shapes == shapes[0]):
        return [int(d) for d in shapes[0]]
    return None


def merge_shapes(
    held: dict[str, list[int] | None] | None, new: dict[str, list[int] | None]
) -> dict[str, list[int] | None]:
    """Shapes of a shard gaining rows with shapes ``new``: equal stays, else None."""
    if held is None:
        return dict(new)
    return {k: v if v == new.get(k) else None for k, v in held.items()}


def _leaf_type(t: pa.DataType) -> tuple[pa.DataType, list[int | None]]:
    dims: list[int | None] = []
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        dims.append(t.list_size if pa.types.is_fixed_size_list(t) else None)
        t = t.value_type
    return t, dims


def infer_encoding(field: pa.Field) -> str:
    """The encoding a column gets when the spec names none, from its Arrow type."""
    t = field.type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_boolean(t):
        return "uint8"
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return np.dtype(t.to_pandas_dtype()).name
    if pa.types.is_decimal(t):
        return "str_decimal"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytes"
    if pa.types.is_temporal(t):
        return "int32" if t.bit_width == 32 else "int64"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        leaf, dims = _leaf_type(t)
        numeric = pa.types.is_integer(leaf) or pa.types.is_floating(leaf)
        if numeric or pa.types.is_boolean(leaf):
            dtype = "uint8" if pa.types.is_boolean(leaf) else np.dtype(leaf.to_pandas_dtype()).name
            if all(d is not None for d in dims):
                return f"ndarray:{dtype}:" + ",".join(str(d) for d in dims)
            return f"ndarray:{dtype}"
        return "json"
    if pa.types.is_struct(t) or pa.types.is_map(t):
        return "json"
    raise EncodingError(field.name, f"Arrow type {t} has no MDS encoding; name one in the spec")
