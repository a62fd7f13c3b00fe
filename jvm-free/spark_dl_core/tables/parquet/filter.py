"""A ``filter=`` on a table snapshot (Delta, Iceberg): the columns it names, checked at open,
and, for a read in place, each data file's keep-mask (deletes and filter together).

Why masks: an in-place dataset's ``len()`` and shard sizes must be known at open, so the
filter is evaluated once per row group over only the columns it references (partition
columns from the add action, others read from the row group), on the rows its deletion
vector keeps, exactly as the export filters them (after the cast to the table's types). A
filter naming only partition columns is evaluated once per file and reads no data.

The masks are cached on local disk per machine (:class:`~.cache.RowGroupCache` under
``<converted-row-group cache>/filter-masks``), one per data file, keyed by the file's identity
(path relative to the table, size, deleted rows, partition values), the filter's serialized
form (its text is truncated by pyarrow for long ``isin`` sets) and the referenced columns'
types: a second open reads ``rows / 8`` bytes per file instead of the columns.
"""

from __future__ import annotations

import hashlib
import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from .cache import RowGroupCache
from .footer import read_group
from .table_files import TableError, file_key, first_line, past_the_end

MASK_FORMAT = 1  # bump when a cached mask's meaning changes for the same inputs
_ROW = "__spark_dl_filter_row__"  # the row index column a mask is read back from
_MISSING = re.compile(r"No match for FieldRef\.\w*\(([^)]*)\)")


def _binds(expr: Any, schema: pa.Schema) -> Exception | None:
    """None when ``expr`` filters a table of ``schema``; else pyarrow's error."""
    try:
        schema.empty_table().filter(expr)
    except (pa.ArrowException, TypeError) as exc:
        return exc
    return None


def filter_columns(snap: Any) -> list[str]:
    """The output columns ``snap.filter`` references, in schema order; a filter naming a
    column the snapshot does not read, or not a boolean, is the snapshot's
    :meth:`~.table_files.TableFiles.filter_error` (Delta's ``DeltaFilterError``)."""
    schema = snap.output_schema
    error = _binds(snap.filter, schema)
    if error is not None:
        raise _refused(snap, error)
    names = schema.names
    return [n for i, n in enumerate(names) if _binds(snap.filter, schema.remove(i)) is not None]


def _refused(snap: Any, error: Exception) -> Exception:
    found = _MISSING.search(str(error))
    if found is None:
        why = f"cannot be applied: {first_line(error)}"
        return snap.filter_error(f"filter {snap.filter} {why}")
    name = found.group(1)
    if name in snap.schema.names:
        why = f"names column {name!r}, which columns= {snap.projection} leaves out: add it there"
    else:
        why = f"names column {name!r}, which the table does not have; it has {snap.schema.names}"
    return snap.filter_error(f"filter {snap.filter} {why}", column=name)


def filter_digest(expr: Any) -> str:
    """The expression's serialized form, hashed (its ``str`` elides long value sets)."""
    serialized = expr.__reduce__()[1][0]
    return hashlib.sha256(serialized.to_pybytes()).hexdigest()


def kept_digest(keep: np.ndarray) -> str:
    """A file's kept rows (deletion vector and filter), hashed: what a filtered row group's
    rows are, whatever filter text produced them."""
    return hashlib.sha256(np.flatnonzero(keep).astype("<i8").tobytes()).hexdigest()


