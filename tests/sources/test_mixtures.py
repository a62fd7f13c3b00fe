"""Mixtures of datasets: exact per-source counts, coverage before repeats, batching, the same
batches on any world size and worker count, exact resume, schemas, specs and bad input."""

from __future__ import annotations

import collections
import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import (
    DatasetSpec,
    MixtureError,
    Source,
    SpecError,
    mix,
    open_dataset,
    open_mixture,
    write_mds,
)
from spark_dl_core.errors import ColumnNotFoundError
from spark_dl_core.order import merged_counts

BASE = {"web": 0, "code": 100_000, "math": 200_000}


def _write(path: Path, n: int, start: int, mode: str = "error", **extra: object) -> str:
    columns = {"id": np.arange(start, start + n, dtype=np.int64)}
    columns["x"] = (np.arange(n) % 7).astype(np.float32)
    table = pa.table({**columns, **extra})  # type: ignore[arg-type]
    write_mds(table, str(path), DatasetSpec(shard_size="2KiB"), mode=mode)
    return str(path)


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mix")
    sizes = {"web": 1000, "code": 300, "math": 50}
    return {name: _write(root / name, n, BASE[name]) for name, n in sizes.items()}


def _mixture(paths: dict[str, str], **kwargs: object) -> object:
    weights = kwargs.pop("weights", {"web": 0.5, "code": 0.3, "math": 0.2})
    sources = [Source(paths[k], proportion=w, name=k) for k, w in weights.items()]  # type: ignore[attr-defined]
    return mix(sources, source_column="src", **kwargs)  # type: ignore[arg-type]


def _epoch(m: object, **kwargs: object) -> list[dict[str, np.ndarray]]:
    return list(m.iter_batches(**kwargs))  # type: ignore[attr-defined]


def _ids(batches: list[dict[str, np.ndarray]]) -> np.ndarray:
    return np.concatenate([b["id"] for b in batches]) if batches else np.empty(0, np.int64)


def _source_of(ids: np.ndarray) -> np.ndarray:
    return (ids >= 100_000).astype(int) + (ids >= 200_000).astype(int)


def test_exact_counts_per_epoch_and_source_column(paths: dict[str, str]) -> None:
    m = _mixture(paths, epoch_size="1k")
    assert len(m) == 1000 and m.counts == [500, 300, 200]  # type: ignore[attr-defined]
    for epoch in range(3):
        batches = _epoch(m, batch_size=64, shuffle=True, seed=1, epoch=epoch)
        ids = _ids(batches)
        src = np.concatenate([b["src"] for b in batches])
        assert np.bincount(src).tolist() == [500, 300, 200]
        assert (src == _source_of(ids)).all()  # the source column names each row's source


def test_rounding_is_largest_remainder_and_sums_to_epoch_size(paths: dict[str, str]) -> None:
    m = _mixture(paths, weights={"web": 1, "code": 1, "math": 1}, epoch_size=100)
    assert m.counts == [34, 33, 33]  # type: ignore[attr-defined]
    default = _mixture(paths, weights={"web": 2, "code": 1, "math": 1})
    assert len(default) == 1350 and sum(default.counts) == 1350  # type: ignore[attr-defined]


def test_coverage_before_repeats_and_repeat_counts(paths: dict[str, str]) -> None:
    sources = [
        Source(paths["web"], choose=400, name="web"),
        Source(paths["math"], repeat=2.5, name="math"),
    ]
    m = mix(sources)
    assert m.counts == [400, 125]
    drawn: list[np.ndarray] = []
    for epoch in range(3):
        ids = _ids(_epoch(m, batch_size=50, shuffle=True, seed=9, epoch=epoch))
        web, math = ids[ids < 100_000], ids[ids >= 200_000]
        counts = collections.Counter(math.tolist())
        assert set(counts.values()) <= {2, 3} and len(counts) == 50  # floor/ceil of 2.5
        drawn.append(np.sort(web))
    first_pass = np.concatenate([drawn[0], drawn[1], drawn[2][:0]])
    assert len(np.unique(first_pass)) == 800  # epochs 0 and 1: 800 distinct of 1000
    # epoch 2 holds the 200 never drawn, then 200 from the next pass
    assert set(range(1000)) - set(first_pass.tolist()) <= set(drawn[2].tolist())


