"""Planning a table snapshot read in place: its shards, the non-empty row groups of its data
files (rows that deletion vectors or a filter drop left out), from the files' Parquet footers.

A footer comes from the plan cache (:mod:`.footers`) or is read: a local table's in one
loop, a remote table's on threads in chunks of files. Each is checked before Python parses it
(:mod:`.footer`), and the first that cannot be read is a typed error naming its file.
:class:`RowGroupPlanning` is the part of :class:`~.in_place.InPlaceDataset` that does this.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ...sources.dataset import _list_depth
from .filter import FileMasks
from .footer import (
    footer_problem,
    leaf_levels,
    parse_footer,
    read_footer,
    read_local_footer,
)
from .footers import FileFooter, PlanCache, Summaries, footer_key, summarize
from .shard_tokens import footer_tokens
from .table_files import TableError, file_key, past_the_end

if TYPE_CHECKING:  # pragma: no cover
    from ...format.shard import Layout
    from ...meta import ColumnPlan
    from ...spec import DatasetSpec
    from .remote import RemoteFiles
    from .table_files import TableFiles

_FOOTER_CHUNK = 256  # footers read per thread task at open (a task per file cost more)
# Data files whose Parquet footer this process read to plan (not found in the plan cache).
footers_read = 0
# Of those, footers parsed by pyarrow (the others' row groups scanned: tables/parquet/footer_scan).
footers_parsed = 0


@dataclass(frozen=True)
class _RowGroup:
    """Where one shard's rows are: file (index into ``files``), row group, first row."""

    file: int
    group: int
    start: int  # the row group's first row in the file (before deletions)
    rows: int  # rows stored in the row group
    live: int  # rows left after the deletion vector
    raw_bytes: int  # uncompressed size (Parquet's estimate)
    stored_bytes: int  # compressed size


