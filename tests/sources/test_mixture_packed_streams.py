"""Packed mixtures cut from streams (pack version 2): the mixture's own streams, each packing
its documents by their recorded lengths, so that a rank of a world size dividing them reads
only its share of every source, with every token once, a step's batches the same at every
world size, and a position resumed exactly at another; sources without recorded lengths,
and schedules in tokens, pack one run of rows as before."""

from __future__ import annotations

import json
import shutil
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
)

from spark_dl_core import DatasetSpec, Source, mix, write_mds
from spark_dl_core.errors import PackError
from spark_dl_core.format.index import META_FILE
from spark_dl_core.meta import meta_bytes

SIZES = {"web": 500, "code": 300}
BIN = PACK | {"mode": "bin"}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], list[np.ndarray]]:
    """Two token datasets whose tokens are unique over both (consecutive within a document,
    a gap between documents), some documents empty, some longer than a row."""
    root = tmp_path_factory.mktemp("mixpack")
    rng = np.random.default_rng(1)
    start, paths, docs = 1, {}, []
    for name, n in SIZES.items():
        mine = []
        for k in rng.integers(0, 100, size=n).tolist():
            mine.append(np.arange(start, start + k, dtype=np.int32))
            start += k + 1
        table = pa.table({"tokens": pa.array([d.tolist() for d in mine], pa.list_(pa.int32()))})
        write_mds(table, str(root / name), DatasetSpec(shard_size="2KiB"))
        paths[name] = str(root / name)
        docs += mine
    return paths, docs


def _mixture(paths: dict[str, str], **kw: Any) -> Any:
    """Each source at its size: every document once an epoch."""
    return mix([Source(paths[k], name=k) for k in SIZES], **kw)


@pytest.mark.parametrize("pack", [PACK, BIN], ids=["concat", "bin"])
def test_every_token_once_and_each_rank_reads_its_share(
    sources: tuple[dict[str, str], list[np.ndarray]], pack: dict[str, Any]
) -> None:
    paths, docs = sources
    m = _mixture(paths)
    settings = SETTINGS | {"pack": pack}
    one = list(m.iter_batches(**settings))
    check_whole_documents(one, docs, L)
    shards = len(m.shard_offsets) - 1
    for world in (2, 4):
        for locality in check_rank_batches(m.to_torch, one, world, settings):
            assert locality["streams"] == 4 and locality["streams_read"] == 4 // world
            assert abs(locality["data_share"] - 1 / world) < 0.03, locality
            # its streams' shards, a shard on a boundary of two streams' pieces, and the
            # last block (64 documents: 8 of these tiny shards) of a stream it takes a
            # batch of once the shortest ended; one run of rows reads all 98 on every rank
            assert locality["shards_touched"] <= shards / world + 20, locality


@pytest.mark.parametrize("pack", [PACK, BIN], ids=["concat", "bin"])
def test_resume_mid_epoch_at_another_world_size_is_exact(
    sources: tuple[dict[str, str], list[np.ndarray]], pack: dict[str, Any]
) -> None:
    m = _mixture(sources[0])
    settings = SETTINGS | {"pack": pack}
    check_resume_at_four_ranks(m.to_torch, list(m.iter_batches(**settings)), 9, settings)


def test_workers_give_the_batches_of_one_process(
    sources: tuple[dict[str, str], list[np.ndarray]],
) -> None:
    m = _mixture(sources[0])
    kw = SETTINGS | {"pack": BIN, "rank": 1, "world_size": 2, "even_batches": True}
    here = [b["input_ids"].numpy() for b in m.to_torch(**kw)]
    there = [b["input_ids"].numpy() for b in m.to_torch(**(kw | {"num_workers": 2}))]
    assert len(here) == len(there) > 0
    assert all(np.array_equal(a, b) for a, b in zip(here, there))


def test_a_schedule_in_samples_streams_and_one_in_tokens_packs_one_run(
    sources: tuple[dict[str, str], list[np.ndarray]],
) -> None:
    paths, _ = sources
    staged = _mixture(
        paths, epoch_size=600, schedule=[(0, {"web": 3, "code": 1}), (300, {"web": 1, "code": 1})]
    )
    settings = SETTINGS | {"pack": PACK}
    one = list(staged.iter_batches(**settings))
    localities = check_rank_batches(staged.to_torch, one, 2, settings)
    assert [x["streams_read"] for x in localities] == [2, 2]
    check_resume_at_four_ranks(staged.to_torch, one, len(one) // 3, settings)  # in stage 1
    tokens = _mixture(
        paths,
        epoch_size=600,
        schedule=[(0, {"web": 3, "code": 1}), ("20000 tokens", {"web": 1, "code": 1})],
    )
    loader = tokens.to_torch(**settings)
    list(loader)
    assert loader.stats()["locality"]["streams"] == 1


def _copy_without_lengths(path: str, out: Path) -> str:
    """A source as a writer before the lengths files wrote it."""
    shutil.copytree(path, out)
    meta = json.loads((out / META_FILE).read_text())
    for entry in meta["shards"]:
        entry.pop("lengths")
    del meta["digest"]
    (out / META_FILE).write_bytes(meta_bytes(meta))
    return str(out)


def test_a_source_without_recorded_lengths_packs_one_run(
    sources: tuple[dict[str, str], list[np.ndarray]], tmp_path: Path
) -> None:
    paths, docs = sources
    bare = _copy_without_lengths(paths["code"], tmp_path / "code")
    old = _mixture({"web": paths["web"], "code": bare})
    got = list(old.iter_batches(**(SETTINGS | {"pack": BIN})))
    want = list(_mixture(paths).iter_batches(**(SETTINGS | {"pack": BIN, "streams": 1})))
    assert len(got) == len(want)
    assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(got, want))
    check_whole_documents(got, docs, L)


def test_a_state_of_one_run_resumes_in_one_run(
    sources: tuple[dict[str, str], list[np.ndarray]],
) -> None:
    """A packed mixture's position saved before its rows were streamed (pack version 1)
    reads on in that one run of rows; a loader asking for streams explicitly is refused."""
    m = _mixture(sources[0])
    plain = m.to_torch(**(SETTINGS | {"streams": 1}))
    it = iter(plain)
    next(it)
    next(it)
    old = plain.state_dict()
    assert old["pack"]["version"] == 1
    want = [b["input_ids"].numpy() for b in it]
    auto = m.to_torch(**(SETTINGS | {"streams": 0}))
    auto.load_state_dict(old)
    assert all(np.array_equal(a, b["input_ids"].numpy()) for a, b in zip(want, auto, strict=True))
    with pytest.raises(PackError, match="streams=1"):
        m.to_torch(**SETTINGS).load_state_dict(old)


@pytest.mark.parametrize("batching", ["stratified", "per_source"])
def test_batched_mixtures_pack_in_streams_and_in_one_run(
    sources: tuple[dict[str, str], list[np.ndarray]], batching: str
) -> None:
    """A mixture that batches its sources orders documents for packing a document at a
    time (one run of rows raised SpecError here before: its batch size was 0)."""
    paths, docs = sources
    m = _mixture(paths, batching=batching)
    for streams in (1, 4):
        got = list(m.iter_batches(**(SETTINGS | {"streams": streams})))
        check_whole_documents(got, docs, L)
