"""Damaged Delta tables end in a DeltaSnapshotError naming the table, the version and the
file, on both read paths (the export: ``to_arrow`` / ``write_mds``; in place: ``dataset()``
/ ``iter_batches``), before any row is served. Tables written by deltalake, deletion
vectors (on-disk and inline) committed as delta-spark writes them (bench/fuzz.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deltalake")
from delta_helpers import fuzz_bench
from deltalake import write_deltalake

from spark_dl_core import SpecError
from spark_dl_core.tables.delta.snapshot import DeltaSnapshotError
from spark_dl_core.tables.delta.table import open_delta

fuzz = fuzz_bench()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """delta-dv (DVs on-disk and inline, JSON log) and delta-ckpt (checkpointed)."""
    return fuzz.build_delta_tables(tmp_path_factory.mktemp("bad"))  # type: ignore[no-any-return]


@pytest.fixture
def table(pristine: dict[str, Path], tmp_path: Path) -> Path:
    copy = tmp_path / "t"
    shutil.copytree(pristine["delta-dv"], copy)
    return copy


def _export(path: Path) -> None:
    open_delta(str(path)).to_arrow()


def _in_place(path: Path) -> None:
    list(open_delta(str(path)).dataset(cache=False).iter_batches(16, shuffle=True, seed=1))


PATHS = pytest.mark.parametrize("read", [_export, _in_place], ids=["export", "in_place"])


def _refused(read: Callable[[Path], None], path: Path, *words: str) -> str:
    with pytest.raises(DeltaSnapshotError) as err:
        read(path)
    text = str(err.value)
    for w in (str(path), *words):
        assert w in text, text
    return text


def _data_file(path: Path, k: int = 0) -> Path:
    return sorted(path.rglob("part-*.parquet"))[k]


def _dv_file(path: Path) -> Path:
    return next(path.glob("deletion_vector_*.bin"))


@PATHS
def test_version_that_does_not_exist_or_was_vacuumed(read: Any, table: Path) -> None:
    snap = open_delta(str(table))
    victim = Path(snap.files[0])
    victim.unlink()  # a vacuum after the snapshot was pinned
    with pytest.raises(DeltaSnapshotError, match=rf"version 3.*{victim.name}.*missing"):
        snap.to_arrow() if read is _export else snap.dataset(cache=False)
    with pytest.raises(DeltaSnapshotError, match=r"version 7.*no such version.*0\.\.3"):
        open_delta(str(table), version=7)


@pytest.mark.parametrize("bad", ["yesterday", "2024-13-01", [2024], True])
def test_timestamp_that_is_no_point_in_time_is_refused_naming_it(table: Path, bad: Any) -> None:
    """It was blamed on the log ('its log cannot be read: Invalid isoformat string')."""
    with pytest.raises(
        SpecError,
        match=r"open_delta\(.*\): timestamp=.* is not a point in "
        r"time; give a datetime.*ISO 8601.*milliseconds since the epoch",
    ):
        open_delta(table, timestamp=bad)
    assert open_delta(table, timestamp="2999-01-01").version == open_delta(table).version


@PATHS
@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_truncated_or_replaced_data_file(read: Any, table: Path, damage: str) -> None:
    """The export took a non-Parquet file for a missing one, or raised ArrowInvalid."""
    victim = _data_file(table)
    data = victim.read_bytes()
    new = {"truncate": data[: len(data) // 2], "garbage": b"x" * len(data), "empty": b""}
    victim.write_bytes(new[damage])
    words = ["version 3", victim.name]
    _refused(read, table, *words, *(["bytes"] if damage != "garbage" else []))


@PATHS
def test_data_file_damaged_after_open(read: Any, table: Path) -> None:
    """The size check is at open: a file replaced later is refused when read."""
    snap = open_delta(str(table))
    victim = Path(snap.files[1])
    victim.write_bytes(b"\0" * victim.stat().st_size)
    with pytest.raises(DeltaSnapshotError, match=rf"version 3.*{victim.name}.*cannot be read"):
        snap.to_arrow() if read is _export else list(snap.dataset(cache=False).iter_batches(8))


@PATHS
def test_parquet_footer_that_does_not_parse(read: Any, table: Path) -> None:
    victim = _data_file(table)
    data = bytearray(victim.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    data[-8 - footer : -8] = b"\xff" * footer  # same size: the add action's check passes
    victim.write_bytes(bytes(data))
    _refused(read, table, "version 3", victim.name)


def _varint(n: int) -> bytes:
    """``n`` as a Thrift compact-protocol i32/i64 (zigzag, then a varint)."""
    z, out = n << 1, b""
    while z >= 0x80:
        out, z = out + bytes([z & 0x7F | 0x80]), z >> 7
    return out + bytes([z])


def _footer_edit(victim: Path, old: bytes, new: bytes) -> None:
    """Replace ``old`` in the file's bytes (same size, in the footer only)."""
    data = victim.read_bytes()
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    assert data.count(old) == data[footer:].count(old) >= 1 and len(old) == len(new)
    victim.write_bytes(data.replace(old, new))


