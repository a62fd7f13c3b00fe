"""The Iceberg face: :func:`open_iceberg` pins a snapshot of an Iceberg table (by catalog
and name, a PyIceberg table, or a metadata file) and hands it what the modules built on the
snapshot give (:class:`~.snapshot.IcebergKind`): its dataset read in place
(:class:`~.in_place.IcebergDataset`, the same row groups as shards, caches, orders and resume
as a Delta snapshot read in place), a dataset following the table, and runs carried on
across snapshots. Nothing is installed into another module: this module is above all of them
and names them."""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ...errors import SpecError
from ...store.cache import default_cache_dir
from ..parquet.remote import fsspec_options
from ..parquet.table_files import first_line as first_line_of
from . import deletes
from .carry import IcebergCarrier
from .columns import FieldIds, duplicate_id
from .errors import IcebergSnapshotError, import_pyiceberg, timestamp_ms
from .follow import update_mds
from .in_place import IcebergDataset
from .snapshot import IcebergKind, IcebergSnapshot, cached_plans, check_filter, plan_snapshot


def open_iceberg(
    table: Any,
    *,
    catalog: Any = None,
    catalog_properties: dict[str, str] | None = None,
    snapshot_id: int | None = None,
    timestamp: Any = None,
    ref: str | None = None,
    columns: Sequence[str] | None = None,
    filter: Any = None,
    since: int | None = None,
    storage_options: dict[str, Any] | None = None,
    plan_cache: bool | str = True,
) -> IcebergSnapshot:
    """Pin a snapshot of an Iceberg table, read in place (no export, no JVM).

    ``table``: a PyIceberg ``Table``; a metadata file (``…/metadata/00003-….metadata.json``);
    or a table name (``"db.events"``) in ``catalog`` (a PyIceberg catalog, or a catalog name
    that ``pyiceberg.catalog.load_catalog`` opens with ``catalog_properties``). At most one
    of ``snapshot_id=``, ``timestamp=`` (the last snapshot at or before it: a datetime,
    ISO string or epoch milliseconds) and ``ref=`` (a branch or tag); none: the current
    snapshot *now*, kept after new commits land. ``columns=``: the columns read;
    ``filter=``: a pyarrow compute expression applied after deletes. ``since=M`` (a
    snapshot id, an ancestor): only the rows appended after snapshot M and live now; a
    snapshot between them that rewrites data files (an overwrite, a compaction) is refused,
    as its rows cannot be told new from old by their files.

    ``storage_options``: how to reach a table on an object store (``s3://``), as fsspec's
    (``key``, ``secret``, ``client_kwargs={"endpoint_url":…, "region_name":…}``) or
    ``open_delta``'s keys: a metadata file is opened through PyIceberg with the matching
    ``s3.*`` FileIO properties (a catalog keeps its own; without ``storage_options`` its
    ``s3.*`` properties reach the data files too), and data files are read in place through
    the node's span cache, as a Delta table on S3 is.

    ``plan_cache``: keep the snapshot's planned data files (and their deletes) on local
    disk, so the next open of it does not decode its manifests again (:mod:`.plan_cache`;
    a directory, default the in-place read's ``plan_cache``, ``<tmp>/spark-dl-cache/<hash
    of the table URI and "#plan">``; False: plan from the manifests every time).

    Raises :class:`~.errors.IcebergSnapshotError` naming the table and snapshot when it
    cannot be read, :class:`~.errors.UnsupportedIcebergFeatureError` naming the feature
    this reader refuses (non-Parquet data files, a scheme it cannot reach). Position
    deletes, deletion vectors and equality deletes are applied.
    """
    given = {"snapshot_id": snapshot_id, "timestamp": timestamp, "ref": ref}
    pins = [k for k, v in given.items() if v is not None]
    if len(pins) > 1:
        raise SpecError(
            f"open_iceberg: give at most one of snapshot_id=, timestamp=, ref= (got {pins})"
        )
    if filter is not None and not isinstance(filter, pc.Expression):
        raise TypeError(
            f"filter must be a pyarrow.compute.Expression (e.g. pc.field('x') > 3), "
            f"not {type(filter).__name__}"
        )
    loaded, name, catalog_name, identifier = _load(
        table, catalog, catalog_properties, snapshot_id, storage_options
    )
    meta = loaded.metadata
    asked = f"{pins[0]}={given[pins[0]]!r}" if pins else None
    chosen = _pick(loaded, name, snapshot_id, timestamp, ref, asked)
    if meta.format_version > 3:
        raise IcebergSnapshotError(name, f"has format version {meta.format_version}, above 3")
    # The table's schema for its current state and a branch; a snapshot's own for time
    # travel (an id, a timestamp, a tag), as PyIceberg's and Spark's readers do
    branch = ref is not None and str(meta.refs[ref].snapshot_ref_type.value) == "branch"
    travel = chosen is not None and chosen.schema_id is not None and pins and not branch
    schema_id = chosen.schema_id if travel else meta.current_schema_id
    ice_schema = meta.schema_by_id(schema_id) or meta.schema()
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    with_ids = schema_to_pyarrow(ice_schema, include_field_ids=True)
    twice = duplicate_id(with_ids, int(meta.last_column_id))
    if twice is not None:
        fields = " and ".join(repr(n) for n in twice[1])
        where = "to both" if len(twice[1]) > 1 else f"(last-column-id {meta.last_column_id}) to"
        raise IcebergSnapshotError(
            name,
            f"its schema {schema_id} gives field id {twice[0]} {where} {fields} (a damaged "
            "metadata file: columns are matched by id)",
            snapshot=None if chosen is None else chosen.snapshot_id,
        )
    plain = schema_to_pyarrow(ice_schema, include_field_ids=False)
    snap = IcebergSnapshot(
        table_uri=meta.location.rstrip("/"),
        version=0 if chosen is None else int(chosen.snapshot_id),
        files=[],
        schema=pa.schema([f.remove_metadata().with_type(_plain(f.type)) for f in plain]),
        name=name,
        metadata_location=str(loaded.metadata_location),
        schema_id=int(schema_id),
        timestamp=None if chosen is None else _iso(chosen.timestamp_ms),
        sequence_number=None if chosen is None else chosen.sequence_number,
        table_uuid=str(meta.table_uuid),
        catalog=catalog_name,
        identifier=identifier,
        ref=ref,
        projection=list(columns) if columns is not None else None,
        filter=filter,
        column_mapping=FieldIds(with_ids),
        storage_options=storage_options or _fsspec_options(loaded.io.properties),
        kind=ICEBERG,
    )
    if plan_cache:
        own = plan_cache if isinstance(plan_cache, str) else None
        snap.plan_dir = own or default_cache_dir(f"{snap.table_uri}#plan")
    snap.output_schema  # noqa: B018  (a column that does not exist: refused now)
    check_filter(snap)
    old: set[str] = set()
    if since is not None:
        snap.since = int(since)
        old = _files_then(loaded, snap, chosen)
    chosen_id = None if chosen is None else chosen.snapshot_id
    plan_snapshot(loaded, snap, chosen_id, skip=old, plan_dir=snap.plan_dir)
    return snap


