"""What ``inspect`` and ``show`` read, named by one path argument: a Delta table read in
place (``TABLE@VERSION`` pinned, ``TABLE@M..N`` the rows new since ``M``), a dataset at
one of the versions it holds (``PATH@M``), a saved mixture spec, or a dataset directory or
URL. Also how such a read keeps going past nulls, and the lines that say it did. Both
describing commands share it; neither needs the other."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar


def _delta_table(path: str) -> tuple[str, int | None, int | None] | None:
    """``(table, version, since)`` when ``path`` names a Delta table, ``TABLE@VERSION``
    pinning one (``version`` None: the latest), ``TABLE@M..N`` the rows new at ``N`` since
    ``M``; None for anything else."""
    table, at, version = path.rpartition("@")
    since, dots, last = version.partition("..")
    if at and dots and None not in (_number(since), _number(last)) and _is_delta(table):
        return table, _number(last), _number(since)
    if at and _number(version) is not None and _is_delta(table):
        return table, _number(version), None
    return (path, None, None) if _is_delta(path) else None


def _number(version: str) -> int | None:  # ``12`` or ``v12`` (as inspect prints it)
    digits = version.removeprefix("v")
    return int(digits) if digits.isdigit() else None


def _is_delta(path: str) -> bool:
    local = path.removeprefix("file://")
    return "://" not in local and os.path.isdir(os.path.join(local, "_delta_log"))


# A Delta table read in place for inspect/show masks its nullable columns: every table Spark
# writes has them, and describing a table must not stop at its first null.
INSPECT_DELTA_SPEC: dict[str, Any] = {"nulls": "mask"}
NULLS_MASKED = (
    "nulls: masked (nulls='mask': a loader gets a null as 0 or empty plus <column>__isnull "
    "= 1; here nulls are counted and shown as null)"
)

AS_JSON = "read as json: {} (arrays holding null elements, which ndarray encodings refuse)"
T = TypeVar("T")


def open_any(path: str, as_json: Sequence[str] = ()) -> Any:
    """What ``inspect`` and ``show`` read: a Delta table (``TABLE@VERSION`` pinned, read in
    place with ``INSPECT_DELTA_SPEC`` and the ``as_json`` columns as json, nothing
    exported), a saved mixture spec, or a dataset directory or URL."""
    from spark_dl_core import open_dataset, open_delta, open_mixture

    delta = _delta_table(path)
    if delta is not None:
        snap = open_delta(delta[0], version=delta[1], since=delta[2])
        return snap.dataset({**INSPECT_DELTA_SPEC, "columns": dict.fromkeys(as_json, "json")})
    base, at, version = path.rpartition("@")
    if at and version.isdigit() and os.path.isdir(os.path.join(base, "_follow")):
        return open_dataset(base, version=int(version))  # PATH@M: a version it holds
    return open_mixture(path) if is_mixture_spec(path) else open_dataset(path)


def read_any(path: str, work: Callable[[Any], T]) -> tuple[T, list[str]]:
    """``work(open_any(path))`` and the columns read as json: a Delta table's array column
    found holding null elements (its default ndarray encoding has no nulls) is read as json
    and ``work`` runs again, so inspecting a table never stops at a null."""
    from spark_dl_core.errors import ArrayNullsError

    as_json: list[str] = []
    while True:
        try:
            return work(open_any(path, as_json)), as_json
        except ArrayNullsError as exc:
            if exc.column in as_json or _delta_table(path) is None:
                raise
            as_json.append(exc.column)


def is_mixture_spec(path: str) -> bool:
    """A saved mixture spec: a .json file that is not one of a dataset's own files (those
    open as a dataset, which says to open the directory instead)."""
    own = ("index.json", "spark_dl.json", "spark_dl.prev.json")
    return path.endswith(".json") and os.path.isfile(path) and os.path.basename(path) not in own