class RowGroupPlanning:
    """The row groups an :class:`~.in_place.InPlaceDataset` serves, from the footers."""

    if TYPE_CHECKING:  # what the dataset holds, and the parts of it planning uses
        snapshot: TableFiles
        plan_dir: str | None
        converted_dir: str | None
        _plans: list[ColumnPlan]
        _filter_keep: list[np.ndarray]
        _groups: list[_RowGroup]
        _leaf_values: dict[str, list[tuple[int, int]]]
        user_spec: DatasetSpec
        layout: Layout

        @property
        def _file_identities(self) -> list[list[Any]]: ...
        def _file_error(self, file: int, group: int | None, why: Any) -> Exception: ...
        def _remote_files(self) -> RemoteFiles | None: ...
        def _parquet(self, file: int, cache: bool = True) -> Any: ...

    def _read_footers(self) -> tuple[list[_RowGroup], dict[str, list[tuple[int, int]]]]:
        """Every non-empty row group (after deletions), in file order; and per stored list
        column, each row group's (rows, leaf values) from the footers (for :attr:`forms`)."""
        snap = self.snapshot
        footers = self._footers()
        if snap.filter is not None:  # rows it keeps, per file: evaluated (or cached) now
            masks = None if self.converted_dir is None else f"{self.converted_dir}/filter-masks"
            self._filter_keep = FileMasks(self, footers, masks).all()
        lists = [p.name for p in self._plans if _list_depth(p.arrow_type) == 1]
        groups: list[_RowGroup] = []
        leaves: dict[str, list[tuple[int, int]]] = {name: [] for name in lists}
        resolved: dict[int, dict[str, str]] = {}  # per file schema: logical -> stored name
        for i, foot in enumerate(footers):
            keep = self._keep_array(i)
            found = resolved.get(id(foot.schema))
            if found is None:  # once per distinct schema object (files share one)
                found = resolved[id(foot.schema)] = self._leaf_names(i, foot, lists)
            rows = foot.rows.tolist()
            for name in lists:
                values = foot.leaves.get(found.get(name, ""))
                counts = [-1] * len(rows) if values is None else values.tolist()
                leaves[name].extend(zip(rows, counts))
            start = 0
            for g, (n, raw, stored) in enumerate(
                zip(rows, foot.raw_bytes.tolist(), foot.stored_bytes.tolist())
            ):
                live = n if keep is None else int(_mask(keep, start, n).sum())
                if live:
                    groups.append(_RowGroup(i, g, start, n, live, raw, stored))
                start += n
            if keep is not None and not keep[start:].all():
                raise self._file_error(i, None, past_the_end(start))
        return groups, leaves

    def shard_values(self, column: str) -> np.ndarray | None:
        """Per row group served, list-of-integers ``column``'s values as the footers record
        them (a packed loader's token counts, :mod:`.shard_tokens`); None when they are not
        exactly the served rows' (deletes, a filter, null or empty lists, transforms). Worked
        out once per column: every stream of a packed epoch asks."""
        known: dict[str, np.ndarray | None] = self.__dict__.setdefault("_shard_tokens", {})
        if column not in known:
            names = self.layout.names
            at = names.index(column) if column in names else None
            known[column] = footer_tokens(
                [(g.rows, g.live) for g in self._groups],
                self._leaf_values.get(column),
                next((p for p in self._plans if p.name == column), None),
                None if at is None else self.layout.encodings[at],
                bool(self.user_spec.transforms),
            )
        return known[column]

    def _leaf_names(self, file: int, foot: FileFooter, lists: list[str]) -> dict[str, str]:
        """Logical list column -> the name of its column in the file (physical names under
        column mapping: a column the file should hold but lacks is refused here, at open)."""
        snap = self.snapshot
        stored = [n for n in snap.output_schema.names if n not in snap.partition_columns]
        columns = snap.file_columns(foot.schema, stored, snap.files[file])
        return {name: read for name, read in zip(columns.names, columns.read) if name in lists}

    def _footers(self) -> list[FileFooter]:
        """Every data file's footer summary: from this machine's plan cache, else read (on
        threads, in chunks of files) and cached for the next open of this or a later
        version (:mod:`.footers`)."""
        snap = self.snapshot
        cache = None if self.plan_dir is None else PlanCache(self.plan_dir)
        mtimes = snap._mtimes
        keys = [
            footer_key(relative, size, mtimes.get(key))
            for (relative, size, _), key in zip(self._file_identities, self._file_keys)
        ]
        cached = cache.load() if cache is not None else {}
        missing = [i for i, key in enumerate(keys) if key not in cached]
        read = dict(zip(missing, _shared_schemas(self._read_missing(missing))))
        footers = [read[i] if i in read else cached[key] for i, key in enumerate(keys)]
        if cache is not None and missing:
            cache.save(keys, footers)
        return footers

    def _read_missing(self, files: list[int]) -> list[FileFooter]:
        """The footers of ``files``, in order; the first (in order) that cannot be read is
        a typed error naming it, and the reads not started yet are cancelled. A local
        table's are read in one loop: a scanned footer is Python-bound, and threads only
        add contention (~70 µs of CPU a file on 16 threads, ~45 µs in one)."""
        global footers_read
        if not files:
            return []
        footers_read += len(files)
        remote = self._remote_files()
        summaries = Summaries()
        if remote is None:
            reader, paths = self._footer_reader()
            return [self._footer(f, summaries, reader, paths[f]) for f in files]
        size = max(1, min(_FOOTER_CHUNK, len(files) // 32))
        chunks = [files[k : k + size] for k in range(0, len(files), size)]
        with remote.footers(files):
            out = [self._footer(files[0], summaries)]  # its layout learnt before the threads
            chunks[0] = chunks[0][1:]
            pool = ThreadPoolExecutor(max_workers=min(16, len(chunks)))
            try:
                read = functools.partial(self._footers_of, summaries=summaries)
                for part in pool.map(read, chunks):
                    out.extend(part)
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
        return out

    def _footer_reader(self) -> tuple[Callable[[str], bytes], list[str]]:
        """How to read a footer of the table's filesystem (``os.pread`` on local files), and
        each data file's path there: made once, not per file."""
        from pyarrow import fs as pafs

        snap = self.snapshot
        filesystem, prefix = snap._filesystem()
        paths = [snap._fs_path(uri, prefix) for uri in snap.files]
        if isinstance(filesystem, pafs.LocalFileSystem):
            return read_local_footer, paths
        return functools.partial(read_footer, filesystem), paths

    def _footers_of(self, files: list[int], summaries: Summaries) -> list[FileFooter]:
        return [self._footer(f, summaries) for f in files]

    def _footer(
        self,
        file: int,
        summaries: Summaries,
        read: Callable[[str], bytes] | None = None,
        path: str = "",
    ) -> FileFooter:
        """The file's footer summary, its column chunks checked before Python reads them
        (pyarrow aborts the process on some damaged ones: :mod:`.footer`); a local
        file (``read`` from ``path``) whose footer key pyarrow has parsed once is scanned without it
        (:class:`~.footers.Summaries`)."""
        footer = b""
        try:
            if read is None:  # a remote file: its footer span, parsed by pyarrow (not walked)
                meta = self._remote_footer(file)
            else:
                footer = read(path)
                scanned = summaries.scanned(footer) if footer else None
                if scanned is not None:
                    return scanned
                global footers_parsed
                footers_parsed += 1
                meta = parse_footer(footer) if footer else self._parquet(file, cache=False).metadata
            levels = leaf_levels(meta)
            why = footer_problem(footer, levels) if footer else None
            if why:
                raise self._file_error(file, None, f"has a damaged Parquet footer: {why}")
            return summaries.learn(footer, meta, levels) if footer else summarize(meta, levels)
        except TableError:
            raise
        except Exception as exc:
            raise self._file_error(file, None, exc) from None

    def _remote_footer(self, file: int) -> Any:
        remote = self._remote_files()
        assert remote is not None  # only called for a remote table's files
        return remote.footer(file)

    def _keep_array(self, file: int) -> np.ndarray | None:
        """The file's rows this dataset serves: its deletion vector's, and the filter's."""
        if self._filter_keep:
            return self._filter_keep[file]
        return self._deletion_keep(file)

    def _deletion_keep(self, file: int) -> np.ndarray | None:
        vectors = self.snapshot._keep
        keep = vectors.get(self._file_keys[file]) if vectors else None
        return None if keep is None else np.asarray(keep, dtype=bool)

    @cached_property
    def _file_keys(self) -> list[str]:
        """Each data file's :func:`.table_files.file_key` (the snapshot's dicts' keys), made
        once: planning looks a file up several times (not pickled: rebuilt on demand)."""
        return [file_key(u) for u in self.snapshot.files]


def _mask(keep: np.ndarray, start: int, rows: int) -> np.ndarray:
    """The keep-mask of rows ``start..start+rows``; rows past the vector's end are kept."""
    part = keep[start : start + rows]
    if len(part) < rows:
        part = np.concatenate([part, np.ones(rows - len(part), dtype=bool)])
    return part


def _shared_schemas(footers: list[FileFooter]) -> list[FileFooter]:
    """``footers`` with equal schemas made one object (files written together share one):
    columns are then resolved once per schema, not per file."""
    seen: list[pa.Schema] = []
    for foot in footers:
        same = next((s for s in reversed(seen) if s.equals(foot.schema, check_metadata=True)), None)
        if same is None:
            seen.append(foot.schema)
        else:
            foot.schema = same
    return footers
