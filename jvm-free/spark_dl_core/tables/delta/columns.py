"""Delta column mapping (``name`` and ``id`` modes): a data file's physical columns read back
as the table's logical columns.

With column mapping a Parquet file names its columns (and nested struct fields) by physical
names such as ``col-5f42…`` and carries each one's id as the Parquet ``field_id``; the log's
schema gives each logical field its ``delta.columnMapping.physicalName`` and
``delta.columnMapping.id``. A rename changes only the logical name, a drop removes the field
from the schema (the file keeps the physical column, which is then ignored), a column added
later gets a new physical name and a higher id. Resolution follows Delta's PROTOCOL.md
("Reader Requirements for Column Mapping"): ``name`` mode by physical name, ``id`` mode by
Parquet field id (a file without field ids is refused). The protocol returns nulls for a
column a file lacks; this reader does so only when the column may have been added after the
file was written. Ids only grow (``delta.columnMapping.maxColumnId``), so a file holding an id
above the missing column's was written when that column existed: that file is refused naming
the column, as a file that does not match its table (never read as nulls).

The interface is narrow: :func:`mapping_of` at open, :func:`file_columns` per data file
(which columns to read, and how to turn them into logical columns), :meth:`ColumnMapping.
identity` for fingerprints and cache keys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

MODE_KEY = "delta.columnMapping.mode"
PHYSICAL_KEY = "delta.columnMapping.physicalName"
ID_KEY = "delta.columnMapping.id"
FIELD_ID_KEY = b"PARQUET:field_id"
MODES = ("none", "name", "id")

Fail = Callable[[str], Exception]


@dataclass(frozen=True)
class ColumnMapping:
    """A table's mapping: its mode and its schema with the log's field metadata."""

    mode: str  # "name" or "id"
    mapped: pa.Schema  # logical names, metadata carrying physical names and ids

    @property
    def logical(self) -> pa.Schema:
        """The table's schema as readers see it: logical names, no mapping metadata."""
        return pa.schema([_strip(f) for f in self.mapped])

    def physical_name(self, name: str) -> str:
        """A top-level column's physical name (partition values are keyed by it)."""
        return _physical(self.mapped.field(name))

    def identity(self, names: list[str]) -> list[Any]:
        """The columns ``names``' fields' (logical path, physical name, id), nested ones
        included: what decides which stored column a logical column reads, so fingerprints
        and cache keys change with it (a column dropped and added again under the same name
        and type is another column)."""
        fields = [self.mapped.field(n) for n in names]
        return [[self.mode, path, _physical(f), _mapping_id(f)] for path, f in _walk(fields)]

    def physical_schema(self, names: list[str]) -> pa.Schema:
        """``names`` as the files store them (physical names at every level)."""
        return pa.schema([_renamed(self.mapped.field(n)) for n in names])


def mapping_of(mode: str | None, schema: pa.Schema, fail: Fail) -> ColumnMapping | None:
    """The mapping of a table whose ``delta.columnMapping.mode`` is ``mode`` (None: none).

    ``fail(message)`` builds the error for a mode or schema this reader cannot follow."""
    mode = mode or "none"
    if mode not in MODES:
        raise fail(f"uses column mapping mode {mode!r}, which is not one of {list(MODES)}")
    if mode == "none":
        return None
    if mode == "id":
        lacking = [path for path, f in _walk(list(schema)) if _mapping_id(f) is None]
        if lacking:
            raise fail(f"uses column mapping mode 'id' but column(s) {lacking} have no {ID_KEY}")
    return ColumnMapping(mode, schema)


@dataclass
class FileColumns:
    """How one data file's columns read as logical ones: ``read`` (the file's top-level
    columns to read) and :meth:`logical` (a table of them, with logical names and types)."""

    read: list[str]
    names: list[str] = field(default_factory=list)  # the logical name of each ``read``
    _convert: list[Callable[[pa.Array], pa.Array]] = field(default_factory=list)

    def logical(self, table: pa.Table) -> pa.Table:
        """``table`` (read with :attr:`read`) under logical names; absent columns stay absent
        (the caller fills them with nulls, as for columns added after the file)."""
        if not self._convert:
            return table
        columns = []
        for i, convert in enumerate(self._convert):
            column = table.column(i)
            chunks = column.chunks or [pa.array([], type=column.type)]
            columns.append(pa.chunked_array([convert(c) for c in chunks]))
        return pa.Table.from_arrays(columns, names=self.names)


