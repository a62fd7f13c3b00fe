"""The first batches of a table read in place with empty caches are served from the rows
they need (``InPlaceDataset.load_rows``: rows taken from the decoded row group and encoded
alone) while whole row groups are converted: the same batches as from a warm cache and as
pyarrow reads the rows, and the conversions still land in the cache for later epochs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

deltalake = pytest.importorskip("deltalake")
from deltalake import WriterProperties, write_deltalake  # noqa: E402

from spark_dl_core.errors import SampleIndexError  # noqa: E402
from spark_dl_core.tables.delta import in_place as delta_inplace  # noqa: E402
from spark_dl_core.tables.delta.table import open_delta  # noqa: E402
from spark_dl_core.tables.parquet.in_place import InPlaceDataset  # noqa: E402
from spark_dl_core.tables.parquet.row_subset import RowSubset  # noqa: E402

BATCH = 64


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """3 files of 1,500 rows in row groups of 500, ``x`` as ``list<float>``: 1-7 values a
    row (ragged, as Spark and delta-rs write arrays) or 4 every row (fixed)."""
    out = {}
    for shape in ("ragged", "fixed"):
        where = str(tmp_path_factory.mktemp(f"first-rows-{shape}") / "t")
        for k in range(3):
            rng = np.random.default_rng(k)
            lengths = rng.integers(1, 8, 1500) if shape == "ragged" else np.full(1500, 4)
            offsets = np.zeros(1501, dtype=np.int32)
            np.cumsum(lengths, out=offsets[1:])
            values = rng.random(int(offsets[-1]), dtype=np.float32)
            x = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
            ids = np.arange(k * 1500, (k + 1) * 1500, dtype=np.int64)
            props = WriterProperties(max_row_group_size=500)
            data = pa.table({"id": ids, "x": x})
            write_deltalake(where, data, mode="append", writer_properties=props)
        out[shape] = where
    return out


def _pyarrow_rows(path: str) -> tuple[np.ndarray, list[list[float]]]:
    """Every row of the table's version in its files' order, as pyarrow reads them."""
    read = pa.concat_tables(pq.read_table(f) for f in open_delta(path).files)
    return read["id"].to_numpy(), read["x"].to_pylist()


def _served_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that records the row count of each RowSubset this process serves."""
    served: list[int] = []
    real = InPlaceDataset.load_rows

    def recorded(self: InPlaceDataset, *args: Any, **kwargs: Any) -> Any:
        got = real(self, *args, **kwargs)
        if isinstance(got, RowSubset):
            served.append(len(got.rows))
        return got

    monkeypatch.setattr(InPlaceDataset, "load_rows", recorded)
    return served


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Bit for bit: the same columns, dtypes, shapes and bytes (row by row for objects)."""
    assert a.keys() == b.keys()
    for name in a:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        assert (x.dtype, x.shape) == (y.dtype, y.shape), name
        if x.dtype == object:
            for r, s in zip(x, y):
                assert (r.dtype, r.shape, r.tobytes()) == (s.dtype, s.shape, s.tobytes()), name
        else:
            assert x.tobytes() == y.tobytes(), name


@pytest.mark.parametrize("shape", ["ragged", "fixed"])
def test_first_batch_from_rows_equals_warm_cache_and_pyarrow(
    tables: dict[str, str], shape: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, cache = tables[shape], str(tmp_path / "cache")
    served = _served_rows(monkeypatch)
    ds = open_delta(path).dataset(cache_dir=cache)
    cold = next(iter(ds.iter_batches(BATCH, shuffle=True, seed=3)))
    if shape == "ragged":
        assert served and sum(served) <= BATCH  # the batch's rows, not its row groups
    else:  # alike rows: converted whole in one copy, no faster by rows
        assert not served and not ds.serves_rows
    ids, xs = _pyarrow_rows(path)
    order = np.asarray(next(iter(ds.sample_order(BATCH, shuffle=True, seed=3))))
    assert cold["id"].tolist() == ids[order].tolist()
    assert [np.asarray(r, dtype=np.float32).tolist() for r in cold["x"]] == [xs[i] for i in order]
    list(open_delta(path).dataset(cache_dir=cache).iter_batches(BATCH))  # a whole pass
    served.clear()
    again = open_delta(path).dataset(cache_dir=cache)
    warm = next(iter(again.iter_batches(BATCH, shuffle=True, seed=3)))
    assert not served  # every row group read whole from the cache
    _assert_same(cold, warm)


def test_first_batch_with_two_workers_equals_warm_cache_and_pyarrow(
    tables: dict[str, str], tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    path, cache = tables["ragged"], str(tmp_path / "cache")

    def first_two() -> list[dict[str, Any]]:
        ds = open_delta(path).dataset(cache_dir=cache)
        loader = iter(ds.to_torch(batch_size=BATCH, shuffle=True, seed=3, num_workers=2))
        return [next(loader), next(loader)]  # one from each worker

    cold = first_two()
    list(open_delta(path).dataset(cache_dir=cache).iter_batches(BATCH))  # a whole pass
    warm = first_two()
    ids, xs = _pyarrow_rows(path)
    order = open_delta(path).dataset().sample_order(BATCH, shuffle=True, seed=3)
    for k, (c, w) in enumerate(zip(cold, warm)):
        assert c["id"].tolist() == w["id"].tolist() == ids[np.asarray(order[k])].tolist()
        for got in (c["x"], w["x"]):
            assert got.values().dtype == torch.float32
            assert [r.tolist() for r in got.unbind()] == [xs[i] for i in order[k]]
        assert torch.equal(c["x"].offsets(), w["x"].offsets())
        assert c["x"].values().numpy().tobytes() == w["x"].values().numpy().tobytes()


def test_two_workers_inherit_the_first_window_decoded_once(
    tables: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The main process decodes the row groups of each worker's first batches before the
    workers fork (``decode_ahead``); they take those rows from the inherited decode and
    convert from it: over a whole pass no row group is decoded twice on the machine."""
    pytest.importorskip("torch")
    path, log = tables["ragged"], tmp_path / "decodes"
    real = InPlaceDataset._finished

    def logged(self: InPlaceDataset, g: Any) -> Any:
        with open(log, "a") as f:  # forked workers inherit the patch: one line a decode
            f.write(f"{os.getpid()} {g.file} {g.group}\n")
        return real(self, g)

    monkeypatch.setattr(InPlaceDataset, "_finished", logged)
    ds = open_delta(path).dataset(cache_dir=str(tmp_path / "cache"))
    loader = ds.to_torch(batch_size=BATCH, shuffle=True, seed=3, num_workers=2)
    ahead = [line.split() for line in log.read_text().splitlines()]  # before any batch
    assert ahead and {pid for pid, _, _ in ahead} == {str(os.getpid())}
    got = [b["id"].tolist() for b in loader]
    order = ds.sample_order(BATCH, shuffle=True, seed=3)
    ids, _ = _pyarrow_rows(path)
    assert got == [ids[np.asarray(order[k])].tolist() for k in range(len(order))]
    decodes = [tuple(line.split()[1:]) for line in log.read_text().splitlines()]
    assert len(decodes) == len(set(decodes)) == ds.num_shards
    first = {int(s) for s in np.searchsorted(ds.shard_offsets, order[0], "right") - 1}
    shards = {(str(g.file), str(g.group)) for g in (ds._groups[s] for s in first)}
    assert shards <= {(f, g) for _, f, g in ahead}


