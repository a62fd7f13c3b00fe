"""Shard hashes under the names Mosaic Streaming records: hashlib's and xxhash's."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import xxhash

from ..errors import SpecError

Data = bytes | memoryview | np.ndarray


def as_buffer(data: Data) -> memoryview:
    """A zero-copy view that every hash and codec accepts."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).data
    return memoryview(data)


def _collect() -> dict[str, Callable[..., Any]]:
    found: dict[str, Callable[..., Any]] = {}
    for name in sorted(hashlib.algorithms_available):
        if hasattr(hashlib, name) and not name.startswith("shake_"):
            found[name] = getattr(hashlib, name)
    for name in sorted(xxhash.algorithms_available):
        found[name] = getattr(xxhash, name)
    return found


_HASHES = _collect()


def hash_names() -> list[str]:
    """Every hash name a dataset may list."""
    return sorted(_HASHES)


def check_hash_name(name: str) -> str:
    if name not in _HASHES:
        raise SpecError(f"unknown hash {name!r}; choose from {hash_names()}")
    return name


def digest(name: str, data: Data) -> str:
    """Hex digest of ``data`` under the named algorithm."""
    return str(_HASHES[check_hash_name(name)](as_buffer(data)).hexdigest())


def content_hash(data: Data) -> str:
    """The hash spark-dl records for every shard to fingerprint datasets (fast, 128-bit)."""
    return xxhash.xxh3_128_hexdigest(as_buffer(data))


# The hash spark-dl records in spark_dl.json for each stored shard file, to check it on
# first read when the index records none: xxh3 runs at memory speed, far below read and
# decompression costs (see docs/reliability.md for the measured figure).
STORED_HASH = "xxh3_64"
_FAST_FIRST = ("xxh3_64", "xxh64", "xxh3_128", "xxh128", "xxh32", "md5", "sha1", "sha256")


def fastest(names: Iterable[str]) -> str | None:
    """The cheapest of the named hashes to compute (None for none)."""
    names = list(names)
    return next((h for h in _FAST_FIRST if h in names), names[0] if names else None)