@PATHS
def test_parquet_head_magic_damaged(read: Any, table: Path) -> None:
    """pyarrow reads a Parquet file from its footer and never checks the leading PAR1: a
    file whose head was overwritten (its pages likely too) was read as if whole."""
    victim = _data_file(table)
    data = bytearray(victim.read_bytes())
    data[3] = ord("=")
    victim.write_bytes(bytes(data))
    _refused(read, table, "version 3", victim.name, "PAR1")


@PATHS
def test_footer_size_statistics_disagree_with_schema(read: Any, table: Path) -> None:
    """The id column's repetition flipped OPTIONAL -> REQUIRED in the footer: its definition
    level histogram (2 counts) no longer fits the schema (1). pyarrow's Python metadata
    accessor (row_group(g).column(c)) ended the process ("terminate called") in place."""
    victim = _data_file(table)
    # SchemaElement: repetition_type (field 3, i32 1 = OPTIONAL) then name (field 4) "id"
    _footer_edit(victim, b"\x25\x02\x18\x02id", b"\x25\x00\x18\x02id")
    _refused(read, table, "version 3", victim.name)
    if read is _in_place:
        _refused(read, table, "histogram")


@PATHS
def test_footer_column_chunk_type_not_the_schemas(read: Any, table: Path) -> None:
    """The list column's leaf chunk typed INT64 in the footer (its schema says FLOAT):
    pyarrow's statistics accessor, which the in-place open reads for list columns, ended the
    process (found by the fuzz). The export reads the pages by the schema's type."""
    import re

    victim = _data_file(table)
    data = victim.read_bytes()
    # ColumnMetaData: type (field 1, i32 4 = FLOAT), encodings, path_in_schema vec.list.element
    chunk = re.compile(rb"\x1c\x15\x08(\x19[^\x19]{1,8}\x19\x38\x03vec)")
    assert chunk.search(data)
    expected = open_delta(str(table)).to_arrow()
    victim.write_bytes(chunk.sub(lambda m: b"\x1c\x15\x04" + m.group(1), data))
    if read is _in_place:
        _refused(read, table, "version 3", victim.name, "physical type")
    else:
        assert open_delta(str(table)).to_arrow().equals(expected)


@PATHS
def test_footer_row_count_disagrees_with_pages(read: Any, table: Path) -> None:
    """A row group's num_rows raised by 2 in the footer: the pages hold 16 rows. In place,
    the deletion-vector mask (sized by the footer) failed with a bare ArrowInvalid "Filter
    inputs must all be the same length"; the export reads the pages' rows (right data)."""
    import pyarrow.parquet as pq

    victim = _data_file(table)
    rg = pq.read_metadata(victim).row_group(0)
    head = b"\x16" + _varint(rg.total_byte_size) + b"\x16"  # RowGroup fields 2 and 3
    _footer_edit(victim, head + _varint(rg.num_rows), head + _varint(rg.num_rows + 2))
    if read is _in_place:
        _refused(read, table, "version 3", victim.name, "row group 0", "16 rows", "says 18")
    else:
        assert open_delta(str(table)).to_arrow().num_rows == 112


@PATHS
def test_footer_column_name_not_utf8(read: Any, table: Path) -> None:
    """The export's ParquetFile open raised a bare UnicodeDecodeError."""
    victim = _data_file(table)
    _footer_edit(victim, b"\x18\x04name", b"\x18\x04n\xeame")
    _refused(read, table, "version 3", victim.name)


@PATHS
def test_string_page_with_invalid_utf8(read: Any, table: Path) -> None:
    """An uncompressed page's text bytes flipped: Parquet readers do not check UTF-8; the
    decode did, later, with a bare UnicodeDecodeError (or served the bytes)."""
    victim = _data_file(table, 2)
    data = victim.read_bytes()
    at = data.index(b"row ")  # a plain-encoded value of the name column
    victim.write_bytes(data[:at] + b"\xff\xfe" + data[at + 2 :])
    _refused(read, table, "version 3", victim.name, "invalid")


@PATHS
def test_on_disk_deletion_vector_corrupt(read: Any, table: Path) -> None:
    """A flipped bitmap byte fails its CRC-32 in delta-rs: that DeltaError was untyped."""
    dv = _dv_file(table)
    data = bytearray(dv.read_bytes())
    data[20] ^= 0x40
    dv.write_bytes(bytes(data))
    _refused(read, table, "version 3", "deletion vector", dv.name)


@PATHS
def test_on_disk_deletion_vector_missing(read: Any, table: Path) -> None:
    dv = _dv_file(table)
    dv.unlink()
    _refused(read, table, "version 3", "deletion vector", dv.name)


