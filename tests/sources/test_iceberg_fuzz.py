"""Damaged Iceberg tables (bench/fuzz.py ``--iceberg``): every corruption of a metadata
file, a manifest list, a manifest, a position or equality delete file or a data file ends
in the pristine rows or an IcebergSnapshotError naming the table, the snapshot and the
file; never other rows, an untyped exception, a crash or a hang. The fixes the fuzz asked
for each have a case here on a real PyIceberg table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyiceberg")
from delta_helpers import fuzz_bench

from spark_dl_core.tables.iceberg.errors import IcebergSnapshotError
from spark_dl_core.tables.iceberg.table import open_iceberg

fuzz = fuzz_bench()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """ice-pos (partitioned, position deletes, a column added) and ice-eq (equality
    deletes), each with its pin (metadata file, snapshot) and a byte copy beside it."""
    return fuzz.build_iceberg_tables(tmp_path_factory.mktemp("ice"))  # type: ignore[no-any-return]


def _open(table: Path) -> Any:
    """The pinned snapshot planned from its manifests (no cached plan: they are damaged)."""
    pin = fuzz.pin_of(str(table))
    return open_iceberg(pin["metadata"], snapshot_id=pin["snapshot_id"], plan_cache=False)


def _files(table: Path, pattern: str) -> list[Path]:
    return sorted(table.glob(pattern))


@pytest.mark.parametrize("which", ["manifest", "manifest list"])
def test_a_damaged_manifest_is_named(pristine: dict[str, Path], which: str) -> None:
    table = pristine["ice-pos"]
    snap = _open(table)
    pattern = "metadata/*-m*.avro" if which == "manifest" else "metadata/snap-*.avro"
    for victim in _files(table, pattern):
        rel = victim.relative_to(table).as_posix()
        with fuzz.mutated_in_place(table, rel, b"Obj\x01 not avro"):
            try:
                _open(table)
            except IcebergSnapshotError as exc:
                assert f"snapshot {snap.version}" in str(exc)
                assert f"{which} " in str(exc) and victim.name in str(exc), str(exc)
                return
    pytest.fail(f"no {which} of the current snapshot refused")


def test_corrupted_iceberg_tables_end_in_the_rows_or_a_typed_error(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A few dozen cases (bench/fuzz.py --iceberg) over both tables, read pinned by the
    export, in place and through write_mds; an error must name the table and the file."""
    scratch = tmp_path_factory.mktemp("fuzz-iceberg")
    counts, bad = fuzz.run(60, seed=5, jobs=2, batch=30, timeout=90, scratch=scratch, iceberg=True)
    assert sum(counts.values()) == 60
    assert not bad, [(r["outcome"], r["file"], r["kind"], r["detail"]) for r in bad[:5]]
    assert counts["typed_unnamed"] == 0
    assert counts["same"] > 5 and counts["typed"] > 20


def test_two_fields_given_one_id_are_refused(pristine: dict[str, Path]) -> None:
    """A metadata file whose schema gives two columns one field id (found by the fuzz: an
    untyped IndexError on the export) is refused naming the table, the snapshot and both."""
    table = pristine["ice-eq"]
    pin = fuzz.pin_of(str(table))
    meta = Path(pin["metadata"][len("file://") :])
    doc = json.loads(meta.read_text())
    schema = next(s for s in doc["schemas"] if s["schema-id"] == doc["current-schema-id"])
    ids = {f["name"]: f["id"] for f in schema["fields"]}
    for f in schema["fields"]:
        if f["name"] == "name":
            f["id"] = ids["part"]
    rel = meta.relative_to(table).as_posix()
    damaged = json.dumps(doc).encode()
    with fuzz.mutated_in_place(table, rel, damaged), pytest.raises(IcebergSnapshotError) as err:
        _open(table)
    text = str(err.value)
    assert meta.name in text and f"snapshot {pin['snapshot_id']}" in text
    assert f"field id {ids['part']}" in text and "'name'" in text and "'part'" in text


