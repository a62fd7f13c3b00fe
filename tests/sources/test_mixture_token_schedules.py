"""Schedules with pack=: boundaries in samples and in tokens ("5k tokens"), placed at the
document, packed into the same rows on any world size, resumed exactly across a boundary,
and bad token boundaries refused naming the stage and the field."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, MixtureError, Source, mix, open_mixture, write_mds

L = 64  # tokens per packed row
EPOCH = 200  # documents per epoch
SIZES = {"web": 300, "code": 120, "math": 60}
PACK = {"column": "tokens", "seq_len": L}


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Token documents of varied lengths (3..150 tokens); each token is the document's id,
    so a packed row tells which documents it holds (ids from 1: 0 pads)."""
    root = tmp_path_factory.mktemp("tok")
    rng = np.random.default_rng(11)
    out, first = {}, 1
    for name, n in SIZES.items():
        ids = np.arange(first, first + n, dtype=np.int64)
        docs = [np.full(int(rng.integers(3, 150)), i, dtype=np.int32) for i in ids]
        table = pa.table({"id": ids, "tokens": pa.array(docs, pa.list_(pa.int32()))})
        write_mds(table, str(root / name), DatasetSpec(shard_size="4KiB"))
        out[name], first = str(root / name), first + n
    return out


def _mix(paths: dict[str, str], schedule: Any) -> Any:
    srcs = [Source(paths[k], name=k) for k in SIZES]
    return mix(srcs, epoch_size=EPOCH, schedule=schedule)


def _docs(m: Any, epochs: int, seed: int = 4) -> list[np.ndarray]:
    """The run's documents in order (the unpacked order of ``m`` without streams, the one a
    packed loader packs)."""
    return [
        d
        for e in range(epochs)
        for b in m.iter_batches(batch_size=16, shuffle=True, seed=seed, epoch=e, streams=1)
        for d in b["tokens"]
    ]


def _rows(m: Any, epoch: int, seed: int = 4, **kw: Any) -> np.ndarray:
    got = [
        b["input_ids"]
        for b in m.iter_batches(batch_size=4, shuffle=True, seed=seed, epoch=epoch, pack=PACK, **kw)
    ]
    return np.concatenate(got) if got else np.empty((0, L), np.int64)


TOKENS = 20_000  # inside epoch 1 (an epoch holds ~15k tokens)
TOKEN_SCHEDULE = [(0, {"web": 2, "code": 1}), ("20k tokens", {"web": 1, "math": 1})]


def test_a_token_boundary_starts_the_stage_at_the_first_document_past_it(
    paths: dict[str, str],
) -> None:
    m = _mix(paths, TOKEN_SCHEDULE)
    placed = m.at_tokens("tokens", 4, True)
    s = placed.stages[1][0]
    assert EPOCH < s < 2 * EPOCH
    docs = _docs(placed, 2)
    lengths = np.array([len(d) for d in docs])
    # the documents before the stage hold >= 20k tokens: its first document starts at or
    # after token 20,000 of the run
    assert lengths[:s].sum() >= TOKENS
    # one document fewer in the stage before would hold fewer (2 sources: counts nest)
    fewer = _mix(paths, [TOKEN_SCHEDULE[0], (s - 1, TOKEN_SCHEDULE[1][1])])
    assert sum(len(d) for d in _docs(fewer, 2)[: s - 1]) < TOKENS
    first_math = int(SIZES["web"] + SIZES["code"]) + 1
    src = np.array([int(d[0]) for d in docs])
    assert not np.any(src[:s] >= first_math) and np.any(src[s:] >= first_math)
    assert not np.any((src[s:] > SIZES["web"]) & (src[s:] < first_math))  # no code after


@pytest.mark.parametrize("token_units", [False, True])
def test_packed_rows_follow_the_staged_order_on_any_world_size(
    paths: dict[str, str], token_units: bool
) -> None:
    schedule = TOKEN_SCHEDULE if token_units else [TOKEN_SCHEDULE[0], (290, TOKEN_SCHEDULE[1][1])]
    m = _mix(paths, schedule)
    order = m.at_tokens("tokens", 4, True)
    stream = np.concatenate(_docs(order, 2)[EPOCH:])  # epoch 1: the boundary is inside it
    rows = _rows(m, 1)
    flat = rows.reshape(-1)
    assert np.array_equal(flat[: len(stream)], stream) and not flat[len(stream) :].any()
    for world in (2, 3):
        per_rank = [_rows(m, 1, rank=r, world_size=world, even_batches=False) for r in range(world)]
        batches = [[p[i : i + 4] for i in range(0, len(p), 4)] for p in per_rank]
        merged = [
            b for group in zip(*[[*x, None] for x in batches]) for b in group if b is not None
        ]
        assert np.array_equal(np.concatenate(merged), rows)


