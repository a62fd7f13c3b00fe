"""The one place above the table kinds that names them, so the mixture and the package face
name none: the kinds a saved mixture reopens in place, by the name a source read in place
records itself under (``in_place_record()``), and :func:`open_dataset`, the public face of
an MDS dataset, which hands a dataset that follows a table the kind's carrier (how a run
carries on across the table's versions)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar

from ..sources.dataset import Dataset
from ..sources.mds import MdsDataset
from .delta.follow_carry import FollowCarrier as DeltaFollowCarrier
from .delta.table import reopen_in_place as reopen_delta
from .iceberg.table import reopen_in_place as reopen_iceberg
from .parquet.follow_carry import FollowCarrier as _FollowCarrier

# kind -> reopen(arguments as recorded, storage options) -> the source read in place
REOPEN: dict[str, Callable[[dict[str, Any], dict[str, Any] | None], Dataset]] = {
    "delta": reopen_delta,
    "iceberg": reopen_iceberg,
}


class FollowCarrier(_FollowCarrier):
    """The carrier :func:`open_dataset` hands a dataset that follows a table of any kind:
    rows moved by a rewrite followed by the kind's row ids where it has them (Delta row
    tracking); an Iceberg table's rows of rewritten files are dropped with a warning."""

    row_ids: ClassVar[dict[str, Any]] = {**DeltaFollowCarrier.row_ids}


def open_dataset(
    path: str | os.PathLike[str],
    *,
    cache_dir: str | None = None,
    allow_unsafe: bool = False,
    storage_options: dict[str, Any] | None = None,
    version: int | str | None = None,
    node_cache: bool | None = None,
) -> MdsDataset:
    """Open an MDS dataset (ours or Mosaic's) at a local path or fsspec URL.

    A dataset that follows a Delta or Iceberg table (``write_mds(..., mode="update")``)
    opens at the latest table version it holds; ``version`` (an int, or its digits as a
    string: a Delta version, an Iceberg snapshot's sequence number) opens another version it
    still holds; a loader's run over one version carries on to another
    (:class:`FollowCarrier`).

    Everything after the path is keyword-only, so ``open_dataset(a, b)`` is a
    ``TypeError`` rather than ``b`` silently taken as the cache directory.
    ``allow_unsafe`` permits decoding ``pkl`` columns, which runs code from the dataset.
    ``cache_dir`` is where shards of remote datasets are kept locally. A local path on a
    network or FUSE mount (NFS, SMB, Lustre, Databricks' ``/Volumes``) is read through that
    node cache too, as a remote URL is; ``node_cache=True`` does so for any local path,
    ``node_cache=False`` reads in place whatever holds the path.
    """
    return MdsDataset(
        path if not isinstance(path, os.PathLike) else os.fspath(path),
        cache_dir=cache_dir,
        allow_unsafe=allow_unsafe,
        storage_options=storage_options,
        version=version,
        node_cache=node_cache,
        carrier=FollowCarrier,
    )
