"""The Delta face: :func:`open_delta`, which hands each snapshot what the modules built on the
snapshot give (:class:`~.snapshot.DeltaKind`): its dataset read in place, a dataset following
the table, the rows new since a version, and runs carried on across versions. Nothing is
installed into another module: this module is above all of them and names them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from . import carry
from .follow import update_mds
from .follow_carry import FollowCarrier
from .in_place import DeltaDataset
from .log import Timestamp
from .since import new_since
from .snapshot import DeltaKind, DeltaSnapshot, open_snapshot


def open_delta(
    path: str | os.PathLike[str],
    *,
    version: int | str | None = None,
    timestamp: Timestamp | None = None,
    storage_options: dict[str, str] | None = None,
    columns: Sequence[str] | None = None,
    filter: Any = None,
    since: int | str | None = None,
) -> DeltaSnapshot:
    """Pin a Delta table at ``version`` (or the last commit at or before ``timestamp``).

    ``since=M``: only the rows live at that version that were not live at version ``M``
    (see :mod:`.since`), an ordinary snapshot whose lineage names ``since``.

    ``None`` for both pins the latest version *now*: the returned snapshot keeps reading
    that version after new commits land. Raises :class:`DeltaSnapshotError` naming the table,
    the asked version and the versions available when the snapshot cannot be read.
    ``version`` may be digits in a string (``"3"``, as Spark's ``versionAsOf`` takes it).
    """
    return open_snapshot(
        path,
        kind=DELTA,
        version=version,
        timestamp=timestamp,
        storage_options=storage_options,
        columns=columns,
        filter=filter,
        since=since,
    )


DELTA = DeltaKind(
    in_place=DeltaDataset,
    update=update_mds,
    since=new_since,
    reopen=open_delta,
    carrier=carry.DeltaCarrier,
    follows=FollowCarrier,
)


def reopen_in_place(record: dict[str, Any], storage_options: dict[str, Any] | None) -> Any:
    """A Delta snapshot read in place, opened again from what its dataset's
    ``in_place_record()`` recorded (a saved mixture's source)."""
    snap = open_delta(
        record["table"],
        version=record["version"],
        since=record.get("since"),
        columns=record.get("projection"),
        storage_options=storage_options,
    )
    return snap.dataset(record.get("spec") or {})
