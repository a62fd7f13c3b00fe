"""Fixed-width rows of a batch spanning several shards (a stratified mixture reads two
sources' windows) are gathered in one C pass straight into the batch's column blocks, with
the same bytes as numpy's per-shard gather; the extension refuses rows outside their shard."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, Source, mix, write_mds
from spark_dl_core.format import buffers

needs_c = pytest.mark.skipif(buffers._buffers is None, reason="C extension not built")


def _write(path: Path, n: int, start: int) -> str:
    ids = np.arange(start, start + n, dtype=np.int64)
    x = (ids[:, None] * 10 + np.arange(4)).astype(np.float32)
    table = pa.table(
        {"id": ids, "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 4)}
    )
    write_mds(table, str(path), DatasetSpec(shard_size="4KiB"), mode="error")
    return str(path)


def _batches(root: Path) -> list[dict[str, np.ndarray]]:
    a, b = _write(root / "a", 3000, 0), _write(root / "b", 1500, 100_000)
    m = mix([Source(a, proportion=2 / 3), Source(b, proportion=1 / 3)], batching="stratified")
    return list(m.iter_batches(batch_size=256, shuffle=True, seed=3))


@needs_c
def test_a_stratified_mixtures_batches_take_the_one_pass_gather(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = buffers._buffers

    class Counting:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def gather_columns(self, *args: object) -> int:
            calls.append(len(args[3]))  # type: ignore[arg-type]
            return real.gather_columns(*args)  # type: ignore[union-attr,arg-type]

    monkeypatch.setattr(buffers, "_buffers", Counting())
    got = _batches(tmp_path / "c")
    monkeypatch.setattr(buffers, "_buffers", None)  # the per-shard numpy gather
    want = _batches(tmp_path / "numpy")
    assert calls and sum(calls) == sum(len(b["id"]) for b in got)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g["id"], w["id"])
        np.testing.assert_array_equal(g["x"], w["x"])
        # right data: each row's x is the one written with its id
        np.testing.assert_array_equal(g["x"], (g["id"][:, None] * 10 + np.arange(4)))


@needs_c
def test_rows_or_spans_outside_their_shard_are_refused() -> None:
    shard = np.arange(40, dtype=np.uint8).reshape(4, 10)
    out = np.empty(20, dtype=np.uint8)
    which = np.array([0, 1], dtype=np.int32)
    whole = [(0, 10, b"")]
    assert (
        buffers.gather_columns(out, [shard, shard[::-1].copy()], which, np.array([3, 0]), 10, whole)
        == -1
    )
    np.testing.assert_array_equal(out.reshape(2, 10), [shard[3], shard[3]])
    split = [(0, 2, b""), (4, 3, bytes([2, 3]))]  # a header: each row's bytes 2..3 are 2, 3?
    assert buffers.gather_columns(out, [shard], None, np.array([0, 1]), 10, split) == 1
    with pytest.raises(IndexError, match="row 1 is outside its matrix"):
        buffers.gather_columns(out, [shard, shard], which, np.array([0, 4]), 10, whole)
    with pytest.raises(IndexError, match="row 0 is outside its matrix"):
        buffers.gather_columns(out, [shard], which, np.array([-1, 0]), 10, whole)
    with pytest.raises(IndexError, match="row 1 is outside its matrix"):
        buffers.gather_columns(out, [shard], which, np.array([0, 0]), 10, whole)  # no shard 1
    with pytest.raises(ValueError, match="not whole rows"):
        buffers.gather_columns(
            out, [shard, np.zeros(15, np.uint8)], which, np.array([0, 0]), 10, whole
        )
    with pytest.raises(ValueError, match="outside the row"):
        buffers.gather_columns(out, [shard], None, np.array([0]), 10, [(8, 3, b"")])
    with pytest.raises(ValueError, match="too small"):
        buffers.gather_columns(out[:5], [shard], None, np.array([0]), 10, whole)
