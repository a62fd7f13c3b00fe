"""Random access: ``ds[i]``, ``ds[[i, j]]``, slices and columns, through the loaders' checks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import open_dataset, write_mds
from spark_dl_core.errors import (
    ColumnNotFoundError,
    HashMismatchError,
    SampleIndexError,
    SparkDLError,
)

N = 100


def _table() -> pa.Table:
    return pa.table(
        {
            "id": np.arange(N, dtype=np.int64),
            "s": [f"row-{i}" for i in range(N)],
            "v": [np.arange(i % 5, dtype=np.float32) for i in range(N)],
        }
    )


@pytest.fixture
def ds_path(tmp_path: Path) -> str:
    path = str(tmp_path / "ds")
    write_mds(_table(), path, {"shard_size": 1 << 10})  # several shards
    return path


def test_one_sample_is_a_dict_of_values(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    assert ds.num_shards > 3
    sample = ds[37]
    assert set(sample) == {"id", "s", "v"}
    assert sample["id"] == 37 and sample["s"] == "row-37"
    np.testing.assert_array_equal(sample["v"], np.arange(37 % 5, dtype=np.float32))
    assert ds[-1]["id"] == N - 1 and ds[-N]["id"] == 0
    assert ds[np.int32(5)]["s"] == "row-5"


def test_lists_slices_and_columns_are_batches(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    batch = ds[[99, 3, -2, 3]]  # across shards, in the order asked, repeats kept
    np.testing.assert_array_equal(batch["id"], [99, 3, 98, 3])
    assert list(batch["s"]) == ["row-99", "row-3", "row-98", "row-3"]
    np.testing.assert_array_equal(ds[10:60:7]["id"], np.arange(10, 60, 7))
    np.testing.assert_array_equal(ds[::-33]["id"], [99, 66, 33, 0])
    np.testing.assert_array_equal(ds[np.array([4, 2])]["id"], [4, 2])
    assert ds[5:5]["id"].shape == (0,)
    assert ds[12, "s"] == "row-12"
    assert set(ds[[1, 2], ["id", "s"]]) == {"id", "s"}
    np.testing.assert_array_equal(ds["id"], np.arange(N))
    # the same values the loaders yield
    whole = next(iter(ds.iter_batches(batch_size=N)))
    for i in (0, 41, 99):
        assert ds[i]["s"] == whole["s"][i]


def test_bad_indices_and_columns_are_typed_errors(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    for bad in (N, -N - 1, [0, N + 5]):
        with pytest.raises(SampleIndexError, match=f"out of range for a dataset of {N}"):
            ds[bad]
    with pytest.raises(IndexError):  # a builtin IndexError too, as a list's
        ds[N]
    for bad_key in (1.5, True, (1, 2, 3), [[1, 2]]):
        with pytest.raises(SampleIndexError, match=r"sample index is an int|rows, columns"):
            ds[bad_key]
    with pytest.raises(ColumnNotFoundError, match=r"no column\(s\) \['nope'\]") as caught:
        ds[0, "nope"]
    assert isinstance(caught.value, KeyError) and isinstance(caught.value, SparkDLError)
    with pytest.raises(KeyError):
        ds["nope"]
    with pytest.raises(ColumnNotFoundError, match="string or a list of strings"):
        ds[0, 5]
    # a for loop over the dataset stops at its end (the IndexError protocol)
    assert sum(1 for _ in ds) == N


def test_reads_check_shard_hashes(ds_path: str) -> None:
    shard = sorted(f for f in os.listdir(ds_path) if f.endswith(".mds"))[-1]
    data = bytearray(Path(ds_path, shard).read_bytes())
    data[-1] ^= 0xFF
    Path(ds_path, shard).write_bytes(bytes(data))
    ds = open_dataset(ds_path)
    assert ds[0]["id"] == 0  # an intact shard
    with pytest.raises(HashMismatchError):
        ds[N - 1]


def test_remote_reads_go_through_the_shard_cache(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    url = f"memory://random-access-{os.getpid()}/ds"
    write_mds(_table(), url, {"shard_size": 1 << 10})
    cache = tmp_path / "cache"
    ds = open_dataset(url, cache_dir=str(cache))
    assert ds[-3]["s"] == f"row-{N - 3}"
    cached = [f for _, _, files in os.walk(cache) for f in files if f.endswith(".mds")]
    assert cached == ["shard.00004.mds"]  # only the shard holding the sample was downloaded


def test_mixture_indexes_its_sources_one_after_another(tmp_path: Path) -> None:
    from spark_dl_core.mixture.open import mix
    from spark_dl_core.mixture.spec import Source

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_mds(pa.table({"x": np.arange(10)}), a)
    write_mds(pa.table({"x": np.arange(100, 105)}), b)
    m = mix([Source(a), Source(b)], source_column="src")
    assert m[12] == {"x": 102, "src": 1}
    np.testing.assert_array_equal(m[[0, -1], "src"], [0, 1])
    with pytest.raises(SampleIndexError):
        m[15]


def _png(seed: int) -> bytes:
    import io

    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (20 + seed % 7, 24 + seed % 5, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


READ_OPS = [
    {"op": "image_decode", "column": "image", "at": "read"},
    {"op": "random_resized_crop", "column": "image", "size": 8, "at": "read"},
    {"op": "horizontal_flip", "column": "image", "p": 0.5, "at": "read"},
    {"op": "normalize", "column": "x", "mean": 1.0, "std": 2.0, "at": "read"},
    {"op": "rename", "mapping": {"id": "key"}, "at": "read"},
]


def test_random_access_applies_the_specs_read_ops_as_the_loaders_do(tmp_path: Path) -> None:
    """ds[i] runs the spec's read ops with seed 0 / epoch 0: a loader's first epoch at its
    default seed gives every sample the same values (random crops and flips included)."""
    import datetime as dt

    n = 24
    table = pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "x": np.arange(n, dtype=np.float32),
            "image": pa.array([_png(i) for i in range(n)], pa.binary()),
            "day": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(n)]),
            "at": pa.array(
                [dt.datetime(2024, 5, 1, 3, i, tzinfo=dt.UTC) for i in range(n)],
                pa.timestamp("us", "UTC"),
            ),
        }
    )
    path = str(tmp_path / "ds")
    write_mds(table, path, {"shard_size": 1 << 12, "transforms": READ_OPS})
    ds = open_dataset(path)
    assert ds.num_shards > 1
    seen = 0
    for batch in ds.iter_batches(batch_size=5, shuffle=True):  # seed 0, epoch 0
        assert set(batch) == {"key", "x", "image", "day", "at"}
        for j, key in enumerate(batch["key"].tolist()):
            sample = ds[key]
            assert set(sample) == set(batch)
            for name in batch:
                np.testing.assert_array_equal(sample[name], batch[name][j], err_msg=name)
                assert np.asarray(sample[name]).dtype == batch[name].dtype, name
            seen += 1
    assert seen == n
    rows = ds[[3, 17]]
    np.testing.assert_array_equal(rows["x"], (np.array([3, 17], np.float32) - 1) / 2)
    assert rows["image"].shape == (2, 8, 8, 3) and rows["image"].dtype == np.uint8
    # Dates and timestamps as the loaders give them: int32 days, int64 microseconds (UTC).
    assert rows["day"].dtype == np.int32 and rows["day"].tolist() == [19723 + 3, 19723 + 17]
    assert ds[0]["at"] == table["at"][0].value
    # Columns are named as the ops leave them; one column needs no other column's ops.
    np.testing.assert_array_equal(ds["key"], np.arange(n))
    assert ds[5, "x"] == np.float32(2.0)
    assert ds[5:5, ["key"]]["key"].shape == (0,)
    with pytest.raises(ColumnNotFoundError, match=r"\['id'\] after its read-time ops"):
        ds[0, "id"]


def _as_numpy(value: object) -> np.ndarray:
    """A torch / tf batch column as numpy (strings as bytes)."""
    numpy = getattr(value, "numpy", None)
    return np.asarray(numpy() if numpy is not None else value)


def _read_ops_dataset(tmp_path: Path) -> Any:
    n = 12
    table = pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "x": np.arange(n, dtype=np.float32),
            "s": [f"row-{i}" for i in range(n)],
            "image": pa.array([_png(i) for i in range(n)], pa.binary()),
        }
    )
    ops = [*READ_OPS, {"op": "rename", "mapping": {"s": "text", "image": "picture"}, "at": "read"}]
    write_mds(table, str(tmp_path / "ds"), {"transforms": ops})
    return open_dataset(tmp_path / "ds")


def test_to_tf_gives_columns_renamed_by_the_specs_read_ops(tmp_path: Path) -> None:
    """to_tf looked up the stored encoding by the renamed name (ValueError: tuple.index);
    it now gives the renamed columns with iter_batches' and to_torch's values."""
    pytest.importorskip("tensorflow")
    pytest.importorskip("torch")
    ds = _read_ops_dataset(tmp_path)
    want = next(iter(ds.iter_batches(batch_size=6)))
    assert set(want) == {"key", "x", "text", "picture"}
    for loader in (ds.to_tf, ds.to_torch):
        got = next(iter(loader(batch_size=6)))
        assert set(got) == set(want), loader
        for name, values in want.items():
            tf_text = name == "text" and loader == ds.to_tf
            expected = [v.encode() for v in values] if tf_text else values  # tf.string
            np.testing.assert_array_equal(_as_numpy(got[name]), expected, err_msg=name)


@pytest.mark.parametrize("columns", [["id"], ["id", "s"], ["x", "image"]])
def test_loaders_skip_the_specs_read_ops_on_columns_left_out(
    tmp_path: Path, columns: list[str]
) -> None:
    """columns= leaving out a column a spec op names (normalize x, image_decode image) was
    refused; the loaders now skip those ops, as ds[...] does, with ds[...]'s values."""
    pytest.importorskip("tensorflow")
    pytest.importorskip("torch")
    ds = _read_ops_dataset(tmp_path)
    renamed = {"id": "key", "s": "text", "image": "picture"}
    names = [renamed.get(c, c) for c in columns]
    want = ds[list(range(6)), names]
    for loader in (ds.iter_batches, ds.to_torch, ds.to_tf):
        got = next(iter(loader(batch_size=6, columns=columns)))
        assert sorted(got) == sorted(names), loader
        for name in names:
            expected = want[name]
            if name == "text" and loader == ds.to_tf:
                expected = [v.encode() for v in expected]  # tf.string: bytes
            np.testing.assert_array_equal(_as_numpy(got[name]), expected, err_msg=name)
