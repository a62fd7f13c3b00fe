"""A stratified order's per-batch shuffles, seeded for a block of batches at once (and, where
the C extension is built, shuffled in one call), draw exactly what a numpy generator
constructed per batch draws: the order stays a pure function of (fingerprint, seed, epoch)."""

from __future__ import annotations

import numpy as np
import pytest

from spark_dl_core.order import seeding
from spark_dl_core.order.dataset_order import _key, _rng
from spark_dl_core.order.mixture_order import MixtureOrder, MixturePlan, merged_counts_at

PATHS = ["each", "numpy"] + (["c"] if seeding._shuffle is not None else [])


def test_seed_words_seed_pcg64_as_numpy_does() -> None:
    keys = [_key(f"batch:{'ab' * 32}:{b}", seed, 3) for b in range(300) for seed in (0, 7)]
    for key, words in zip(keys, seeding.seed_words(keys)):
        state = np.random.PCG64(np.frombuffer(key, dtype=np.uint32)).state["state"]
        assert seeding.pcg64_state(words.tolist()) == (state["state"], state["inc"])


@pytest.mark.parametrize("path", PATHS)
def test_batch_shuffles_match_a_generator_per_batch(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches across block boundaries, of every awkward size (empty, one, a partial last
    one, past 2^16), from a non-aligned first batch."""
    sizes = [1024] * 40 + [0, 1, 2, 3, 1000, 70_000, 5] + [1024] * 300
    first = seeding.BatchShuffles.BLOCK - 17
    ids = np.random.default_rng(1).integers(0, 1 << 40, sum(sizes))
    want = ids.copy()
    at = 0
    for b, n in enumerate(sizes, start=first):
        _rng(f"batch:fp:{b}", 11, 2).shuffle(want[at : at + n])
        at += n
    monkeypatch.setattr(seeding, "_checked", path)
    got = ids.copy()
    seeding.BatchShuffles("batch:fp:", 11, 2).shuffle(got, first, sizes)
    np.testing.assert_array_equal(got, want)


def test_a_stratified_order_is_the_same_whichever_path_shuffles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = MixturePlan(
        fingerprint="f" * 64,
        shard_sizes=(np.array([700, 900, 650]), np.array([400, 333])),
        bases=(0, 2250),
        counts=(2000, 900),
        source_fingerprints=("a" * 64, "b" * 64),
        batching="stratified",
    )
    orders = {}
    for path in PATHS:
        monkeypatch.setattr(seeding, "_checked", path)
        order = MixtureOrder(plan, seed=5, epoch=1, shuffle=True, window=2, batch_size=100)
        orders[path] = np.concatenate(
            [order.take(s, min(order.total, s + 1700), True) for s in range(0, order.total, 1700)]
        )
    for path in PATHS[1:]:
        np.testing.assert_array_equal(orders[path], orders["each"])
    assert sorted(orders["each"].tolist()) != orders["each"].tolist()


@pytest.mark.skipif(seeding._shuffle is None, reason="C extension not built")
def test_batches_interleaved_and_shuffled_in_one_pass_match_numpy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each batch takes its share of every source in turn, then is shuffled by its own
    generator: the C pass gives what concatenating and numpy's shuffle give, with sources
    missing from some batches, an empty batch and parts longer than used."""
    rng = np.random.default_rng(4)
    lengths = rng.integers(0, 300, (40, 3))
    lengths[5] = 0
    lengths[7:12, 1] = 0
    parts = [rng.integers(0, 1 << 40, int(c) + 9) for c in lengths.sum(axis=0)]
    first = seeding.BatchShuffles.BLOCK - 3  # across a block of seeding words
    monkeypatch.setattr(seeding, "_checked", "c")
    got = seeding.BatchShuffles("batch:fp:", 2, 9).interleaved(parts, lengths, first)
    at = np.zeros(3, dtype=int)
    want = []
    for row in lengths:
        want.append(np.concatenate([p[a : a + n] for p, a, n in zip(parts, at, row)]))
        at += row
    flat = np.concatenate(want)
    monkeypatch.setattr(seeding, "_checked", "numpy")
    seeding.BatchShuffles("batch:fp:", 2, 9).shuffle(flat, first, lengths.sum(axis=1).tolist())
    assert got is not None
    np.testing.assert_array_equal(got, flat)


@pytest.mark.skipif(seeding._shuffle is None, reason="C extension not built")
def test_interleaving_past_a_part_is_refused() -> None:
    parts = [np.arange(10), np.arange(5)]
    words = np.zeros(8, dtype=np.uint64)
    out = np.empty(16, dtype=np.int64)
    with pytest.raises(ValueError, match="batch 1 passes the end of part 1"):
        seeding._shuffle.interleave_shuffle(out, parts, np.array([[5, 3], [3, 3]]), words)
    with pytest.raises(ValueError, match="4 uint64 words a batch"):
        seeding._shuffle.interleave_shuffle(out, parts, np.array([[5, 3]]), words)


def test_merged_bounds_kept_per_block_are_a_merge_per_range() -> None:
    """A stratified order merges its batch bounds a block of batches at a time; any range
    (across blocks, a few batches, a schedule part's lead) reads the same counts."""
    plan = MixturePlan(
        fingerprint="f" * 64,
        shard_sizes=(np.array([7000, 9000]), np.array([4000]), np.array([333, 300])),
        bases=(0, 16000, 20000),
        counts=(9000, 3500, 633),
        source_fingerprints=("a" * 64, "b" * 64, "c" * 64),
        batching="stratified",
    )
    order = MixtureOrder(plan, seed=1, epoch=0, shuffle=True, batch_size=7, lead=3)
    block = MixtureOrder.COUNT_BLOCK
    for first, stop in [(0, 16), (block - 5, block + 11), (3, 5), (block - 1, 3 * block + 2)]:
        edges = np.arange(first, stop + 1) * 7 - 3
        want = merged_counts_at(plan.counts, np.clip(edges, 0, order.total))
        np.testing.assert_array_equal(order._bound_counts(first, stop), want)
