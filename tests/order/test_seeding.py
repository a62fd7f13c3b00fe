"""A stratified order's per-batch shuffles, seeded for a block of batches at once (and, where
the C extension is built, shuffled in one call), draw exactly what a numpy generator
constructed per batch draws: the order stays a pure function of (fingerprint, seed, epoch)."""

from __future__ import annotations

import numpy as np
import pytest

from spark_dl_core.order import seeding
from spark_dl_core.order.dataset_order import _key, _rng
from spark_dl_core.order.mixture_order import MixtureOrder, MixturePlan

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