@PATHS
def test_inline_deletion_vector_past_the_file(read: Any, table: Path) -> None:
    """A vector deleting row 1000 of a 20-row file (not the file the log wrote) whose stats
    claim 2000 rows (delta-rs checks the vector against numRecords only): the reader
    applied its first rows and ignored the rest."""
    commit = table / "_delta_log" / f"{3:020}.json"
    lines = commit.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if '"storageType": "i"' in line)
    action = json.loads(lines[at])
    action["add"]["deletionVector"] = fuzz.inline_dv([1, 1000])
    action["add"]["stats"] = json.dumps({"numRecords": 2000})
    lines[at] = json.dumps(action)
    commit.write_text("\n".join(lines) + "\n")
    name = action["add"]["path"].rsplit("/", 1)[-1]
    _refused(read, table, "version 3", name, "deletion vector deletes rows past")


def _set_inline_dv(table: Path, dv: dict[str, Any], stats: bool = True) -> str:
    """Give commit 3's first inline-vector add ``dv``; the data file's name."""
    commit = table / "_delta_log" / f"{3:020}.json"
    lines = commit.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if '"storageType": "i"' in line)
    action = json.loads(lines[at])
    action["add"]["deletionVector"] = dv
    if not stats:
        action["add"].pop("stats")
    lines[at] = json.dumps(action)
    commit.write_text("\n".join(lines) + "\n")
    return str(action["add"]["path"]).rsplit("/", 1)[-1]


@PATHS
@pytest.mark.parametrize("stats", [True, False], ids=["stats", "no_stats"])
def test_inline_deletion_vector_bucket_key_flipped(read: Any, table: Path, stats: bool) -> None:
    """A structurally sound vector whose bucket key became 2^30 (row 2^62): delta-rs sized
    the keep-mask by it before comparing with numRecords and aborted the process
    ("memory allocation of 4611686018427387905 bytes failed")."""
    name = _set_inline_dv(table, fuzz.inline_dv([1, 1 << 62]), stats)
    _refused(read, table, "version 3", name, "00000000000000000003.json", "deletes row")


@PATHS
@pytest.mark.parametrize(
    "damage, why",
    [
        ("magic", "magic"),
        ("buckets", "bucket count"),
        ("cookie", "cookie"),
        ("card", "runs past"),
        ("order", "not increasing"),
        ("cardinality", "cardinality says 5"),
        ("size", "sizeInBytes"),
        ("z85", "alphabet"),
    ],
)
def test_inline_deletion_vector_damaged(read: Any, table: Path, damage: str, why: str) -> None:
    """Inline vectors have no CRC: their structure is checked before delta-rs decodes them
    (magic, bucket count, cookie, a container's count against its bytes, sorted values,
    the descriptor's cardinality and size, the Z85 alphabet)."""
    import base64
    import struct

    blob = bytearray(fuzz.roaring64([1, 2, 19]))
    if damage == "magic":
        blob[0] ^= 1
    elif damage == "buckets":
        blob[4:12] = struct.pack("<q", 1 << 40)
    elif damage == "cookie":
        blob[17] ^= 0x40
    elif damage == "card":  # container 0 says 4 values; 3 are there
        blob[26:28] = struct.pack("<H", 3)
    elif damage == "order":
        blob[-2:] = struct.pack("<H", 0)
    dv = fuzz.inline_dv([1, 2, 19])
    padded = bytes(blob) + b"\0" * (-len(blob) % 4)
    text = base64.b85encode(padded).decode().translate(str.maketrans(fuzz.B85, fuzz.Z85))
    dv["pathOrInlineDv"] = text
    if damage == "cardinality":
        dv["cardinality"] = 5
    elif damage == "size":
        dv["sizeInBytes"] = len(blob) + 9
    elif damage == "z85":
        dv["pathOrInlineDv"] = "~" + text[1:]
    name = _set_inline_dv(table, dv)
    _refused(read, table, "version 3", name, "inline deletion vector", why)


def test_inline_deletion_vector_damaged_in_a_checkpoint(table: Path) -> None:
    """The live vectors of a checkpointed version come from the checkpoint's adds."""
    from deltalake import DeltaTable

    name = _set_inline_dv(table, fuzz.inline_dv([1, 1 << 62]))
    DeltaTable(str(table)).create_checkpoint()
    checkpoint = next(table.glob("_delta_log/*.checkpoint.parquet")).name
    _refused(_export, table, "version 3", name, checkpoint, "deletes row")


