"""Opening a snapshot in place reads each data file's footer once per machine: the plan's
row-group metadata is cached (sources/delta_footers), so a second open, or a later version
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

from spark_dl_core.sources import delta_inplace  # noqa: E402
from spark_dl_core.sources.delta import DeltaSnapshotError, open_delta  # noqa: E402


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
    before = delta_inplace.footers_read
    ds = open_delta(path, **kwargs).dataset(cache=False, plan_cache=str(plans))
    return ds, delta_inplace.footers_read - before


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