@pytest.mark.parametrize("position", [-1, 1 << 40])
def test_a_position_delete_outside_its_data_file_is_refused(
    pristine: dict[str, Path], position: int
) -> None:
    """A position-delete file naming a row before the first or past the last of its data
    file: a negative one deleted a row counted from the end (other rows, silently), a huge
    one sized the keep-mask by it (found by the fuzz: a 128 GiB allocation). Refused,
    naming the delete file and the data file."""
    table = pristine["ice-pos"]
    snap = _open(table)
    victim = _files(table, "data/delete-*.parquet")[0]
    rows = pq.read_table(victim)
    pos = rows["pos"].to_pylist()
    pos[0] = position
    buf = pa.BufferOutputStream()
    pq.write_table(rows.set_column(1, rows.schema.field(1), pa.array(pos, pa.int64())), buf)
    rel = victim.relative_to(table).as_posix()
    damaged = buf.getvalue().to_pybytes()
    with fuzz.mutated_in_place(table, rel, damaged), pytest.raises(IcebergSnapshotError) as err:
        _open(table)
    text = str(err.value)
    assert f"snapshot {snap.version}" in text and victim.name in text
    assert f"deletes row {position} of data file" in text and rows["file_path"][0].as_py() in text


def test_a_missing_data_file_names_the_manifest_listing_it(pristine: dict[str, Path]) -> None:
    """A data file that is not there (removed, or its path damaged in the manifest: found
    by the fuzz, where the error named only the path the damaged manifest gave) names the
    manifest that lists it."""
    table = pristine["ice-pos"]
    snap = _open(table)
    victim = Path(snap.files[0][len("file://") :])
    gone = fuzz.mutated_in_place(table, victim.relative_to(table).as_posix(), None)
    expected = pytest.raises(IcebergSnapshotError, match=r"is missing \(listed in manifest ")
    with gone, expected as err:
        _open(table)
    assert victim.name in str(err.value) and "-m0.avro" in str(err.value)


def test_an_unreadable_metadata_file_names_the_snapshot_asked(pristine: dict[str, Path]) -> None:
    table = pristine["ice-pos"]
    pin = fuzz.pin_of(str(table))
    meta = Path(pin["metadata"][len("file://") :])
    damaged = fuzz.mutated_in_place(table, meta.relative_to(table).as_posix(), b"{")
    expected = pytest.raises(IcebergSnapshotError, match="metadata file cannot be read")
    with damaged, expected as err:
        _open(table)
    assert meta.name in str(err.value) and f"at snapshot {pin['snapshot_id']}" in str(err.value)


def test_a_field_id_above_the_last_column_id_is_refused(pristine: dict[str, Path]) -> None:
    """A column whose id a damaged metadata file changed to one no column was given (above
    ``last-column-id``) matched no file's column and read as nulls, as an added column
    would (found by the fuzz: other rows, silently). Refused, naming it."""
    table = pristine["ice-eq"]
    pin = fuzz.pin_of(str(table))
    meta = Path(pin["metadata"][len("file://") :])
    doc = json.loads(meta.read_text())
    schema = next(s for s in doc["schemas"] if s["schema-id"] == doc["current-schema-id"])
    next(f for f in schema["fields"] if f["name"] == "name")["id"] = 2**40
    damaged = fuzz.mutated_in_place(
        table, meta.relative_to(table).as_posix(), json.dumps(doc).encode()
    )
    with damaged, pytest.raises(IcebergSnapshotError) as err:
        _open(table)
    text = str(err.value)
    assert meta.name in text and f"snapshot {pin['snapshot_id']}" in text
    assert f"field id {2**40} (last-column-id {doc['last-column-id']}) to 'name'" in text