def file_columns(
    mapping: ColumnMapping | None, file_schema: pa.Schema, names: list[str], fail: Fail
) -> FileColumns:
    """Which of a file's columns hold the logical columns ``names``, and how to read them.

    Without mapping: the names the file has. With it: resolved by physical name or field id;
    a missing column is left out (nulls) when it may be newer than the file, else
    ``fail(message)`` is raised naming it."""
    if mapping is None:
        present = [n for n in names if n in set(file_schema.names)]
        return FileColumns(present, list(present))
    resolver = _Resolver(mapping.mode, file_schema, fail)
    out = FileColumns([], [], [])
    for name in names:
        wanted = mapping.mapped.field(name)
        at = resolver.find(list(file_schema), wanted, name)
        if at is not None:
            found = file_schema.field(at)
            out.read.append(found.name)
            out.names.append(name)
            out._convert.append(resolver.converter(found, wanted, name))
    return out


class _Resolver:
    """Resolution of logical fields in one file: by physical name or by field id."""

    def __init__(self, mode: str, file_schema: pa.Schema, fail: Fail) -> None:
        self.mode = mode
        self.fail = fail
        ids = [i for f in _every_field(list(file_schema)) if (i := _field_id(f)) is not None]
        if mode == "id" and not ids:
            raise fail(
                "has no Parquet field ids, which column mapping mode 'id' resolves columns by"
            )
        self.newest = max(ids, default=-1)  # the highest id this file holds

    def find(self, candidates: list[pa.Field], wanted: pa.Field, path: str) -> int | None:
        """The index of the file field holding ``wanted``; None when it may have been added
        after the file was written."""
        for i, f in enumerate(candidates):
            if self._matches(f, wanted):
                return i
        wanted_id = _mapping_id(wanted)
        if wanted_id is not None and wanted_id < self.newest:
            how = f"field id {wanted_id}" if self.mode == "id" else f"'{_physical(wanted)}'"
            raise self.fail(
                f"has no column for {path!r} (column mapping {self.mode!r}: {how}), though it "
                f"holds field id {self.newest}, assigned after that column: the file does "
                "not match the table's schema"
            )
        return None

    def _matches(self, f: pa.Field, wanted: pa.Field) -> bool:
        if self.mode == "id":
            return _field_id(f) == _mapping_id(wanted)
        return f.name == _physical(wanted)

    def converter(self, stored: pa.Field, wanted: pa.Field, path: str) -> Any:
        """A function turning arrays of ``stored`` into arrays of ``wanted``'s logical type."""
        if not _has_struct(wanted.type):
            return _same
        return lambda array: self._convert(array, stored.type, wanted.type, path)

    def _convert(
        self, array: pa.Array, stored: pa.DataType, wanted: pa.DataType, path: str
    ) -> pa.Array:
        """``array`` (of the file's type ``stored``) as the logical type ``wanted``."""
        if pa.types.is_struct(wanted) and pa.types.is_struct(stored):
            return self._struct(array, stored, wanted, path)
        if _is_list(wanted) and _is_list(stored):
            values = self._convert(array.values, stored.value_type, wanted.value_type, path)
            kind = pa.large_list if pa.types.is_large_list(wanted) else pa.list_
            typ = kind(_strip(wanted.value_field).with_type(values.type))
            return type(array).from_arrays(array.offsets, values, type=typ, mask=_nulls(array))
        if pa.types.is_map(wanted) and pa.types.is_map(stored):
            keys = self._convert(array.keys, stored.key_type, wanted.key_type, path)
            items = self._convert(array.items, stored.item_type, wanted.item_type, path)
            typ = pa.map_(keys.type, items.type)
            return pa.MapArray.from_arrays(array.offsets, keys, items, type=typ, mask=_nulls(array))
        return array

    def _struct(
        self, array: pa.Array, stored: pa.DataType, wanted: pa.DataType, path: str
    ) -> pa.Array:
        stored_fields = [stored.field(i) for i in range(stored.num_fields)]
        children, fields = [], []
        for i in range(wanted.num_fields):
            child = wanted.field(i)
            where = f"{path}.{child.name}"
            at = self.find(stored_fields, child, where)
            if at is None:  # added to the struct after this file was written
                value = pa.nulls(len(array), type=_strip(child).type)
            else:
                value = self._convert(array.field(at), stored_fields[at].type, child.type, where)
            children.append(value)
            fields.append(_strip(child).with_type(value.type))
        return pa.StructArray.from_arrays(children, fields=fields, mask=_nulls(array))