ICEBERG = IcebergKind(
    in_place=IcebergDataset, update=update_mds, reopen=open_iceberg, carrier=IcebergCarrier
)


def _files_then(table: Any, snap: IcebergSnapshot, chosen: Any) -> set[str]:
    """The data files of snapshot ``snap.since``, an ancestor of ``chosen`` with nothing
    but appends and deletes between them (a rewrite would carry old rows into new files)."""
    meta = table.metadata
    since = snap.since
    between = []
    at = chosen
    while at is not None and at.snapshot_id != since:
        between.append(at)
        parent = at.parent_snapshot_id
        at = meta.snapshot_by_id(parent) if parent is not None else None
    if at is None:
        raise snap.table_error(
            f"since={since}: not an ancestor of snapshot {snap.version} still in the metadata "
            "(expired, or on another branch)"
        )
    for step in between:
        operation = str(step.summary.operation.value) if step.summary else "?"
        added = int((step.summary or {}).get("added-data-files", "0") or 0)
        if operation != "append" and added:
            raise snap.table_error(
                f"since={since}: snapshot {step.snapshot_id} between them ({operation}) "
                f"rewrites data files, carrying old rows into new files: the rows new since "
                "cannot be told by their files (read the snapshot whole)"
            )
    store = cached_plans(table, at.snapshot_id, snap.plan_dir)
    cached = None if store is None else store.load()
    if cached is not None:
        return set(cached.paths)
    return {t.file.file_path for t in deletes.plan(table, at.snapshot_id).tasks}


