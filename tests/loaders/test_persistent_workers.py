"""Persistent DataLoader workers (``persistent_workers=True``, the default): the same worker
processes serve every pass, and every pass yields exactly the batches that workers started
per pass (``persistent_workers=False``) yield: epochs, ``set_epoch`` jumps, early exits and
mid-epoch resume into the same loader and a fresh one."""

from __future__ import annotations

import gc
import io
import time
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pytest
from PIL import Image

torch = pytest.importorskip("torch")

from spark_dl_core import DatasetSpec, open_dataset, write_mds  # noqa: E402

N = 1500


def _workers() -> set[int]:
    """PIDs of this process's children (DataLoader workers among them)."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _canon(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch as comparable plain values (ids, values, pixels, strings, pad masks)."""
    out: dict[str, Any] = {}
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            out[name] = (tuple(value.shape), str(value.dtype), value.numpy().tobytes())
        elif isinstance(value, int):  # a packed batch's max_seqlen
            out[name] = value
        else:
            out[name] = repr([np.asarray(v).tolist() for v in value])
    return out


@pytest.fixture(scope="module")
def rows_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("persist") / "rows"
    ids = np.arange(N, dtype=np.int64)
    table = pa.table(
        {
            "id": ids,
            "x": pa.array(list(np.random.default_rng(0).random((N, 8), dtype=np.float32))),
            "name": pa.array([f"row {i}" * (1 + i % 3) for i in range(N)]),
        }
    )
    write_mds(table, str(path), DatasetSpec(shard_size="16KiB", compression="zstd"))
    return str(path)


def _script(ds: Any, **kw: Any) -> tuple[list[list[dict[str, Any]]], list[set[int]]]:
    """Passes a trainer makes, as canonical batches, and the worker PIDs seen in each."""
    before = _workers()
    passes: list[list[dict[str, Any]]] = []
    pids: list[set[int]] = []

    def run(it: Any, limit: int | None = None) -> None:
        got = []
        for b in it:
            got.append(_canon(b))
            if len(got) == 1:
                pids.append(_workers() - before)
            if limit is not None and len(got) == limit:
                break
        passes.append(got)

    loader = ds.to_torch(**kw)
    run(loader)  # epoch 0
    run(loader)  # epoch 1
    run(loader, limit=3)  # epoch 2, left early: the position stays
    run(loader)  # epoch 2 again, all of it
    loader.set_epoch(7)
    run(loader, limit=4)  # epoch 7: four batches, then a checkpoint
    state = loader.state_dict()
    loader.load_state_dict(state)
    run(loader)  # the rest of epoch 7, same loader
    fresh = ds.to_torch(**kw)
    fresh.load_state_dict(state)
    run(fresh)  # the rest of epoch 7, a fresh loader
    del fresh
    peek = iter(loader)  # epoch 8: an iterator held open while another pass runs
    passes.append([_canon(next(peek))])
    run(loader)  # epoch 8 in full (the held iterator keeps its own workers busy)
    passes.append([_canon(b) for b in peek])  # the held pass goes on where it was
    del peek
    run(loader)  # epoch 9
    del loader
    gc.collect()
    deadline = time.monotonic() + 20
    while _workers() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _workers() - before, "DataLoader workers outlived their loader"
    return passes, pids


@pytest.mark.parametrize(
    "extra",
    [
        {},  # fixed-width x in shared-memory slabs, strings beside
        {"columns": ["id", "x"], "group": 2},  # slabs only
        {"world_size": 2, "rank": 1, "even_batches": True, "pad_mask": True},
        {"drop_last": True, "columns": ["id", "name"]},  # no slabs
    ],
)
def test_same_batches_and_same_workers_across_passes(rows_path: str, extra: Any) -> None:
    ds = open_dataset(rows_path)
    kw = dict(batch_size=64, shuffle=True, seed=5, num_workers=2, **extra)
    persistent, pids = _script(ds, persistent_workers=True, **kw)
    per_pass, old_pids = _script(ds, persistent_workers=False, **kw)
    assert persistent == per_pass
    assert [len(p) for p in persistent][:4] == [len(persistent[0])] * 2 + [3, len(persistent[0])]
    in_process, _ = _script(ds, **{**kw, "num_workers": 0})
    assert persistent == in_process
    _same_workers(pids)
    assert len({frozenset(p) for p in old_pids}) == len(old_pids)  # fresh ones every pass


