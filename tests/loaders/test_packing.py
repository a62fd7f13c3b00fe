"""Packing token documents into fixed-length rows at read time: against a plain reference
packer, every token once, the same rows on any world size and worker count, exact resume at
the token, tf equal to torch, and typed refusals."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, open_dataset, write_mds
from spark_dl_core.errors import PackError
from spark_dl_core.order import global_order

L = 32


def _docs(n: int = 400, seed: int = 0, top: int = 80) -> list[np.ndarray]:
    """Documents whose tokens are unique over the dataset (document start + position), so
    where each token went is visible; some empty, some longer than a row."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, top, size=n)
    starts = np.cumsum(lengths + 1) - lengths  # a gap: no document continues another
    return [np.arange(s, s + k, dtype=np.int32) + 1 for s, k in zip(starts, lengths)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = str(tmp_path_factory.mktemp("pack") / "ds")
    docs = _docs()
    table = pa.table({"tokens": pa.array([d.tolist() for d in docs], pa.list_(pa.int32()))})
    write_mds(table, path, DatasetSpec(shard_size="2KiB"))
    ds = open_dataset(path)
    assert ds.num_shards > 8
    return ds


def _all(ds: Any, **kw: Any) -> list[dict[str, Any]]:
    return list(ds.iter_batches(**kw))


def _reference_concat(ds: Any, seed: int, epoch: int, window: int, pad: int) -> dict[str, Any]:
    """Rows made the plain way: documents in the epoch's order, token by token."""
    sizes = np.diff(ds.shard_offsets)
    order = global_order(sizes, ds.fingerprint, seed, epoch, True, window)
    docs = next(iter(ds.iter_batches(batch_size=len(ds))))["tokens"]
    ids, pos, starts = [], [], []
    for doc in order:
        for p, t in enumerate(docs[doc].tolist()):
            if len(ids) % L == 0 or p == 0:
                starts.append(len(ids))
            ids.append(t)
            pos.append(p)
    real = len(ids)
    while len(ids) % L:
        if len(ids) == real:
            starts.append(len(ids))
        ids.append(pad)
        pos.append(len(ids) - 1 - real)
    labels = np.array(ids)
    labels[starts] = -100
    labels[real:] = -100
    return {
        "input_ids": np.array(ids).reshape(-1, L),
        "position_ids": np.array(pos).reshape(-1, L),
        "labels": labels.reshape(-1, L),
        "starts": starts,
    }


def _stack(batches: list[dict[str, Any]], key: str) -> np.ndarray:
    return np.concatenate([np.asarray(b[key]) for b in batches])


def test_concat_matches_a_plain_reference_packer(dataset: Any) -> None:
    pack = {"column": "tokens", "seq_len": L, "pad_id": 0}
    got = _all(dataset, batch_size=5, shuffle=True, seed=3, shuffle_window=2, pack=pack)
    ref = _reference_concat(dataset, 3, 0, 2, 0)
    for key in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(_stack(got, key), ref[key]), key
        assert got[0][key].dtype == np.int64 and got[0][key].shape == (5, L)
    at = 0
    for b in got:  # cu_seqlens: the reference's segment starts, per batch, 0 .. B*L
        n = b["input_ids"].size
        want = [s - at for s in ref["starts"] if at <= s < at + n] + [n]
        assert b["cu_seqlens"].dtype == np.int32 and b["cu_seqlens"].tolist() == want
        assert b["max_seqlen"] == int(np.diff(want).max())
        at += n


@pytest.mark.parametrize("mode", ["concat", "bin"])
def test_every_token_once_and_positions_count_within_documents(dataset: Any, mode: str) -> None:
    docs = _docs()
    got = _all(
        dataset,
        batch_size=4,
        shuffle=True,
        seed=1,
        pack={"column": "tokens", "seq_len": L, "mode": mode},
    )
    ids, labels, pos = (_stack(got, k) for k in ("input_ids", "labels", "position_ids"))
    real = ids != 0  # pad_id 0 is no token here (tokens start at 1)
    tokens = np.sort(ids[real])
    assert np.array_equal(tokens, np.concatenate(docs))
    doc_start = {int(d[0]): int(d[0]) for d in docs if len(d)}
    starts = np.array(sorted(doc_start))
    first = starts[np.searchsorted(starts, ids[real], side="right") - 1]
    assert np.array_equal(pos[real], ids[real] - first)
    # labels: the tokens except each segment's first (a row start or a document start)
    seg_first = np.ones_like(real)
    seg_first[:, 1:] = ids[:, 1:] != ids[:, :-1] + 1  # not the next token of one document
    assert np.all(labels[real & ~seg_first] == ids[real & ~seg_first])
    assert np.all(labels[~real | seg_first] == -100)
    if mode == "bin":  # a document of at most L tokens is never split
        for row in ids:
            for d in docs:
                if 0 < len(d) <= L and np.isin(d, row).any():
                    assert np.isin(d, row).all()
    else:  # only the epoch's last row is padded
        assert np.all(real[:-1])


def test_the_same_rows_on_any_world_size(dataset: Any) -> None:
    pack = {"column": "tokens", "seq_len": L, "mode": "bin"}
    one = _all(dataset, batch_size=3, shuffle=True, seed=5, pack=pack)
    for world in (2, 3):
        for rank in range(world):
            mine = _all(
                dataset,
                batch_size=3,
                shuffle=True,
                seed=5,
                pack=pack,
                rank=rank,
                world_size=world,
                even_batches=False,
            )
            want = one[rank::world]
            assert len(mine) == len(want)
            for a, b in zip(mine, want):
                assert all(np.array_equal(a[k], b[k]) for k in a)


def test_even_batches_pad_the_last_round_with_whole_masked_rows(dataset: Any) -> None:
    pack = {"column": "tokens", "seq_len": L}
    one = np.concatenate([b["input_ids"] for b in _all(dataset, batch_size=4, pack=pack)])
    n = len(one)
    world = next(w for w in (3, 5, 7, 2) if ((n - 1) % (4 * w) + 1) % w)  # needs padding
    per_rank = [
        _all(dataset, batch_size=4, pack=pack, rank=r, world_size=world, pad_mask=True)
        for r in range(world)
    ]
    assert len({len(b) for b in per_rank}) == 1
    real, repeats = [], []
    for batches in per_rank:
        for b in batches:
            assert b["cu_seqlens"][-1] == b["input_ids"].size
            real.append(b["input_ids"][~b["pad_mask"]])
            repeats.append(b["input_ids"][b["pad_mask"]])
            assert np.all(b["labels"][b["pad_mask"]] == -100)
    assert sorted(map(tuple, np.concatenate(real))) == sorted(map(tuple, one))
    padded = np.concatenate(repeats)
    assert 0 < len(padded) < world and np.array_equal(padded, one[: len(padded)])


def test_torch_resumes_at_the_token_on_another_world_size(dataset: Any) -> None:
    pack = {"column": "tokens", "seq_len": L}
    full = dataset.to_torch(batch_size=4, shuffle=True, seed=2, pack=pack)
    rows = np.concatenate([b["input_ids"].numpy() for b in full])
    assert len(full) * 4 >= len(rows) > (len(full) - 1) * 4
    first = dataset.to_torch(batch_size=4, shuffle=True, seed=2, pack=pack)
    it = iter(first)
    seen = [next(it)["input_ids"].numpy() for _ in range(3)]
    state = first.state_dict()
    assert state["pack"]["rows"] == 12 and state["consumed"] == 0
    import pickle

    state = pickle.loads(pickle.dumps(state))
    rest = []
    for rank in range(2):
        again = dataset.to_torch(
            batch_size=4,
            shuffle=True,
            seed=2,
            pack=pack,
            rank=rank,
            world_size=2,
            even_batches=False,
        )
        again.load_state_dict(state)
        rest.append([b["input_ids"].numpy() for b in again])
    merged = [b for pair in zip(rest[0], rest[1] + [None]) for b in pair if b is not None]
    assert np.array_equal(np.concatenate(seen + merged), rows)
    # the resumed rows continue a document cut at the row end (positions do not restart)
    positions = np.concatenate([b["position_ids"].numpy() for b in full])
    assert positions[12, 0] > 0 or positions[12:, 0].max() > 0


def test_a_finished_pass_moves_to_the_next_epoch_and_stats_report_fill(dataset: Any) -> None:
    loader = dataset.to_torch(
        batch_size=8, shuffle=True, pack={"column": "tokens", "seq_len": L, "mode": "bin"}
    )
    a = [b["input_ids"] for b in loader]
    stats = loader.stats()
    real = sum(int((b != 0).sum()) for b in a)
    slots = sum(b.numel() for b in a)
    assert stats["tokens"] == real and stats["fill"] == pytest.approx(real / slots)
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["pack"]["rows"] == 0
    b = [x["input_ids"] for x in loader]
    assert not all(x.shape == y.shape and bool((x == y).all()) for x, y in zip(a, b))


def test_workers_give_the_batches_of_one_process(dataset: Any) -> None:
    from spark_dl_core import PackSpec

    pack = PackSpec(column="tokens", seq_len=L, mode="bin")
    plain = list(dataset.to_torch(batch_size=4, shuffle=True, seed=9, pack=pack))
    workers = list(dataset.to_torch(batch_size=4, shuffle=True, seed=9, pack=pack, num_workers=2))
    assert len(plain) == len(workers)
    for a, b in zip(plain, workers):
        assert all((a[k] == b[k]) if k == "max_seqlen" else bool((a[k] == b[k]).all()) for k in a)


def test_workers_give_each_rank_its_batches_with_the_padded_last_round(dataset: Any) -> None:
    """Workers send batches in their compact form: with ranks, an even (padded) last round
    and ``pad_mask``, each rank's batches equal one process's, masks and labels too."""
    pack = {"column": "tokens", "seq_len": L, "mode": "concat", "pad_id": 5}
    padded = False
    for batch_size, rank in [(b, r) for b in (3, 4, 5) for r in range(2)]:
        kw = dict(batch_size=batch_size, shuffle=True, seed=2, pack=pack, rank=rank)
        kw |= dict(world_size=2, even_batches=True, pad_mask=True)
        plain = list(dataset.to_torch(**kw))
        workers = list(dataset.to_torch(**kw, num_workers=2))
        assert len(plain) == len(workers)
        padded |= any(bool(b["pad_mask"].any()) for b in plain)
        for a, b in zip(plain, workers):
            assert a.keys() == b.keys()
            for k in a:
                assert (a[k] == b[k]) if k == "max_seqlen" else bool((a[k] == b[k]).all()), k
    assert padded  # some last round was padded with repeated rows


def test_drop_last_gives_every_rank_the_same_steps(dataset: Any) -> None:
    pack = {"column": "tokens", "seq_len": L}
    lens = [
        len(dataset.to_torch(batch_size=7, pack=pack, rank=r, world_size=3, drop_last=True))
        for r in range(3)
    ]
    assert len(set(lens)) == 1
    got = list(dataset.to_torch(batch_size=7, pack=pack, rank=2, world_size=3, drop_last=True))
    assert len(got) == lens[2] and all(b["input_ids"].shape == (7, L) for b in got)


def test_tf_yields_the_torch_tensors(dataset: Any) -> None:
    pack = {"column": "tokens", "seq_len": L, "mode": "bin"}
    torch_batches = list(dataset.to_torch(batch_size=6, shuffle=True, seed=4, pack=pack))
    tfds = dataset.to_tf(batch_size=6, shuffle=True, seed=4, pack=pack)
    tf_batches = list(tfds)
    assert len(tf_batches) == len(torch_batches)
    for a, b in zip(torch_batches, tf_batches):
        for k in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            assert b[k].dtype.name == str(a[k].dtype).removeprefix("torch.")
            assert np.array_equal(b[k].numpy(), a[k].numpy())
        assert int(b["max_seqlen"]) == a["max_seqlen"]
    state = tfds.state_dict(2)
    loader = dataset.to_torch(batch_size=6, shuffle=True, seed=4, pack=pack)
    loader.load_state_dict(state)
    assert np.array_equal(
        next(iter(loader))["input_ids"].numpy(), tf_batches[2]["input_ids"].numpy()
    )


def test_bad_pack_settings_are_refused_naming_the_field(dataset: Any, tmp_path: Path) -> None:
    def refused(field: str, **kw: Any) -> None:
        with pytest.raises(PackError) as err:
            list(dataset.iter_batches(batch_size=2, **kw))
        assert err.value.field == field and field.split(".")[-1] in str(err.value)

    refused("seq_len", pack={"column": "tokens", "seq_len": 0})
    refused("mode", pack={"column": "tokens", "seq_len": 8, "mode": "greedy"})
    refused("column", pack={"column": "nope", "seq_len": 8})
    refused("columns", pack={"column": "tokens", "seq_len": 8}, columns=["tokens"])
    other = str(tmp_path / "other")
    write_mds(
        pa.table({"x": pa.array([[0.5, 1.0], [2.0]], pa.list_(pa.float32())), "s": ["a", "b"]}),
        other,
    )
    ds = open_dataset(other)
    for column in ("x", "s"):
        with pytest.raises(PackError, match=repr(column)) as err:
            list(ds.iter_batches(pack={"column": column, "seq_len": 8}))
        assert err.value.field == "column"


def test_states_from_other_settings_are_refused(dataset: Any) -> None:
    pack = {"column": "tokens", "seq_len": L}
    loader = dataset.to_torch(batch_size=4, pack=pack)
    next(iter(loader))
    state = loader.state_dict()
    other = dataset.to_torch(batch_size=4, pack={**pack, "seq_len": 16})
    with pytest.raises(PackError) as err:
        other.load_state_dict(state)
    assert err.value.field == "pack.seq_len"
    plain = dataset.to_torch(batch_size=4)
    with pytest.raises(PackError, match="pack"):
        plain.load_state_dict(state)
    next(iter(plain))
    with pytest.raises(PackError, match="no pack position"):
        loader.load_state_dict(plain.state_dict())


def test_pad_id_colliding_with_a_real_token_is_refused(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        ["some text to learn from"] * 20,
        trainers.BpeTrainer(vocab_size=260, special_tokens=["<pad>", "</s>"]),
    )
    tok.save(str(tmp_path / "tok.json"))
    op = {
        "op": "tokenize",
        "column": "text",
        "tokenizer": str(tmp_path / "tok.json"),
        "eos_token": "</s>",
    }
    write_mds(
        pa.table({"text": ["some text", "to learn"]}),
        str(tmp_path / "ds"),
        DatasetSpec(transforms=[op]),
    )
    ds = open_dataset(str(tmp_path / "ds"))
    with pytest.raises(PackError) as err:
        list(ds.iter_batches(pack={"column": "tokens", "seq_len": 8, "pad_id": 5}))
    assert err.value.field == "pad_id" and "pad_id=5" in str(err.value)
    eos = tok.token_to_id("</s>")
    batch = next(ds.iter_batches(batch_size=4, pack={"column": "tokens", "seq_len": 64}))
    assert batch["input_ids"][0, -1] == eos  # padded with the eos id by default
    assert batch["labels"][0, -1] == -100
    padded = next(
        ds.iter_batches(batch_size=4, pack={"column": "tokens", "seq_len": 64, "pad_id": 300})
    )
    assert padded["input_ids"][0, -1] == 300


def test_a_mixture_packs_like_a_dataset(tmp_path: Path) -> None:
    from spark_dl_core import Source, mix

    for name, seed in (("a", 1), ("b", 2)):
        docs = _docs(120, seed)
        table = pa.table({"tokens": pa.array([d.tolist() for d in docs], pa.list_(pa.int32()))})
        write_mds(table, str(tmp_path / name), DatasetSpec(shard_size="2KiB"))
    sources = [Source(str(tmp_path / n), proportion=0.5) for n in ("a", "b")]
    m = mix(sources, epoch_size=200)
    pack = {"column": "tokens", "seq_len": L, "mode": "bin"}
    loader = m.to_torch(batch_size=4, shuffle=True, seed=3, pack=pack)
    n = len(loader)  # the epoch's length first, then the pass
    whole = [b["input_ids"].numpy() for b in loader]
    assert len(whole) == n
    ranks = [
        list(m.iter_batches(batch_size=4, shuffle=True, seed=3, pack=pack, rank=r, world_size=2))
        for r in range(2)
    ]
    assert len(ranks[0]) == len(ranks[1])
    for r in range(2):
        for got, want in zip(ranks[r], whole[r::2]):
            assert np.array_equal(got["input_ids"], want)


def _reference_best_fit(lengths: list[int], seq_len: int, window: int) -> list[tuple[int, ...]]:
    """Best fit the plain way: per document, its whole rows, then the open row with the least
    room that holds the rest (equal room: the older row), else a new row; open rows are
    forgotten every ``window`` documents. Segments (row, col, doc, tok, length) by row, col."""
    segments, opened = [], 0
    for begin in range(0, len(lengths), window):
        room: dict[int, int] = {}  # row -> free tokens
        for d in range(begin, min(len(lengths), begin + window)):
            tok = 0
            while lengths[d] - tok >= seq_len:
                segments.append((opened, 0, d, tok, seq_len))
                opened, tok = opened + 1, tok + seq_len
            rest = lengths[d] - tok
            if not rest:
                continue
            fits = [(free, row) for row, free in room.items() if free >= rest]
            if fits:
                free, row = min(fits)
            else:
                free, row, opened = seq_len, opened, opened + 1
            segments.append((row, seq_len - free, d, tok, rest))
            room[row] = free - rest
    return sorted(segments)


def test_bin_packing_matches_a_plain_best_fit() -> None:
    from spark_dl_core.loaders.packed_epoch import pack_bin

    rng = np.random.default_rng(7)
    for case in range(200):
        seq_len = int(rng.integers(1, 200))
        n = int(rng.integers(0, 300))
        if case % 2:
            lengths = rng.integers(0, 3 * seq_len + 2, n)
        else:  # log-normal: mostly short documents, a few long ones
            lengths = np.clip(rng.lognormal(np.log(seq_len / 3 + 1), 1.0, n), 0, 5 * seq_len)
        lengths = lengths.astype(np.int64)
        window, row_at = int(rng.integers(1, 60)), int(rng.integers(0, 50))
        seg, rows = pack_bin(lengths, row_at, seq_len, window)
        want = _reference_best_fit(lengths.tolist(), seq_len, window)
        got = list(zip(seg.row - row_at, seg.col, seg.doc, seg.tok, seg.length))
        assert [tuple(int(v) for v in s) for s in got] == want, case
        assert rows == (max(s[0] for s in want) + 1 if want else 0)


def test_bin_resumes_at_the_row_on_another_world_size(dataset: Any) -> None:
    pack = {"column": "tokens", "seq_len": L, "mode": "bin", "window": 16}
    full = dataset.to_torch(batch_size=4, shuffle=True, seed=4, shuffle_window=2, pack=pack)
    rows = np.concatenate([b["input_ids"].numpy() for b in full])
    first = dataset.to_torch(batch_size=4, shuffle=True, seed=4, shuffle_window=2, pack=pack)
    it = iter(first)
    seen = [next(it)["input_ids"].numpy() for _ in range(7)]
    state = first.state_dict()
    rest = []
    for rank in range(3):
        again = dataset.to_torch(
            batch_size=4,
            shuffle=True,
            seed=4,
            shuffle_window=2,
            pack=pack,
            rank=rank,
            world_size=3,
            even_batches=False,
        )
        again.load_state_dict(state)
        rest.append([b["input_ids"].numpy() for b in again])
    merged = [b for k in range(len(rest[0])) for r in rest if k < len(r) for b in [r[k]]]
    assert np.array_equal(np.concatenate(seen + merged), rows)


@pytest.mark.parametrize(
    ("leaf", "bad", "named"),
    [
        (pa.uint64(), (1 << 63) + 5, str((1 << 63) + 5)),
        (pa.int32(), -7, "-7"),
        (pa.int64(), -100, "-100"),
    ],
    ids=["uint64-above-int64", "negative-int32", "negative-int64-is-ignore-index"],
)
def test_token_ids_that_int64_input_ids_cannot_hold_are_refused(
    tmp_path: Path, leaf: pa.DataType, bad: int, named: str
) -> None:
    """A uint64 id >= 2**63 used to wrap to a negative input id, a negative one passed through
    (and -100 reads as an ignored label): both are refused naming the column and the row."""
    docs = [[1, 2, 3], [4, 5, bad, 6], [7, 8]]
    path = str(tmp_path / "ds")
    write_mds(pa.table({"ids": pa.array(docs, pa.list_(leaf))}), path)
    ds = open_dataset(path)
    with pytest.raises(PackError) as err:
        list(ds.iter_batches(batch_size=1, pack={"column": "ids", "seq_len": 4, "pad_id": 0}))
    assert err.value.field == "column" and "'ids'" in str(err.value)
    assert named in str(err.value) and "row 1" in str(err.value)
    fine = [[1, 2, 3], [4, 5, 6], [(1 << 63) - 1 if leaf == pa.uint64() else 9]]
    write_mds(pa.table({"ids": pa.array(fine, pa.list_(leaf))}), str(tmp_path / "ok"))
    got = list(
        open_dataset(str(tmp_path / "ok")).iter_batches(
            batch_size=2, pack={"column": "ids", "seq_len": 4, "pad_id": 0}
        )
    )
    assert _stack(got, "input_ids").reshape(-1)[:7].tolist() == [x for d in fine for x in d]


def test_positions_are_checked(dataset: Any) -> None:
    """set_epoch(-1) / set_epoch("2") and state_dict steps outside the pass are refused."""
    pytest.importorskip("torch")
    from spark_dl_core.errors import SpecError

    pack = {"column": "tokens", "seq_len": L}
    loader = dataset.to_torch(batch_size=6, pack=pack)
    for bad in (-1, "2"):
        with pytest.raises(SpecError, match="set_epoch"):
            loader.set_epoch(bad)
    pytest.importorskip("tensorflow")
    tfds = dataset.to_tf(batch_size=6, pack=pack)
    batches = len(list(tfds))
    assert tfds.state_dict(batches)["epoch"] == 1
    for bad in (-1, batches + 1):
        with pytest.raises(SpecError, match=rf"state_dict\(steps={bad}\).*0 to {batches}"):
            tfds.state_dict(bad)


def _assembled(plan: Any, j: int, worker: int, workers: int) -> dict[str, Any]:
    """Batch ``j`` of ``plan``'s worker made row by row by ``assemble`` (the reference)."""
    from spark_dl_core.loaders.packed_rows import _until, assemble

    packing, B, W = plan.packing, plan.batch_size, plan.world_size
    a = plan.rows + (plan.rank + (worker + j * workers) * W) * B
    b = min(a + B, plan.total)
    chunks = list(_until(packing.chunks_from(a), b))
    pad = int(packing.pack.pad_id or 0)
    return assemble(chunks, a, b, packing.seq_len, pad, packing.pack.column)[0]


@pytest.mark.parametrize("mode", ["concat", "bin"])
@pytest.mark.parametrize(
    ("batch_size", "world", "workers", "rows", "stretch"),
    [(5, 1, 1, 0, 1 << 19), (3, 3, 2, 7, 1 << 19), (2, 2, 1, 11, 4 * L), (7, 1, 3, 0, 1)],
)
def test_stretches_make_the_rows_assemble_makes(
    dataset: Any,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    batch_size: int,
    world: int,
    workers: int,
    rows: int,
    stretch: int,
) -> None:
    """Batches are made several at a time (a stretch: tokens copied once per shard, segments
    placed in whole-array steps): the same arrays as ``assemble`` makes batch by batch, over
    block and shard boundaries, ranks, workers, a resumed position, and stretches of one
    batch to many."""
    from spark_dl_core.loaders import packed_rows, packing
    from spark_dl_core.loaders.settings import LoaderSettings

    monkeypatch.setattr(packed_rows, "STRETCH_TOKENS", stretch)
    pack = {"column": "tokens", "seq_len": L, "mode": mode, "pad_id": 7}
    settings = LoaderSettings(
        batch_size=batch_size,
        shuffle=True,
        seed=4,
        shuffle_window=2,
        pack=pack,
        even_batches=False,  # (the padded last round's repeats are assemble's own)
    )
    for rank in range(world):
        plan = packing.packed_plan(
            dataset, settings, epoch=1, rows=rows, rank=rank, world_size=world
        )
        for worker in range(workers):
            got = [batch for batch, _ in plan.batches(worker, workers)]
            # what a DataLoader worker sends: the compact form, pickled, widened on arrival
            sent = [
                packed_rows.widened(pickle.loads(pickle.dumps(batch)))
                for batch, _ in plan.batches(worker, workers, compact=True)
            ]
            assert got and len(sent) == len(got)
            for j, (batch, arrived) in enumerate(zip(got, sent)):
                want = _assembled(plan, j, worker, workers)
                assert batch.keys() == want.keys() == arrived.keys()
                for key, value in want.items():
                    for made in (batch, arrived):
                        assert np.array_equal(made[key], value), (key, j)
                        assert np.asarray(made[key]).dtype == np.asarray(value).dtype


def test_a_pad_id_beyond_the_stored_dtype_pads_rows(tmp_path: Path) -> None:
    """uint16 tokens padded with an id a uint16 cannot hold (the stretch widens its staged
    tokens first): the padding holds that id, masked in labels."""
    path = str(tmp_path / "ds")
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]]
    write_mds(pa.table({"ids": pa.array(docs, pa.list_(pa.uint16()))}), path)
    pack = {"column": "ids", "seq_len": 4, "mode": "bin", "pad_id": 70_000}
    got = list(open_dataset(path).iter_batches(batch_size=2, pack=pack))
    ids, labels = _stack(got, "input_ids"), _stack(got, "labels")
    real = np.isin(ids, np.arange(1, 11))
    assert sorted(ids[real].tolist()) == list(range(1, 11))
    assert np.all(ids[~real] == 70_000) and np.all(labels[~real] == -100)
    assert (~real).any() and ids.dtype == np.int64
