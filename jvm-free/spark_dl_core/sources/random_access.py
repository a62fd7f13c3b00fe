"""Random access to a dataset: ``ds[i]``, ``ds[a:b]``, ``ds[rows, columns]``, ``ds["col"]``,
read through the loaders' path and the spec's read ops."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..errors import ColumnNotFoundError, SampleIndexError
from ..format.encodings import DecodeOptions, ImageMode
from ..format.shard import ShardData
from ..meta import python_types
from ..shard_source import Batch, ShardSource


class _Readable(ShardSource, Protocol):
    """What random access needs of a dataset (:class:`~.dataset.Dataset` and its kinds)."""

    _accessed: tuple[int, ShardData] | None  # the last shard ``ds[...]`` read

    def _decode_plan(
        self, columns: list[str] | None, images: ImageMode
    ) -> tuple[list[str], DecodeOptions]: ...

    def _access(self, rows: Any, columns: list[str] | None, key: Any) -> Any: ...

    def _after_ops(
        self, batch: Batch, ops: Any, asked: list[str] | None, indices: np.ndarray
    ) -> Batch: ...


class RandomAccess:
    """Mixin of :class:`~.dataset.Dataset`: indexing it as a list or Mosaic's and Hugging
    Face's datasets are indexed."""

    _accessed: tuple[int, ShardData] | None

    def __getitem__(self: _Readable, key: Any) -> Any:
        """Random access, as a list or Mosaic's and Hugging Face's datasets index.

        ``ds[i]`` (negative counts from the end): one sample as a dict of column -> value;
        ``ds[[i, j]]``, ``ds[a:b]`` or an integer array: a batch dict of column -> array, as
        :meth:`read` returns. ``ds[rows, "col"]`` / ``ds[rows, ["a", "b"]]`` pick columns;
        ``ds["col"]`` is the whole column (every shard is read). A mixture indexes its
        sources' stored samples one after another. Samples go through the
        loaders' path (the store or its remote cache, size and hash checks, decoders);
        the last shard read stays loaded, so neighbouring samples decode without a reload.
        An index outside the dataset is a :class:`SampleIndexError` (an ``IndexError``), an
        unknown column a :class:`ColumnNotFoundError` (a ``KeyError``).
        """
        rows: Any = key
        columns: Any = None
        if isinstance(key, tuple):
            if len(key) != 2:
                raise SampleIndexError(
                    f"{self.shown}: index with ds[rows] or ds[rows, columns], got {len(key)} parts"
                )
            rows, columns = key
        elif isinstance(key, str):
            return self._access(slice(None), [key], key)[key]
        names: list[str] | None = None
        if isinstance(columns, str):
            names = [columns]
        elif isinstance(columns, (list, tuple)) and all(isinstance(c, str) for c in columns):
            names = list(columns)
        elif columns is not None:
            raise ColumnNotFoundError(
                f"{self.shown}: columns are named by a string or a list of strings, got {columns!r}"
            )
        one_column = columns if isinstance(columns, str) else None
        batch = self._access(rows, names, key)
        return batch[one_column] if one_column is not None else batch

    def _access(self: _Readable, rows: Any, columns: list[str] | None, key: Any) -> Any:
        """``ds[rows, columns]``: a sample dict for an integer ``rows``, else a batch dict."""
        n = int(self.shard_offsets[-1])  # stored samples (a mixture's sources one after another)
        from ..ops.read import random_access_ops

        asked, ops = columns, random_access_ops(self, columns)
        if ops is not None:  # asked names are the ops' outputs: read every stored column
            columns = None
        derived = [c for c in (self.derived if columns is None else columns) if c in self.derived]
        if columns is not None:
            columns = [c for c in columns if c not in self.derived]
            self._decode_plan(columns, "bytes")  # unknown columns: refused before any read
        single = isinstance(rows, (int, np.integer)) and not isinstance(rows, (bool, np.bool_))
        if single:
            indices = np.array([int(rows)], dtype=np.int64)
        elif isinstance(rows, slice):
            picked = range(n)[rows]
            indices = np.arange(picked.start, picked.stop, picked.step, dtype=np.int64)
        else:
            array = np.asarray(rows)
            if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
                raise SampleIndexError(
                    f"{self.shown}: a sample index is an int, a slice or a list of ints, "
                    f"got {key!r}"
                )
            indices = array.astype(np.int64)
        bad = (indices < -n) | (indices >= n)
        if bad.any():
            raise SampleIndexError(
                f"{self.shown}: sample index {int(indices[bad][0])} is out of range for a "
                f"dataset of {n} samples"
            )
        indices = np.where(indices < 0, indices + n, indices)
        if not len(indices):
            names = [*(self.layout.names if columns is None else columns), *derived]
            if ops is not None:
                names = asked if asked is not None else ops.names_after(names)
            return {c: np.empty(0, dtype=object) for c in names}
        loaded: dict[int, ShardData] = {}
        last = int(np.searchsorted(self.shard_offsets, indices[-1], side="right") - 1)
        accessed = getattr(self, "_accessed", None)
        if accessed is not None:
            loaded[accessed[0]] = accessed[1]
        batch = python_types(self.plans, self.read(indices, columns, loaded=loaded))
        self._accessed = (last, loaded[last])
        for name in derived:
            batch[name] = self.derive(name, indices)
        if ops is not None:
            batch = self._after_ops(batch, ops, asked, indices)
        if not single:
            return batch
        return {name: value[0] for name, value in batch.items()}

    def _after_ops(
        self: _Readable, batch: Batch, ops: Any, asked: list[str] | None, indices: np.ndarray
    ) -> Batch:
        """A random-access batch through the spec's read ops, as a loader hands it out
        (plain numpy, no jagged or image-list wrappers), with the asked columns."""
        out = ops.apply(batch, indices)
        for name, value in out.items():
            if hasattr(value, "to_objects"):  # Jagged, a pipeline's ImageList
                out[name] = value.to_objects()
        return out if asked is None else {name: out[name] for name in asked}
