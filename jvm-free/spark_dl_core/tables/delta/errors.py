"""A Delta table's broken parts as typed errors naming the table, the version and the file.

``deltalake`` (delta-rs) reports a damaged log as a ``DeltaError`` (or a Rust panic) that
names neither the table nor, mostly, the file; pyarrow reports a damaged Parquet file as an
``ArrowInvalid`` or ``OSError``. A caller of :func:`~.table.open_delta` gets a
:class:`~.log.DeltaSnapshotError` instead: :func:`typed_errors` wraps every failure below
open_delta's own checks, and :func:`log_culprit` looks, on that failure path only, for the
log file that does not parse (local tables), so the message can say which one to restore.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ...errors import SparkDLError
from ..parquet.table_files import past_the_end as past_the_end

F = TypeVar("F", bound=Callable[..., Any])
_PASS_THROUGH = (SparkDLError, KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError)


def typed_errors(open_delta: F) -> F:
    """``open_delta`` raising only spark-dl errors: any other failure (deltalake's, a Rust
    panic, pyarrow's, a log value of the wrong type) becomes a ``DeltaSnapshotError``."""

    @functools.wraps(open_delta)
    def opened(path: Any, **kwargs: Any) -> Any:
        from .log import as_expression

        as_expression(kwargs.get("filter"))  # a wrong argument stays the caller's TypeError
        try:
            return open_delta(path, **kwargs)
        except _PASS_THROUGH:
            raise
        except BaseException as exc:  # a pyo3 PanicException is a BaseException
            raise _log_error(path, kwargs, exc) from None

    return opened  # type: ignore[return-value]


def _log_error(path: Any, kwargs: dict[str, Any], exc: BaseException) -> SparkDLError:
    from .log import DeltaSnapshotError, first_line

    uri = os.fspath(path)
    asked = None
    if kwargs.get("version") is not None:
        asked = f"version {kwargs['version']}"
    elif kwargs.get("timestamp") is not None:
        asked = f"timestamp {kwargs['timestamp']}"
    return DeltaSnapshotError(
        uri,
        f"its log cannot be read{culprit_text(uri)}: {type(exc).__name__}: {first_line(exc)}",
        asked=asked,
    )


def culprit_text(uri: str) -> str:
    """`` (<the log file that does not parse>)``, or nothing: for an error message."""
    culprit = log_culprit(uri)
    return f" ({culprit})" if culprit else ""


def log_culprit(uri: str) -> str | None:
    """The first file of a local table's ``_delta_log`` that does not parse, said as
    ``"_delta_log/<name> <why>"``; None when all parse (or the table is not local)."""
    if "://" in uri and not uri.startswith("file://"):
        return None
    log = Path(uri.removeprefix("file://"), "_delta_log")
    try:
        names = sorted(p.name for p in log.iterdir() if p.is_file())
    except OSError:
        return None
    for name in names:
        why = _unparsed(log / name)
        if why:
            return f"_delta_log/{name} {why}"
    return None


def _unparsed(file: Path) -> str | None:
    """Why a log file does not parse as its kind, or None."""
    try:
        data = file.read_bytes()
        if file.name.endswith(".json"):
            if not data:
                return "is empty"
            for n, line in enumerate(data.decode().splitlines(), 1):
                action = json.loads(line) if line.strip() else {}
                if not isinstance(action, dict):
                    return f"line {n} is not a JSON object"
                add = action.get("add")
                if add is not None and not isinstance(add, dict):
                    return f"line {n}: its add action is not a JSON object"
                stats = (add or {}).get("stats")
                if isinstance(stats, str):  # the file's statistics: JSON in a string
                    json.loads(stats)
        elif file.name == "_last_checkpoint":
            if not isinstance(json.loads(data), dict):
                return "is not a JSON object"
        elif file.name.endswith(".parquet"):
            import pyarrow.parquet as pq

            pq.read_table(file)  # the failure path only: a checkpoint is read whole
    except (OSError, ValueError) as exc:  # JSONDecodeError, UnicodeError, ArrowInvalid
        return f"does not parse ({str(exc).splitlines()[0][:120] if str(exc) else exc!r})"
    return None


def empty_commit(filesystem: Any, log_dir: str, version: int) -> str | None:
    """The name of an empty commit file that the snapshot at ``version`` is built from
    (after its last checkpoint): a torn write whose actions delta-rs skips silently."""
    from pyarrow import fs as pafs

    infos = filesystem.get_file_info(pafs.FileSelector(log_dir, allow_not_found=True))
    commits: dict[int, tuple[str, int | None]] = {}
    checkpoint = -1
    for info in infos:
        name = info.base_name
        head = name.split(".", 1)[0]
        if not head.isdigit() or int(head) > version:
            continue
        if name == f"{head}.json":
            commits[int(head)] = (name, info.size)
        elif ".checkpoint." in name:
            checkpoint = max(checkpoint, int(head))
    for v in sorted(commits):
        name, size = commits[v]
        if v > checkpoint and size == 0:
            return name
    return None
