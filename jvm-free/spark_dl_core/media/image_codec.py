"""Image files as bytes: their size from the header, the decoders at hand, and the
write-time ``reencode_image`` op's shrinking (registered in the op registry, where the
transforms that declare the op find it). Below the read-time image pipeline
(:mod:`spark_dl_core.media.images`) and the dataset card, which use its header reading.
"""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa

from ..errors import ReencodeError, optional_import
from ..ops.registry import register_op

try:  # region decoding over libjpeg-turbo: an optional C extension, built at install
    from . import _jpeg as jpeg_ext
except ImportError:  # pragma: no cover - depends on the build
    jpeg_ext = None  # type: ignore[assignment]

try:  # the fast JPEG decoder (the "images" extra); PIL is the fallback
    import simplejpeg
except ImportError:  # pragma: no cover - depends on the environment
    simplejpeg = None

JPEG_MAGIC = b"\xff\xd8"


def pil() -> Any:
    """PIL's ``Image`` module (the ``images`` extra)."""
    return optional_import("PIL.Image", "image ops")


def image_size(raw: bytes) -> tuple[int, int]:
    """``(h, w)`` from the header, without decoding the pixels."""
    if jpeg_ext is not None and raw[:2] == JPEG_MAGIC:
        h, w, _ = jpeg_ext.header(raw)
        return int(h), int(w)
    if simplejpeg is not None and raw[:2] == JPEG_MAGIC:
        try:
            h, w, _, _ = simplejpeg.decode_jpeg_header(raw)
            return int(h), int(w)
        except ValueError:  # any libjpeg warning (junk before a marker): PIL reads past it
            pass
    with pil().open(io.BytesIO(raw)) as image:
        w, h = image.size
    return int(h), int(w)


def reencode_array(array: pa.Array, max_side: int, quality: int, column: str) -> pa.Array:
    """Images larger than ``max_side`` shrunk to fit and re-encoded as JPEG ``quality``."""
    image_module = pil()
    values = array.to_pylist()
    out: list[bytes | None] = []
    for row, raw in enumerate(values):
        if raw is None:
            out.append(None)
            continue
        try:
            h, w = image_size(raw)
            if max(h, w) <= max_side:
                out.append(raw)
                continue
            image = image_module.open(io.BytesIO(raw))
            scale = max_side / max(h, w)
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            if image.format == "JPEG":
                image.draft("RGB", size)
            image = image.convert("RGB" if image.mode not in ("L", "RGB") else image.mode)
            image = image.resize(size, image_module.BILINEAR, reducing_gap=3.0)
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG", quality=quality)
            out.append(buffer.getvalue())
        except Exception as exc:
            raise ReencodeError(
                column, f"reencode_image: the image does not decode: {exc}", row
            ) from None
    return pa.array(out, type=array.type)


def _reencode_op(op: Any, array: pa.Array) -> pa.Array:
    """The ``reencode_image`` op's work on one column (found through the op registry)."""
    return reencode_array(array, op.max_side, op.quality, op.column)


register_op("reencode_image", _reencode_op)
