"""The ``mds`` source's options: what each read and write takes, checked before any work,
and the ``DatasetSpec`` they describe (Spark lowercases option keys; catalog keys it adds are
ignored)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from spark_dl_core import DatasetSpec
from spark_dl_core.errors import DatasetError, SpecError

from .mixture_source import MIXTURE_READ_OPTIONS

FORMAT = "mds"
# Lineage column the client adds for a pinned Delta read (see :func:`_canonical_frame`): the
# data file each row came from. Write tasks cut shards at its changes and drop it.
SOURCE_FILE_COLUMN = "__spark_dl_source_file"
_ROW_INDEX_COLUMN = "__spark_dl_row_index"
_SPLIT_START_COLUMN = "__spark_dl_split_start"
SPEC_OPTIONS = ("compression", "shard_size", "hashes", "nulls", "columns", "spec")
_READ_ROWS = 8192  # rows per Arrow batch a mixture read task yields (bounded memory)
# An ``mds`` read task yields batches of about this many decoded bytes (within the row
# bounds): fewer, larger batches cost Spark less per row; the bytes bound keeps memory flat.
READ_BATCH_BYTES = 8 << 20
READ_BATCH_ROWS = (64, 1 << 17)
# Shards are grouped into input partitions as Spark plans files (``maxSplitBytes``): up to
# this many bytes each, each shard counted with an opening cost, fewer bytes when the
# dataset is small so every core still gets a partition.
PARTITION_BYTES = 128 << 20
SHARD_OPEN_BYTES = 4 << 20


# Every option the source understands (keys arrive lowercased); prefixes take any suffix.
WRITE_OPTIONS = frozenset(
    {
        "path",
        *SPEC_OPTIONS,
        "save_mode",
        "vector_dtype",
        "vacuum_retention",
        "source",
        "canonical_files",
        "delta_schema",
    }
)
READ_OPTIONS = frozenset(
    {
        *("path", "shards_per_partition", "verify_hashes", "allow_unsafe", "version"),
        *MIXTURE_READ_OPTIONS,
    }
)
OPTION_PREFIXES = ("encoding.", "storage.")
# Table properties Spark's catalog adds to a ``CREATE TABLE … USING mds`` table's options
# (its reserved keys): not ours to check; ``location`` is the table's path.
CATALOG_KEYS = frozenset(
    {"owner", "location", "provider", "comment", "external", "is_managed_location", "collation"}
)
MIN_SANE_SHARD_SIZE = 16 << 10  # below this nearly every sample gets a shard file of its own


def validate_options(options: Mapping[str, str], kind: Literal["read", "write"]) -> None:
    """Refuse what would otherwise be silently ignored or misread: unknown option names
    (with the closest known one), booleans other than true/false, ints out of range."""
    import difflib

    known = WRITE_OPTIONS if kind == "write" else READ_OPTIONS
    other = READ_OPTIONS if kind == "write" else WRITE_OPTIONS
    for raw in options:
        key = raw.lower()
        if key in known or key.startswith(OPTION_PREFIXES):
            continue
        if kind == "read" and key in CATALOG_KEYS:
            continue
        close = difflib.get_close_matches(key, sorted(known | other), n=1, cutoff=0.6)
        if key in other:
            hint = f"; {key!r} is a {'read' if kind == 'write' else 'write'} option"
        elif close:
            hint = f"; did you mean {close[0]!r}?"
        else:
            hint = f"; known: {', '.join(sorted(known))}, {OPTION_PREFIXES[0]}<column>, " + (
                f"{OPTION_PREFIXES[1]}<key>"
            )
        raise SpecError(f"unknown {kind} option {raw!r} for format('mds'){hint}")
    lowered = {k.lower(): v for k, v in options.items()}
    for key in ("verify_hashes", "allow_unsafe"):
        if key in lowered:
            bool_option(lowered, key)
    if "shards_per_partition" in lowered:
        int_option(lowered, "shards_per_partition", 1, 1, 1 << 20)
    if "version" in lowered:
        version_option(lowered)
    if lowered.get("vector_dtype", "float64") not in ("float64", "float32"):
        raise SpecError(
            f"option 'vector_dtype' must be float64 or float32, got {lowered['vector_dtype']!r}"
        )
    retention = lowered.get("vacuum_retention", "").strip().lower()
    if retention and retention not in ("off", "none", "false", "-1"):
        try:
            ok = float(retention) >= 0
        except ValueError:
            ok = False
        if not ok:
            raise SpecError(
                "option 'vacuum_retention' must be seconds (0 or more) or 'off', "
                f"got {lowered['vacuum_retention']!r}"
            )


def bool_option(options: Mapping[str, str], key: str, default: bool = False) -> bool:
    """``true`` / ``false`` (any case); anything else is an error naming the option."""
    text = options.get(key)
    if text is None:
        return default
    value = str(text).strip().lower()
    if value not in ("true", "false"):
        raise SpecError(f"option {key!r} must be true or false, got {text!r}")
    return value == "true"


def int_option(options: Mapping[str, str], key: str, default: int, low: int, high: int) -> int:
    """An integer in ``[low, high]``; anything else is an error naming the option."""
    text = options.get(key)
    if text is None:
        return default
    try:
        value = int(str(text).strip())
    except ValueError:
        raise SpecError(f"option {key!r} must be an integer, got {text!r}") from None
    if not low <= value <= high:
        raise SpecError(f"option {key!r} must be between {low} and {high}, got {value}")
    return value


def version_option(options: Mapping[str, str]) -> int | None:
    """Read option ``version``: the Delta table version to read of a dataset that follows a
    table, as the core's ``open_dataset(path, version=N)`` (None: the latest it holds). A
    mixture has no versions of its own: its sources are pinned by its spec."""
    if "version" not in options:
        return None
    if "mixture" in options:
        raise SpecError(
            "option 'version' reads a version held by a dataset that follows a Delta table; "
            "a mixture's sources are pinned by its spec, so it takes none"
        )
    return int_option(options, "version", 0, 0, (1 << 63) - 1)


def spec_from_options(options: dict[str, str], schema_names: Sequence[str] = ()) -> DatasetSpec:
    """A :class:`DatasetSpec` from data source options (keys arrive lowercased).

    ``spec`` is a whole spec as JSON; the other keys override its fields. ``columns`` is a
    JSON object (column names keep their case there); ``encoding.<column>`` options are
    matched to ``schema_names`` case-insensitively, since Spark lowercases option keys.
    """
    opts = {k.lower(): v for k, v in options.items()}
    fields: dict[str, Any] = _json_option(opts, "spec", dict) or {}
    for key in ("compression", "shard_size", "nulls"):
        if key in opts:
            fields[key] = opts[key] or None if key == "compression" else opts[key]
    if "shard_size" in fields and str(fields["shard_size"]).isdigit():
        fields["shard_size"] = int(fields["shard_size"])
    if "hashes" in opts:
        text = opts["hashes"].strip()
        fields["hashes"] = (
            _json_option(opts, "hashes", list)
            if text.startswith("[")
            else [h.strip() for h in text.split(",") if h]
        )
    columns = dict(fields.get("columns") or {})
    if opts.get("columns"):
        try:
            columns.update(json.loads(opts["columns"]))
        except json.JSONDecodeError as exc:
            raise SpecError(
                f"option 'columns' must be a JSON object like '{{\"image\": \"jpeg\"}}': {exc}"
            ) from None
    for key, value in opts.items():
        if key.startswith("encoding."):
            columns[_encoding_column(key[len("encoding.") :], schema_names)] = value
    if columns:
        fields["columns"] = columns
    spec = DatasetSpec(**fields)
    if "shard_size" in opts and spec.shard_size < MIN_SANE_SHARD_SIZE:
        warnings.warn(
            f"spark-dl: shard_size={opts['shard_size']} is {spec.shard_size} bytes, below "
            f"{MIN_SANE_SHARD_SIZE >> 10}KiB: nearly every sample gets a shard file of its own "
            "(MDS shards are usually tens of MiB)",
            stacklevel=2,
        )
    return spec


def _encoding_column(name: str, schema_names: Sequence[str]) -> str:
    """The column an ``encoding.<name>`` option means. Spark lowercases option keys, so
    the name is matched case-insensitively; two columns matching it (``a`` and ``A``) are
    refused rather than one picked."""
    matches = [n for n in schema_names if n.lower() == name.lower()]
    if len(matches) > 1:
        raise SpecError(
            f"option 'encoding.{name}' matches columns {matches}: Spark lowercases option "
            "keys, so it cannot say which; give the encodings in the 'spec' option instead "
            f'(JSON keeps the case: {{"columns": {{"{matches[0]}": "..."}}}}) or '
            "the 'columns' option"
        )
    return matches[0] if matches else name


def _has_spec_options(options: dict[str, str]) -> bool:
    return any(k.lower() in SPEC_OPTIONS or k.lower().startswith("encoding.") for k in options)


def _storage_options(options: Mapping[str, str]) -> dict[str, Any]:
    """``storage.<key>`` options, passed to fsspec (``storage.key``, ``storage.secret``,
    ``storage.endpoint_url``…): Spark tasks do not see the client's environment."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key.lower().startswith("storage."):
            out[key[len("storage.") :]] = value
    for key in ("endpoint_url", "region_name"):  # botocore client settings, for s3fs
        if key in out:
            out.setdefault("client_kwargs", {})[key] = out.pop(key)
    return out


