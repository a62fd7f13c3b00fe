"""Opening a snapshot in place reads each data file's footer once per machine: the plan's
row-group metadata is cached (tables/parquet/footers), so a second open, or a later version
keeping most files, reads one file instead of every footer, with the same plan. Real tables
written by deltalake, a real deletion vector."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

deltalake = pytest.importorskip("deltalake")
from delta_helpers import add_deletion_vector  # noqa: E402
from deltalake import WriterProperties, write_deltalake  # noqa: E402

from spark_dl_core.tables.delta.snapshot import DeltaSnapshotError  # noqa: E402
from spark_dl_core.tables.delta.table import open_delta  # noqa: E402
from spark_dl_core.tables.parquet import plan as delta_plan  # noqa: E402


def _data(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "emb": pa.array([[float(i)] * 4 for i in ids], pa.list_(pa.float32())),
            "tok": pa.array([list(range(i % 5)) for i in ids], pa.list_(pa.int64())),
        }
    )


@pytest.fixture
def table(tmp_path: Path) -> str:
    path = str(tmp_path / "t")
    props = WriterProperties(max_row_group_size=50)
    config = {"delta.enableDeletionVectors": "true"}
    for k in range(3):
        write_deltalake(
            path,
            _data(k * 120, 120),
            mode="append",
            writer_properties=props,
            configuration=config if k == 0 else None,
        )
    add_deletion_vector(path, [0, 7, 60])
    return path


def _open(path: str, plans: Path, **kwargs: Any) -> Any:
    before = delta_plan.footers_read
    ds = open_delta(path, **kwargs).dataset(cache=False, plan_cache=str(plans))
    return ds, delta_plan.footers_read - before


def _plan(ds: Any) -> tuple[Any, ...]:
    order = next(iter(ds.iter_batches(64, shuffle=True, seed=5)))["id"]
    return ds.fingerprint, ds._groups, ds.forms, ds._leaf_values, np.asarray(order).tolist()


def test_second_open_and_later_version_read_only_new_footers(table: str, tmp_path: Path) -> None:
    plans = tmp_path / "plans"
    files = len(open_delta(table).files)
    cold, read = _open(table, plans)
    assert read == files and (plans / "plan.arrow").exists()
    warm, read = _open(table, plans)
    assert read == 0  # every footer from the cache
    uncached = open_delta(table).dataset(cache=False, plan_cache=False)
    assert _plan(warm) == _plan(cold) == _plan(uncached)
    assert cold.forms["emb"] == ("dense", (4,)) and cold.forms["tok"][0] == "jagged"
    write_deltalake(table, _data(1000, 80), mode="append")
    later, read = _open(table, plans)
    assert read == 1 and len(later) == len(cold) + 80
    assert _plan(later) == _plan(open_delta(table).dataset(cache=False, plan_cache=False))
    older, read = _open(table, plans, version=3)  # the earlier version: all cached
    assert read == 0 and _plan(older) == _plan(cold)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped"])
def test_damaged_cache_is_ignored_and_rebuilt(table: str, tmp_path: Path, damage: str) -> None:
    plans = tmp_path / "plans"
    cold, _ = _open(table, plans)
    cache = plans / "plan.arrow"
    data = bytearray(cache.read_bytes())
    if damage == "garbage":
        data = bytearray(b"x" * len(data))
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 3] ^= 0x20
    cache.write_bytes(bytes(data))
    again, read = _open(table, plans)
    assert read == len(open_delta(table).files) and _plan(again) == _plan(cold)
    assert _open(table, plans)[1] == 0  # rewritten whole


def test_file_changed_in_place_is_not_read_from_the_cache(table: str, tmp_path: Path) -> None:
    """A data file rewritten outside Delta with the same size (so the log's size check
    passes): its cached footer is not used, the damaged footer is refused naming it."""
    plans = tmp_path / "plans"
    _open(table, plans)
    snap = open_delta(table)
    victim = Path(snap.files[0])
    data = bytearray(victim.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    data[-8 - footer : -8] = b"\xff" * footer
    victim.write_bytes(bytes(data))
    with pytest.raises(DeltaSnapshotError, match=victim.name):
        _open(table, plans)


def _varied(start: int, n: int) -> pa.Table:
    """Lists with nulls and empty lists, strings and a nullable column: the statistics and
    row groups a scanned footer must read as pyarrow does."""
    ids = np.arange(start, start + n)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "emb": pa.array([[float(i)] * 3 for i in ids], pa.list_(pa.float32())),
            "tok": pa.array(
                [None if i % 7 == 0 else list(range(i % 4)) for i in ids], pa.list_(pa.int32())
            ),
            "name": pa.array([f"n{i}" if i % 5 else None for i in ids], pa.string()),
        }
    )


def test_footers_of_one_layout_are_parsed_once_and_scanned_alike(tmp_path: Path) -> None:
    """A cold open parsed every footer with pyarrow (~100 µs each: minutes at 10⁵ files);
    footers sharing their bytes but the row groups are now scanned, with pyarrow's numbers."""
    from pyarrow.fs import LocalFileSystem

    from spark_dl_core.tables.parquet.footer import leaf_levels, parse_footer, read_footer
    from spark_dl_core.tables.parquet.footer_scan import split_top
    from spark_dl_core.tables.parquet.footers import Summaries, summarize

    path = str(tmp_path / "t")
    for k in range(12):  # one footer layout, row groups and statistics of every kind
        props = WriterProperties(max_row_group_size=[16, 40, 1000][k % 3])
        write_deltalake(path, _varied(k * 90, 90), mode="append", writer_properties=props)
    before = delta_plan.footers_parsed
    ds, read = _open(path, tmp_path / "plans")
    assert read == 12 and delta_plan.footers_parsed - before < 6
    reference, _ = _open(path, tmp_path / "p2")  # read again, compared below footer by footer
    summaries = Summaries()
    layouts, parsed = set(), 0
    for uri in open_delta(path).files:
        footer = read_footer(LocalFileSystem(), uri.removeprefix("file://"))
        start, end = split_top(footer) or (0, 0)
        layouts.add((footer[:start], footer[end:]))  # the table's first write names list
        scanned = summaries.scanned(footer)  # elements otherwise than its appends
        parsed += scanned is None
        meta = parse_footer(footer)
        want = summarize(meta, leaf_levels(meta))
        got = scanned if scanned is not None else summaries.learn(footer, meta, leaf_levels(meta))
        assert got.schema.equals(want.schema, check_metadata=True)
        for key in ("rows", "raw_bytes", "stored_bytes"):
            assert getattr(got, key).tolist() == getattr(want, key).tolist()
        assert {k: v.tolist() for k, v in got.leaves.items()} == {
            k: v.tolist() for k, v in want.leaves.items()
        }
    assert parsed == len(layouts) < 12
    facts = ("fingerprint", "_groups", "forms", "_leaf_values")
    assert [getattr(ds, k) for k in facts] == [getattr(reference, k) for k in facts]


def test_damaged_row_groups_of_a_scanned_footer_are_refused_at_open(tmp_path: Path) -> None:
    """A footer scanned (not parsed) whose row group lacks a required field, or whose
    column chunk's type is not the schema's, goes to pyarrow's path: refused naming it."""
    path = str(tmp_path / "t")
    for k in range(3):
        write_deltalake(path, _varied(k * 10, 10), mode="append")
    snap = open_delta(path)
    victim = Path(snap.files[-1].removeprefix("file://"))
    data = bytearray(victim.read_bytes())
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    at = data.index(b"\x15\x04\x19\x35", footer)  # ColumnMetaData: type INT64, encodings...
    data[at + 1] = 0x0C  # ... typed FLOAT (the id column's schema says INT64)
    victim.write_bytes(bytes(data))
    with pytest.raises(DeltaSnapshotError, match=f"{victim.name}.*damaged Parquet footer"):
        open_delta(path).dataset(cache=False, plan_cache=False)