def _same(array: pa.Array) -> pa.Array:
    return array


def _nulls(array: pa.Array) -> pa.Array | None:
    return array.is_null() if array.null_count else None


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _has_struct(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return True
    if _is_list(t):
        return _has_struct(t.value_type)
    if pa.types.is_map(t):
        return _has_struct(t.key_type) or _has_struct(t.item_type)
    return False


def _children(t: pa.DataType) -> list[pa.Field]:
    """The fields directly under a nested type (a list's element, a map's key and value)."""
    if pa.types.is_struct(t):
        return [t.field(i) for i in range(t.num_fields)]
    if _is_list(t):
        return [t.value_field]
    if pa.types.is_map(t):
        return [t.key_field, t.item_field]
    return []


def _named(t: pa.DataType) -> list[pa.Field]:
    """The struct fields nested in ``t``, through lists and maps (whose elements, keys and
    values have no name of their own in a Delta schema)."""
    if pa.types.is_struct(t):
        return _children(t)
    return [f for child in _children(t) for f in _named(child.type)]


def _walk(fields: list[pa.Field], prefix: str = "") -> Iterator[tuple[str, pa.Field]]:
    """Every named field (columns, struct fields at any depth) with its dotted path."""
    for f in fields:
        path = f"{prefix}{f.name}"
        yield path, f
        yield from _walk(_named(f.type), path + ".")


def _every_field(fields: list[pa.Field]) -> Iterator[pa.Field]:
    """Every field of a file's schema, list elements and map entries included."""
    for f in fields:
        yield f
        yield from _every_field(_children(f.type))


def _meta(f: pa.Field, key: str) -> str | None:
    value = (f.metadata or {}).get(key.encode())
    return None if value is None else value.decode()


def _physical(f: pa.Field) -> str:
    """A field's physical name; its display name when the log gives none (as Delta does)."""
    return _meta(f, PHYSICAL_KEY) or f.name


def _mapping_id(f: pa.Field) -> int | None:
    value = _meta(f, ID_KEY)
    return None if value is None else int(value)


def _field_id(f: pa.Field) -> int | None:
    value = (f.metadata or {}).get(FIELD_ID_KEY)
    return None if value is None else int(value)


def _strip(f: pa.Field) -> pa.Field:
    """``f`` without column-mapping metadata, at every level."""
    meta = {k: v for k, v in (f.metadata or {}).items() if not k.startswith(b"delta.columnMapping")}
    return pa.field(f.name, _map_type(f.type, _strip), f.nullable, meta or None)


def _renamed(f: pa.Field) -> pa.Field:
    """``f`` under its physical names, at every level (no mapping metadata)."""
    return pa.field(_physical(f), _map_type(f.type, _renamed), f.nullable)


def _map_type(t: pa.DataType, each: Callable[[pa.Field], pa.Field]) -> pa.DataType:
    if pa.types.is_struct(t):
        return pa.struct([each(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_large_list(t):
        return pa.large_list(_element(t.value_field, each))
    if pa.types.is_list(t):
        return pa.list_(_element(t.value_field, each))
    if pa.types.is_map(t):
        key, item = t.key_field, t.item_field
        return pa.map_(_element(key, each), _element(item, each), keys_sorted=t.keys_sorted)
    return t


def _element(f: pa.Field, each: Callable[[pa.Field], pa.Field]) -> pa.Field:
    """A list element / map key or value: its name kept, its type mapped."""
    return pa.field(f.name, _map_type(f.type, each), f.nullable)


def names_agree(mapping: ColumnMapping, file_schema: pa.Schema) -> bool:
    """True when resolving the file's columns by physical name finds what resolving them by
    field id finds (always in ``name`` mode): an engine reading by name reads it right."""
    if mapping.mode != "id":
        return True
    physical = {_mapping_id(f): _physical(f) for _, f in _walk(list(mapping.mapped))}
    return all(
        physical[i] == f.name
        for f in _every_field(list(file_schema))
        if (i := _field_id(f)) is not None and i in physical
    )
