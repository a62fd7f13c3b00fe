"""Exceptions that name what went wrong: the column, the file, the version.

Every error spark-dl raises on purpose is a :class:`SparkDLError`; callers tell kinds apart
by class (or by a ``reason`` attribute where one class covers several causes), never by
matching message text. Messages show URLs with credentials redacted.
"""

from __future__ import annotations

import importlib
from typing import Any


class SparkDLError(Exception):
    """Base class of every error spark-dl raises on purpose."""


class SpecError(SparkDLError, ValueError):
    """A dataset spec, option or argument that cannot be honoured."""


class SpecValidationError(SpecError):
    """A spec whose fields fail validation; ``fields`` names them (``"columns.x"``…)."""

    def __init__(self, message: str, fields: list[str]) -> None:
        super().__init__(message)
        self.fields = fields


class MixtureError(SpecError):
    """A mixture that cannot be built or reopened: weights, sources, columns, settings."""


class SchemaDriftError(SpecError):
    """Data or a spec that differs from the dataset it is appended to (names the column)."""

    def __init__(self, message: str, column: str | None = None, field: str | None = None):
        super().__init__(message)
        self.column = column
        self.field = field  # the spec field that differs, if the drift is in the spec


class EncodingError(SparkDLError, ValueError):
    """A column's values do not fit the encoding chosen for them."""

    def __init__(self, column: str, message: str, row: int | None = None) -> None:
        at = "" if row is None else f", row {row}"
        super().__init__(f"column {column!r}{at}: {message}")
        self.column = column
        self.detail = message
        self.row = row  # within the values encoded, when one row is to blame


class ArrayNullsError(EncodingError):
    """An array column holds null elements, which MDS arrays cannot store (``json`` can):
    its own class so a reader that may pick the encoding (``spark-dl inspect``) can."""


class ReencodeError(EncodingError):
    """A write-time re-encoding op (``reencode_audio``, ``reencode_video``) met a value it
    cannot decode; the message names the column and the row (with the partition in a Spark
    write)."""


class MissingDependencyError(SparkDLError, ImportError):
    """An optional extra (fsspec, deltalake, torch…) is needed and not installed."""


# The one place that says which extra of spark-dl-core installs an optional library.
EXTRAS = {
    "tokenizers": "text",
    "PIL": "images",
    "simplejpeg": "images",
    "soundfile": "media",
    "soxr": "media",
    "av": "media",
    "deltalake": "delta",
    "pyiceberg": "iceberg",
    "fsspec": "remote",
    "s3fs": "remote",
    "tqdm": "progress",
    "torch": "torch",
    "tensorflow": "tf",
}


def optional_import(module: str, needed_for: str) -> Any:
    """Import an optional library (``module``, dotted names too), or raise
    :class:`MissingDependencyError` saying what needs it and which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        extra = EXTRAS.get(top)
        how = f"pip install 'spark-dl-core[{extra}]'" if extra else f"pip install {top}"
        raise MissingDependencyError(f"{needed_for} needs {top!r}: {how} ({exc})") from None


class DatasetError(SparkDLError):
    """A dataset on storage is missing, malformed or unsafe to read."""


class MetadataError(DatasetError):
    """A metadata file (``index.json``, ``spark_dl.json``, the compact index) that is
    corrupted, truncated or does not match what it should describe; names ``file`` and,
    where one is to blame, the ``field``."""

    def __init__(self, file: str, message: str, field: str | None = None) -> None:
        where = f" field {field!r}" if field else ""
        super().__init__(f"{file}{where}: {message}")
        self.file = file
        self.field = field
        self.detail = message


class DatasetChangedError(DatasetError):
    """A dataset overwritten (or vacuumed) since it was opened: its old shards are gone;
    open it again."""


class DatasetExistsError(DatasetError):
    """A write with save mode ``error`` found a dataset already committed at its path."""


class FollowError(DatasetError):
    """An update of a dataset that follows a Delta table which cannot be made (backwards,
    another table, a history that no longer reaches the version held, a version the
    dataset does not hold, a race lost to another updater): names the table, the versions
    and the dataset path. Nothing was written."""

    def __init__(
        self,
        message: str,
        *,
        table: str | None = None,
        path: str | None = None,
        held: list[int] | None = None,
        asked: int | None = None,
    ) -> None:
        super().__init__(message)
        self.table = table
        self.path = path
        self.held = list(held or [])
        self.asked = asked


class NotOurDatasetError(DatasetError):
    """An operation needs spark-dl's metadata (``spark_dl.json``) and the dataset has none."""


