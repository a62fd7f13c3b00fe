"""Decoding one image's bytes into pixels on the CPU: a JPEG by the optional C extension
(``spark_dl_core.media._jpeg``, libjpeg-turbo, over a region at a reduced DCT scale) or
simplejpeg, anything else by PIL; the warnings that leave wrong pixels behind are errors.
Also the count of images this process decoded (tests count decodes per sample)."""

from __future__ import annotations

import io

import numpy as np

from ..errors import DatasetError
from .image_codec import JPEG_MAGIC as _JPEG
from .image_codec import jpeg_ext as _jpeg
from .image_codec import pil as _pil
from .image_codec import simplejpeg as _simplejpeg

_decodes = 0  # images decoded by this process


def decode_count() -> int:
    """How many images this process has decoded (for tests and diagnostics)."""
    return _decodes


def count_decodes(n: int) -> None:
    global _decodes
    _decodes += n


class ImageError(DatasetError):
    """An image that does not decode, named by column, shard and sample index."""

    def __init__(self, message: str) -> None:  # one argument: DataLoader re-raises it intact
        super().__init__(message)


# --------------------------------------------------------------------------- decoding


def _four_channel(raw: bytes) -> bool:
    """A CMYK or YCCK JPEG: PIL decodes those (Adobe's inverted CMYK to RGB as PIL
    converts it); libjpeg-based decoders convert them another way, a level or two off."""
    try:
        if _jpeg is not None:
            return int(_jpeg.header(raw)[2]) == 4
        return str(_simplejpeg.decode_jpeg_header(raw)[2]) in ("CMYK", "YCCK")
    except Exception:  # not a readable header: the decoder says what is wrong
        return False


def decode_image(
    raw: bytes,
    mode: str,
    at_least: tuple[int, int] | None = None,
    into: np.ndarray | None = None,
) -> np.ndarray:
    """Pixels ``[H, W, C]`` (uint8). ``at_least=(h, w)`` allows a reduced DCT scale that
    keeps the image at least that large (JPEG only; others decode at full size)."""
    count_decodes(1)
    if raw[:2] == _JPEG and not _four_channel(raw):
        pixels = _decode_jpeg(raw, mode, at_least, into)
        if pixels is not None:
            return pixels
    min_h, min_w = at_least or (0, 0)
    image = _pil().open(io.BytesIO(raw))
    if at_least is not None and image.format == "JPEG":
        image.draft(mode, (max(1, int(min_w)), max(1, int(min_h))))
    image = image.convert(mode)
    pixels = np.asarray(image)
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


# libjpeg's texts of the warnings that leave wrong pixels behind (truncated or corrupt
# entropy data): the errors csrc/jpeg_region.c raises. Every other warning (junk bytes
# before a marker, odd JFIF revisions, ...) is harmless, and PIL decodes through it.
_HARMFUL_WARNINGS = (
    "Corrupt JPEG data: premature end of data segment",
    "Corrupt JPEG data: bad Huffman code",
    "Corrupt JPEG data: bad arithmetic code",
    "Premature end of JPEG file",
    "instead of RST",
)


def _decode_jpeg(
    raw: bytes, mode: str, at_least: tuple[int, int] | None, into: np.ndarray | None
) -> np.ndarray | None:
    """A JPEG's pixels, warnings treated as the crop path and PIL treat them (only those
    that mean wrong pixels are errors), so a file decodes on every path or on none.
    simplejpeg first (fast, but it refuses any warning); a file it refuses goes to the
    extension's full decode, else (not built) to PIL (None)."""
    if _simplejpeg is not None:
        try:
            pixels = _simplejpeg.decode_jpeg(
                raw,
                colorspace="RGB" if mode == "RGB" else "GRAY",
                min_height=int(at_least[0]) if at_least else 0,
                min_width=int(at_least[1]) if at_least else 0,
                buffer=into,
            )
        except ValueError as exc:
            if _jpeg is None and any(text in str(exc) for text in _HARMFUL_WARNINGS):
                raise
        else:
            pixels = np.asarray(pixels)
            return pixels if pixels.ndim == 3 else pixels[:, :, None]
    if _jpeg is None:
        return None
    scale = 8
    if at_least is not None:  # the smallest DCT scale keeping the image that large
        height, width, _ = _jpeg.header(raw)
        big_enough = [
            s
            for s in _SCALES
            if scaled_size(height, s) >= at_least[0] and scaled_size(width, s) >= at_least[1]
        ]
        scale = big_enough[0] if big_enough else 8
    channels = 3 if mode == "RGB" else 1
    buffer, _, _, cols, rows = _jpeg.decode(raw, scale, gray=channels == 1, out=into)
    return np.frombuffer(buffer, np.uint8, rows * cols * channels).reshape(rows, cols, channels)


# JPEG DCT scales (eighths) a region is decoded at. libjpeg-turbo also has 3/8, 5/8, 6/8
# and 7/8, but measured here 5/8..7/8 decode slower than 8/8 and 3/8 no faster than 4/8.
_SCALES = (1, 2, 4, 8)


def scaled_size(n: int, scale: int) -> int:
    """libjpeg's output size of ``n`` pixels at ``scale``/8 (rounded up)."""
    return -(-n * scale // 8)


def region_scale(
    box: tuple[float, float, float, float], source: tuple[int, int], out: tuple[int, int]
) -> int:
    """The smallest DCT scale (eighths) keeping ``box`` (source pixels) at least ``out``."""
    (full_h, full_w), (oh, ow) = source, out
    bw, bh = box[2] - box[0], box[3] - box[1]
    for scale in _SCALES:
        sw, sh = scaled_size(full_w, scale), scaled_size(full_h, scale)
        if bw * sw / full_w >= ow and bh * sh / full_h >= oh:
            return scale
    return 8
