"""``df.dl``: write a DataFrame as MDS, or get a cached PyTorch / TensorFlow loader for it.

The accessor is a property on both ``pyspark.sql.DataFrame`` and Spark Connect's DataFrame,
and only uses public DataFrame API, so it behaves the same on both. It sits on top:
``accessor`` → ``converter`` (the cache) → ``datasource`` (the writes), never back.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

from spark_dl_core import DatasetSpec
from spark_dl_core.meta import column_names

from .converter import Converter, as_spec, make_converter, resolve_spec
from .datasource import FORMAT, register_source

SpecLike: TypeAlias = DatasetSpec | dict[str, Any] | None
InPlace: TypeAlias = bool | Literal["auto"]

__all__ = ["DLAccessor", "install_accessor"]


def _given(**settings: Any) -> dict[str, Any]:
    """Loader settings the caller set: ``None`` means "the core loader's default", so a
    setting the core names differently or adds later is never forced on it."""
    return {k: v for k, v in settings.items() if v is not None}


class DLAccessor:
    """``df.dl``: MDS writes and cached loaders for one DataFrame."""

    def __init__(self, df: Any) -> None:
        self._df = df
        self._pinned: Any = None  # see _frame
        self._iceberg: Any = None  # the Iceberg snapshot a plain Iceberg scan reads
        # a session created after ``import spark_dl`` in an environment where Spark cannot
        # discover the source by itself (spark-dl only on a path) still gets it
        register_source(df.sparkSession, force=False)

    def _frame(self) -> Any:
        """The DataFrame written and loaded: a plain delta-spark scan (a catalog table, a
        ``VERSION AS OF``, a ``versionAsOf`` load) as the pinned read of its snapshot
        (:mod:`spark_dl.delta_scan`), so it records its table and version like a
        ``read_delta`` DataFrame; a plain scan of an Iceberg table as the read of the
        snapshot Spark resolved (:mod:`spark_dl.iceberg_scan`); any other DataFrame as it is."""
        if self._pinned is None:
            from .delta_scan import pin_delta_scan

            pinned = pin_delta_scan(self._df)
            if pinned is None:
                from .iceberg_scan import pin_iceberg_scan

                iceberg = pin_iceberg_scan(self._df)
                if iceberg is not None:
                    pinned, self._iceberg = iceberg
            self._pinned = self._df if pinned is None else pinned
        return self._pinned

    def lineage(self) -> dict[str, Any] | None:
        """The table and snapshot this DataFrame reads, as a dataset written from it records
        them: a pinned Delta read (``read_delta``, a delta-spark scan) or a plain Iceberg scan
        (``kind: iceberg``, ``table``, ``snapshot_id``, ``metadata``); None otherwise."""
        frame = self._frame()
        if self._iceberg is not None:
            return dict(self._iceberg.lineage())
        from .delta import lineage_for

        return lineage_for(frame)

    def resolved_spec(self, spec: SpecLike = None, *, infer_shapes: bool = True) -> DatasetSpec:
        """``spec`` with ``json`` for ragged nested arrays, which no inferred encoding can
        store (see :func:`spark_dl.converter.ragged_nested_as_json`)."""
        return resolve_spec(self._df, spec, infer_shapes)

    def write_mds(
        self,
        path: str,
        spec: SpecLike = None,
        *,
        mode: str = "error",
        infer_shapes: bool = True,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        """``df.write.format("mds")`` with the spec as an object; ``mode`` as in Spark."""
        if str(mode).strip().lower() == "update":  # the followed dataset's spec stands:
            given = as_spec(spec).model_dump_json(exclude_unset=True)  # compare what is given
        else:
            resolved = self.resolved_spec(spec, infer_shapes=infer_shapes and mode != "append")
            given = resolved.model_dump_json()
        writer = self._frame().write.format(FORMAT).option("spec", given)
        if self._iceberg is not None:  # Delta's reads are found by the writer itself
            writer = writer.option("source", json.dumps(self._iceberg.lineage(), sort_keys=True))
        for key, value in (storage_options or {}).items():
            writer = writer.option(f"storage.{key}", value)
        writer.mode(mode).save(path)

    def converter(self, spec: SpecLike = None, *, cache_dir: str | None = None) -> Converter:
        """The DataFrame materialized once (cached by plan and spec) as an MDS dataset."""
        return make_converter(self._frame(), as_spec(spec), cache_dir)

    def _loader_source(self, spec: SpecLike, cache_dir: str | None, in_place: InPlace) -> Any:
        """What the loader reads: the pinned Delta version itself (``in_place``, see
        :mod:`spark_dl.delta_inplace`), else the converter's cached MDS copy."""
        if in_place:
            from .delta_inplace import NotInPlaceError, in_place_snapshot
            from .iceberg_scan import iceberg_in_place

            iceberg = iceberg_in_place(self._df)
            if iceberg is not None:
                return iceberg.dataset(as_spec(spec))
            try:
                return in_place_snapshot(self._frame()).dataset(as_spec(spec))
            except NotInPlaceError as exc:
                if in_place is True:
                    raise
                warnings.warn(f"{exc} (in_place='auto': copying)", stacklevel=3)
        return self.converter(spec, cache_dir=cache_dir)

    def to_torch(
        self,
        batch_size: int = 256,
        *,
        shuffle: bool = False,
        seed: int = 0,
        spec: SpecLike = None,
        cache_dir: str | None = None,
        num_workers: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        epoch: int | None = None,
        drop_last: bool = False,
        even_batches: bool | None = None,
        pad_mask: bool | None = None,
        pack: Any = None,
        columns: Sequence[str] | None = None,
        shuffle_window: int | None = None,
        images: str | None = None,
        transforms: Sequence[Any] | None = None,
        device: str | None = None,
        verify_hashes: bool | None = None,
        prefetch_bytes: int | None = None,
        prefetch_factor: int | None = None,
        pin_memory: bool | None = None,
        multiprocessing_context: Any = None,
        progress: bool | None = None,
        in_place: InPlace = False,
    ) -> Any:
        """A PyTorch loader (``IterableDataset``-style, with ``state_dict``) over the
        DataFrame's cached MDS copy; the parameters are the core ``Dataset.to_torch``'s.

        Args:
            batch_size: samples per batch.
            shuffle, seed: the deterministic global shuffle; same seed, same order.
            spec: the ``DatasetSpec`` the cache is written with (part of the cache key).
            cache_dir: where the cache lives (default: Spark conf
                ``spark.spark_dl.cache.dir``, else a temp directory).
            num_workers: torch worker processes.
            rank, world_size: this process's share (default: from ``torch.distributed``).
            epoch: the epoch to start at (each pass then advances it).
            drop_last: drop the last, short batch.
            even_batches: over several ranks, every rank the same number of batches (the
                default), by repeating the epoch's first samples; False: each sample once.
            pad_mask: add a bool ``pad_mask`` column marking those repeats.
            pack: packed token rows instead of samples (``{"column": "tokens",
                "seq_len": 2048}``; see docs/llm.md).
            columns: the columns to load (default: all).
            shuffle_window: shards mixed at a time by the shuffle (memory bound).
            images: how image columns come out (``"bytes"``, ``"uint8"``…).
            transforms: read-time ops applied to each batch (e.g. image decode, resize).
            device: where batches land (``"cuda"``: decode and ops there).
            verify_hashes: check shard hashes as they are read.
            prefetch_bytes, prefetch_factor, pin_memory, multiprocessing_context,
            progress: loader tuning, as in the core.
            in_place: read a ``spark_dl.read_delta`` DataFrame, or a delta-spark one of a
                catalog table or a version (alone, or a select of its columns; see
                :mod:`spark_dl.delta_scan`) from the table's files with no Spark job and no
                copy, as ``open_delta(uri, version).dataset(spec).to_torch`` does; an
                Iceberg table's scan likewise through ``open_iceberg`` at the snapshot Spark
                resolved (:mod:`spark_dl.iceberg_scan`, classic sessions); anything else
                raises ``NotInPlaceError`` saying why (``"auto"``: warns and copies).
                ``cache_dir`` is the copy's: unused in place.
        """
        settings = _given(
            rank=rank,
            world_size=world_size,
            epoch=epoch,
            even_batches=even_batches,
            pad_mask=pad_mask,
            pack=pack,
            columns=column_names(columns),
            shuffle_window=shuffle_window,
            images=images,
            transforms=list(transforms) if transforms is not None else None,
            device=device,
            verify_hashes=verify_hashes,
            prefetch_bytes=prefetch_bytes,
            prefetch_factor=prefetch_factor,
            pin_memory=pin_memory,
            multiprocessing_context=multiprocessing_context,
            progress=progress,
        )
        return self._loader_source(spec, cache_dir, in_place).to_torch(
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            num_workers=num_workers,
            drop_last=drop_last,
            **settings,
        )

    def to_tf(
        self,
        batch_size: int = 256,
        *,
        shuffle: bool = False,
        seed: int = 0,
        spec: SpecLike = None,
        cache_dir: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        epoch: int | None = None,
        drop_last: bool = False,
        even_batches: bool | None = None,
        pad_mask: bool | None = None,
        pack: Any = None,
        columns: Sequence[str] | None = None,
        shuffle_window: int | None = None,
        images: str | None = None,
        transforms: Sequence[Any] | None = None,
        device: str | None = None,
        verify_hashes: bool | None = None,
        prefetch_bytes: int | None = None,
        as_tuple: tuple[list[str], list[str]] | tuple[str, str] | None = None,
        in_place: InPlace = False,
    ) -> Any:
        """A ``tf.data.Dataset`` of batches over the DataFrame's cached MDS copy; the
        parameters are the core ``Dataset.to_tf``'s (see :meth:`to_torch` for the shared
        ones). ``as_tuple=("x", "y")`` yields ``(features, labels)`` pairs for
        ``model.fit``; ``in_place`` as in :meth:`to_torch`."""
        settings = _given(
            rank=rank,
            world_size=world_size,
            epoch=epoch,
            even_batches=even_batches,
            pad_mask=pad_mask,
            pack=pack,
            columns=column_names(columns),
            shuffle_window=shuffle_window,
            images=images,
            transforms=list(transforms) if transforms is not None else None,
            device=device,
            verify_hashes=verify_hashes,
            prefetch_bytes=prefetch_bytes,
            as_tuple=as_tuple,
        )
        return self._loader_source(spec, cache_dir, in_place).to_tf(
            batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, **settings
        )


def _dl(self: Any) -> DLAccessor:
    return DLAccessor(self)


def install_accessor() -> None:
    """Add the ``dl`` property to classic and Spark Connect DataFrames."""
    from pyspark.sql import DataFrame

    DataFrame.dl = property(_dl, doc="spark-dl: MDS writes and cached loaders")  # type: ignore[attr-defined]
    try:
        from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame
    except ImportError:  # Connect's extra dependencies are not installed
        return
    ConnectDataFrame.dl = property(_dl, doc="spark-dl: MDS writes and cached loaders")  # type: ignore[attr-defined]
