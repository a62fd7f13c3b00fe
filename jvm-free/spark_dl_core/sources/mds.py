"""The MDS kind of source: a dataset written by spark-dl or Mosaic Streaming's MDSWriter,
opened at a path (:class:`MdsDataset`).

Its jobs beyond the shared base (:class:`~.dataset.Dataset`) live beside it, as mixins it
inherits: loading its shards with size and hash checks (:mod:`.shard_loading`), and what a
dataset that follows a Delta table adds (:mod:`.followed_version`). The public face that
opens it is ``spark_dl_core.open_dataset`` (``tables/kinds``, which hands it the carrier of
the table kind it follows).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import numpy as np

from ..errors import DatasetError
from ..format.compact import CompactIndex, ShardTable
from ..format.doc_lengths import decode_lengths
from ..format.encodings import get_encoding
from ..format.index import INDEX_FILE, ShardInfo
from ..format.shard import Layout, ShardData
from ..meta import ColumnPlan, lengths_info, plans_from_meta, read_meta, stored_layout
from ..store.cached_store import shard_store
from ..store.indexing import index_fingerprint
from ..store.storage import check_path
from ..versions import Piece, version_number
from .dataset import Dataset, _list_depth
from .followed_version import FollowedVersion
from .shard_loading import ShardLoading


class MdsDataset(FollowedVersion, ShardLoading, Dataset):
    """An MDS dataset on storage: its shards, columns and fingerprint.

    Written by spark-dl or by Mosaic Streaming's MDSWriter. Use
    :func:`~spark_dl_core.open_dataset`.
    """

    def __init__(
        self,
        path: str,
        *,
        cache_dir: str | None = None,
        allow_unsafe: bool = False,
        storage_options: dict[str, Any] | None = None,
        version: int | str | None = None,
        node_cache: bool | None = None,
        carrier: Any = None,
    ) -> None:
        check_path(path)
        self.path = str(path)
        # remote stores (and network mounts) serve shard files through the node cache
        self.store = shard_store(self.path, storage_options, cache_dir, node_cache)
        self.shown = self.store.display()  # the path with any credentials redacted
        self.cache_dir = cache_dir
        self.node_cache = node_cache
        self.allow_unsafe = allow_unsafe
        self._compact: CompactIndex | None = None
        # a dataset that follows a Delta table: the table version opened and the shards
        # assembled from others (see spark_dl_core.versions); None / {} otherwise
        self.version: int | None = None
        self._virtual: dict[str, list[Piece]] = {}
        self.carrier = carrier  # a followed version's runs carried on (see FollowedVersion)
        asked = version_number(version, f"open_dataset({self.shown!r})")
        self.shards, self.meta, self._index_text = self._load(asked)
        self.layout = self._layout()
        self.shard_offsets = np.zeros(len(self.shards) + 1, dtype=np.int64)
        np.cumsum(self.shards.samples, out=self.shard_offsets[1:])
        self._verified: set[int] = set()  # shards checked once in this process
        self._warned_unverifiable = False
        self._accessed: tuple[int, ShardData] | None = None  # last shard ``ds[...]`` read

    # -- opening

    def _load(self, version: int | None) -> tuple[ShardTable, dict[str, Any] | None, bytes | None]:
        if version is not None:  # a version held by a dataset that follows a table
            asked = self._open_followed(version)
            assert asked is not None  # a version not held is a FollowError
            return asked
        # The compact index when present: per-shard JSON is never parsed on open. Read first,
        # so an unreachable store is reported for the dataset's index, not its _follow/.
        committed = read_meta(self.store, compact=True, cache_dir=self.cache_dir)
        held = self._open_followed(None)  # a followed table's dataset: its latest manifest
        if held is not None:
            return held
        if committed is None:
            raise DatasetError(self._why_no_index())
        self._compact = committed.compact
        found: Any = committed.shards
        shards = found if isinstance(found, ShardTable) else ShardTable.from_infos(list(found))
        return shards, committed.meta, committed.index_text

    def _why_no_index(self) -> str:
        """Why nothing is committed at this path, in the words a user can act on."""
        store, shown = self.store, self.store.display()
        if os.path.basename(store.root) == INDEX_FILE:
            parent = shown[: -len(INDEX_FILE)].rstrip("/") or "/"
            return f"{shown} names the index file; open the dataset directory {parent}"
        if not store.remote:
            if os.path.isfile(store.root):
                return f"{shown} is a file, not a dataset directory (one holding {INDEX_FILE})"
            if not os.path.exists(store.root):
                return f"{shown} does not exist"
        return f"{store.display(INDEX_FILE)} does not exist: no dataset is committed at {shown}"

    def _layout(self) -> Layout:
        if self._compact is not None and len(self.shards):  # one column layout by construction
            return self._layout_of([self.shards[0]])
        return self._layout_of(self.shards)

    def _layout_of(self, shards: Sequence[ShardInfo]) -> Layout:
        if not shards:
            plans = self.plans
            return stored_layout(plans) if plans else Layout((), ())
        first = shards[0]
        for i, shard in enumerate(shards):
            if (shard.column_names, shard.column_encodings, shard.column_sizes) != (
                first.column_names,
                first.column_encodings,
                first.column_sizes,
            ):
                raise DatasetError(
                    f"{self.shown}: shard {i} ({shard.stored.basename}) has columns "
                    f"{dict(zip(shard.column_names, shard.column_encodings))}, shard 0 has "
                    f"{dict(zip(first.column_names, first.column_encodings))}"
                )
        encodings = []
        for name, enc, size in zip(first.column_names, first.column_encodings, first.column_sizes):
            try:
                encoding = get_encoding(enc)
            except ValueError as exc:
                raise DatasetError(f"{self.shown}: column {name!r}: {exc}") from None
            if encoding.size != size:
                raise DatasetError(
                    f"{self.shown}: column {name!r} ({enc}) lists size {size}, "
                    f"the encoding has {encoding.size}"
                )
            encodings.append(encoding)
        if len(set(first.column_names)) != len(first.column_names):
            raise DatasetError(f"{self.shown}: column names repeat: {first.column_names}")
        return Layout(tuple(first.column_names), tuple(encodings))

    # -- facts: from the committed metadata and index

    @cached_property
    def plans(self) -> list[ColumnPlan] | None:
        """Our record of each column's Arrow type and null mask (None for Mosaic datasets)."""
        return plans_from_meta(self.meta) if self.meta else None

    @cached_property
    def fingerprint(self) -> str:
        """Identifies content and spec; for datasets not written by spark-dl, the index."""
        if self.meta and self.meta.get("fingerprint"):
            return str(self.meta["fingerprint"])
        if self._index_text is None and self._compact is not None:
            return self._compact.fingerprint  # computed from index.json when it was built
        return index_fingerprint(self._index_text or b"")

    @property
    def spec(self) -> dict[str, Any] | None:
        return self.meta.get("spec") if self.meta else None

    @property
    def source(self) -> dict[str, Any]:
        return dict(self.meta.get("source") or {}) if self.meta else {}

    @cached_property
    def forms(self) -> dict[str, tuple[str, tuple[int, ...] | None]]:
        """Each variable ``ndarray`` column's form (see :attr:`Dataset.forms`): from the
        shapes every shard's ``spark_dl.json`` entry records, and the column plans."""
        forms: dict[str, tuple[str, tuple[int, ...] | None]] = {}
        plans = {p.name: p for p in self.plans or []}
        shard_meta = self.meta["shards"] if self.meta else []
        for name, encoding in zip(self.layout.names, self.layout.encodings):
            if encoding.size is not None or not encoding.ndarray:
                continue
            recorded = [(m.get("shapes") or {}).get(name, "?") for m in shard_meta]
            plan = plans.get(name)
            if plan is None:
                forms[name] = ("auto", None)
                continue
            if recorded and all(isinstance(r, list) and r == recorded[0] for r in recorded):
                forms[name] = ("dense", tuple(recorded[0]))
            elif plan is not None and _list_depth(plan.arrow_type) == 1:
                forms[name] = ("jagged", None)
            else:
                forms[name] = ("objects", None)
        return forms

    def shard_values(self, column: str) -> np.ndarray | None:
        """Per shard, ``column``'s values as each ``spark_dl.json`` entry records them (the
        writer does for list-of-integers columns); None when a shard's are not recorded
        (written before they were, by another tool, or from a table in place)."""
        entries = self.meta["shards"] if self.meta else []
        got = [(m.get("values") or {}).get(column) for m in entries]
        if not got or len(got) != len(self.shard_offsets) - 1 or None in got:
            return None
        return np.asarray(got, dtype=np.int64)

    def doc_lengths(self, column: str, shards: Sequence[int]) -> list[np.ndarray] | None:
        """Per shard of ``shards``, each sample's count of list-of-integers ``column``'s
        values (a token document's length) from the lengths file beside it
        (:mod:`~spark_dl_core.format.doc_lengths`), read without the shard: through the node
        cache for a remote dataset, size and hash checked, kept once read (4 bytes a sample).
        None when not every shard of the dataset records them (written before they were, by
        another tool, or a followed version's assembled shards)."""
        entries = self.meta["shards"] if self.meta else []
        recorded: dict[str, bool] = self.__dict__.setdefault("_lengths_recorded", {})
        if column not in recorded:  # looked up once: every shard load and block asks
            recorded[column] = len(entries) == self.num_shards and all(
                column in (m.get("values") or {}) and lengths_info(m) for m in entries
            )
        if not recorded[column]:
            return None
        kept: dict[tuple[str, int], np.ndarray] = self.__dict__.setdefault("_doc_lengths", {})
        wanted = [int(s) for s in shards if (column, int(s)) not in kept]
        infos = {s: lengths_info(entries[s]) for s in wanted}
        if infos:
            self.store.prefetch_shards(
                [(i.basename, i.bytes, i.hashes) for i in infos.values() if i]
            )
        for s, info in infos.items():
            assert info is not None
            data = np.asarray(self.store.read_shard(info.basename, info.bytes, info.hashes))
            shown = self.store.display(info.basename)
            columns = sorted(entries[s]["values"])
            got = decode_lengths(data.tobytes(), info, columns, int(self.shards.samples[s]), shown)
            for name, lengths in got.items():
                kept[(name, s)] = lengths
        return [kept[(column, int(s))] for s in shards]

    def locate(self, sample: int) -> tuple[str, int]:
        """The shard file holding global sample ``sample`` and its index within it."""
        shard = int(np.searchsorted(self.shard_offsets, sample, side="right") - 1)
        file = self.store.display(self.shards[shard].stored.basename)
        return file, sample - int(self.shard_offsets[shard])

    def __repr__(self) -> str:
        return (
            f"<Dataset {self.shown!r}: {len(self)} samples, {self.num_shards} shards, "
            f"columns={self.columns}>"
        )
