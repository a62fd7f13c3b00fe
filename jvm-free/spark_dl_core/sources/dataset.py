"""The shared base of every kind of source: :class:`Dataset`, a source of shards read as
one id space, and decoding its samples batch by batch into numpy.

A kind of source (the MDS dataset, :mod:`.mds`; a table read in place, ``tables/``; a
mixture, ``mixture/``) derives from :class:`Dataset` and overrides only the defaults it
answers otherwise: how it opens, its fingerprint, plans and forms, where a sample lives, how
a shard loads. ``ds[...]`` is a mixin it inherits (:mod:`.random_access`), as are the
defaults of :class:`~spark_dl_core.shard_source.SourceCapabilities`. Its loading methods and
its notebook card are implemented in rooms above this one, which the package face hands in
(:func:`install`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import (
    ColumnNotFoundError,
    SampleIndexError,
    ShardError,
)
from ..format.buffers import (
    Jagged,
    Pieces,
    copy_pieces,
    gather,
    gather_fixed,
    offsets_from_lengths,
)
from ..format.compact import ShardTable
from ..format.encodings import DecodeOptions, Encoding, ImageMode
from ..format.shard import Layout, ShardData
from ..meta import ColumnPlan, column_names
from ..shard_source import Batch, SourceCapabilities
from .random_access import RandomAccess

# column -> numpy array, or a Jagged batch (token sequences) inside the loaders


class Dataset(RandomAccess, SourceCapabilities):
    """A source of shards: its samples, columns and fingerprint, and their decoding.

    Every kind derives from it (``isinstance(ds, Dataset)`` holds for an MDS dataset, a
    table read in place and a mixture alike). Use :func:`~spark_dl_core.open_dataset`,
    ``open_delta(...).dataset()``, :func:`~spark_dl_core.mix`...
    """

    # What each kind sets when it opens.
    path: str
    shown: str  # the path with any credentials redacted
    allow_unsafe: bool
    shards: ShardTable
    layout: Layout
    shard_offsets: np.ndarray  # the first global sample of each shard, and the total
    _accessed: tuple[int, ShardData] | None  # the last shard ``ds[...]`` read

    # -- facts

    def __len__(self) -> int:
        return int(self.shard_offsets[-1])

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def columns(self) -> dict[str, str]:
        """Stored columns and their MDS encodings, in stored order."""
        return {n: e.name for n, e in zip(self.layout.names, self.layout.encodings)}

    @cached_property
    def plans(self) -> list[ColumnPlan] | None:
        """Our record of each column's Arrow type and null mask (None: none recorded)."""
        return None

    @cached_property
    def fingerprint(self) -> str:
        """Identifies the source's content and spec: each kind computes its own."""
        raise NotImplementedError(f"{type(self).__name__} names no fingerprint")

    @property
    def spec(self) -> dict[str, Any] | None:
        return None

    @property
    def source(self) -> dict[str, Any]:
        return {}

    def encoding(self, column: str) -> Encoding:
        return self.layout.encodings[self.layout.names.index(column)]

    @cached_property
    def forms(self) -> dict[str, tuple[str, tuple[int, ...] | None]]:
        """How each variable ``ndarray`` column leaves every reader, fixed per dataset.

        ``("dense", shape)``: every shard's ``spark_dl.json`` entry records that one shape
        for the column (Spark's ``array<float>`` of equal lengths): a dense batch.
        ``("jagged", None)``: recorded 1-D lists of numbers otherwise (token sequences):
        values + offsets, a ``torch.nested`` jagged tensor / ``tf.RaggedTensor``.
        ``("objects", None)``: n-D values not all of one shape: a numpy object array.
        Datasets written by other tools record no shapes: their columns are ``("auto",
        None)``, each batch dense when its values share one shape (as Mosaic's reader
        leaves it to the user). Fixed-width and other columns are not listed.
        """
        return {}

    def _conform(self, name: str, value: Any, file: str) -> Any:
        """Give a decoded variable ndarray column its dataset-wide form (see :attr:`forms`)."""
        form = self.forms.get(name)
        if form is None:
            return value
        kind, shape = form
        n = len(value)
        if kind == "auto":
            return value
        if kind == "dense":
            assert shape is not None
            if n == 0:
                encoding = self.encoding(name)
                dtype = getattr(encoding, "dtype", None) or np.float64
                return np.empty((0, *shape), dtype=np.dtype(dtype).newbyteorder("="))
            if isinstance(value, np.ndarray) and value.dtype != object and value.shape[1:] == shape:
                return value
            raise ShardError(
                file,
                f"column {name!r} is recorded with one shape {shape} in every shard (dense), "
                "but this batch holds arrays of another shape",
            )
        if kind == "jagged":
            if isinstance(value, Jagged):
                return value
            if isinstance(value, np.ndarray) and value.dtype != object and value.ndim == 2:
                return Jagged.from_dense(value)
            if n == 0:
                encoding = self.encoding(name)
                dtype = getattr(encoding, "dtype", None) or np.float64
                return Jagged(np.empty(0, np.dtype(dtype).newbyteorder("=")), np.zeros(1, np.int64))
            raise ShardError(
                file, f"column {name!r} is recorded as 1-D arrays but holds arrays of other rank"
            )
        if isinstance(value, Jagged):
            return value.to_objects()
        if isinstance(value, np.ndarray) and value.dtype != object:
            return _as_objects(list(value))
        return value

    # Columns computed from sample ids rather than stored (a mixture's source column).
    derived: tuple[str, ...] = ()

    def derive(self, name: str, index: np.ndarray) -> np.ndarray:
        raise ColumnNotFoundError(f"{self.shown} has no derived column {name!r}")

    def locate(self, sample: int) -> tuple[str, int]:
        """The shard holding global sample ``sample`` (as a person finds it) and its index
        within it."""
        shard = int(np.searchsorted(self.shard_offsets, sample, side="right") - 1)
        return f"shard {shard}", sample - int(self.shard_offsets[shard])

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.shown!r}: {len(self)} samples, "
            f"{self.num_shards} shards, columns={self.columns}>"
        )

    # -- shards: each kind loads its own

    def load_shard(
        self,
        shard: int,
        verify_hashes: bool | None = None,
        timings: dict[str, float] | None = None,
    ) -> ShardData:
        """One shard, decoded from storage as MDS shard bytes: each kind loads its own."""
        raise NotImplementedError(f"{type(self).__name__} loads no shard")

    def stored_bytes(self, shard: int) -> np.ndarray:
        """One shard's stored bytes: each kind reads its own."""
        raise NotImplementedError(f"{type(self).__name__} stores no shard")

    def prefetch_shards(self, shards: list[int], threads: int | None = None) -> bool:
        """Start fetching these shards in the background (False: nothing to fetch)."""
        return False

    def release_shards(self, shards: list[int]) -> None:
        """Forget background fetches of these shards (a reader that stops early)."""

    def download_stats(self) -> dict[str, float] | None:
        """This process's download telemetry (None: nothing downloaded)."""
        return None

    def load_rows(
        self,
        shard: int,
        rows: np.ndarray,
        verify_hashes: bool | None = None,
        timings: dict[str, float] | None = None,
        decoded_only: bool = False,
    ) -> ShardData | None:
        """Only ``rows`` (ascending local indices) of ``shard``, answering by the shard's
        own indices, when the source can serve them sooner than the whole shard (a table
        read in place, before its row group is converted); None: load the shard.
        ``decoded_only``: only from a shard this process already holds decoded."""
        return None

    def decode_ahead(self, shards: list[int]) -> list[int]:
        """Decode ``shards`` now and hold them, so DataLoader workers forked next inherit
        the decode (:meth:`load_rows` then serves rows without decoding again); the shards
        held, none for a source whose shards are read whole."""
        return []

    def forget_decoded(self) -> None:
        """Drop what :meth:`decode_ahead` holds (its workers have forked)."""

    # -- decoding

    def _decode_plan(
        self, columns: list[str] | None, images: ImageMode
    ) -> tuple[list[str], DecodeOptions]:
        """The columns to decode (checked to exist and to be safe to decode) and options."""
        names = column_names(columns) or (list(self.layout.names) if columns is None else [])
        missing = [c for c in names if c not in self.layout.names]
        if missing:
            raise ColumnNotFoundError(
                f"{self.shown} has no column(s) {missing}; it has {list(self.layout.names)}"
            )
        options = DecodeOptions(images=images, allow_unsafe=self.allow_unsafe)
        for name in names:
            self.encoding(name).check_safe(name, options)
        return names, options

    def decode(
        self,
        shard: ShardData,
        index: np.ndarray,
        columns: list[str] | None = None,
        images: ImageMode = "bytes",
        jagged: bool = False,
    ) -> Batch:
        """Decode the samples at ``index`` (positions within ``shard``) into numpy arrays.

        Token-sequence columns (form ``jagged``) come back as :class:`Jagged` batches with
        ``jagged=True``, else as object arrays of 1-D arrays.
        """
        names, options = self._decode_plan(columns, images)
        pieces = shard.columns(np.asarray(index, dtype=np.int64), names)
        out: Batch = {}
        for name in names:
            try:
                value = self.encoding(name).decode(pieces[name], len(index), name, options)
            except (ValueError, IndexError) as exc:
                if isinstance(exc, ShardError):
                    raise
                raise ShardError(shard.file, f"column {name!r}: {exc}") from None
            value = self._conform(name, value, shard.file)
            out[name] = value if jagged or not isinstance(value, Jagged) else value.to_objects()
        return out

    def read(
        self,
        indices: np.ndarray,
        columns: list[str] | None = None,
        images: ImageMode = "bytes",
        verify_hashes: bool | None = None,
        loaded: dict[int, ShardData] | None = None,
        jagged: bool = False,
    ) -> Batch:
        """Decode samples by global index, in the order given.

        ``loaded`` keeps decompressed shards between calls; the caller bounds its size.
        """
        columns = column_names(columns)
        indices = np.asarray(indices, dtype=np.int64)
        stored = int(self.shard_offsets[-1])
        if len(indices) and (indices.min() < 0 or indices.max() >= stored):
            raise SampleIndexError(
                f"{self.shown}: sample index out of range for a dataset of {stored} samples"
            )
        shard_of = np.searchsorted(self.shard_offsets, indices, side="right") - 1
        shards = np.unique(shard_of).tolist()
        datas: list[tuple[np.ndarray, ShardData]] = []
        for shard in shards:
            where = np.flatnonzero(shard_of == shard)
            data = loaded.get(shard) if loaded is not None else None
            if data is None:
                data = self.load_shard(shard, verify_hashes)
                if loaded is not None:
                    loaded[shard] = data
            datas.append((where, data))
        if jagged and self.layout.row_size is None:
            direct = self._read_direct(indices, shards, datas, columns, images)
            if direct:
                names = list(self.layout.names) if columns is None else list(columns)
                rest = [c for c in names if c not in direct]
                other = self._read_loaded(indices, shards, datas, rest, images, jagged)
                return {c: direct[c] if c in direct else other[c] for c in names}
        return self._read_loaded(indices, shards, datas, columns, images, jagged)

    def _read_loaded(
        self,
        indices: np.ndarray,
        shards: list[int],
        datas: list[tuple[np.ndarray, ShardData]],
        columns: list[str] | None,
        images: ImageMode,
        jagged: bool,
    ) -> Batch:
        """The general decode of samples in loaded shards: per shard, or across shards."""
        if columns is not None and not columns:
            return {}
        if len(datas) > 1 and self.layout.row_size is None:
            # A shuffled batch spans several shards: gather each shard's bytes, put them in
            # the requested order, decode once (not once per shard plus a merge).
            return self._decode_across(indices, datas, columns, images, jagged)
        parts: list[tuple[np.ndarray, Batch]] = []
        for (where, data), shard in zip(datas, shards):
            local = indices[where] - self.shard_offsets[shard]
            parts.append((where, self.decode(data, local, columns, images, jagged)))
        return _merge(parts, len(indices))

    def row_spans(
        self, data: ShardData, columns: list[str]
    ) -> tuple[int, list[tuple[int, int, Any]]] | None:
        """When every row of ``data`` has one layout (fixed-width datasets, and Spark's
        equal-length arrays in a variable layout): the row size and, per column, where its
        values lie in a row and how they decode: an encoding, or for a dense ndarray column
        ``(dtype, shape, header)``, the header bytes every row must carry before its values
        (the reader checks them in the rows it gathers). None otherwise."""
        rows = data.row_matrix
        if rows is None or not len(rows):
            return None
        spans: list[tuple[int, int, Any]] = []
        for name in columns:
            i = data.layout.names.index(name)  # the shard's own layout (mixtures differ)
            at, width = data.row_span(i)
            encoding = self.encoding(name)
            if encoding.size is not None:
                spans.append((at, width, encoding))
                continue
            form = self.forms.get(name)
            header = getattr(encoding, "dense_header", None)
            if form is None or form[0] != "dense" or header is None:
                return None
            assert form[1] is not None
            found = header(rows[0, at : at + width], form[1], name)
            if found is None:
                return None
            head, dtype = found
            spans.append((at + head, width - head, (dtype, form[1], rows[0, at : at + head])))
        return rows.shape[1], spans

    def _read_direct(
        self,
        indices: np.ndarray,
        shards: list[int],
        datas: list[tuple[np.ndarray, ShardData]],
        columns: list[str] | None,
        images: ImageMode,
    ) -> Batch:
        """Token-sequence (form ``jagged``) and fixed-width columns of a variable layout,
        read straight from the shards' bytes: each sample's column positions are found once,
        then each column is copied into its batch buffer in the requested order (one copy
        per byte, no intermediate pieces). Columns this does not fit (strings, n-D arrays,
        other dtypes) are left out of the result, for the general decode."""
        names, options = self._decode_plan(columns, images)
        wanted = [
            name
            for name in names
            if self.encoding(name).size is not None or self.forms.get(name, ("",))[0] == "jagged"
        ]
        if not any(self.encoding(name).size is None for name in wanted):
            return {}  # nothing jagged: the general path is as direct
        n = len(indices)
        located = []
        for shard, (where, data) in zip(shards, datas):
            starts, sizes = data.positions(indices[where] - self.shard_offsets[shard])
            located.append((where, data, starts, sizes))
        out: Batch = {}
        for name in wanted:
            encoding = self.encoding(name)
            if encoding.size is not None:
                block = np.empty((n, encoding.size), dtype=np.uint8)
                for where, data, starts, _ in located:
                    i = data.layout.names.index(name)  # each shard's own layout
                    block[where] = gather_fixed(data.raw, starts[:, i], encoding.size)
                pieces = Pieces(block.reshape(-1), width=encoding.size)
                out[name] = encoding.decode(pieces, n, name, options)
                continue
            value = self._jagged_values(name, located, n)
            if value is not None:
                out[name] = value
        return out

    def _jagged_values(self, name: str, located: list[tuple[Any, ...]], n: int) -> Jagged | None:
        """One token-sequence column of a batch as a :class:`Jagged` (None: values that are
        not 1-D of one dtype, left to the general decode)."""
        spans = getattr(self.encoding(name), "value_spans", None)
        if spans is None:
            return None
        nbytes = np.zeros(n, dtype=np.int64)
        found, dtype = [], None
        for where, data, starts, sizes in located:
            i = data.layout.names.index(name)
            try:
                got = spans(data.raw, starts[:, i], sizes[:, i], name)
            except ValueError as exc:
                raise ShardError(data.file, f"column {name!r}: {exc}") from None
            if got is None or (dtype is not None and got[2] != dtype):
                return None
            dtype = got[2]
            nbytes[where] = got[1]
            found.append((where, data.raw, got[0], got[1]))
        if dtype is None:
            return None
        offsets = offsets_from_lengths(nbytes)
        values = np.empty(int(offsets[-1]), dtype=np.uint8)
        for where, raw, starts_, lengths in found:
            copy_pieces(values, offsets[where], raw, starts_, lengths)
        native = values.view(dtype).astype(dtype.newbyteorder("="), copy=False)
        return Jagged(native, offsets // dtype.itemsize)

    def _decode_across(
        self,
        indices: np.ndarray,
        datas: list[tuple[np.ndarray, ShardData]],
        columns: list[str] | None,
        images: ImageMode,
        jagged: bool,
    ) -> Batch:
        names, options = self._decode_plan(columns, images)
        n = len(indices)
        order = np.concatenate([where for where, _ in datas])
        inverse = np.empty(n, dtype=np.int64)
        inverse[order] = np.arange(n)
        parts = []
        for where, data in datas:
            shard = int(np.searchsorted(self.shard_offsets, indices[where[0]], side="right") - 1)
            parts.append(data.columns(indices[where] - self.shard_offsets[shard], names))
        files = ", ".join(data.file for _, data in datas)
        out: Batch = {}
        for name in names:
            pieces = _take_pieces(_concat_pieces([p[name] for p in parts]), inverse, n)
            try:
                value = self.encoding(name).decode(pieces, n, name, options)
            except (ValueError, IndexError) as exc:
                if isinstance(exc, ShardError):
                    raise
                raise ShardError(files, f"column {name!r}: {exc}") from None
            value = self._conform(name, value, files)
            out[name] = value if jagged or not isinstance(value, Jagged) else value.to_objects()
        return out

    # The loading methods below hand over to spark_dl_core.loaders.loading, a room above this one
    # (orders, readers, loader settings, framework adapters) that the package face hands in
    # (install); this room imports none of those.

    def iter_batches(self, batch_size: int | None = None, **settings: Any) -> Iterator[Batch]:
        """Batches (dicts of numpy arrays) of one rank's share of one epoch.

        Keywords are :class:`~spark_dl_core.loaders.settings.LoaderSettings` fields
        (``shuffle``, ``seed``, ``epoch``, ``rank``, ``world_size``, ``columns``,
        ``transforms``, ``pack``...), or ``settings=`` a ``LoaderSettings``; ``state=`` (a
        loader's ``state_dict()``) continues after the samples it records as consumed. The
        global order depends only on (fingerprint, seed, epoch, shuffle settings); see
        :mod:`spark_dl_core.order` and :func:`spark_dl_core.loaders.loading.iter_batches`.
        """
        return _loading.iter_batches(self, batch_size, **settings)

    def sample_order(self, batch_size: int | None = None, **settings: Any) -> Any:
        """One rank's batches of global sample indices for an epoch, lazily (an
        :class:`~spark_dl_core.order.EpochPlan`): the very order every loader reads.
        ``len(order)`` batches; ``order[k]`` is an int64 array, computed when asked
        (O(shards) memory, no shard read). See :func:`spark_dl_core.loaders.loading.sample_order`.
        """
        return _loading.sample_order(self, batch_size, **settings)

    def to_arrow(self, columns: list[str] | None = None, *, batch_size: int = 65536) -> pa.Table:
        """The whole dataset (or some columns) as an Arrow table with the recorded types."""
        return _loading.to_arrow(self, columns, batch_size=batch_size)

    def to_torch(self, batch_size: int | None = None, **settings: Any) -> Any:
        """A PyTorch loader over this dataset (see :mod:`spark_dl_core.loaders.torch_loader`).

        Keywords are :class:`~spark_dl_core.loaders.settings.LoaderSettings` fields, or
        ``settings=`` a ``LoaderSettings``.
        """
        return _loading.to_framework("torch", self, batch_size, **settings)

    def to_tf(self, batch_size: int | None = None, **settings: Any) -> Any:
        """A ``tf.data.Dataset`` over this dataset (see
        :mod:`spark_dl_core.loaders.tf_loader.loader`); ``state=`` resumes from a loader state."""
        return _loading.to_framework("tf", self, batch_size, **settings)

    def _repr_html_(self) -> str:
        """The dataset card (a fragment) in a notebook cell: see :mod:`spark_dl_core.card`."""
        return _card(self)


# What Dataset's loading methods and notebook card run, from rooms above this one: see install.
_loading: Any = None
_card: Callable[[Any], str] = repr


def install(loading: Any, card: Callable[[Any], str]) -> None:
    """Give :class:`Dataset` its loading methods' implementation (``loading``:
    :mod:`spark_dl_core.loaders.loading`) and its notebook card (``card``:
    :func:`spark_dl_core.card.notebook_card`). The package face (``spark_dl_core/__init__.py``)
    calls it once, naming both, so the dataset room reaches no orders, readers, frameworks or
    media itself."""
    global _loading, _card
    _loading, _card = loading, card


def _merge(parts: list[tuple[np.ndarray, Batch]], n: int) -> Batch:
    """Put per-shard decoded pieces back into the requested order.

    Every part of a column has the same form (see ``Dataset.forms``): dense arrays are
    concatenated, jagged batches joined by offsets, object arrays concatenated.
    """
    if len(parts) == 1 and np.array_equal(parts[0][0], np.arange(n)):
        return parts[0][1]
    out: Batch = {}
    if not parts:
        return out
    order = np.concatenate([where for where, _ in parts])
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.arange(n)
    for name in parts[0][1]:
        values = [batch[name] for _, batch in parts]
        if all(isinstance(v, Jagged) for v in values):
            out[name] = Jagged.concat(values).take(inverse)
            continue
        values = [v.to_objects() if isinstance(v, Jagged) else v for v in values]
        if any(v.dtype == object for v in values) or len({v.shape[1:] for v in values}) > 1:
            merged = _as_objects([x for v in values for x in list(v)])
        else:
            merged = np.concatenate(values)
        out[name] = merged[inverse]
    return out


def _concat_pieces(parts: list[Pieces]) -> Pieces:
    """The values of several shards' pieces back to back (each part's data is compact)."""
    if all(p.width is not None for p in parts) and len({p.width for p in parts}) == 1:
        return Pieces(np.concatenate([p.data for p in parts]), width=parts[0].width)
    datas, lengths = [], []
    for p in parts:
        n = len(p)
        if p.offsets is not None:
            datas.append(p.data[int(p.offsets[0]) : int(p.offsets[-1])])
        else:
            datas.append(p.data[: n * (p.width or 0)])
        lengths.append(p.lengths(n))
    return Pieces(np.concatenate(datas), offsets=offsets_from_lengths(np.concatenate(lengths)))


def _take_pieces(pieces: Pieces, order: np.ndarray, n: int) -> Pieces:
    """Pieces reordered: result position ``k`` holds input value ``order[k]``."""
    if pieces.width is not None:
        width = pieces.width
        return Pieces(pieces.data.reshape(n, width)[order].reshape(-1), width=width)
    data, offsets = gather(pieces.data, pieces.starts(n)[order], pieces.lengths(n)[order])
    return Pieces(data, offsets=offsets)


def _list_depth(t: pa.DataType) -> int:
    depth = 0
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t, depth = t.value_type, depth + 1
    return depth


def _as_objects(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out
