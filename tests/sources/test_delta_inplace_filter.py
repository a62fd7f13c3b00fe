"""A ``filter=`` read in place: the rows the export keeps, in its order, with ``len()`` known
at open, deterministic and resumable shuffles, typed errors and masks cached per machine.
Real tables written by deltalake (several files, several row groups each, a partition
column) with real deletion vectors committed as delta-spark does."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

deltalake = pytest.importorskip("deltalake")
from delta_helpers import delete_by_dv  # noqa: E402
from deltalake import WriterProperties, write_deltalake  # noqa: E402

from spark_dl_core import SpecError  # noqa: E402
from spark_dl_core.tables.delta.log import DeltaFilterError  # noqa: E402
from spark_dl_core.tables.delta.table import open_delta  # noqa: E402

GROUP = 70  # rows per row group: every file holds several
# a stored column and the partition column: some row groups keep nothing
FILTER = (pc.bit_wise_and(pc.field("id"), 3) != 0) & (
    (pc.field("part") == "a") | (pc.field("id") >= 700)
)


def _data(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "emb": pa.array([[float(i)] * 4 for i in ids], pa.list_(pa.float32())),
            "name": [f"row{i}" for i in ids],
            "part": ["a" if i < 300 or i % 3 else "b" for i in ids],
        }
    )


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Three appends (two partition files each), deletion vectors across files."""
    path = str(tmp_path_factory.mktemp("filtered") / "t")
    props = WriterProperties(max_row_group_size=GROUP)
    for k in range(3):
        write_deltalake(
            path,
            _data(k * 400, 400),
            mode="append",
            partition_by=["part"],
            writer_properties=props,
            configuration={"delta.enableDeletionVectors": "true"} if k == 0 else None,
        )
    delete_by_dv(path, [1, 2, 3, 401, 402, 777, 778, 1001])
    return path


def _ids(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in np.asarray(b["id"])]


def test_rows_and_order_equal_the_export(table: str, tmp_path: Path) -> None:
    snap = open_delta(table, filter=FILTER)
    expected = snap.to_arrow()
    assert snap.has_deletion_vectors and 0 < expected.num_rows < len(open_delta(table))
    ds = snap.dataset(cache_dir=str(tmp_path))
    assert len(ds) == len(snap) == expected.num_rows
    assert _ids(ds.iter_batches(64)) == expected["id"].to_pylist()
    assert ds[5]["name"] == expected["name"][5].as_py()
    assert np.asarray(ds[len(ds) - 1]["emb"]).tolist() == expected["emb"][-1].as_py()
    # row groups the filter (or deletions) empty are no shards
    plain = open_delta(table).dataset(cache=False)
    assert len(snap.files) * 2 <= ds.num_shards < plain.num_shards
    assert snap.lineage()["filter"] == str(FILTER) == ds.lineage["filter"]


def test_projection_and_partition_only_filter(table: str) -> None:
    snap = open_delta(table, columns=["id", "part"], filter=pc.field("part") == "b")
    expected = snap.to_arrow()
    ds = snap.dataset(cache=False)
    assert list(ds.columns) == ["id", "part"] and len(ds) == expected.num_rows > 0
    assert _ids(ds.iter_batches(100)) == expected["id"].to_pylist()
    assert set(pa.Table.from_batches(list(snap.batches()))["part"].to_pylist()) == {"b"}


def test_fingerprint_names_the_filter(table: str) -> None:
    plain = open_delta(table).fingerprint
    one = open_delta(table, filter=FILTER).fingerprint
    other = open_delta(table, filter=pc.field("id") >= 0).fingerprint  # keeps every row
    assert len({plain, one, other}) == 3
    assert open_delta(table, filter=FILTER).fingerprint == one


def test_shuffle_deterministic_and_every_row_once(table: str) -> None:
    snap = open_delta(table, filter=FILTER)
    kw = {"shuffle": True, "seed": 3}
    first = _ids(snap.iter_batches(50, **kw))
    assert first == _ids(open_delta(table, filter=FILTER).iter_batches(50, **kw))
    assert first != snap.to_arrow()["id"].to_pylist()
    assert sorted(first) == sorted(snap.to_arrow()["id"].to_pylist())
    ranks = [
        _ids(snap.iter_batches(50, rank=r, world_size=3, even_batches=False, **kw))
        for r in range(3)
    ]
    assert sorted(i for rank in ranks for i in rank) == sorted(first)


def test_resume_at_another_world_size(table: str) -> None:
    pytest.importorskip("torch")
    snap = open_delta(table, filter=FILTER)
    kw = {"batch_size": 30, "shuffle": True, "seed": 9, "even_batches": False}
    seen, states = [], []
    for r in range(2):
        it = iter(loader := snap.to_torch(rank=r, world_size=2, **kw))
        for _ in range(3):
            seen += [int(i) for i in next(it)["id"]]
        states.append(json.loads(json.dumps(loader.state_dict())))
    assert states[0] == states[1]
    rest = []
    again = open_delta(table, filter=FILTER)  # a fresh open, as a restarted job does
    for r in range(3):
        loader = again.to_torch(rank=r, world_size=3, **kw)
        loader.load_state_dict(states[0])
        rest += [int(i) for b in loader for i in b["id"]]
    counts = Counter(seen + rest)
    assert sorted(counts) == sorted(again.to_arrow()["id"].to_pylist())
    assert set(counts.values()) == {1}
    # a state of the unfiltered snapshot is not this dataset's
    loader = open_delta(table).to_torch(**kw)
    with pytest.raises(SpecError, match="loader state is for dataset"):
        loader.load_state_dict(states[0])
        next(iter(loader))


def test_missing_column_is_a_typed_error_naming_it(table: str) -> None:
    with pytest.raises(DeltaFilterError, match="'nope', which the table does not have") as e:
        open_delta(table, filter=pc.field("nope") > 1)
    assert e.value.column == "nope" and table in str(e.value)
    with pytest.raises(DeltaFilterError, match=r"'name', which columns=.*leaves out"):
        open_delta(table, columns=["id"], filter=pc.field("name") == "row9")
    with pytest.raises(DeltaFilterError, match="cannot be applied"):
        open_delta(table, filter=pc.field("id") + 1)  # not a boolean


def test_filter_matching_nothing_is_an_empty_dataset(table: str) -> None:
    snap = open_delta(table, filter=pc.field("id") < 0)
    ds = snap.dataset(cache=False)
    assert len(ds) == 0 == snap.to_arrow().num_rows and ds.num_shards == 0
    assert list(ds.iter_batches(10)) == []
    assert list(ds.iter_batches(10, shuffle=True, seed=1)) == []


def test_masks_are_cached_per_machine(table: str, tmp_path: Path) -> None:
    first = open_delta(table, filter=FILTER).dataset(cache_dir=str(tmp_path))
    masks = sorted((tmp_path / "filter-masks").glob("*.mds"))
    assert len(masks) == len(first.snapshot.files)
    for path in masks:  # damaged: evaluated again, never read wrong
        path.write_bytes(path.read_bytes()[:-3] + b"xyz")
    again = open_delta(table, filter=FILTER).dataset(cache_dir=str(tmp_path))
    assert again.fingerprint == first.fingerprint and len(again) == len(first)
    assert _ids(again.iter_batches(64)) == _ids(first.iter_batches(64))
    other = open_delta(table, filter=pc.field("id") > 1000).dataset(cache_dir=str(tmp_path))
    assert len(list((tmp_path / "filter-masks").glob("*.mds"))) == 2 * len(masks)
    assert _ids(other.iter_batches(64)) == other.snapshot.to_arrow()["id"].to_pylist()