class UnsupportedFeatureError(DatasetError):
    """Valid data that uses a feature this reader does not implement (``reason`` says which)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class DecompressionError(DatasetError, ValueError):
    """Compressed bytes that do not decompress to the promised size."""


class ShardError(DatasetError):
    """A shard file is corrupted, truncated or does not match its index entry."""

    def __init__(self, file: str, message: str) -> None:
        super().__init__(f"shard {file!r}: {message}")
        self.file = file


class HashMismatchError(ShardError):
    """A shard's bytes do not hash to the value its index entry records."""


class UnsafeEncodingError(DatasetError):
    """A column uses an encoding that executes code on read (pickle) and was not allowed."""


class ColumnNotFoundError(DatasetError, KeyError):
    """A column a caller named is not in the dataset (a ``KeyError`` too, as a dict's)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class SampleIndexError(DatasetError, IndexError):
    """A sample index outside the dataset or shard (an ``IndexError`` too, as a list's)."""


class TokenizeError(SpecError):
    """A ``tokenize`` op that cannot run: its tokenizer file, a special token or its column
    (``column`` and ``value`` name them)."""

    def __init__(self, message: str, column: str, value: object = None) -> None:
        super().__init__(message)
        self.column = column
        self.value = value


class PackError(SpecError):
    """Packing settings, a pack column or a saved pack position that cannot be used
    (``field`` names the setting)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class RanksDisagreeError(SpecError):
    """Ranks of one distributed run would read different orders of one loader (another
    dataset version, seed, setting or saved position on some rank): samples would repeat or
    be skipped across ranks. Raised on every rank before its first batch."""


class SparkDLWarning(UserWarning):
    """Base class of every warning spark-dl gives on purpose: something the reader had to
    drop, repeat or change that the caller should know of (filter them by class)."""


class RowsDroppedWarning(SparkDLWarning):
    """A run carried on to another version of a dataset (``load_state_dict(state,
    strict=False)``) drops rows of its epoch: rows not yet served whose data files were
    rewritten (an OPTIMIZE, a copy-on-write DELETE or UPDATE) and that the table gives no
    identity across files (no Delta row tracking). ``files`` names the rewritten files,
    ``rows`` counts the rows dropped, ``epoch`` is the carried epoch; the loader's
    ``stats()["carry"]`` counts them too."""

    def __init__(self, message: str, *, files: list[str], rows: int, epoch: int) -> None:
        super().__init__(message)
        self.files = list(files)
        self.rows = int(rows)
        self.epoch = int(epoch)


class RanksNotComparedWarning(SparkDLWarning):
    """Some ranks of a distributed run did not start a loader within
    ``SPARK_DL_RANKS_TIMEOUT_S`` seconds of this one (a rank joining late, or a loader only
    some ranks iterate): their order settings were not compared with this rank's."""


class CacheTooSmallWarning(SparkDLWarning):
    """A remote source's node cache holds less than the shards this node's ranks read in an
    epoch: each epoch downloads them again. ``node_bytes`` is this node's share of an epoch,
    ``limit_bytes`` the cache's limit (``SPARK_DL_CACHE_BYTES``)."""

    def __init__(self, message: str, *, node_bytes: int, limit_bytes: int) -> None:
        super().__init__(message)
        self.node_bytes = int(node_bytes)
        self.limit_bytes = int(limit_bytes)
