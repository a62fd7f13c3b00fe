"""Shard compression, named as Mosaic Streaming names it: ``family`` or ``family:level``.

The compressed file's suffix is the family name (``shard.00000.mds.zstd``). Decompression
is bounded by the size the index promises, so a forged shard cannot balloon in memory.
"""

from __future__ import annotations

import bz2
import zlib
from dataclasses import dataclass

import brotli
import cramjam
import zstandard

from ..errors import DecompressionError, SpecError
from .hashing import Data, as_buffer

# family -> (allowed levels, default level); None: the family has no levels.
_FAMILIES: dict[str, tuple[range, int] | None] = {
    "br": (range(0, 12), 11),
    "bz2": (range(1, 10), 9),
    "gz": (range(0, 10), 9),
    "snappy": None,
    "zstd": (range(1, 23), 3),
}


__all__ = ["Codec", "DecompressionError", "compression_names", "parse_compression"]


@dataclass(frozen=True)
class Codec:
    """One compression setting: a family and, where the family has them, a level."""

    family: str
    level: int | None

    @property
    def extension(self) -> str:
        return self.family

    def compress(self, data: Data) -> bytes:
        data = as_buffer(data)
        if self.family == "zstd":
            return zstandard.ZstdCompressor(level=self.level or 3).compress(data)
        if self.family == "gz":
            # gzip framing with mtime 0, as gzip.compress(data, level) writes it.
            c = zlib.compressobj(self.level if self.level is not None else 9, zlib.DEFLATED, 31)
            return c.compress(data) + c.flush()
        if self.family == "bz2":
            return bz2.compress(data, self.level or 9)
        if self.family == "br":
            return brotli.compress(
                bytes(data), quality=self.level if self.level is not None else 11
            )
        return bytes(cramjam.snappy.compress_raw(bytes(data)))

    def decompress(self, data: Data, expected_size: int) -> bytes:
        """Decompress, refusing output larger than ``expected_size`` bytes."""
        limit = expected_size
        data = as_buffer(data)
        try:
            if self.family == "zstd":
                reader = zstandard.ZstdDecompressor().stream_reader(bytes(data))
                out = reader.read(limit + 1)
            elif self.family == "gz":
                d = zlib.decompressobj(31)
                out = d.decompress(data, limit + 1)
            elif self.family == "bz2":
                bz = bz2.BZ2Decompressor()
                out = bz.decompress(data, limit + 1)
            elif self.family == "br":
                br = brotli.Decompressor()
                out = br.process(bytes(data), output_buffer_limit=limit + 1)
            else:
                claimed = _snappy_length(bytes(data[:10]))
                if claimed > limit:
                    raise DecompressionError(
                        f"snappy header claims {claimed} bytes, index promises {limit}"
                    )
                out = bytes(cramjam.snappy.decompress_raw(bytes(data)))
        except DecompressionError:
            raise
        except Exception as exc:  # every codec has its own error types
            raise DecompressionError(f"{self.family} data does not decompress: {exc}") from exc
        if len(out) != expected_size:
            raise DecompressionError(
                f"{self.family} data decompresses to {'more than ' if len(out) > limit else ''}"
                f"{len(out)} bytes, index promises {expected_size}"
            )
        return bytes(out)


def _snappy_length(head: bytes) -> int:
    """The uncompressed length a raw snappy block declares (a little-endian varint)."""
    value = shift = 0
    for byte in head:
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
    raise DecompressionError("snappy header is truncated")


def parse_compression(name: str | None) -> Codec | None:
    """Parse ``zstd``, ``zstd:7``, ``gz``, … into a codec; None or '' means no compression."""
    if not name:
        return None
    family, _, level_text = name.partition(":")
    if family not in _FAMILIES:
        raise SpecError(
            f"unknown compression {name!r}; choose one of {sorted(_FAMILIES)}, "
            "optionally with ':level'"
        )
    levels = _FAMILIES[family]
    if not level_text:
        return Codec(family, levels[1] if levels else None)
    if levels is None:
        raise SpecError(f"compression {family!r} takes no level (got {name!r})")
    try:
        level = int(level_text)
    except ValueError:
        raise SpecError(f"compression level in {name!r} is not an integer") from None
    if level not in levels[0]:
        raise SpecError(
            f"compression level {level} is out of range for {family!r} "
            f"({levels[0].start}..{levels[0].stop - 1})"
        )
    return Codec(family, level)


def compression_names() -> list[str]:
    """Every family name accepted by :func:`parse_compression`."""
    return sorted(_FAMILIES)