def _load(
    table: Any,
    catalog: Any,
    properties: dict[str, str] | None,
    snapshot_id: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> tuple[Any, str, str | None, str | None]:
    """The PyIceberg table, how messages name it, its catalog's name and its identifier
    (an error names the snapshot asked, ``snapshot_id``, where one was); a metadata file is
    opened with the FileIO properties ``storage_options`` give."""
    import_pyiceberg()
    from pyiceberg.table import StaticTable, Table

    if isinstance(table, Table):
        ident = ".".join(table.name())
        cat = getattr(table.catalog, "name", None)
        return table, f"{cat}.{ident}" if cat else ident, cat, ident
    text = os.fspath(table) if isinstance(table, os.PathLike) else str(table)
    if catalog is None:
        if not text.endswith(".json") and not os.path.isfile(text):
            raise SpecError(
                f"open_iceberg({text!r}): give catalog= to open a table by name, or a table's "
                "metadata file (…/metadata/….metadata.json)"
            )
        try:
            io = _io_properties(text, storage_options)
            return StaticTable.from_metadata(text, properties=io), text, None, None
        except Exception as exc:
            why = f"its metadata file cannot be read: {first_line_of(exc)}"
            raise IcebergSnapshotError(text, why, snapshot=snapshot_id) from None
    if isinstance(catalog, str):
        from pyiceberg.catalog import load_catalog

        catalog = load_catalog(catalog, **(properties or {}))
    try:
        loaded = catalog.load_table(text)
    except Exception as exc:
        why = f"cannot be loaded: {first_line_of(exc)}"
        raise IcebergSnapshotError(f"{catalog.name}.{text}", why, snapshot=snapshot_id) from None
    return loaded, f"{catalog.name}.{text}", catalog.name, text


# fsspec's (s3fs's) option for each of PyIceberg's S3 FileIO properties
_S3_PROPERTIES = {
    "s3.access-key-id": "key",
    "s3.secret-access-key": "secret",
    "s3.session-token": "token",
}
_S3_CLIENT_PROPERTIES = {"s3.endpoint": "endpoint_url", "s3.region": "region_name"}


def _io_properties(uri: str, storage_options: dict[str, Any] | None) -> dict[str, str]:
    """PyIceberg FileIO properties reaching ``uri`` as ``storage_options`` do (fsspec's or
    ``open_delta``'s keys, :func:`~..parquet.remote.fsspec_options`): the same endpoint,
    region and credentials for metadata, manifests and delete files as for data files."""
    options = fsspec_options(uri, storage_options)
    if uri.split("://", 1)[0] not in ("s3", "s3a"):
        return {}
    client = dict(options.get("client_kwargs") or {})
    out = {p: options[o] for p, o in _S3_PROPERTIES.items() if options.get(o) is not None}
    out.update({p: client[o] for p, o in _S3_CLIENT_PROPERTIES.items() if client.get(o)})
    return {k: str(v) for k, v in out.items()}


def _fsspec_options(properties: dict[str, str]) -> dict[str, Any] | None:
    """fsspec options from a catalog's S3 FileIO properties (None: it sets none), so the
    data files read in place reach the same endpoint with the same credentials."""
    out: dict[str, Any] = {o: properties[p] for p, o in _S3_PROPERTIES.items() if p in properties}
    client = {o: properties[p] for p, o in _S3_CLIENT_PROPERTIES.items() if p in properties}
    if client:
        out["client_kwargs"] = client
    return out or None


def _pick(
    table: Any,
    name: str,
    snapshot_id: int | None,
    timestamp: Any,
    ref: str | None,
    asked: str | None,
) -> Any:
    """The snapshot asked (None: a table with no snapshot yet)."""
    meta = table.metadata
    if snapshot_id is not None:
        found = meta.snapshot_by_id(int(snapshot_id))
    elif timestamp is not None:
        found = table.snapshot_as_of_timestamp(timestamp_ms(timestamp))
    elif ref is not None:
        found = table.snapshot_by_name(ref)
    else:
        return table.current_snapshot()
    if found is None:
        kept = sorted(s.snapshot_id for s in meta.snapshots)
        refs = sorted(meta.refs)
        raise IcebergSnapshotError(
            name,
            f"has no snapshot for {asked} (expired, or never there); it keeps snapshots {kept} "
            f"and refs {refs}",
        )
    return found


def _plain(t: pa.DataType) -> pa.DataType:
    """``t`` with 32-bit offsets (PyIceberg's schema says large_string, large_list; its
    ``to_arrow`` and the files say string, list): what an export and a mixture expect."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_plain(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct(
            [t.field(i).with_type(_plain(t.field(i).type)) for i in range(t.num_fields)]
        )
    if pa.types.is_map(t):
        return pa.map_(_plain(t.key_type), t.item_field.with_type(_plain(t.item_type)))
    return t


def _iso(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).isoformat(
        timespec="milliseconds"
    )


def reopen_in_place(record: dict[str, Any], storage_options: dict[str, Any] | None) -> Any:
    """An Iceberg snapshot read in place, opened again from what its dataset's
    ``in_place_record()`` recorded (a saved mixture's source)."""
    snap = open_iceberg(
        record["metadata"],
        snapshot_id=record["snapshot_id"],
        since=record.get("since"),
        columns=record.get("projection"),
        storage_options=storage_options,
    )
    return snap.dataset(record.get("spec") or {})
