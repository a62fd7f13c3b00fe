"""Region decoding of JPEGs at a reduced DCT scale (optional C extension, csrc/jpeg_region.c)."""

from typing import Any, TypeAlias, TypeVar, overload

import numpy as np
from typing_extensions import Buffer

_Bytes: TypeAlias = Buffer | np.ndarray[Any, Any]  # numpy arrays export the buffer protocol
_Out = TypeVar("_Out", bound=_Bytes)

LIBJPEG_VERSION: int

def header(data: _Bytes, /) -> tuple[int, int, int]:
    """``(height, width, components)`` from the JPEG header."""

@overload
def decode(
    data: _Bytes,
    scale: int = 8,
    x: int = 0,
    y: int = 0,
    width: int = 0,
    height: int = 0,
    gray: bool = False,
    out: None = None,
) -> tuple[bytearray, int, int, int, int]:
    """Rows ``y..y+height`` and at least columns ``x..x+width`` at ``scale``/8 (scaled
    pixels; 0 means to the edge), as RGB or luma rows, into a new bytearray. Returns
    ``(buffer, left, top, width, height)`` of the region actually decoded."""

@overload
def decode(
    data: _Bytes,
    scale: int = 8,
    x: int = 0,
    y: int = 0,
    width: int = 0,
    height: int = 0,
    gray: bool = False,
    *,
    out: _Out,
) -> tuple[_Out, int, int, int, int]:
    """The same, written into ``out`` (writable, C-contiguous, large enough)."""

def interleave(
    planes: _Bytes, out: _Bytes, channels: int, height: int, width: int, flip: bool = False
) -> None:
    """Planar ``[C, H, W]`` bytes into ``out`` as ``[H, W, C]``, mirrored with ``flip``."""