@pytest.mark.parametrize("token_units", [False, True])
def test_packed_resume_across_the_boundary_at_another_world_size(
    paths: dict[str, str], token_units: bool
) -> None:
    pytest.importorskip("torch")
    schedule = TOKEN_SCHEDULE if token_units else [TOKEN_SCHEDULE[0], (290, TOKEN_SCHEDULE[1][1])]
    m = _mix(paths, schedule)
    first_math = int(SIZES["web"] + SIZES["code"]) + 1
    rows = _rows(m, 1)
    boundary_row = int(np.argmax((rows >= first_math).any(axis=1)))
    assert 4 < boundary_row < len(rows) - 8
    for cut in (boundary_row // 4 - 1, boundary_row // 4 + 1):  # before and after it
        loader = m.to_torch(batch_size=4, shuffle=True, seed=4, epoch=1, pack=PACK)
        it = iter(loader)
        seen = [next(it)["input_ids"].numpy() for _ in range(cut)]
        state = pickle.loads(pickle.dumps(loader.state_dict()))
        rest = []
        for rank in range(3):
            again = _mix(paths, schedule).to_torch(
                batch_size=4, shuffle=True, seed=4, pack=PACK, rank=rank, world_size=3,
                even_batches=False,
            )  # fmt: skip
            again.load_state_dict(state)
            rest.append([b["input_ids"].numpy() for b in again])
        merged = [b for g in zip(*[[*r, None] for r in rest]) for b in g if b is not None]
        assert np.array_equal(np.concatenate(seen + merged), rows)


def test_token_schedules_are_in_the_fingerprint_and_the_spec(
    paths: dict[str, str], tmp_path: Path
) -> None:
    m = _mix(paths, TOKEN_SCHEDULE)
    samples = _mix(paths, [TOKEN_SCHEDULE[0], (20_000, TOKEN_SCHEDULE[1][1])])
    assert m.fingerprint != samples.fingerprint
    m.save(str(tmp_path / "m.json"))
    saved = json.loads((tmp_path / "m.json").read_text())
    assert saved["schedule"][1] == {"start": 20_000, "weights": {"web": 1.0, "math": 1.0},
                                    "unit": "tokens"}  # fmt: skip
    again = open_mixture(str(tmp_path / "m.json"))
    assert again.fingerprint == m.fingerprint
    assert np.array_equal(_rows(again, 1), _rows(m, 1))
    samples.save(str(tmp_path / "s.json"))
    assert "unit" not in (tmp_path / "s.json").read_text()  # sample schedules: as before
    inline = json.loads((tmp_path / "m.json").read_text())
    inline["schedule"][1] = {"start": "20k tokens", "weights": {"web": 1, "math": 1}}
    assert open_mixture(inline).fingerprint == m.fingerprint
    assert m.at_tokens("tokens", 4, True).fingerprint != m.at_tokens("tokens", 5, True).fingerprint


@pytest.mark.parametrize(
    ("schedule", "field"),
    [
        ([(0, {"web": 1}), ("20k tokns", {"code": 1})], "schedule stage 1 start"),
        ([(0, {"web": 1}), (" tokens", {"code": 1})], "schedule stage 1 start"),
        ([(0, {"web": 1}), ("1k tokens", {"code": 1}), (5000, {"math": 1})], "stage 2"),
        ([(0, {"web": 1}), ("1.5 tokens", {"code": 1})], "whole number"),
    ],
)
def test_bad_token_boundaries_are_refused_when_mixed(
    paths: dict[str, str], schedule: Any, field: str
) -> None:
    with pytest.raises(MixtureError, match=field):
        _mix(paths, schedule)


def test_token_boundaries_need_pack_and_a_reachable_place(paths: dict[str, str]) -> None:
    m = _mix(paths, TOKEN_SCHEDULE)
    with pytest.raises(
        MixtureError, match=r"stage 1 starts at 20000 tokens \(field start\).*pack="
    ):
        next(iter(m.iter_batches(batch_size=4)))
    # stage 1 would be empty: 2 tokens after stage 1, the run is already past stage 2's start
    close = _mix(
        paths, [(0, {"web": 1}), ("1000 tokens", {"code": 1}), ("1001 tokens", {"web": 1})]
    )
    with pytest.raises(
        MixtureError, match=r"stage 2 \(start=1001 tokens\).*stage 1 would be empty"
    ):
        _rows(close, 0)
    # beyond the run: past int64 run positions
    far = _mix(paths, [(0, {"web": 1}), ("4000000000T tokens", {"code": 1})])
    with pytest.raises(MixtureError, match=r"stage 1 \(start=4000000000000000000000 tokens\)"):
        _rows(far, 0)
