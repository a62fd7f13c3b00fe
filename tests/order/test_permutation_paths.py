"""The order's window permutation computed by the C extension equals its numpy definition.

Every saved loader state and every pinned batch depends on these values, so the fast path
must be bit-identical to the numpy code, for every range size (odd bit widths, powers of
two and their neighbours, cycle walking) and key.
"""

from __future__ import annotations

import numpy as np
import pytest

from spark_dl_core.order import dataset_order as order

pytestmark = pytest.mark.skipif(order._shuffle is None, reason="built without the C extensions")

SIZES = [1, 2, 3, 4, 5, 7, 8, 9, 255, 256, 257, 1000, 4095, 4096, 4097, 65_537, 500_000]
KEYS = [0, 1, 0x9E3779B97F4A7C15, 2**64 - 1, 12_345_678_901_234]


@pytest.mark.parametrize("n", SIZES)
def test_a_whole_range_matches_numpy(n: int) -> None:
    for key in KEYS:
        fast = order._permute_range(n, np.uint64(key))
        slow = order._permute_range_numpy(n, np.uint64(key))
        assert fast.dtype == slow.dtype == np.int64
        np.testing.assert_array_equal(fast, slow)
        assert np.array_equal(np.sort(fast), np.arange(n))  # a permutation of the range


def test_positions_with_their_own_ranges_and_keys_match_numpy() -> None:
    rng = np.random.default_rng(7)
    sizes = rng.choice(np.array(SIZES, dtype=np.uint64), 20_000)
    keys = rng.integers(0, 2**63, 20_000, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    positions = (rng.random(20_000) * sizes).astype(np.uint64)
    fast = order.window_permute(positions, sizes, keys)
    slow = order._window_permute_numpy(positions.copy(), sizes, keys)
    np.testing.assert_array_equal(fast, slow)


def test_a_position_past_its_range_is_refused() -> None:
    with pytest.raises(ValueError, match="past its range"):
        order.window_permute(np.array([5]), np.array([5], np.uint64), np.array([1], np.uint64))


@pytest.mark.parametrize(("sizes", "bases"), [([7, 1, 300, 64], None), ([5] * 9, [100] * 9)])
def test_window_ids_in_one_pass_match_the_search_and_gathers(
    sizes: list[int], bases: list[int] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every window's ids by ``runs_to_ids`` (in place, one pass) equal the numpy search
    and gathers, for shards of unequal sizes and mixtures' per-source bases."""

    def all_windows() -> list[np.ndarray]:
        starts = None if bases is None else np.cumsum([10_000, *bases[:-1]]).astype(np.int64)
        o = order.GlobalOrder(np.array(sizes), "fp", 3, 1, True, window=2, bases=starts)
        return [o._window_ids(w).copy() for w in range(len(o.window_bounds) - 1)]

    fast = all_windows()
    monkeypatch.delattr(order._shuffle, "runs_to_ids")
    slow = all_windows()
    for a, b in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_position_outside_the_runs_is_refused() -> None:
    bounds, shifts = np.array([0, 4, 9], np.int64), np.array([10, 20], np.int64)
    values = np.array([0, 3, 4, 8], np.int64)
    order._shuffle.runs_to_ids(values, bounds, shifts)
    assert values.tolist() == [10, 13, 24, 28]
    with pytest.raises(ValueError, match="outside the runs"):
        order._shuffle.runs_to_ids(np.array([9], np.int64), bounds, shifts)


@pytest.mark.parametrize("n", [1, 2, 9, 257, 4097, 65_537])
def test_a_span_of_a_range_is_that_slice_of_the_whole_range(n: int) -> None:
    """What a DataLoader worker computes of a window (its spans) equals the same slice of
    the window's whole order, in C and in numpy."""
    rng = np.random.default_rng(n)
    for key in KEYS:
        whole = order._permute_range_numpy(n, np.uint64(key))
        for start, stop in [(0, n), (0, 1), (n - 1, n), *rng.integers(0, n + 1, (6, 2)).tolist()]:
            start, stop = int(min(start, stop)), int(max(start, stop))
            span = order._permute_span(start, stop - start, n, np.uint64(key))
            np.testing.assert_array_equal(span, whole[start:stop])
            slow = order.window_permute(np.arange(start, stop), np.int64(n), np.uint64(key))
            np.testing.assert_array_equal(slow, whole[start:stop])
    with pytest.raises(ValueError, match="passes the range's end"):
        order._shuffle.permute_span(np.empty(3, np.int64), n - 1, n, 1)


@pytest.mark.parametrize("window", [1, 2, 3])
def test_a_sparse_take_equals_the_dense_order(window: int) -> None:
    """A reader of part of each window (``take(..., dense=False)``: a DataLoader worker)
    gets the ids the whole windows give, over ranges across window and shard boundaries."""
    rng = np.random.default_rng(window)
    sizes = rng.integers(0, 700, 11)
    o = order.GlobalOrder(sizes, "fp", 5, 2, True, window=window)
    dense = o.take(0, o.total, True)
    assert sorted(dense.tolist()) == list(range(o.total))
    fresh = order.GlobalOrder(sizes, "fp", 5, 2, True, window=window)
    for start, stop in [(0, o.total), *rng.integers(0, o.total + 1, (40, 2)).tolist()]:
        start, stop = min(start, stop), max(start, stop)
        np.testing.assert_array_equal(fresh.take(start, stop, False), dense[start:stop])
    assert not fresh.__dict__.get("_dense")  # no window computed whole


def test_a_span_without_the_c_extension_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = order._permute_span(100, 900, 4097, np.uint64(KEYS[2]))
    monkeypatch.setattr(order, "_shuffle", None)
    np.testing.assert_array_equal(order._permute_span(100, 900, 4097, np.uint64(KEYS[2])), fast)


def test_a_window_job_inherited_from_a_parent_process_is_not_waited_for() -> None:
    """A forked DataLoader worker inherits the order with the parent's window job, whose
    thread it does not have: the job never finishes there, so the worker computes the
    window itself instead of waiting for it forever."""
    import os
    import threading
    from concurrent.futures import Future

    o = order.GlobalOrder(np.full(6, 500), "fp", 1, 0, True, window=2)
    want = order.GlobalOrder(np.full(6, 500), "fp", 1, 0, True, window=2).take(0, 1000, True)
    o.__dict__["_ahead"] = (0, Future(), os.getpid() + 1)  # the parent's, never done here
    got: list[np.ndarray] = []
    reader = threading.Thread(target=lambda: got.append(o.take(0, 1000, True)), daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert got, "the take waited for a job of another process"
    np.testing.assert_array_equal(got[0], want)
