"""The kinds of table a saved mixture reopens in place, by the name a source read in place
records itself under (``in_place_record()``): the one place above the table kinds that
names them, so the mixture names none."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..sources.dataset import Dataset
from .delta.table import reopen_in_place as reopen_delta
from .iceberg.table import reopen_in_place as reopen_iceberg

# kind -> reopen(arguments as recorded, storage options) -> the source read in place
REOPEN: dict[str, Callable[[dict[str, Any], dict[str, Any] | None], Dataset]] = {
    "delta": reopen_delta,
    "iceberg": reopen_iceberg,
}