class FileMasks:
    """Each data file's keep-mask for ``ds`` (a DeltaDataset being opened with a filter)."""

    def __init__(self, ds: Any, footers: list[Any], directory: str | None) -> None:
        self.ds = ds
        self.snap: Any = ds.snapshot
        self.footers = footers  # each file's FileFooter (tables/parquet/footers)
        self.refs = filter_columns(self.snap)
        self.ref_schema = pa.schema([self.snap.output_schema.field(n) for n in self.refs])
        self.stored = [n for n in self.refs if n not in self.snap.partition_columns]
        self.cache = RowGroupCache(directory) if directory is not None else None
        self.expr_digest = filter_digest(self.snap.filter)

    def all(self) -> list[np.ndarray]:
        """Every file's mask over its rows (True: kept), files in snapshot order."""
        files = range(len(self.snap.files))
        with ThreadPoolExecutor(max_workers=min(8, max(1, len(files)))) as pool:
            return list(pool.map(self.mask, files))

    def mask(self, file: int) -> np.ndarray:
        rows = self.footers[file].num_rows
        key = self._key(file)
        if self.cache is not None:
            raw = self.cache.read(key, verify=True)
            if raw is not None and len(raw) == (rows + 7) // 8:
                return np.unpackbits(np.asarray(raw), count=rows).astype(bool)
        keep = self._evaluate(file, rows)
        if self.cache is not None:
            self.cache.write(key, np.packbits(keep))
        return keep

    def _key(self, file: int) -> str:
        content = {
            "format": MASK_FORMAT,
            "file": self.ds._file_identities[file],
            "partition": self.snap._partition_values.get(file_key(self.snap.files[file]), {}),
            "filter": self.expr_digest,
            "columns": [[f.name, str(f.type)] for f in self.ref_schema],
            **self.ds._mapping_identity,
        }
        text = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:40]

    def _evaluate(self, file: int, rows: int) -> np.ndarray:
        """The deletion vector's keep-mask and the filter's, over the file's rows."""
        deletion = self.ds._deletion_keep(file)
        if deletion is not None and not deletion[rows:].all():
            raise self.ds._file_error(file, None, past_the_end(rows))
        keep = _padded(deletion, rows)
        if not self.stored:  # partition columns only: one value per file
            return keep & self._passes(file, pa.table({_ROW: [0]}))[0]
        pf = None if self.ds._remote_files() is not None else self.ds._parquet(file, cache=False)
        start = 0
        for group, n in enumerate(self.footers[file].rows.tolist()):
            live = keep[start : start + n]
            if live.any():
                table = read_columns(self.ds, pf, file, group, self.stored)
                passed = self._passes(file, table.filter(pa.array(live)))
                live[np.flatnonzero(live)[~passed]] = False
            start += n
        return keep

    def _passes(self, file: int, table: pa.Table) -> np.ndarray:
        """Per row of ``table`` (the referenced stored columns): does the filter keep it."""
        uri = self.snap.files[file]
        rows = pa.array(np.arange(table.num_rows))
        if len(self.ref_schema):
            finished = self.snap._finish(table, uri, self.ref_schema, filtered=False)
            result = pa.Table.from_batches(list(finished), schema=self.ref_schema)
            indexed = result.append_column(_ROW, rows)
        else:  # a constant filter
            indexed = pa.table({_ROW: rows})
        try:
            kept = indexed.filter(self.snap.filter).column(_ROW).to_numpy()
        except (pa.ArrowException, TypeError) as exc:
            raise self.snap.filter_error(
                f"data file {uri}: filter {self.snap.filter} fails: {first_line(exc)}"
            ) from None
        out = np.zeros(table.num_rows, dtype=bool)
        out[kept] = True
        return out


def read_columns(ds: Any, pf: Any, file: int, group: int, names: list[str]) -> pa.Table:
    """The stored columns ``names`` of one row group under their logical names (those the
    file lacks, added to the schema later, are left for ``_finish`` to fill with nulls)."""
    snap = ds.snapshot
    try:
        remote = ds._remote_files()
        if remote is not None:  # its span fetched once per machine, as a shard load does
            table = remote.read_group(file, group)
            return table.select([n for n in names if n in table.column_names])
        columns = snap.file_columns(pf.schema_arrow, names, snap.files[file])
        return columns.logical(read_group(pf, group, columns.read))
    except TableError:
        raise
    except Exception as exc:
        raise ds._file_error(file, group, exc) from None


def _padded(keep: np.ndarray | None, rows: int) -> np.ndarray:
    """A writable keep-mask of ``rows`` rows; rows past a deletion vector's end are kept."""
    if keep is None:
        return np.ones(rows, dtype=bool)
    out = np.ones(rows, dtype=bool)
    out[: min(rows, len(keep))] = keep[:rows]
    return out
