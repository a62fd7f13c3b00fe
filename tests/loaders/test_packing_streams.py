"""Packed rows cut from streams (pack version 2): every token once per epoch, each rank of
a world size dividing the streams reads only its streams' shards, a step's batches are the
same at every world size, and a position resumes exactly at another world size."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from packing_helpers import (
    PACK,
    SETTINGS,
    L,
    check_rank_batches,
    check_resume_at_four_ranks,
    check_whole_documents,
    token_ids,
)

from spark_dl_core import DatasetSpec, open_dataset, write_mds
from spark_dl_core.errors import DatasetError, PackError
from spark_dl_core.format.doc_lengths import decode_lengths, encode_lengths
from spark_dl_core.format.index import META_FILE, FileInfo
from spark_dl_core.loaders import packed_streams as packed_streams_module
from spark_dl_core.loaders.packed_streams import packed_streams
from spark_dl_core.loaders.settings import LoaderSettings
from spark_dl_core.meta import meta_bytes
from spark_dl_core.order.token_streams import StreamRounds, weighted_streams


def _docs(n: int = 700, seed: int = 1, top: int = 120) -> list[np.ndarray]:
    """Documents of consecutive tokens, unique over the dataset (a gap between documents),
    so each token names its document and its place in it; some empty, some over a row."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, top, size=n)
    starts = np.cumsum(lengths + 1) - lengths
    return [np.arange(s, s + k, dtype=np.int32) + 1 for s, k in zip(starts, lengths)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = str(tmp_path_factory.mktemp("pack_streams") / "ds")
    table = pa.table({"tokens": pa.array([d.tolist() for d in _docs()], pa.list_(pa.int32()))})
    write_mds(table, path, DatasetSpec(shard_size="2KiB"))
    ds = open_dataset(path)
    assert ds.num_shards > 64 and ds.shard_values("tokens") is not None
    return ds


def _batches(ds: Any, **kw: Any) -> list[dict[str, Any]]:
    return list(ds.iter_batches(**(SETTINGS | kw)))


def test_every_token_once_with_positions_labels_and_segments(dataset: Any) -> None:
    got = _batches(dataset)
    check_whole_documents(got, _docs(), L)
    ids = token_ids(got)
    assert (ids == 0).sum() < 4 * L  # each of the 4 streams pads its last row only


@pytest.mark.parametrize("world", [2, 4])
def test_a_steps_batches_are_the_one_rank_batches_and_ranks_read_their_share(
    dataset: Any, world: int
) -> None:
    for locality in check_rank_batches(dataset.to_torch, _batches(dataset), world, SETTINGS):
        assert locality["streams"] == 4 and locality["streams_read"] == 4 // world
        assert abs(locality["data_share"] - 1 / world) < 0.05
        # its streams' shards, and at most a window's at the other streams' ends
        assert locality["shards_touched"] <= dataset.num_shards / world + 6, locality


def test_resume_mid_epoch_at_another_world_size_is_exact(dataset: Any) -> None:
    check_resume_at_four_ranks(dataset.to_torch, _batches(dataset), 7, SETTINGS)


@pytest.mark.parametrize("mode", ["concat", "bin"])
def test_workers_give_the_batches_of_one_process(dataset: Any, mode: str) -> None:
    kw = SETTINGS | {"rank": 1, "world_size": 2, "even_batches": True, "pad_mask": True}
    kw["pack"] = PACK | {"mode": mode}
    here = [b for b in dataset.to_torch(**kw)]
    there = [b for b in dataset.to_torch(**(kw | {"num_workers": 2}))]
    assert len(here) == len(there) > 0
    for a, b in zip(here, there):
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens", "pad_mask"):
            assert np.array_equal(a[key].numpy(), b[key].numpy()), key


def test_even_batches_and_drop_last_give_every_rank_the_same_steps(dataset: Any) -> None:
    one = _batches(dataset)
    world = 3  # shares no divisor with the 4 streams: correct, less local
    even = [
        list(
            dataset.to_torch(
                **(
                    SETTINGS
                    | {"rank": r, "world_size": world, "even_batches": True, "pad_mask": True}
                )
            )
        )
        for r in range(world)
    ]
    assert len({len(e) for e in even}) == 1 and len(even[0]) * world >= len(one)
    served = np.concatenate(
        [b["input_ids"].numpy().reshape(-1) for e in even for b in e if not b["pad_mask"].any()]
    )
    assert np.array_equal(np.sort(served), np.sort(token_ids(one)))
    for e in even:
        for b in e:
            if b["pad_mask"].any():
                assert (b["labels"].numpy() == -100).all()
    dropped = [
        len(dataset.to_torch(**(SETTINGS | {"rank": r, "world_size": world, "drop_last": True})))
        for r in range(world)
    ]
    assert len(set(dropped)) == 1
    full = _batches(dataset, drop_last=True)
    assert all(b["input_ids"].shape == (4, L) for b in full) and len(full) >= dropped[0] * world


def test_old_states_keep_one_run_and_other_settings_are_refused(
    dataset: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(packed_streams_module, "MIN_STREAM_ROWS", 1)  # automatic: 4 streams
    assert packed_streams(dataset, LoaderSettings(batch_size=4, shuffle=True, pack=PACK)) == 4
    plain = dataset.to_torch(**(SETTINGS | {"streams": 1}))
    it = iter(plain)
    next(it)
    next(it)
    old = plain.state_dict()
    assert old["pack"]["version"] == 1 and old["pack"]["rows"] == 8
    want = [b["input_ids"].numpy() for b in it]
    auto = dataset.to_torch(**(SETTINGS | {"streams": 0}))
    auto.load_state_dict(old)  # a version 1 position reads on in one run of rows
    assert auto.settings.streams == 1
    assert all(np.array_equal(a, b["input_ids"].numpy()) for a, b in zip(want, auto, strict=True))
    with pytest.raises(PackError, match="streams=1") as info:
        dataset.to_torch(**SETTINGS).load_state_dict(old)
    assert info.value.field == "streams"
    new = dataset.to_torch(**SETTINGS)
    next(iter(new))
    state = new.state_dict()
    with pytest.raises(PackError, match="batch_size=4") as info:
        dataset.to_torch(**(SETTINGS | {"batch_size": 8})).load_state_dict(state)
    assert info.value.field == "batch_size"
    with pytest.raises(PackError, match="streams=4"):
        dataset.to_torch(**(SETTINGS | {"streams": 2})).load_state_dict(state)
    # 2 packed streams shuffle windows of 4 // 2 shards, not 7 // 2 (the sample order's
    # 4 automatic streams take both as windows of 1 shard)
    two = SETTINGS | {"streams": 2}
    saver = dataset.to_torch(**two)
    next(iter(saver))
    with pytest.raises(PackError, match="shuffle_window=4") as info:
        dataset.to_torch(**(two | {"shuffle_window": 7})).load_state_dict(saver.state_dict())
    assert info.value.field == "shuffle_window"


def test_automatic_streams_need_enough_rows_per_stream(dataset: Any) -> None:
    auto = LoaderSettings(batch_size=4, shuffle=True, pack=PACK)
    assert packed_streams(dataset, auto) == 1  # ~1,300 rows: under 1,024 a stream
    assert packed_streams(dataset, auto.replace(streams=8)) == 8
    assert packed_streams(dataset, auto.replace(streams=8, shuffle=False)) == 1
    binned = auto.replace(streams=8, pack=PACK | {"mode": "bin"})
    assert packed_streams(dataset, binned) == 8  # every document's length is recorded


def test_streams_balance_tokens_and_rounds_skip_streams_that_ran_out() -> None:
    weights = np.random.default_rng(0).integers(0, 500, size=50)
    of = weighted_streams(weights, "fp", 3, 4)
    sums = np.bincount(of, weights=weights, minlength=4)
    assert sums.max() - sums.min() <= 2 * weights.max()
    assert np.array_equal(of, weighted_streams(weights, "fp", 3, 4))  # fixed for the seed
    for counts in ([3, 5, 4, 4], [0, 2, 1], [2, 2, 2], [7]):
        rounds = StreamRounds(np.array(counts))
        stream, k = rounds.locate(np.arange(rounds.total))
        want = [(s, r) for r in range(max(counts)) for s in range(len(counts)) if counts[s] > r]
        assert list(zip(stream.tolist(), k.tolist())) == want


def test_tf_yields_the_streamed_batches_and_reports_locality(dataset: Any) -> None:
    pytest.importorskip("tensorflow")
    one = _batches(dataset)
    tfds = dataset.to_tf(**(SETTINGS | {"rank": 1, "world_size": 2, "even_batches": False}))
    got = [b["input_ids"].numpy() for b in tfds]
    assert len(got) == len(one[1::2])
    assert all(np.array_equal(a, b["input_ids"]) for a, b in zip(got, one[1::2]))
    locality = tfds.stats()["locality"]
    assert locality["streams_read"] == 2
    assert locality["shards_touched"] <= dataset.num_shards / 2 + 6


def test_the_streams_of_pack_version_2_are_pinned() -> None:
    """Saved positions count batches of these streams: a change here is a new pack version."""
    weights = np.array([5, 9, 9, 3, 0, 7, 7, 2, 8, 1])
    assert weighted_streams(weights, "pinned", 7, 3).tolist() == [1, 0, 1, 1, 0, 0, 2, 2, 2, 0]


# --------------------------------------------------------------------------- bin over streams

BIN = SETTINGS | {"pack": PACK | {"mode": "bin"}}


def _copy(dataset: Any, tmp_path: Path, edit: Callable[[dict[str, Any], Path], None]) -> Any:
    """A copy of the dataset with ``edit(meta, path)`` applied, ``spark_dl.json`` sealed again."""
    out = tmp_path / "copy"
    shutil.copytree(dataset.path, out)
    meta = json.loads((out / META_FILE).read_text())
    edit(meta, out)
    del meta["digest"]
    (out / META_FILE).write_bytes(meta_bytes(meta))
    return open_dataset(str(out))


def test_bin_rows_from_streams_keep_short_documents_whole_and_every_token_once(
    dataset: Any,
) -> None:
    got = _batches(dataset, **BIN)
    check_whole_documents(got, _docs(), L)
    flat = token_ids(got)
    order = np.argsort(flat, kind="stable")
    row_of = order // L  # the row each token (sorted) was served in
    for d in _docs():
        if 0 < len(d) <= L:  # best fit never splits a document that fits a row
            at = np.searchsorted(flat[order], [d[0], d[-1]])
            assert row_of[at[0]] == row_of[at[1]], d[0]
    # best fit shares rows: fewer than if no two documents shared one, more than concat
    rows = sum(len(b["input_ids"]) for b in got)
    assert sum(len(b["input_ids"]) for b in _batches(dataset)) <= rows
    assert rows < sum(-(-len(d) // L) for d in _docs())


@pytest.mark.parametrize("world", [2, 4])
def test_bin_steps_are_the_one_rank_batches_and_ranks_read_their_share(
    dataset: Any, world: int
) -> None:
    """Every rank counts every stream's rows from the recorded lengths (no shard read), and
    reads only its own streams' shards."""
    for locality in check_rank_batches(dataset.to_torch, _batches(dataset, **BIN), world, BIN):
        assert locality["streams"] == 4 and locality["streams_read"] == 4 // world
        assert locality["shards_touched"] <= dataset.num_shards / world + 6, locality


def test_bin_resume_mid_epoch_at_another_world_size_is_exact(dataset: Any) -> None:
    check_resume_at_four_ranks(dataset.to_torch, _batches(dataset, **BIN), 7, BIN)


def test_bin_rows_are_counted_without_a_shard(dataset: Any, tmp_path: Path) -> None:
    blind = _copy(dataset, tmp_path, lambda meta, path: None)
    for shard in Path(blind.path).glob("*.mds"):
        shard.unlink()  # the lengths files stay
    kw = BIN | {"rank": 1, "world_size": 2, "even_batches": False}
    assert len(blind.to_torch(**kw)) == len(dataset.to_torch(**kw)) > 0
    assert blind.to_torch(**kw).stats()["token_counts"] == "recorded"


def test_bin_without_recorded_lengths_packs_one_run(dataset: Any, tmp_path: Path) -> None:
    """A dataset written before the lengths files (or by another tool): ``bin`` rows are
    packed in one run, as before, and ``stats()`` says every rank reads every stream."""

    def strip(meta: dict[str, Any], path: Path) -> None:
        for entry in meta["shards"]:
            entry.pop("lengths")

    old = _copy(dataset, tmp_path, strip)
    assert old.doc_lengths("tokens", [0]) is None
    got = _batches(old, **BIN)
    want = _batches(dataset, **(BIN | {"streams": 1}))
    assert len(got) == len(want) and all(
        np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(got, want)
    )
    loader = old.to_torch(**(BIN | {"rank": 0, "world_size": 2}))
    list(loader)
    assert loader.stats()["locality"]["streams"] == 1


def _edit_lengths(swap: bool) -> Callable[[dict[str, Any], Path], None]:
    """Shard 0's lengths file with two of its lengths swapped (same total) and its entry
    updated (``swap``), or with a byte flipped and its entry left as it was (corrupted)."""

    def edit(meta: dict[str, Any], path: Path) -> None:
        shard = meta["shards"][0]
        entry = shard["lengths"]
        file = path / entry["basename"]
        if not swap:
            data = bytearray(file.read_bytes())
            data[-1] ^= 0xFF
            file.write_bytes(bytes(data))
            return
        info = FileInfo(entry["basename"], entry["bytes"], entry["hashes"])
        got = decode_lengths(file.read_bytes(), info, ["tokens"], shard["samples"], str(file))
        lengths = got["tokens"].copy()
        a, b = np.flatnonzero(lengths != lengths[0])[0], 0
        lengths[[a, b]] = lengths[[b, a]]
        data, info = encode_lengths(entry["basename"], {"tokens": lengths})
        file.write_bytes(data)
        shard["lengths"] = info.to_json()

    return edit


def test_a_lengths_file_other_than_its_shard_is_refused(dataset: Any, tmp_path: Path) -> None:
    lying = _copy(dataset, tmp_path, _edit_lengths(swap=True))
    with pytest.raises(PackError, match=r"shard\.00000\.mds.*other lengths") as info:
        _batches(lying, **BIN)
    assert info.value.field == "column"


def test_a_corrupted_lengths_file_is_refused_naming_it(dataset: Any, tmp_path: Path) -> None:
    broken = _copy(dataset, tmp_path, _edit_lengths(swap=False))
    with pytest.raises(DatasetError, match=r"shard\.00000\.mds\.lengths.*corrupted"):
        _batches(broken, **BIN)