def test_a_row_group_another_process_cached_after_our_look_is_read_not_decoded_again(
    tables: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race of two DataLoader workers: one looks in the cache, finds nothing, and the
    other finishes converting the row group before the first claims it. The claimant then
    reads the cached file rather than decode and convert the row group a second time."""
    path, cache = tables["ragged"], str(tmp_path / "cache")
    other = open_delta(path).dataset(cache_dir=cache)
    other.load_shard(0)  # "the other worker": converted and cached
    ds = open_delta(path).dataset(cache_dir=cache)
    real_look = InPlaceDataset._from_disk
    looks: list[int] = []

    def late(self: InPlaceDataset, shard: int, verify: Any) -> Any:
        looks.append(shard)
        return None if len(looks) == 1 else real_look(self, shard, verify)  # not there yet

    decodes: list[Any] = []
    real_decode = InPlaceDataset._finished
    monkeypatch.setattr(InPlaceDataset, "_from_disk", late)
    monkeypatch.setattr(
        InPlaceDataset, "_finished", lambda self, g: decodes.append(g) or real_decode(self, g)
    )
    got = ds.load_shard(0)
    assert len(looks) == 2 and not decodes  # looked again once claimed: read, not decoded
    assert got.raw.tobytes() == other.load_shard(0).raw.tobytes()


def test_rows_served_first_are_converted_by_the_pass_and_cached(
    tables: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, cache = tables["ragged"], tmp_path / "cache"
    served = _served_rows(monkeypatch)
    ds = open_delta(path).dataset(cache_dir=str(cache))
    before = delta_inplace.conversions
    # batches of 2,000 rows: every row group is needed by the first batch or two
    first = [b["id"].tolist() for b in ds.iter_batches(2000, shuffle=True, seed=1)]
    assert served  # the first batches were served by rows
    assert delta_inplace.conversions - before == ds.num_shards  # each converted once
    assert len(list(cache.glob("*.mds"))) == ds.num_shards
    served.clear()
    again = open_delta(path).dataset(cache_dir=str(cache))
    before = delta_inplace.conversions
    second = [b["id"].tolist() for b in again.iter_batches(2000, shuffle=True, seed=1)]
    assert second == first
    assert delta_inplace.conversions == before and not served  # all from the cache


def test_a_row_subset_holds_the_whole_shards_bytes_and_refuses_other_rows(
    tables: dict[str, str],
) -> None:
    ds = open_delta(tables["ragged"]).dataset(cache=False)
    with pytest.raises(SampleIndexError, match="holds 500"):
        ds.load_rows(1, np.array([2, 500]))
    part = ds.load_rows(1, np.array([3, 10, 11, 499]))
    assert isinstance(part, RowSubset)
    whole = ds.load_shard(1)
    index = np.array([499, 11, 3, 10, 3])
    for name in ("id", "x"):
        a, b = part.columns(index, [name])[name], whole.columns(index, [name])[name]
        assert a.data.tobytes() == b.data.tobytes()
    with pytest.raises(SampleIndexError, match="row 4 was not read"):
        part.positions(np.array([3, 4]))
    with pytest.raises(SampleIndexError, match="row 500 was not read"):
        part.columns(np.array([500]), ["x"])


def test_a_damaged_row_group_decoded_ahead_of_the_workers_is_an_error_naming_its_file(
    tables: dict[str, str], tmp_path: Path
) -> None:
    """A data file whose pages are damaged fails the decode done before the workers fork:
    the first batch raises the table's error naming the file (no batch is served), and the
    main process holds no decoded row group afterwards."""
    pytest.importorskip("torch")
    from spark_dl_core.tables.delta.snapshot import DeltaSnapshotError

    path = tmp_path / "t"
    shutil.copytree(tables["ragged"], path)
    for f in path.glob("*.parquet"):  # the pages, not the footer: the table still opens
        raw = bytearray(f.read_bytes())
        raw[8 : len(raw) // 2] = np.random.default_rng(0).bytes(len(raw) // 2 - 8)
        f.write_bytes(bytes(raw))
    ds = open_delta(str(path)).dataset(cache_dir=str(tmp_path / "cache"))
    loader = ds.to_torch(batch_size=BATCH, shuffle=True, seed=3, num_workers=2)
    with pytest.raises(DeltaSnapshotError, match=r"part-.*\.parquet.*cannot be read as Parquet"):
        next(iter(loader))
    assert not ds._decoded
