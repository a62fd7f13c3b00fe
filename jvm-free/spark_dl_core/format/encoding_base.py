"""What every MDS encoding is (the :class:`Encoding` base: facts and codecs) and the helpers
the encodings share; the encodings themselves are in ``encodings``, ``ndarray`` and
``image_encodings``, found by name through ``encodings.get_encoding``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from ..errors import EncodingError, UnsafeEncodingError
from .buffers import (
    I64,
    U8,
    Pieces,
    offsets_from_lengths,
    one_width,
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

    def encode_masked(self, array: pa.Array, column: str, null: np.ndarray) -> Pieces:
        """:meth:`encode` of a column written with nulls='mask', its nulls filled with the
        type's zero or empty value (``null``: nonzero where the row was null). Encodings
        that check their values' contents skip those rows."""
        return self.encode(array, column)

    def encode_rows(self, array: pa.Array, column: str) -> list[np.ndarray] | None:
        """The values of a null-free Arrow array as blocks to lay side by side, each
        ``(n, width)`` bytes or one ``(1, width)`` row every sample shares, when every value
        has the same width; None when they differ. A shard whose samples are all alike is
        then written with one strided copy per block (:meth:`ShardWriter.one_shard`)."""
        n = len(array)
        found = one_width(self.encode(array, column), n)
        if found is None:
            return None
        data, width = found
        return [data.reshape(n, width)]

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