def test_a_manifest_cut_at_a_block_boundary_is_refused(pristine: dict[str, Path]) -> None:
    """A manifest cut after its header (at an Avro block boundary) still parses, as no
    entries: its files' rows, or its deletes, were dropped silently (found by the fuzz:
    an equality delete lost, rows it deleted served). Its entries are checked against the
    manifest list's counts, and a short one is refused naming it."""
    table = pristine["ice-eq"]
    pin = fuzz.pin_of(str(table))
    refused = []
    for victim in _files(table, "metadata/*-m*.avro"):
        data = victim.read_bytes()
        header = data.index(data[-16:]) + 16  # the sync marker ends the header and each block
        with fuzz.mutated_in_place(table, victim.relative_to(table).as_posix(), data[:header]):
            try:
                _open(table)
            except IcebergSnapshotError as exc:
                assert victim.name in str(exc) and "entries, its manifest list counts" in str(exc)
                assert f"snapshot {pin['snapshot_id']}" in str(exc)
                refused.append(victim.name)
    assert len(refused) >= 3  # the current snapshot's: data, position and equality deletes


def test_manifest_entries_are_counted_as_decoded_once(pristine: dict[str, Path]) -> None:
    """A manifest's entries are counted as the planner decodes them (every manifest read
    once), equal to its manifest list's counts; a manifest cut inside a block is refused,
    naming it."""
    from pyiceberg.io.pyarrow import PyArrowFileIO
    from pyiceberg.manifest import read_manifest_list

    from spark_dl_core.tables.iceberg.deletes import manifest_entries

    table = pristine["ice-eq"]
    pin = fuzz.pin_of(str(table))
    io = PyArrowFileIO()
    listed = next(
        v for v in _files(table, "metadata/snap-*.avro") if str(pin["snapshot_id"]) in v.name
    )
    manifests = list(read_manifest_list(io.new_input(str(listed))))
    assert manifests
    for manifest in manifests:
        counted = manifest.added_files_count + manifest.existing_files_count
        counted += manifest.deleted_files_count
        assert len(manifest_entries(io, manifest)) == counted > 0
    victim = Path(manifests[0].manifest_path.removeprefix("file://"))  # the current snapshot's
    data = victim.read_bytes()
    rel = victim.relative_to(table).as_posix()
    with fuzz.mutated_in_place(table, rel, data[:-20]), pytest.raises(IcebergSnapshotError) as err:
        _open(table)
    assert victim.name in str(err.value) and f"snapshot {pin['snapshot_id']}" in str(err.value)


def test_a_manifest_list_cut_at_a_block_boundary_is_refused(pristine: dict[str, Path]) -> None:
    """A manifest list cut after its header still parses, as no manifests: every data file's
    rows would be dropped silently (the fuzz's last open finding; the list counts nothing to
    check it by). The planned data files and records are checked against the snapshot
    summary's totals, and the short list is refused, naming the table and snapshot."""
    table = pristine["ice-pos"]
    pin = fuzz.pin_of(str(table))
    victim = next(
        v for v in _files(table, "metadata/snap-*.avro") if str(pin["snapshot_id"]) in v.name
    )
    data = victim.read_bytes()
    header = data.index(data[-16:]) + 16  # the sync marker ends the header and each block
    rel = victim.relative_to(table).as_posix()
    with (
        fuzz.mutated_in_place(table, rel, data[:header]),
        pytest.raises(IcebergSnapshotError) as err,
    ):
        _open(table)
    said = str(err.value)
    assert f"snapshot {pin['snapshot_id']}" in said and "total-data-files=0" in said, said
    assert len(_open(table)) > 0  # restored, the table reads again


def test_a_garbled_data_file_path_is_refused_naming_it(pristine: dict[str, Path]) -> None:
    """A path a damaged manifest garbles (a NUL byte in it) raised an untyped ValueError
    from os.stat (the fuzz, seed 4 case 2509); it is refused naming the file."""
    from spark_dl_core.tables.iceberg.snapshot import _stat_files

    snap = _open(pristine["ice-pos"])
    snap.files = [snap.files[0] + "\x00garbled"]
    with pytest.raises(IcebergSnapshotError, match=r"garbled.*cannot be read: ValueError"):
        _stat_files(snap, lambda uri: "")
