"""Per-shard token counts recorded by the writer: a ``concat`` packed loader counts its
epoch's rows (``len``, even batches, the skip to a resumed row) without reading a shard,
gives the batches it gives when it reads them, and refuses counts that do not describe a
shard."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, open_dataset, write_mds
from spark_dl_core.errors import PackError
from spark_dl_core.format.doc_lengths import decode_lengths, encode_lengths
from spark_dl_core.format.index import META_FILE
from spark_dl_core.meta import lengths_info, meta_bytes

L = 32
PACK = {"column": "tokens", "seq_len": L, "pad_id": 0}


def _table(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 90, size=n)
    docs = [list(range(1, k + 1)) for k in lengths.tolist()]
    docs[3] = None  # a null document: no tokens
    tokens = pa.array(docs, pa.list_(pa.int32()))
    return pa.table({"tokens": tokens, "id": pa.array(np.arange(n), pa.int64())})


def _rewrite_meta(path: Path, edit: Any) -> None:
    """spark_dl.json with ``edit(meta)`` applied, sealed again."""
    meta = json.loads((path / META_FILE).read_text())
    edit(meta)
    del meta["digest"]
    (path / META_FILE).write_bytes(meta_bytes(meta))


def _strip(meta: dict[str, Any]) -> None:
    """As a writer before the per-shard records: neither totals nor per-row lengths."""
    for entry in meta["shards"]:
        entry.pop("values", None)
        entry.pop("lengths", None)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("counts") / "ds"
    write_mds(_table(500, 1), str(path), DatasetSpec(shard_size="2KiB", nulls="mask"))
    return path


def _copy(written: Path, tmp_path: Path, edit: Any = None) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(written, out)
    if edit is not None:
        _rewrite_meta(out, edit)
    return out


def test_the_writer_records_each_shards_tokens(written: Path) -> None:
    ds = open_dataset(str(written))
    recorded = ds.shard_values("tokens")
    assert recorded is not None and len(recorded) == ds.num_shards > 8
    offsets = ds.shard_offsets
    docs = next(iter(ds.iter_batches(batch_size=len(ds), columns=["tokens"])))["tokens"]
    lengths = np.array([len(d) for d in docs])
    for s in range(ds.num_shards):
        assert recorded[s] == lengths[offsets[s] : offsets[s + 1]].sum()
    assert recorded.sum() == sum(len(d or []) for d in _table(500, 1)["tokens"].to_pylist())
    assert ds.shard_values("id") is None  # not a list of integers
    # and each document's length, in a file beside its shard (a null document: 0)
    per_shard = ds.doc_lengths("tokens", range(ds.num_shards))
    assert per_shard is not None
    want = [len(d or []) for d in _table(500, 1)["tokens"].to_pylist()]
    assert np.concatenate(per_shard).tolist() == want
    assert ds.doc_lengths("id", [0]) is None


def test_an_append_keeps_the_earlier_shards_counts(tmp_path: Path) -> None:
    path = str(tmp_path / "ds")
    spec = DatasetSpec(shard_size="2KiB", nulls="mask")
    write_mds(_table(200, 2), path, spec)
    write_mds(_table(150, 3), path, spec, mode="append")
    ds = open_dataset(path)
    recorded = ds.shard_values("tokens")
    assert recorded is not None and len(recorded) == ds.num_shards
    total = sum(
        len(d or []) for t in (_table(200, 2), _table(150, 3)) for d in t["tokens"].to_pylist()
    )
    assert recorded.sum() == total
    lengths = ds.doc_lengths("tokens", range(ds.num_shards))
    assert lengths is not None and int(np.concatenate(lengths).sum()) == total


@pytest.mark.parametrize("shuffle", [True, False])
def test_len_reads_no_shard_and_batches_equal_the_reading_loaders(
    written: Path, tmp_path: Path, shuffle: bool
) -> None:
    """With the shard files gone, ``len`` still counts (no shard is read); the batches of a
    loader counting from the records equal those of one reading every shard's lengths."""
    kw: dict[str, Any] = {"batch_size": 3, "shuffle": shuffle, "seed": 5, "shuffle_window": 3}
    read = open_dataset(str(_copy(written, tmp_path / "a", _strip)))
    assert read.shard_values("tokens") is None
    blind_path = _copy(written, tmp_path / "b")
    blind = open_dataset(str(blind_path))
    for f in blind_path.glob("*.mds*"):
        f.unlink()
    for world, extra in ((1, {}), (2, {"drop_last": True}), (4, {"even_batches": True})):
        for rank in range(world):
            opts = kw | extra | {"pack": PACK, "rank": rank, "world_size": world}
            counted = blind.to_torch(**opts)
            reading = read.to_torch(**opts)
            assert len(counted) == len(reading) > 0
            assert counted.stats()["token_counts"] == "recorded"
            assert reading.stats()["token_counts"] == "read"
    whole = _copy(written, tmp_path / "c")
    mine = open_dataset(str(whole)).to_torch(pack=PACK, world_size=2, rank=1, drop_last=True, **kw)
    theirs = read.to_torch(pack=PACK, world_size=2, rank=1, drop_last=True, **kw)
    for a, b in zip(mine, theirs, strict=True):
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            assert np.array_equal(a[key].numpy(), b[key].numpy())


