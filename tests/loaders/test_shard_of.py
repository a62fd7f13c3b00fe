"""Sample id -> shard by the reader's bucket table: the binary search's answer for every
shard layout a dataset can have (empty shards, a tiny last shard, one shard, uneven sizes)."""

from __future__ import annotations

import numpy as np
import pytest

from spark_dl_core.loaders.reader import ShardOf


def _offsets(sizes: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def test_bucket_table_gives_the_binary_search_answer_for_any_shard_sizes() -> None:
    rng = np.random.default_rng(0)
    tables = 0
    for _ in range(2000):
        sizes = rng.integers(0, int(rng.choice([3, 50, 5000, 200_000])), int(rng.integers(1, 40)))
        if rng.random() < 0.3:
            sizes[-1] = rng.integers(0, 3)  # a dataset's short last shard
        offsets = _offsets(sizes)
        if offsets[-1] == 0:
            continue
        ids = rng.integers(0, offsets[-1], 1000).astype(np.int64)
        lookup = ShardOf(offsets)
        tables += lookup.table is not None
        want = np.searchsorted(offsets, ids, side="right") - 1
        np.testing.assert_array_equal(lookup(ids), want)
    assert tables > 1000  # most layouts take the table, not the fallback


def test_uneven_shards_fall_back_to_the_binary_search() -> None:
    offsets = _offsets(np.array([1_000_000] + [1] * 50 + [1_000_000]))
    lookup = ShardOf(offsets)
    assert lookup.table is None  # 50 shard starts inside one bucket
    ids = np.array([0, 999_999, 1_000_000, 1_000_025, 1_000_050, 2_000_049])
    np.testing.assert_array_equal(lookup(ids), np.searchsorted(offsets, ids, "right") - 1)


def test_an_id_past_the_last_sample_is_refused_not_mapped() -> None:
    lookup = ShardOf(_offsets(np.array([4096, 4096, 100])))
    assert lookup.table is not None
    with pytest.raises(IndexError):
        lookup(np.array([1 << 20], dtype=np.int64))


def test_a_batch_plan_gives_each_ids_shard_and_the_distinct_shards_in_one_pass() -> None:
    """``ShardOf.plan`` (the C pass the reader plans each batch with, or numpy without the
    extension): the binary search's shard per id and the sorted distinct shards, for
    table and fallback layouts alike, and its marks left clear for the next batch."""
    from spark_dl_core.loaders import reader

    rng = np.random.default_rng(1)
    fallback = _offsets(np.array([1_000_000] + [1] * 50 + [1_000_000]))
    layouts = [fallback] + [
        _offsets(rng.integers(1, int(rng.choice([3, 50, 5000])), int(rng.integers(1, 40))))
        for _ in range(300)
    ]
    for offsets in layouts:
        lookup = ShardOf(offsets)
        for size in (1, 7, 3000):
            ids = rng.integers(0, offsets[-1], size).astype(np.int64)
            want = np.searchsorted(offsets, ids, side="right") - 1
            got, needs = lookup.plan(ids)
            assert got.dtype == np.int32
            np.testing.assert_array_equal(got, want)
            assert needs == np.unique(want).tolist()
    assert reader._shards_of is not None  # the C pass ran (make install builds it)
    assert lookup._seen is not None and not lookup._seen.any()


@pytest.mark.parametrize("bad", [-1, 8292, 1 << 40])
def test_a_batch_plan_refuses_an_id_outside_the_dataset_naming_it(bad: int) -> None:
    lookup = ShardOf(_offsets(np.array([4096, 4096, 100])))
    with pytest.raises(IndexError, match=str(bad)):
        lookup.plan(np.array([5, bad, 7], dtype=np.int64))
    got, needs = lookup.plan(np.array([5, 4100], dtype=np.int64))  # the marks were cleared
    assert got.tolist() == [0, 1] and needs == [0, 1]
