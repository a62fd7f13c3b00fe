"""Exceptions that name what went wrong: the column, the file, the version."""

from __future__ import annotations


class SparkDLError(Exception):
    """Base class of every error spark-dl raises on purpose."""


class SpecError(SparkDLError, ValueError):
    """A dataset spec, option or argument that cannot be honoured."""


class EncodingError(SparkDLError, ValueError):
    """A column's values do not fit the encoding chosen for them."""

    def __init__(self, column: str, message: str) -> None:
        super().__init__(f"column {column!r}: {message}")
        self.column = column


class DatasetError(SparkDLError):
    """A dataset on storage is missing, malformed or unsafe to read."""


class ShardError(DatasetError):
    """A shard file is corrupted, truncated or does not match its index entry."""

    def __init__(self, file: str, message: str) -> None:
        super().__init__(f"shard {file!r}: {message}")
        self.file = file


class HashMismatchError(ShardError):
    """A shard's bytes do not hash to the value its index entry records."""


class UnsafeEncodingError(DatasetError):
    """A column uses an encoding that executes code on read (pickle) and was not allowed."""