@pytest.mark.parametrize("batching", ["random", "stratified", "per_source"])
def test_same_batches_on_any_world_size(paths: dict[str, str], batching: str) -> None:
    m = _mixture(paths, epoch_size=900, batching=batching)
    whole = [b["id"] for b in _epoch(m, batch_size=40, shuffle=True, seed=2, epoch=1)]
    for world in (2, 3):
        per_rank = [
            [
                b["id"]
                for b in _epoch(
                    m,
                    batch_size=40,
                    shuffle=True,
                    seed=2,
                    epoch=1,
                    rank=r,
                    world_size=world,
                    even_batches=False,
                )
            ]
            for r in range(world)
        ]
        dealt = [per_rank[g % world][g // world] for g in range(len(whole))]
        assert all((a == b).all() for a, b in zip(whole, dealt))
        padded = [
            len(_epoch(m, batch_size=40, shuffle=True, seed=2, epoch=1, rank=r, world_size=world))
            for r in range(world)
        ]
        assert len(set(padded)) == 1  # even_batches (the default): equal steps on every rank
    again = [b["id"] for b in _epoch(m, batch_size=40, shuffle=True, seed=2, epoch=1)]
    assert all((a == b).all() for a, b in zip(whole, again))
    other = _ids(_epoch(m, batch_size=40, shuffle=True, seed=2, epoch=2))
    assert not np.array_equal(np.concatenate(whole), other)  # a new order each epoch


def test_stratified_batches_hold_each_share(paths: dict[str, str]) -> None:
    m = _mixture(paths, epoch_size=1000, batching="stratified")
    for b in _epoch(m, batch_size=64, shuffle=True, seed=0):
        n = len(b["id"])
        got = np.bincount(b["src"], minlength=3)
        want = np.array([0.5, 0.3, 0.2]) * n
        assert np.all(np.abs(got - want) <= 1), (got, want)


def test_per_source_batches_come_from_one_source(paths: dict[str, str]) -> None:
    m = _mixture(paths, epoch_size=1000, batching="per_source")
    batches = _epoch(m, batch_size=64, shuffle=True, seed=0)
    whole = sum(c // 64 for c in m.counts)  # type: ignore[attr-defined]
    assert all(len(set(b["src"].tolist())) == 1 for b in batches[:whole])
    assert np.bincount(np.concatenate([b["src"] for b in batches])).tolist() == [500, 300, 200]


def test_merged_counts_are_monotone_and_exact() -> None:
    counts = [7, 3, 1, 1000, 13]
    total = sum(counts)
    previous = [0] * len(counts)
    for x in range(total + 1):
        got = merged_counts(counts, x)
        assert sum(got) == x and all(g >= p for g, p in zip(got, previous))
        assert all(abs(g - x * c / total) < 2 for g, c in zip(got, counts))
        previous = got
    assert previous == counts


def test_torch_workers_and_resume_at_another_world_size(paths: dict[str, str]) -> None:
    pytest.importorskip("torch")
    m = _mixture(paths, epoch_size=700)
    plain = [b["id"].numpy() for b in m.to_torch(batch_size=32, shuffle=True, seed=5)]  # type: ignore[attr-defined]
    workers = [
        b["id"].numpy()
        for b in m.to_torch(batch_size=32, shuffle=True, seed=5, num_workers=2)  # type: ignore[attr-defined]
    ]
    assert all((a == b).all() for a, b in zip(plain, workers)) and len(plain) == len(workers)
    loader = m.to_torch(batch_size=32, shuffle=True, seed=5)  # type: ignore[attr-defined]
    it = iter(loader)
    seen = [next(it)["id"].numpy() for _ in range(6)]
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()  # type: ignore[attr-defined]
    rest = []
    for r in range(2):
        resumed = m.to_torch(batch_size=32, shuffle=True, seed=5, rank=r, world_size=2)  # type: ignore[attr-defined]
        resumed.load_state_dict(state)
        rest += [b["id"].numpy() for b in resumed]
    delivered = np.concatenate(seen + rest)
    assert sorted(delivered.tolist()) == sorted(np.concatenate(plain).tolist())


def test_state_of_another_mixture_or_batch_size_is_refused(paths: dict[str, str]) -> None:
    m = _mixture(paths, epoch_size=700)
    loader = m.to_torch(batch_size=32, shuffle=True, seed=5)  # type: ignore[attr-defined]
    for _ in loader:
        break
    other = _mixture(paths, epoch_size=800).to_torch(batch_size=32, shuffle=True, seed=5)  # type: ignore[attr-defined]
    with pytest.raises(SpecError, match="fingerprint"):
        other.load_state_dict(loader.state_dict())
    strat = _mixture(paths, epoch_size=700, batching="stratified")
    first = strat.to_torch(batch_size=32, shuffle=True, seed=5)  # type: ignore[attr-defined]
    for _ in first:
        break
    with pytest.raises(SpecError, match="batch_size"):
        strat.to_torch(batch_size=16, shuffle=True, seed=5).load_state_dict(first.state_dict())  # type: ignore[attr-defined]


def test_tf_yields_the_torch_batches(paths: dict[str, str]) -> None:
    pytest.importorskip("tensorflow")
    m = _mixture(paths, epoch_size=300)
    torch_ids = _ids(_epoch(m, batch_size=50, shuffle=True, seed=4))
    tf_ids = np.concatenate([b["id"].numpy() for b in m.to_tf(batch_size=50, shuffle=True, seed=4)])  # type: ignore[attr-defined]
    assert np.array_equal(torch_ids, tf_ids)


def test_fingerprint_changes_with_content_counts_and_batching(paths: dict[str, str]) -> None:
    a = _mixture(paths, epoch_size=700).fingerprint  # type: ignore[attr-defined]
    assert a == _mixture(paths, epoch_size=700).fingerprint  # type: ignore[attr-defined]
    assert a != _mixture(paths, epoch_size=701).fingerprint  # type: ignore[attr-defined]
    assert a != _mixture(paths, epoch_size=700, batching="stratified").fingerprint  # type: ignore[attr-defined]


def test_spec_round_trip_and_changed_source(paths: dict[str, str], tmp_path: Path) -> None:
    local = {k: shutil.copytree(v, tmp_path / k) for k, v in paths.items()}
    m = _mixture({k: str(v) for k, v in local.items()}, epoch_size=500)
    saved = tmp_path / "mixture.json"
    m.save(str(saved))  # type: ignore[attr-defined]
    again = open_mixture(str(saved))
    assert again.fingerprint == m.fingerprint and again.counts == m.counts  # type: ignore[attr-defined]
    assert [s["fingerprint"] for s in again.lineage] == [
        open_dataset(str(v)).fingerprint for v in local.values()
    ]
    _write(local["math"], 60, BASE["math"], mode="overwrite")  # the source is rewritten
    with pytest.raises(MixtureError, match=r"math.*changed"):
        open_mixture(str(saved))
    with pytest.warns(UserWarning, match="following"):
        followed = open_mixture(str(saved), follow=True)
    assert followed.fingerprint != m.fingerprint  # type: ignore[attr-defined]


def test_columns_differ_between_sources(tmp_path: Path) -> None:
    a = _write(tmp_path / "a", 40, 0)
    b = _write(tmp_path / "b", 30, 100_000, label=pa.array(["x"] * 30))
    with pytest.raises(MixtureError, match=r"columns=\['id', 'x'\]"):
        mix([Source(a), Source(b)])
    m = mix([Source(a), Source(b)], columns=["id", "x"])
    table = m.to_arrow()
    assert table.column_names == ["id", "x"]
    assert sorted(table["id"].to_pylist()) == [*range(40), *range(100_000, 100_030)]
    c = str(tmp_path / "c")
    write_mds(pa.table({"id": np.arange(5, dtype=np.int32), "x": np.ones(5, np.float32)}), c)
    with pytest.raises(MixtureError, match="column 'id' differs"):
        mix([Source(a), Source(c)])
    with pytest.raises(ColumnNotFoundError, match="label"):
        mix([Source(a), Source(b)], columns=["label"])


def test_token_documents_mix_as_jagged(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    ragged = [rng.integers(0, 100, rng.integers(1, 9)).astype(np.int32) for _ in range(60)]
    write_mds(pa.table({"tokens": pa.array(ragged, pa.list_(pa.int32()))}), str(tmp_path / "r"))
    equal = [np.full(4, i, np.int32) for i in range(40)]  # one shape: a dense column alone
    write_mds(pa.table({"tokens": pa.array(equal, pa.list_(pa.int32()))}), str(tmp_path / "e"))
    m = mix([Source(str(tmp_path / "r")), Source(str(tmp_path / "e"))], source_column="src")
    total = 0
    for batch in m.to_torch(batch_size=16, shuffle=True, seed=1):
        assert batch["tokens"].is_nested
        total += batch["tokens"].size(0)
        for row, src in zip(batch["tokens"].unbind(), batch["src"].tolist()):
            assert (src == 1) == (row.numel() == 4 and bool((row == row[0]).all()))
    assert total == 100 and isinstance(total, int) and torch is not None


@pytest.mark.parametrize(
    ("sources", "kwargs", "message"),
    [
        ([{"proportion": -1.0}, {"proportion": 1.0}], {}, "proportion=-1.0 must be finite"),
        ([{"proportion": 0.0}, {"proportion": 0.0}], {}, "sum to 0"),
        ([{"repeat": float("inf")}, {}], {}, "repeat=inf"),
        ([{"proportion": 1.0, "repeat": 2.0}, {"proportion": 1.0}], {}, "give one of"),
        ([{"proportion": 1.0}, {"repeat": 2.0}], {}, "cannot be mixed"),
        ([{"repeat": 2.0}, {}], {"epoch_size": 10}, "epoch_size=10 with repeat"),
        ([{}, {}], {"batching": "roundrobin"}, "batching='roundrobin'"),
        ([{"proportion": "lots"}, {"proportion": 1.0}], {}, "is not a number"),
        ([{"choose": 2.7}, {"choose": 3}], {}, "source 0 choose=2.7: a whole number"),
        ([{"choose": "2.5"}, {"choose": 3}], {}, "choose='2.5': a whole number"),
        ([{"proportion": 1.0}, {}], {"epoch_size": "1.0005k"}, "epoch_size=.1.0005k.: a whole"),
    ],
)
def test_bad_weights_are_refused_naming_source_and_field(
    paths: dict[str, str], sources: list[dict[str, object]], kwargs: dict[str, object], message: str
) -> None:
    built = [Source(paths[k], **w) for k, w in zip(("web", "code"), sources)]  # type: ignore[arg-type]
    with pytest.raises(MixtureError, match=message.replace("(", r"\(").replace("[", r"\[")):
        mix(built, **kwargs)  # type: ignore[arg-type]


def test_empty_or_missing_sources_are_refused(paths: dict[str, str], tmp_path: Path) -> None:
    empty = str(tmp_path / "empty")
    write_mds(pa.table({"id": pa.array([], pa.int64()), "x": pa.array([], pa.float32())}), empty)
    with pytest.raises(MixtureError, match=r"source 1 .*empty"):
        mix([Source(paths["web"], proportion=1.0), Source(empty, proportion=1.0)])
    with pytest.raises(MixtureError, match=r"source 1 .*nowhere.*cannot be opened"):
        mix([Source(paths["web"]), Source(str(tmp_path / "nowhere"))])
    with pytest.raises(MixtureError, match="non-empty list"):
        mix([])


def test_cli_inspect_shows_each_source_share_of_an_epoch(
    paths: dict[str, str], tmp_path: Path
) -> None:
    from spark_dl.cli import main

    saved = tmp_path / "mixture.json"
    mix([Source(paths["web"], choose=400, name="web"), Source(paths["math"], repeat=2.5)]).save(
        str(saved)
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["inspect", str(saved), "--epoch", "2", "--json"]) == 0
    info = json.loads(out.getvalue())
    assert info["epoch_size"] == 525 and info["epoch"] == 2
    web, math = info["sources"]
    assert (web["name"], web["per_epoch"], web["passes"]) == ("web", 400, [0.8, 1.2])
    assert math["per_epoch"] == 125 and math["passes"] == [5.0, 7.5]
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert main(["inspect", str(saved)]) == 0
    assert "web: 400 samples (76.2%) of 1000, passes 0.00-0.40" in text.getvalue()


def test_packing_reads_every_token_of_the_mixture_epoch_once(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    for name, n in [("a", 120), ("b", 60)]:
        docs = [rng.integers(1, 1000, rng.integers(5, 60)).astype(np.int32) for _ in range(n)]
        write_mds(pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))}), str(tmp_path / name))
    m = mix([Source(str(tmp_path / "a"), choose=90), Source(str(tmp_path / "b"), repeat=1.5)])
    epoch = list(m.iter_batches(batch_size=16, shuffle=True, seed=1, epoch=1))
    want = sorted(t for b in epoch for doc in b["tokens"] for t in doc.tolist())
    pack = {"column": "tokens", "seq_len": 64}
    got = []
    for b in m.to_torch(batch_size=4, shuffle=True, seed=1, epoch=1, pack=pack):
        ids = b["input_ids"]
        got += ids[ids != 0].tolist()  # token ids are >= 1; 0 pads the epoch's last row
    assert sorted(got) == want


def _merge_reference(counts: list[int]) -> list[list[int]]:
    """Prefix counts of the smooth merge, straight from its definition: every item (s, j)
    at time (j + (2s + 1) / 2S) / counts[s], all sorted by (time, s) in exact fractions."""
    from fractions import Fraction

    q = 2 * len(counts)
    items = sorted(
        (Fraction(j * q + 2 * s + 1, c * q), s) for s, c in enumerate(counts) for j in range(c)
    )
    got, out = [0] * len(counts), [[0] * len(counts)]
    for _, s in items:
        got[s] += 1
        out.append(list(got))
    return out


def test_vectorized_merge_matches_the_definition_on_random_proportions() -> None:
    from spark_dl_core.order import merged_counts_at
    from spark_dl_core.order.mixture_order import _merged_counts_exact

    rng = np.random.default_rng(3)
    for _ in range(60):
        n = int(rng.integers(1, 7))
        counts = rng.integers(0, 80, n).tolist()
        counts[int(rng.integers(n))] += 1  # at least one item
        if rng.random() < 0.3:  # equal sizes: the staggered phases must break the ties
            counts = [counts[0]] * n
        want = _merge_reference(counts)
        total = sum(counts)
        got = merged_counts_at(counts, np.arange(total + 1))
        assert got.tolist() == want, counts
        assert [merged_counts(counts, x) for x in range(total + 1)] == want
        assert [_merged_counts_exact(counts, x) for x in range(total + 1)] == want
    # large mixtures: against the scalar path in Python integers, through each branch of
    # the vectorized one (pairwise fix-up, the scalar fix-up for many sources, and the
    # fallback where int64 products could overflow)
    for n, high in [(2, 10**6), (5, 10**8), (40, 10**6), (3, 10**12), (1, 10**9)]:
        for _ in range(8):
            counts = rng.integers(0, high, n).tolist()
            counts[0] += 1
            xs = np.append(rng.integers(0, sum(counts) + 1, 300), [0, sum(counts)])
            got = merged_counts_at(counts, xs)
            assert got.tolist() == [_merged_counts_exact(counts, int(x)) for x in xs]
            assert (got.sum(axis=1) == xs).all()


def _stratified_reference(order: Any, b: int) -> np.ndarray:
    """Batch ``b`` of a stratified mixture order, one batch at a time, as defined: each
    source's stream range between the merge's counts at the batch's bounds, then the
    batch's own seeded permutation (shuffled) or the merge's time order (not)."""
    from spark_dl_core.order.dataset_order import _rng
    from spark_dl_core.order.mixture_order import _merged_counts_exact

    size, counts = order.batch_size, order.counts
    x0, x1 = b * size, min((b + 1) * size, order.total)
    lo, hi = _merged_counts_exact(counts, x0), _merged_counts_exact(counts, x1)
    ids, times = [], []
    for s, (a, z) in enumerate(zip(lo, hi)):
        ids.append(order.streams[s].ids(np.arange(a, z)))  # sparse: no window cache
        times.append(
            (np.arange(a, z, dtype=np.float64) + (2 * s + 1) / (2 * len(counts))) / counts[s]
        )
    batch = np.concatenate(ids)
    if order.shuffle:
        fingerprint = order.plan.fingerprint
        return batch[
            _rng(f"batch:{fingerprint}:{b}", order.seed, order.epoch).permutation(len(batch))
        ]
    return batch[np.argsort(np.concatenate(times), kind="stable")]


@pytest.mark.parametrize("shuffle", [True, False])
def test_stratified_order_matches_batch_by_batch_reference(shuffle: bool) -> None:
    from spark_dl_core.order import MixtureOrder, MixturePlan

    rng = np.random.default_rng(11)
    for case in range(12):
        n = int(rng.integers(1, 6))
        shard_sizes = tuple(rng.integers(0, 200, int(rng.integers(1, 7))) for _ in range(n))
        sizes = [int(s.sum()) for s in shard_sizes]
        bases = tuple(int(v) for v in np.cumsum([0, *sizes[:-1]]))
        counts = tuple(int(rng.integers(0, 3 * m + 1)) if m else 0 for m in sizes)
        if not sum(counts):
            continue
        fps = tuple(f"source{s}" for s in range(n))
        plan = MixturePlan(f"mix{case}", shard_sizes, bases, counts, fps, "stratified")
        for batch_size in (1, 13, 256):
            order = MixtureOrder(
                plan, seed=5, epoch=case % 3, shuffle=shuffle, window=2, batch_size=batch_size
            )
            batches = -(-order.total // batch_size)
            want = np.concatenate([_stratified_reference(order, b) for b in range(batches)])
            assert np.array_equal(order.take(0, order.total), want)
            for start, stop in [
                (0, 1),
                (batch_size - 1, 2 * batch_size + 3),
                (order.total // 3, order.total),
            ]:
                start, stop = min(start, order.total), min(stop, order.total)
                assert np.array_equal(order.take(start, stop), want[start:stop])


def test_stratified_order_is_pinned() -> None:
    """The order is a contract (same fingerprints, settings, seed and epoch: same batches);
    these digests were taken before the merge was vectorized and must not move without an
    ORDER_VERSION bump."""
    import hashlib

    from spark_dl_core.order import MixtureOrder, MixturePlan

    sizes = (np.array([120, 80, 33]), np.array([50, 50]), np.array([7]))
    plan = MixturePlan(
        "pinned", sizes, (0, 233, 333), (300, 170, 31), ("a", "b", "c"), "stratified"
    )
    digests = []
    for shuffle in (True, False):
        order = MixtureOrder(plan, seed=7, epoch=1, shuffle=shuffle, window=2, batch_size=32)
        digests.append(hashlib.sha256(order.take(0, order.total).tobytes()).hexdigest()[:16])
    assert digests == ["82e0ea0414432e56", "91fb7bd9183c44a4"]
