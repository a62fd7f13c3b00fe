"""Carrying a run on after its mixture changed (``load_state_dict(state, strict=False)``):
the position continues, a kept source delivers nothing again before it is exhausted, a
removed source is no longer read, an added one starts fresh; the same at another world
size, resumable as it is; refused (strict) or a MixtureError (cannot honour) otherwise."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, MixtureError, Source, mix, write_mds

BASE = {"web": 0, "code": 100_000, "math": 200_000}
SIZES = {"web": 900, "code": 400, "math": 150}
EPOCH = 400

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("carry")
    out = {}
    for name, n in SIZES.items():
        ids = np.arange(BASE[name], BASE[name] + n, dtype=np.int64)
        write_mds(pa.table({"id": ids}), str(root / name), DatasetSpec(shard_size="512B"))
        out[name] = str(root / name)
    return out


def _a(paths: dict[str, str]) -> Any:
    """Mixture A: web and code, 3:1."""
    return mix(
        [
            Source(paths["web"], name="web", proportion=3),
            Source(paths["code"], name="code", proportion=1),
        ],
        epoch_size=EPOCH,
    )


def _b(paths: dict[str, str], **kwargs: Any) -> Any:
    """Mixture B: weights changed, code removed, math added."""
    return mix(
        [
            Source(paths["web"], name="web", proportion=1),
            Source(paths["math"], name="math", proportion=1),
        ],
        epoch_size=EPOCH,
        **kwargs,
    )


# A changed mixture carries on runs read without streams (streams=1): a streamed run's
# sources were read from streams of their shards (test_mixture_streams refuses it by name).
SETTINGS = {"shuffle": True, "seed": 4, "streams": 1}


def _consume(m: Any, steps: int, batch_size: int = 25, **kwargs: Any) -> tuple[np.ndarray, dict]:
    """The first ``steps`` batches of a run (across epochs) and the state after them."""
    loader = m.to_torch(batch_size=batch_size, **SETTINGS, **kwargs)
    ids = []
    while len(ids) + len(loader) <= steps:
        ids += [b["id"].numpy() for b in loader]
    it = iter(loader)
    ids += [next(it)["id"].numpy() for _ in range(steps - len(ids))]
    state = json.loads(json.dumps(loader.state_dict()))  # as a checkpoint stores it
    it.close()
    return np.concatenate(ids), state


def _rest(m: Any, state: dict, world: int, epochs: int = 1, batch_size: int = 20) -> np.ndarray:
    """The run from ``state`` for ``epochs`` passes, dealt to ``world`` ranks, back in the
    order of the global batches."""
    loaders = []
    for r in range(world):
        loader = m.to_torch(
            batch_size=batch_size, rank=r, world_size=world, even_batches=False, **SETTINGS
        )
        loader.load_state_dict(state, strict=False)
        loaders.append(loader)
    out = []
    for _ in range(epochs):
        per_rank = [[b["id"].numpy() for b in loader] for loader in loaders]
        total = sum(len(p) for p in per_rank)
        out += [per_rank[g % world][g // world] for g in range(total)]
    return np.concatenate(out)


def _source(ids: np.ndarray) -> np.ndarray:
    return ids // 100_000


@pytest.mark.parametrize("steps", [6, 16])  # mid-epoch; exactly at epoch 1's start
def test_changed_mixture_carries_on_at_another_world_size(
    paths: dict[str, str], steps: int
) -> None:
    a, b = _a(paths), _b(paths)
    before = [_consume(a, steps)[0]]
    seen, state = _consume(a, steps)
    assert np.array_equal(seen, before[0])
    epoch, consumed = divmod(steps * 25, EPOCH)
    one = _rest(b, state, world=1, epochs=2)
    two = _rest(b, state, world=2, epochs=2)
    assert np.array_equal(one, two)  # the same global batches at any world size
    # the position continues: the rest of the epoch, then a whole one
    assert len(one) == (EPOCH - consumed) + EPOCH
    src = _source(one)
    assert not (src == 1).any()  # code was removed: no longer read
    # the rest of the epoch follows B's weights (1:1) over the samples left
    assert (
        np.bincount(src[: EPOCH - consumed], minlength=3)[[0, 2]].tolist()
        == [(EPOCH - consumed) // 2] * 2
    )
    # web: nothing served in this pass comes again before its 900 samples are all served
    web_before = np.concatenate([_consume(a, e)[0] for e in [steps]])
    web_before = web_before[_source(web_before) == 0]
    web_after = one[src == 0]
    served = int(state["source"]["sources"][0]["served"])
    assert served >= len(web_before)
    room = SIZES["web"] - served  # what this pass has left
    assert not set(web_before.tolist()) & set(web_after[:room].tolist())
    assert len(set(web_after[:room].tolist())) == min(room, len(web_after))
    # math was added: it starts fresh, its first pass without repeats
    math_ids = one[: EPOCH - consumed][src[: EPOCH - consumed] == 2]
    assert len(math_ids) == (EPOCH - consumed) // 2
    assert len(set(math_ids.tolist())) == min(len(math_ids), SIZES["math"])
    if consumed == 0:  # at an epoch start nothing is passed over: web's stream goes on
        assert served == len(web_before) and epoch == 1


def test_carried_run_resumes_exactly_and_strictly(paths: dict[str, str]) -> None:
    a, b = _a(paths), _b(paths)
    _, state = _consume(a, 5)
    carried = b.to_torch(batch_size=25, **SETTINGS)
    carried.load_state_dict(state, strict=False)
    whole = np.concatenate([x["id"].numpy() for x in carried])
    again = b.to_torch(batch_size=25, **SETTINGS)
    again.load_state_dict(state, strict=False)
    it = iter(again)
    head = [next(it)["id"].numpy() for _ in range(3)]
    mid = json.loads(json.dumps(again.state_dict()))
    it.close()
    assert mid["source"]["carry"]["consumed"] == 125
    fresh = b.to_torch(batch_size=10, rank=1, world_size=2, even_batches=False, **SETTINGS)
    fresh.load_state_dict(mid)  # strict: the carried run is this mixture's own
    other = b.to_torch(batch_size=10, rank=0, world_size=2, even_batches=False, **SETTINGS)
    other.load_state_dict(mid)
    r0, r1 = [x["id"].numpy() for x in other], [x["id"].numpy() for x in fresh]
    dealt = [(r0, r1)[g % 2][g // 2] for g in range(len(r0) + len(r1))]
    assert np.array_equal(np.concatenate(head + dealt), whole)


def test_strict_refuses_naming_what_differs(paths: dict[str, str]) -> None:
    _, state = _consume(_a(paths), 3)
    loader = _b(paths).to_torch(batch_size=25, **SETTINGS)
    with pytest.raises(MixtureError, match="source 'math' added, source 'code' removed"):
        loader.load_state_dict(state)


def test_a_schedule_appended_carries_on(paths: dict[str, str]) -> None:
    a = _a(paths)
    seen, state = _consume(a, 20)  # epoch 1, position 100
    staged = mix(
        [Source(paths["web"], name="web"), Source(paths["code"], name="code")],
        epoch_size=EPOCH,
        schedule=[(0, {"web": 3, "code": 1}), (2 * EPOCH, {"web": 1, "code": 1})],
    )
    rest = _rest(staged, state, world=3, epochs=2)
    src = _source(rest)
    assert np.bincount(src[:300]).tolist() == [225, 75]  # epoch 1: still 3:1
    assert np.bincount(src[300:]).tolist() == [200, 200]  # epoch 2: the new stage
    # code: epoch 0's 100 and epoch 1's first served (the rest of A's part passed over:
    # served = 200), then 75 from stream position 200, all unique
    early = np.concatenate([seen[_source(seen) == 1], rest[:300][src[:300] == 1]])
    assert len(early) == len(set(early.tolist())) > 175
    assert state["source"]["sources"][1]["served"] == 200
    # epoch 2 takes stream positions [275, 475): only the 75 of the next pass may repeat
    later = rest[300:][src[300:] == 1]
    assert len(set(later.tolist()) & set(early.tolist())) <= 75


def test_states_it_cannot_honour_are_refused(paths: dict[str, str], tmp_path: Any) -> None:
    _, state = _consume(_a(paths), 3)
    shorter = mix(
        [
            Source(paths["web"], name="web", proportion=1),
            Source(paths["math"], name="math", proportion=1),
        ],
        epoch_size=50,
    )
    with pytest.raises(MixtureError, match="field epoch_size"):
        shorter.to_torch(batch_size=25, **SETTINGS).load_state_dict(state, strict=False)
    renamed = mix(
        [
            Source(paths["math"], name="web", proportion=1),
            Source(paths["code"], name="code", proportion=1),
        ],
        epoch_size=EPOCH,
    )
    with pytest.raises(MixtureError, match=r"source 0 \(web\).*field fingerprint"):
        renamed.to_torch(batch_size=25, **SETTINGS).load_state_dict(state, strict=False)
    plain = dict(state)
    del plain["source"]
    with pytest.raises(MixtureError, match="field source"):
        _b(paths).to_torch(batch_size=25, **SETTINGS).load_state_dict(plain, strict=False)


def test_numpy_and_tf_loaders_take_strict(paths: dict[str, str]) -> None:
    a, b = _a(paths), _b(paths)
    _, state = _consume(a, 6)
    want = _rest(b, state, world=1, batch_size=25)
    got = np.concatenate(
        [x["id"] for x in b.iter_batches(25, state=state, strict=False, **SETTINGS)]
    )
    assert np.array_equal(got, want)
    with pytest.raises(MixtureError, match="strict=False"):
        b.iter_batches(25, state=state, **SETTINGS)
    tf = pytest.importorskip("tensorflow")
    del tf
    tfds = b.to_tf(batch_size=25, state=state, strict=False, **SETTINGS)
    got_tf = np.concatenate([x["id"].numpy() for x in tfds.take(len(want) // 25)])
    assert np.array_equal(got_tf, want)
