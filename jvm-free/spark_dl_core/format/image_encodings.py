"""Image encodings (``jpeg``, ``png``, ``pil`` and lists of them): encoded bytes, checked by
signature, decoded to numpy or PIL on request (``images=``).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import EncodingError, optional_import
from .buffers import (
    I64,
    U8,
    Pieces,
    interleave,
    offsets_from_lengths,
)
from .encoding_base import (
    DecodeOptions,
    Encoding,
    ImageMode,
    _binary_array,
    _binary_pieces,
    _object_array,
    _u32,
)

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
        return self._encode(array, column, None)

    def encode_masked(self, array: pa.Array, column: str, null: np.ndarray) -> Pieces:
        """A masked null is stored empty: it is no image, and not checked as one."""
        return self._encode(array, column, np.asarray(null, bool))

    def _encode(self, array: pa.Array, column: str, null: np.ndarray | None) -> Pieces:
        if not (pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):
            raise EncodingError(
                column, f"{self.name!r} columns take encoded image bytes, not {array.type}"
            )
        pieces = _binary_pieces(array)
        _check_signatures(self.name, pieces, column, skip=null)
        return pieces

    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> np.ndarray:
        raw = _binary_array(pieces, False, column).to_pylist()
        values = [_decode_image(self.name, r, options.images, column) for r in raw]
        return _stack_if_uniform(values) if options.images == "numpy" else _object_array(values)

    def arrow_type(self) -> pa.DataType:
        return pa.binary()


def _check_signatures(
    kind: str,
    pieces: Pieces,
    column: str,
    owner: np.ndarray | None = None,
    skip: np.ndarray | None = None,
) -> None:
    """Each value starts with ``kind``'s signature; the error names the row (``owner``: the
    row of each value, where a row holds several images). ``skip``: values not checked
    (masked nulls)."""
    signature = _SIGNATURES.get(kind)
    if signature is None or pieces.offsets is None:
        return
    starts, lengths = pieces.offsets[:-1], np.diff(pieces.offsets)
    checked = np.arange(len(lengths)) if skip is None else np.flatnonzero(~skip)

    def row(value: int) -> int:
        return int(value if owner is None else owner[value])

    short = checked[lengths[checked] < len(signature)]
    if len(short):
        size = int(lengths[short[0]])
        raise EncodingError(
            column, f"a value of {size} byte(s) is too short to be a {kind} file", row(short[0])
        )
    head = pieces.data[starts[checked][:, None] + np.arange(len(signature))]
    bad = checked[np.any(head != np.frombuffer(signature, dtype=U8), axis=1)]
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