def _path(options: Mapping[str, str]) -> str:
    """The dataset's path: the ``path`` option, or a catalog table's ``location``."""
    path = options.get("path") or options.get("location")
    if path and path.startswith("file:/") and not path.startswith("file://"):
        return path[len("file:") :]  # Hadoop's form of a local URI, as the catalog gives it
    if path:
        return path
    if not options:  # what a catalog table declared with columns reads with
        raise DatasetError(
            "the mds data source got no path and no options at all: Spark passes neither "
            "the LOCATION nor the OPTIONS of a table declared with a column list "
            "(CREATE TABLE t (id BIGINT, ...) USING mds ...) to a Python data source; leave "
            "the column list out (CREATE TABLE t USING mds LOCATION '/path': the columns "
            "come from the dataset) or use CREATE TEMPORARY VIEW t USING mds OPTIONS "
            "(path '/path')"
        )
    raise DatasetError("the mds data source needs a path: .save(path) / .load(path)")


def _json_option(options: Mapping[str, str], key: str, kind: type) -> Any:
    """Option ``key`` parsed as JSON of type ``kind``, or None when absent."""
    text = options.get(key)
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"option {key!r} must be JSON ({kind.__name__}): {exc}") from None
    if not isinstance(value, kind):
        raise SpecError(f"option {key!r} must be a JSON {kind.__name__}, got {text[:80]!r}")
    return value