@PATHS
def test_remove_action_path_damaged(read: Any, table: Path) -> None:
    """Commit 3 removes each file and adds it back with a deletion vector; a flipped byte in
    a remove's path left the old entry (no vector) live beside the new one: the file's rows
    were read twice, once undeleted (found by bench/fuzz.py)."""
    commit = table / "_delta_log" / f"{3:020}.json"
    lines = commit.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if '"remove"' in line)
    action = json.loads(lines[at])
    path = action["remove"]["path"]
    action["remove"]["path"] = path.replace("part-", "parx-")
    lines[at] = json.dumps(action)
    commit.write_text("\n".join(lines) + "\n")
    _refused(read, table, "version 3", path.rsplit("/", 1)[-1], "live twice")


@PATHS
@pytest.mark.parametrize("damage", ["garbled", "empty", "add_type"])
def test_commit_json_damaged(read: Any, table: Path, damage: str) -> None:
    """delta-rs's DeltaProtocolError / DeltaError were untyped and named no file; an empty
    commit (a torn write) was skipped, its files' rows silently missing."""
    commit = table / "_delta_log" / f"{1:020}.json"
    text = commit.read_text()
    if damage == "garbled":
        text = text.replace('"add"', '"add" "', 1)
    elif damage == "add_type":  # found by bench/fuzz.py: the culprit search itself failed
        text = "\n".join('{"add": 7}' if '"add"' in line else line for line in text.splitlines())
    commit.write_text("" if damage == "empty" else text)
    _refused(read, table, "_delta_log/00000000000000000001.json")


@PATHS
def test_checkpoint_damaged(read: Any, pristine: dict[str, Path], tmp_path: Path) -> None:
    table = tmp_path / "ckpt"
    shutil.copytree(pristine["delta-ckpt"], table)
    checkpoint = next(table.glob("_delta_log/*.checkpoint.parquet"))
    data = checkpoint.read_bytes()
    checkpoint.write_bytes(data[: len(data) // 2])
    _refused(read, table, checkpoint.name)


@PATHS
def test_last_checkpoint_pointing_wrong(
    read: Any, pristine: dict[str, Path], tmp_path: Path
) -> None:
    table = tmp_path / "ckpt"
    shutil.copytree(pristine["delta-ckpt"], table)
    hint = table / "_delta_log" / "_last_checkpoint"
    hint.write_text(json.dumps(dict(json.loads(hint.read_text()), version=1)))
    try:
        read(table)  # delta-rs may find the real checkpoint by listing: the right rows
    except DeltaSnapshotError as exc:
        assert str(table) in str(exc)
    else:
        expected = open_delta(str(pristine["delta-ckpt"])).to_arrow()
        assert open_delta(str(table)).to_arrow().equals(expected)


def test_schema_changed_under_a_resumed_state(tmp_path: Path) -> None:
    """A loader state saved on version M of the in-place dataset, loaded on version N after
    a column was added: refused naming the table and version, before a batch."""
    pytest.importorskip("torch")
    import pyarrow as pa

    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array(range(50), pa.int64())}))
    loader = open_delta(path).to_torch(8, shuffle=True, seed=1)
    next(iter(loader))
    state = loader.state_dict()
    extra = pa.table({"id": pa.array([99], pa.int64()), "label": pa.array(["x"])})
    write_deltalake(path, extra, mode="append", schema_mode="merge")
    later = open_delta(path)
    assert later.version == 1 and "label" in later.output_schema.names
    resumed = later.to_torch(8, shuffle=True, seed=1)
    with pytest.raises(SpecError, match=rf"table '{path}' version 0.*version 1 \(fingerprint"):
        resumed.load_state_dict(state)
        next(iter(resumed))


def test_fuzz_counts_valid_log_changes_unchecked(pristine: dict[str, Path]) -> None:
    """The harness's ``unchecked`` for a commit changed into another valid log (a renamed
    deletionVector key, a changed partition value, a sound inline vector, an unknown
    action), and not for a damaged path (which the reader refuses)."""
    name = "_delta_log/00000000000000000003.json"
    original = (pristine["delta-dv"] / name).read_bytes()
    text = original.decode()

    def changed(old: str, new: str) -> str | None:
        return fuzz.valid_log_change(name, original, text.replace(old, new, 1).encode())

    assert changed('"deletionVector"', '"deletionVecttr"') == "an add lost its deletion vector"
    assert "partition value" in str(changed('{"part": "a"}, "size"', '{"part": "Q"}, "size"'))
    inline = json.loads(next(line for line in text.splitlines() if '"storageType": "i"' in line))
    dv = inline["add"]["deletionVector"]
    sound = fuzz.inline_dv([4, 7, 9])["pathOrInlineDv"]
    assert changed(dv["pathOrInlineDv"], sound) == "an inline vector changed to another sound one"
    assert changed('"removm"', "") is None  # sanity: an unchanged commit is no change
    assert "unknown" in str(changed('"add": {', '"adc": {'))
    assert changed('"path": "part=', '"path": "parx=') is None  # the reader refuses it