def _same_workers(pids: list[set[int]]) -> None:
    """The loader's two workers served every pass; the fresh loader, and the pass run while
    another iterator held the workers, had two more of their own beside them."""
    assert len(pids) == 9 and len(pids[0]) == 2
    assert all(pids[i] == pids[0] for i in (1, 2, 3, 4, 5, 8))
    assert all(len(pids[i]) == 4 and pids[0] < pids[i] for i in (6, 7))


def _jpeg(i: int) -> bytes:
    w, h = 48 + 8 * (i % 4), 40 + 4 * (i % 5)
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None, None]
    pixels = np.concatenate(
        [np.broadcast_to(x, (h, w, 1)), np.broadcast_to(y, (h, w, 1)), np.full((h, w, 1), i % 256)],
        axis=2,
    ).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def test_images_decoded_in_persistent_workers(tmp_path: Any) -> None:
    """Decoded images travel in leased shared memory (reclaimed after early exits)."""
    n = 120
    table = pa.table({"id": np.arange(n, dtype=np.int64), "image": [_jpeg(i) for i in range(n)]})
    write_mds(table, str(tmp_path / "ds"), DatasetSpec(columns={"image": "jpeg"}))
    ds = open_dataset(tmp_path / "ds")
    ops = [
        {"op": "image_decode", "column": "image"},
        {"op": "random_resized_crop", "column": "image", "size": 24},
        {"op": "horizontal_flip", "column": "image", "p": 0.5},
    ]
    kw = dict(batch_size=8, shuffle=True, seed=1, num_workers=2, transforms=ops)
    persistent, pids = _script(ds, persistent_workers=True, **kw)
    per_pass, _ = _script(ds, persistent_workers=False, **kw)
    assert persistent == per_pass
    _same_workers(pids)


def test_packed_rows_from_persistent_workers(tmp_path: Any) -> None:
    from spark_dl_core import PackSpec

    rng = np.random.default_rng(3)
    docs = [rng.integers(1, 1000, size=int(k), dtype=np.int32) for k in rng.integers(1, 90, 300)]
    table = pa.table({"tokens": pa.array([d.tolist() for d in docs], pa.list_(pa.int32()))})
    write_mds(table, str(tmp_path / "ds"), DatasetSpec(shard_size="2KiB"))
    ds = open_dataset(tmp_path / "ds")
    pack = PackSpec(column="tokens", seq_len=32, mode="bin")
    kw = dict(batch_size=4, shuffle=True, seed=9, pack=pack, num_workers=2)
    persistent, pids = _script(ds, persistent_workers=True, **kw)
    per_pass, _ = _script(ds, persistent_workers=False, **kw)
    assert persistent == per_pass
    _same_workers(pids)


def test_setting_is_checked() -> None:
    from spark_dl_core import SpecError
    from spark_dl_core.loaders.settings import LoaderSettings

    assert LoaderSettings().persistent_workers is True
    with pytest.raises(SpecError, match="persistent_workers"):
        LoaderSettings(persistent_workers=1)  # type: ignore[arg-type]


def test_workers_start_with_the_loader(rows_path: str) -> None:
    """A loader's workers start when it is made (its first pass begins while the caller
    builds a model), the first pass is served by them, a position moved before it (
    ``set_epoch``, ``load_state_dict``) still yields exactly that position's batches, and
    making and iterating the loader draws nothing from torch's global RNG."""
    ds = open_dataset(rows_path)
    kw = dict(batch_size=64, shuffle=True, seed=5, num_workers=2, columns=["id", "x"])
    reference = ds.to_torch(**{**kw, "num_workers": 0})
    reference.set_epoch(3)
    expected = [_canon(b) for b in reference]
    before = _workers()
    torch.manual_seed(0)
    drawn = torch.rand(4)
    torch.manual_seed(0)
    loader = ds.to_torch(**kw)
    started = _workers() - before
    assert len(started) == 2, "the workers did not start with the loader"
    loader.set_epoch(3)  # the pass started ahead was epoch 0's
    got = []
    for b in loader:
        got.append(_canon(b))
        if len(got) == 1:
            assert _workers() - before == started
    assert got == expected
    assert torch.equal(torch.rand(4), drawn), "the loader drew from the global RNG"
    state = loader.state_dict()
    fresh = ds.to_torch(**kw)  # started ahead on epoch 0, then moved to the saved state
    fresh.load_state_dict(state)
    reference.load_state_dict(state)
    assert [_canon(b) for b in fresh] == [_canon(b) for b in reference]
    del loader, fresh
    gc.collect()
    deadline = time.monotonic() + 20
    while _workers() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _workers() - before, "DataLoader workers outlived their loader"
