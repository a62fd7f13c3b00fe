"""Iceberg schema evolution by field id: a data file's Parquet columns resolved to the
snapshot schema's columns by their ``PARQUET:field_id``, never by name.

A rename changes only the name in the schema (the file keeps the old one and the id); a
dropped column's id leaves the schema (the file's column is ignored); an added column has a
new id that older files lack: it reads as nulls, as the Iceberg spec says; a promoted type
(int to long, float to double, a wider decimal) is cast when the row group is finished. A
nested column is read only when its nested field ids are the table's, in the same places:
a struct whose fields were added, dropped or moved is refused naming the column (never read
wrong). A file without field ids (imported, read through a name mapping) is refused, and so
is a file that lacks an identity-partitioned column (its value would be in the metadata).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

FIELD_ID = b"PARQUET:field_id"
Fail = Callable[[str], Exception]


def field_id(f: pa.Field) -> int | None:
    raw = (f.metadata or {}).get(FIELD_ID)
    return None if raw is None else int(raw)


def _children(t: pa.DataType) -> list[pa.Field]:
    if pa.types.is_struct(t):
        return [t.field(i) for i in range(t.num_fields)]
    if pa.types.is_map(t):
        return [t.key_field, t.item_field]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return [t.value_field]
    return []


def nested_ids(f: pa.Field) -> list[int | None]:
    """The field ids below ``f`` (struct fields, list elements, map keys and values), in
    pre-order: what a nested column must agree on to be read as the table's."""

    def walk(t: pa.DataType) -> Iterator[int | None]:
        for child in _children(t):
            yield field_id(child)
            yield from walk(child.type)

    return list(walk(f.type))


def duplicate_id(schema: pa.Schema, last_id: int) -> tuple[int, list[str]] | None:
    """A field id that two fields of ``schema`` share (at any level) and their names, or
    one outside 1..``last_id`` (the table's last-column-id) and its name, or None: a damaged
    schema, whose files' columns could not be told apart (or found) by id."""
    seen: dict[int, str] = {}

    def walk(fields: list[pa.Field], prefix: str) -> tuple[int, list[str]] | None:
        for f in fields:
            name = f"{prefix}{f.name}"
            i = field_id(f)
            if i is not None and not 0 < i <= last_id:
                return i, [name]
            if i is not None and i in seen:
                return i, [seen[i], name]
            if i is not None:
                seen[i] = name
            found = walk(_children(f.type), f"{name}.")
            if found:
                return found
        return None

    return walk(list(schema), "")


@dataclass(frozen=True)
class FieldIds:
    """The snapshot schema's field ids (its Arrow form with ``PARQUET:field_id``s): the
    column mapping the Parquet layer resolves files with (:meth:`identity` goes into the
    fingerprint, so a column dropped and added again under its name is another column)."""

    schema: pa.Schema  # logical names, field ids in the metadata at every level

    def identity(self, names: list[str]) -> list[list[object]]:
        return [
            [n, field_id(self.schema.field(n)), nested_ids(self.schema.field(n))] for n in names
        ]

    def resolve(
        self, file_schema: pa.Schema, names: list[str], identity: set[str], fail: Fail
    ) -> FileColumns:
        """Which file columns hold ``names`` (``identity``: those partitioned by identity,
        which the file must hold); ``fail(message)``: the snapshot's error for this file."""
        by_id = {i: f for f in file_schema if (i := field_id(f)) is not None}
        if not by_id and len(file_schema):
            raise fail(
                "has no Parquet field ids: a file imported without them is read through the "
                "table's name mapping, which this reader does not support"
            )
        out = FileColumns([], [], [])
        for name in names:
            wanted = self.schema.field(name)
            wanted_id = field_id(wanted)
            found = None if wanted_id is None else by_id.get(wanted_id)
            if found is None:
                if name in identity:
                    raise fail(
                        f"does not store column {name!r} (field id {field_id(wanted)}), "
                        "partitioned by identity: reading its value from the manifest is "
                        "not supported"
                    )
                continue  # added after the file was written: nulls
            if nested_ids(found) != nested_ids(wanted):
                raise fail(
                    f"column {name!r} holds nested field ids {nested_ids(found)}, the "
                    f"snapshot's schema {nested_ids(wanted)}: nested schema evolution is not "
                    "supported"
                )
            out.read.append(found.name)
            out.names.append(name)
            out.types.append(wanted.type if _children(wanted.type) else None)
        return out


@dataclass
class FileColumns:
    """One file's columns to read (``read``), their logical names (``names``) and, for a
    nested column, the snapshot's type (its nested fields renamed by position: their ids
    agree, their names may not, after a rename)."""

    read: list[str]
    names: list[str] = field(default_factory=list)
    types: list[pa.DataType | None] = field(default_factory=list)

    def logical(self, table: pa.Table) -> pa.Table:
        if not any(t is not None for t in self.types):
            return table if self.read == self.names else table.rename_columns(self.names)
        columns = []
        for i, wanted in enumerate(self.types):
            column = table.column(i)
            if wanted is not None:
                chunks = column.chunks or [pa.array([], type=column.type)]
                column = pa.chunked_array([_renamed(c, wanted) for c in chunks])
            columns.append(column)
        return pa.Table.from_arrays(columns, names=self.names)


def _renamed(array: pa.Array, wanted: pa.DataType) -> pa.Array:
    """``array`` with the nested field names of ``wanted`` (same shape, same field ids);
    leaf types are left to the cast that follows (promotions)."""
    nulls = array.is_null() if array.null_count else None
    if pa.types.is_struct(wanted) and pa.types.is_struct(array.type):
        children = [
            _renamed(array.field(i), wanted.field(i).type) for i in range(wanted.num_fields)
        ]
        fields = [wanted.field(i).with_type(c.type) for i, c in enumerate(children)]
        return pa.StructArray.from_arrays(children, fields=fields, mask=nulls)
    if _is_list(wanted) and _is_list(array.type):
        values = _renamed(array.values, wanted.value_type)
        typ = pa.list_(wanted.value_field.with_type(values.type))
        return pa.ListArray.from_arrays(array.offsets, values, type=typ, mask=nulls)
    if pa.types.is_map(wanted) and pa.types.is_map(array.type):
        keys = _renamed(array.keys, wanted.key_type)
        items = _renamed(array.items, wanted.item_type)
        typ = pa.map_(
            wanted.key_field.with_type(keys.type), wanted.item_field.with_type(items.type)
        )
        return pa.MapArray.from_arrays(array.offsets, keys, items, type=typ, mask=nulls)
    return array


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))