def test_a_resumed_loader_skips_to_its_row_by_the_counts(written: Path, tmp_path: Path) -> None:
    """A state deep in the epoch resumes at its token, equal to the uninterrupted pass."""
    kw: dict[str, Any] = {"batch_size": 2, "shuffle": True, "seed": 3, "shuffle_window": 2}
    ds = open_dataset(str(written))
    rows = np.concatenate([b["input_ids"].numpy() for b in ds.to_torch(pack=PACK, **kw)])
    first = ds.to_torch(pack=PACK, **kw)
    it = iter(first)
    steps = len(first) * 3 // 4
    for _ in range(steps):
        next(it)
    state = first.state_dict()
    again = open_dataset(str(written)).to_torch(pack=PACK, **kw)
    again.load_state_dict(state)
    rest = np.concatenate([b["input_ids"].numpy() for b in again])
    assert np.array_equal(rest, rows[steps * 2 :])
    assert again.stats()["token_counts"] == "recorded"
    tfds = open_dataset(str(written)).to_tf(pack=PACK, **kw)
    assert tfds.stats()["token_counts"] == "recorded"
    assert len(list(tfds)) == len(first)


def test_counts_that_do_not_describe_a_shard_are_refused(written: Path, tmp_path: Path) -> None:
    def wrong(meta: dict[str, Any]) -> None:
        meta["shards"][0]["values"]["tokens"] += 1

    path = _copy(written, tmp_path, wrong)
    loader = open_dataset(str(path)).to_torch(batch_size=4, shuffle=False, pack=PACK)
    with pytest.raises(PackError, match=r"shard '.*00000\.mds'.*records") as info:
        list(loader)
    assert info.value.field == "column"


def test_verify_compares_each_lengths_file_with_its_shard(written: Path, tmp_path: Path) -> None:
    """``spark-dl verify`` checks every lengths file against its shard's rows; one whose
    lengths were swapped (its hash updated) is named."""
    from spark_dl.cli.verify import _checked_summary, verify

    results, problems = verify(str(written))
    assert problems == [] and all(r["lengths_checked"] for r in results)
    assert f"lengths files {len(results)}/{len(results)}" in _checked_summary(results)

    def swap(meta: dict[str, Any]) -> None:
        shard = meta["shards"][1]
        info = lengths_info(shard)
        assert info is not None
        file = tmp_path / "a" / "copy" / info.basename
        got = decode_lengths(file.read_bytes(), info, ["tokens"], shard["samples"], str(file))
        lengths = got["tokens"][::-1].copy()
        data, new = encode_lengths(info.basename, {"tokens": lengths})
        file.write_bytes(data)
        shard["lengths"] = new.to_json()

    copy = _copy(written, tmp_path / "a", swap)
    results, problems = verify(str(copy))
    assert [p["file"].rsplit("/", 1)[-1] for p in problems] == [results[1]["file"]]
    assert "lengths file" in problems[0]["error"]
