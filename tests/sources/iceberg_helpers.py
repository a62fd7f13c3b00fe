"""Iceberg tables for the tests, written by PyIceberg: a SQL catalog over sqlite in a temp
directory, and merge-on-read position deletes, which PyIceberg reads but does not write
(its ``delete`` rewrites files): a Parquet position-delete file committed in a delete
manifest, as Spark and Flink write them."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestWriterV2,
)
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.typedef import Record

FILE_PATH_ID = 2147483546  # the spec's reserved field ids of a position-delete file
POS_ID = 2147483545


def catalog(tmp: Any) -> SqlCatalog:
    where = os.path.join(str(tmp), "warehouse")
    os.makedirs(where, exist_ok=True)
    cat = SqlCatalog("test", uri=f"sqlite:///{where}/catalog.db", warehouse=f"file://{where}")
    cat.create_namespace("db")
    return cat


class _DeleteManifestWriter(ManifestWriterV2):
    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _AddDeletes(_FastAppendFiles):
    """A snapshot adding delete files (in one delete manifest) and nothing else."""

    def __init__(self, deletes: list[DataFile], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._deletes = deletes

    def _manifests(self) -> list[Any]:
        writer = _DeleteManifestWriter(
            self.spec(self._deletes[0].spec_id),
            self.schema(),
            self.new_manifest_output(),
            self._snapshot_id,
            self._compression,
        )
        with writer:
            for delete in self._deletes:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=self._snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=delete,
                    )
                )
        return [writer.to_manifest_file(), *self._existing_manifests()]


def _write(table: Any, location: str, data: pa.Table) -> int:
    """Write a delete file through the table's FileIO (local or S3); its size."""
    with table.io.new_output(location).create(overwrite=True) as out:
        pq.write_table(data, out)
    return len(table.io.new_input(location))


def position_deletes(table: Any, deletes: dict[str, list[int]]) -> None:
    """Commit one position-delete file deleting rows ``deletes[data file path]`` (for data
    files of one partition: the file carries that partition)."""
    paths = sorted(deletes)
    rows = [(p, pos) for p in paths for pos in sorted(deletes[p])]
    schema = pa.schema(
        [
            pa.field("file_path", pa.string(), False, {b"PARQUET:field_id": str(FILE_PATH_ID)}),
            pa.field("pos", pa.int64(), False, {b"PARQUET:field_id": str(POS_ID)}),
        ]
    )
    data = pa.table([[p for p, _ in rows], [r for _, r in rows]], schema=schema)
    location = f"{table.metadata.location}/data/delete-{uuid.uuid4()}.parquet"
    size = _write(table, location, data)
    first = next(t.file for t in table.scan().plan_files() if t.file.file_path == paths[0])
    delete = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=first.partition,
        record_count=len(rows),
        file_size_in_bytes=size,
    )
    delete.spec_id = first.spec_id
    with table.transaction() as tx:
        producer = _AddDeletes([delete], operation=Operation.DELETE, transaction=tx, io=table.io)
        producer.commit()


def equality_deletes(table: Any, rows: pa.Table, partition_of: str | None = None) -> None:
    """Commit one equality-delete file deleting the rows whose columns ``rows.column_names``
    equal one of ``rows`` (as Flink writes them; PyIceberg does not apply them when reading);
    scoped to the partition of data file ``partition_of`` (default: the table's spec, which
    must then be unpartitioned)."""
    schema = table.schema()
    ids = [schema.find_field(name).field_id for name in rows.column_names]
    fields = [
        pa.field(f.name, f.type, True, {b"PARQUET:field_id": str(i)})
        for f, i in zip(rows.schema, ids)
    ]
    location = f"{table.metadata.location}/data/eq-delete-{uuid.uuid4()}.parquet"
    size = _write(table, location, rows.cast(pa.schema(fields)))
    partition, spec_id = Record(), table.metadata.default_spec_id
    if partition_of is not None:
        data = next(t.file for t in table.scan().plan_files() if t.file.file_path == partition_of)
        partition, spec_id = data.partition, data.spec_id
    delete = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=rows.num_rows,
        file_size_in_bytes=size,
        equality_ids=ids,
    )
    delete.spec_id = spec_id
    with table.transaction() as tx:
        _AddDeletes([delete], operation=Operation.DELETE, transaction=tx, io=table.io).commit()
