"""Spark's side of an MDS read: shards grouped into input partitions, each task decoding its
shards to Arrow batches of bounded size, with the spec's read-time ops (as the core's
``to_arrow``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    InputPartition,
)
from pyspark.sql.types import StructField, StructType

from spark_dl_core import open_dataset
from spark_dl_core.errors import DatasetError, SpecError
from spark_dl_core.ops.arrow import arrow_schema, batch_to_arrow

from .mds_options import (
    CATALOG_KEYS,
    PARTITION_BYTES,
    READ_BATCH_BYTES,
    READ_BATCH_ROWS,
    SHARD_OPEN_BYTES,
    _path,
    _storage_options,
    bool_option,
    int_option,
    version_option,
)
from .types import conform, spark_arrow_schema, to_spark_schema


class ShardGroup(InputPartition):
    """A read partition: some consecutive shards, named so a changed dataset is noticed."""

    def __init__(self, shards: list[int], basenames: list[str]) -> None:
        super().__init__(shards)
        self.shards = shards
        self.basenames = basenames


class MDSReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.path = _path(options)
        self.storage_options = _storage_options(options)
        # unset: shards grouped by bytes (:func:`plan_groups`); set: that many per partition
        self.shards_per_partition = (
            int_option(options, "shards_per_partition", 1, 1, 1 << 20)
            if "shards_per_partition" in options
            else None
        )
        # unset: each shard checked once (the core's default); true: every hash; false: none
        self.verify = bool_option(options, "verify_hashes") if "verify_hashes" in options else None
        self.allow_unsafe = bool_option(options, "allow_unsafe")
        self.version = version_option(options)  # a followed table's version (None: latest)
        self.columns, self.names = _asked_columns(self.path, self._open(), schema)
        self.nullable = [f.nullable for f in schema.fields]

    def _open(self) -> Any:
        return open_dataset(
            self.path,
            allow_unsafe=self.allow_unsafe,
            storage_options=self.storage_options,
            version=self.version,
        )

    def partitions(self) -> Sequence[InputPartition]:
        ds = self._open()
        n = ds.num_shards
        step = self.shards_per_partition
        if step is None:
            sizes = [ds.shards[i].raw_data.bytes for i in range(n)]
            groups = plan_groups(sizes, os.cpu_count() or 1)
        else:
            groups = [list(range(i, min(n, i + step))) for i in range(0, n, step)]
        return [ShardGroup(g, [ds.shards[i].stored.basename for i in g]) for g in groups] or [
            ShardGroup([], [])
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ShardGroup)
        if not partition.shards:
            return
        ds = self._open()
        names = [ds.shards[i].stored.basename for i in partition.shards]
        if names != partition.basenames:
            raise DatasetError(f"{self.path} changed while it was being read; read it again")
        schema = spark_arrow_schema(arrow_schema(ds, self.columns))
        if self.names is not None:  # the asked schema's spelling of each name
            schema = pa.schema(
                [
                    f.with_name(n).with_nullable(null)
                    for f, n, null in zip(schema, self.names, self.nullable)
                ]
            )
        stored = None
        if self.columns is not None:
            masks = {p.name: p.null_mask for p in ds.plans or [] if p.null_mask}
            stored = [*self.columns, *(masks[c] for c in self.columns if c in masks)]
        for i in partition.shards:
            data = ds.load_shard(i, verify_hashes=self.verify)
            n = ds.shards[i].samples
            step = batch_rows(ds.shards[i].raw_data.bytes, n)
            for start in range(0, n, step):
                index = np.arange(start, min(n, start + step))
                decoded = ds.decode(data, index, columns=stored)
                batch = batch_to_arrow(ds, decoded, columns=self.columns)
                if self.names is not None:
                    batch = batch.rename_columns(self.names)
                yield conform(batch, schema)


def plan_groups(sizes: Sequence[int], cores: int) -> list[list[int]]:
    """Consecutive shards (by their decoded ``sizes``) grouped into input partitions as
    Spark splits files: groups of up to ``PARTITION_BYTES``, each shard also counting
    ``SHARD_OPEN_BYTES``, and smaller groups when the dataset is small so each of ``cores``
    gets work. One task per shard paid a task (and a Python batch stream) per small shard;
    one task per dataset left cores idle. Consecutive, so partitions keep the stored order."""
    total = sum(size + SHARD_OPEN_BYTES for size in sizes)
    target = min(PARTITION_BYTES, max(SHARD_OPEN_BYTES, total // max(1, cores)))
    groups: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i, size in enumerate(sizes):
        if current and filled + size > target:
            groups.append(current)
            current, filled = [], 0
        current.append(i)
        filled += size + SHARD_OPEN_BYTES
    return [*groups, current] if current else groups


def batch_rows(shard_bytes: int, samples: int) -> int:
    """Rows per yielded Arrow batch for a shard: about ``READ_BATCH_BYTES`` of its decoded
    bytes, within ``READ_BATCH_ROWS`` (Spark pays per batch; memory grows per byte)."""
    low, high = READ_BATCH_ROWS
    per_row = max(1, shard_bytes // max(1, samples))
    return max(low, min(high, READ_BATCH_BYTES // per_row))


def _asked_columns(
    path: str, ds: Any, asked: StructType
) -> tuple[list[str] | None, list[str] | None]:
    """The stored columns a user-given read schema (``.schema("id long")``) selects, and its
    spelling of their names; ``(None, None)`` for the dataset's own schema. A column the
    dataset lacks, or a type other than the stored one, is refused naming it."""
    full = to_spark_schema(arrow_schema(ds))
    if [(f.name, f.dataType) for f in asked.fields] == [(f.name, f.dataType) for f in full]:
        return None, None
    by_name = {f.name: f for f in full.fields}
    by_lower = {f.name.lower(): f for f in full.fields}
    columns = []
    for f in asked.fields:
        stored = by_name.get(f.name) or by_lower.get(f.name.lower())
        if stored is None:
            raise SpecError(
                f"{path}: the read schema asks for column {f.name!r}, which the dataset "
                f"does not have (columns: {full.names})"
            )
        if stored.dataType.simpleString() != f.dataType.simpleString():
            raise SpecError(
                f"{path}: the read schema gives column {f.name!r} type "
                f"{f.dataType.simpleString()}, the dataset stores "
                f"{stored.dataType.simpleString()}: leave .schema() out or use that type"
            )
        columns.append(stored.name)
    return columns, [f.name for f in asked.fields]


TABLE_OPTIONS_KEY = "spark_dl.table_options"  # field metadata carrying a catalog table's options


def _with_table_options(schema: StructType, options: Mapping[str, str]) -> StructType:
    """``schema`` with a catalog table's read options (path included, ``storage.*`` keys
    left out: they may be secrets) in its first field's metadata. Spark stores the schema
    in the catalog and hands it to every later reader, but passes those readers no options
    at all, so this is how a ``CREATE TABLE t USING mds LOCATION '…'`` table finds its data."""
    if not schema.fields:
        return schema
    kept = {
        k.lower(): v
        for k, v in options.items()
        if k.lower() not in CATALOG_KEYS and not k.lower().startswith("storage.")
    }
    kept["path"] = _path(options)
    first = schema.fields[0]
    meta = {**(first.metadata or {}), TABLE_OPTIONS_KEY: json.dumps(kept, sort_keys=True)}
    fields = [StructField(first.name, first.dataType, first.nullable, meta), *schema.fields[1:]]
    return StructType(fields)


def _unprefixed(options: Mapping[str, str]) -> dict[str, str]:
    """Options with keys lowercased and a catalog table's ``option.`` prefix (how Spark
    hands over ``CREATE TABLE … OPTIONS (…)``) taken off."""
    out = {k.lower(): v for k, v in options.items()}
    if "provider" in out:
        for key in [k for k in out if k.startswith("option.")]:
            out.setdefault(key[len("option.") :], out.pop(key))
    return out


def _reader_options(options: Mapping[str, str], schema: StructType) -> dict[str, str]:
    """The options a reader runs with: its own, or (a catalog table's read, which gets
    none) those its table's schema carries (see :func:`_with_table_options`)."""
    if options or not schema.fields:
        return dict(options)
    carried = (schema.fields[0].metadata or {}).get(TABLE_OPTIONS_KEY)
    return dict(json.loads(carried)) if carried else {}
