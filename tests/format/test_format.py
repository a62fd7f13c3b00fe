"""The JVM-free MDS core: round trips, shard layout, compression, hashes and bad input."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import (
    DatasetError,
    DatasetSpec,
    EncodingError,
    HashMismatchError,
    ShardError,
    SpecError,
    UnsafeEncodingError,
    open_dataset,
    parse_size,
    write_mds,
)
from spark_dl_core.format.compression import compression_names, parse_compression


def _png(color: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (4, 3), (color, 0, 0)).save(out, format="PNG")
    return out.getvalue()


def _table(n: int = 200) -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table(
        {
            "i8": pa.array(rng.integers(-128, 127, n), pa.int8()),
            "u16": pa.array(rng.integers(0, 60000, n), pa.uint16()),
            "i64": pa.array(np.arange(n) * 10**12, pa.int64()),
            "f16": pa.array(rng.random(n).astype(np.float16)),
            "f32": pa.array(rng.random(n).astype(np.float32)),
            "f64": pa.array(rng.random(n)),
            "flag": pa.array(rng.random(n) > 0.5),
            "text": pa.array([f"ünïcode {i} " * (i % 4) for i in range(n)]),
            "blob": pa.array([bytes([i % 256]) * (i % 7) for i in range(n)], pa.binary()),
            "vec": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(n * 8).astype(np.float32)), 8
            ),
            "ragged": pa.array([list(range(i % 6)) for i in range(n)], pa.list_(pa.int32())),
            "matrix": pa.array(
                [[[float(i), 1.0], [2.0, 3.0], [4.0, 5.0]] for i in range(n)],
                pa.list_(pa.list_(pa.float64())),
            ),
            "day": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(n)]),
            "ts": pa.array(
                [dt.datetime(2024, 1, 1, 0, 0, i % 60) for i in range(n)], pa.timestamp("us")
            ),
            "price": pa.array(
                [decimal.Decimal(f"{i}.{i % 100:02d}") for i in range(n)], pa.decimal128(12, 2)
            ),
            "meta": pa.array([{"k": i, "tags": ["a"] * (i % 3)} for i in range(n)]),
            "attrs": pa.array([[("x", i)] for i in range(n)], pa.map_(pa.string(), pa.int64())),
        }
    )


@pytest.mark.parametrize("compression", [None, "zstd", "zstd:7", "gz", "bz2", "br", "snappy"])
def test_round_trip_every_type(tmp_path: Path, compression: str | None) -> None:
    table = _table()
    spec = DatasetSpec(compression=compression, shard_size="8KiB", hashes=["sha1", "xxh64"])
    result = write_mds(table, str(tmp_path), spec)
    ds = open_dataset(tmp_path)
    assert len(ds) == table.num_rows == result.num_samples
    assert ds.num_shards > 3
    assert ds.to_arrow().equals(table)
    batches = list(ds.iter_batches(batch_size=64, verify_hashes=True))
    assert [len(b["i64"]) for b in batches] == [64, 64, 64, 8]
    first = batches[0]
    assert first["vec"].shape == (64, 8) and first["vec"].dtype == np.float32
    assert first["matrix"].shape == (64, 3, 2)
    assert first["text"][5] == table["text"][5].as_py()
    assert first["i8"].dtype == np.int8
    np.testing.assert_array_equal(np.concatenate([b["i64"] for b in batches]), table["i64"])


def test_inferred_encodings_are_mosaic_names(tmp_path: Path) -> None:
    write_mds(_table(20), str(tmp_path))
    assert open_dataset(tmp_path).columns == {
        "i8": "int8",
        "u16": "uint16",
        "i64": "int64",
        "f16": "float16",
        "f32": "float32",
        "f64": "float64",
        "flag": "uint8",
        "text": "str",
        "blob": "bytes",
        "vec": "ndarray:float32:8",
        "ragged": "ndarray:int32",
        "matrix": "ndarray:float64",
        "day": "int32",
        "ts": "int64",
        "price": "str_decimal",
        "meta": "json",
        "attrs": "json",
    }


def test_shard_layout_and_index_fields(tmp_path: Path) -> None:
    table = pa.table({"a": pa.array([1, 2, 3], pa.int32()), "s": ["x", "yy", ""]})
    write_mds(table, str(tmp_path), DatasetSpec(hashes=["sha1"]))
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["version"] == 2
    (shard,) = index["shards"]
    assert shard["column_names"] == ["a", "s"]
    assert shard["column_encodings"] == ["int32", "str"]
    assert shard["column_sizes"] == [4, None]
    assert shard["format"] == "mds" and shard["zip_data"] is None
    raw = (tmp_path / shard["raw_data"]["basename"]).read_bytes()
    assert shard["raw_data"]["bytes"] == len(raw)
    count = int(np.frombuffer(raw[:4], "<u4")[0])
    offsets = np.frombuffer(raw[4 : 4 + 16], "<u4")
    assert count == 3
    config = json.loads(raw[20 : offsets[0]])
    assert config["column_names"] == ["a", "s"] and config["size_limit"] == 1 << 26
    # sample 1: [u32 size of 's'] [int32 a] [utf-8 s]
    sample = raw[offsets[1] : offsets[2]]
    assert sample == np.uint32(2).tobytes() + np.int32(2).tobytes() + b"yy"


def test_shard_size_limit_follows_mosaic_rule(tmp_path: Path) -> None:
    table = pa.table({"x": pa.array(np.arange(1000), pa.int64())})
    write_mds(table, str(tmp_path), DatasetSpec(shard_size=2000))
    index = json.loads((tmp_path / "index.json").read_text())
    for shard in index["shards"]:
        assert shard["raw_data"]["bytes"] <= 2000
    config_len = (
        len((tmp_path / "shard.00000.mds").read_bytes())
        - 4
        - 4 * (index["shards"][0]["samples"] + 1)
        - 8 * index["shards"][0]["samples"]
    )
    per_shard = (2000 - 8 - config_len) // 12
    assert index["shards"][0]["samples"] == per_shard


def test_image_columns_pass_bytes_and_decode(tmp_path: Path) -> None:
    images = [_png(i) for i in range(10)]
    table = pa.table({"img": pa.array(images, pa.binary()), "y": list(range(10))})
    write_mds(table, str(tmp_path), DatasetSpec(columns={"img": "png"}))
    ds = open_dataset(tmp_path)
    (raw,) = ds.iter_batches(batch_size=10)
    assert list(raw["img"]) == images
    (decoded,) = ds.iter_batches(batch_size=10, images="numpy")
    assert decoded["img"].shape == (10, 3, 4, 3)
    assert decoded["img"][7, 0, 0].tolist() == [7, 0, 0]


def test_explicit_encodings(tmp_path: Path) -> None:
    table = pa.table(
        {
            "n": pa.array([1, 2, 300], pa.int64()),
            "s": pa.array([10, -20, 30], pa.int64()),
            "f": pa.array([0.5, 1.25, -3.0]),
            "v": pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], pa.list_(pa.float64())),
        }
    )
    spec = DatasetSpec(columns={"n": "int", "s": "str_int", "f": "str_float", "v": "ndarray"})
    write_mds(table, str(tmp_path), spec)
    (batch,) = open_dataset(tmp_path).iter_batches(batch_size=8)
    assert batch["n"].tolist() == [1, 2, 300]
    assert batch["s"].tolist() == [10, -20, 30]
    assert batch["f"].tolist() == [0.5, 1.25, -3.0]
    assert batch["v"].shape == (3, 2) and batch["v"].dtype == np.float64


def test_pickle_needs_explicit_permission(tmp_path: Path) -> None:
    table = pa.table({"obj": pa.array([{"a": 1}, {"a": 2}])})
    write_mds(table, str(tmp_path), DatasetSpec(columns={"obj": "pkl"}))
    with pytest.raises(UnsafeEncodingError, match="'obj'"):
        list(open_dataset(tmp_path).iter_batches())
    (batch,) = open_dataset(tmp_path, allow_unsafe=True).iter_batches()
    assert batch["obj"].tolist() == [{"a": 1}, {"a": 2}]


def test_append_and_overwrite(tmp_path: Path) -> None:
    path = str(tmp_path)
    first = pa.table({"x": pa.array([1, 2], pa.int64())})
    write_mds(first, path)
    with pytest.raises(DatasetError, match="already exists"):
        write_mds(first, path, mode="error")
    write_mds(pa.table({"x": pa.array([3], pa.int64())}), path, mode="append")
    assert open_dataset(path).to_arrow()["x"].to_pylist() == [1, 2, 3]
    with pytest.raises(SpecError, match="'x' has type double"):
        write_mds(pa.table({"x": [1.5]}), path, mode="append")
    write_mds(pa.table({"x": pa.array([9], pa.int64())}), path, mode="overwrite")
    assert open_dataset(path).to_arrow()["x"].to_pylist() == [9]
    # The replaced shards are gone; only the new dataset's files remain.
    shards = [n for n in os.listdir(path) if ".mds" in n]
    assert len(shards) == 1


def test_fingerprint_tracks_content_and_spec(tmp_path: Path) -> None:
    table = _table(50)
    a = write_mds(table, str(tmp_path / "a")).fingerprint
    b = write_mds(table, str(tmp_path / "b")).fingerprint
    c = write_mds(table, str(tmp_path / "c"), DatasetSpec(compression="zstd")).fingerprint
    d = write_mds(table.slice(1), str(tmp_path / "d")).fingerprint
    assert a == b
    assert len({a, c, d}) == 3
    assert open_dataset(tmp_path / "a").fingerprint == a


def test_nulls_fail_by_default_and_round_trip_with_mask(tmp_path: Path) -> None:
    table = pa.table({"x": pa.array([1, None, 3], pa.int64()), "s": ["a", None, "c"]})
    with pytest.raises(EncodingError, match=r"column 'x'.*first at row 1"):
        write_mds(table, str(tmp_path / "err"))
    assert not (tmp_path / "err" / "index.json").exists()
    write_mds(table, str(tmp_path / "ok"), DatasetSpec(nulls="mask"))
    assert open_dataset(tmp_path / "ok").to_arrow().equals(table)


F32, I64, BOOL = pa.float32(), pa.int64(), pa.bool_()
GRIDS = [[[1, 2, 3], [4, 5, 6]], [[7, 8, 9], [0, -1, -2]]]
MASKED_FIXED_ARRAYS = [  # Arrow type, its non-null rows, the fixed encoding (None: inferred)
    pytest.param(pa.list_(F32), [[1.5, -2, 3, 4], [5, 6, 7, 8]], "ndarray:float32:4", id="f32"),
    pytest.param(pa.large_list(I64), [[1, -(2**40)], [7, 8]], "ndarray:int64:2", id="i64"),
    pytest.param(pa.list_(BOOL), [[True, False], [False, True]], "ndarray:uint8:2", id="bool"),
    pytest.param(pa.list_(BOOL, 2), [[True, False], [False, True]], None, id="fixed-bool"),
    pytest.param(pa.list_(pa.list_(F32)), GRIDS, "ndarray:float32:2,3", id="2d"),
    pytest.param(pa.list_(pa.list_(F32, 3)), GRIDS, "ndarray:float32:2,3", id="2d-fixed-inner"),
    pytest.param(pa.list_(pa.list_(F32, 3), 2), GRIDS, None, id="fixed-2d"),
    pytest.param(
        pa.list_(pa.list_(BOOL)),
        [[[True], [False]], [[False], [True]]],
        "ndarray:uint8:2,1",
        id="2d-bool",
    ),
]


@pytest.mark.parametrize(("t", "values", "encoding"), MASKED_FIXED_ARRAYS)
def test_masked_nulls_of_fixed_shape_arrays_from_any_list_type(
    tmp_path: Path, t: pa.DataType, values: list[Any], encoding: str | None
) -> None:
    """nulls='mask' with a fixed ndarray shape, from plain lists (1-D, nested 2-D, booleans)
    as from fixed-size lists: a plain list's null was filled with [] and refused for its
    shape, a fixed-size list of booleans or of lists could not be filled at all. Now a null
    row is masked and zeros of the shape, as a fixed-size list of numbers always was, in
    every reader; the other rows are their values."""
    rows = [values[0], None, None, values[1], None]
    table = pa.table({"v": pa.array(rows, t), "i": pa.array(range(5), pa.int64())})
    spec = DatasetSpec(nulls="mask", columns={"v": encoding} if encoding else {})
    write_mds(table.to_batches(max_chunksize=2), str(tmp_path), spec)  # nulls in each batch
    ds = open_dataset(tmp_path)
    shape = np.asarray(values[0]).shape
    assert ds.encoding("v").size is not None and ds.columns["v"] == (encoding or ds.columns["v"])
    assert ds.to_arrow().equals(table)
    null = np.array([r is None for r in rows])
    want = np.zeros((5, *shape), dtype=ds["v"].dtype)
    want[~null] = np.asarray(values)
    for i in range(5):
        assert ds[i]["v__isnull"] == null[i]
        np.testing.assert_array_equal(ds[i]["v"], want[i], strict=True)
    (batch,) = ds.iter_batches(batch_size=5, columns=["v", "v__isnull"])
    np.testing.assert_array_equal(batch["v"], want, strict=True)
    assert batch["v__isnull"].tolist() == null.astype(int).tolist()


def test_masked_fixed_shape_arrays_of_another_shape_name_their_row(tmp_path: Path) -> None:
    """A non-null row of another length (1-D and 2-D) names the column and its row in the
    whole input, and nothing is left behind even with shards already written; a value that
    does not fit names its row, not its place among the values."""
    rows: list[Any] = [[float(i)] * 4 if i % 3 else None for i in range(200)]
    rows[151] = [1.0, 2.0]
    table = pa.table({"v": pa.array(rows, pa.list_(F32))})
    spec = DatasetSpec(nulls="mask", shard_size=256, columns={"v": "ndarray:float32:4"})
    path = tmp_path / "short"
    with pytest.raises(EncodingError, match=r"'v'.*shape \(2,\).*needs \(4,\).*row 151 of the"):
        write_mds(table.to_batches(max_chunksize=20), str(path), spec)
    assert not path.exists() or not os.listdir(path)
    grids: list[Any] = [[[1.0, 2.0], [3.0, 4.0]], None, [[1.0], [2.0]]]
    grid = pa.table({"g": pa.array(grids, pa.list_(pa.list_(F32)))})
    with pytest.raises(EncodingError, match=r"'g'.*shape \(2, 1\).*needs \(2, 2\).*row 2 of"):
        write_mds(
            grid, str(tmp_path / "g"), {"nulls": "mask", "columns": {"g": "ndarray:float32:2,2"}}
        )
    assert not (tmp_path / "g" / "index.json").exists()
    big = pa.table({"b": pa.array([None, [1, 2], [3, 300]], pa.list_(I64))})
    for encoding in ("ndarray:int8:2", "ndarray:int8"):
        with pytest.raises(EncodingError, match=r"'b'.*300 does not fit int8.*at row 2 of"):
            write_mds(big, str(tmp_path / "b"), {"nulls": "mask", "columns": {"b": encoding}})


@pytest.mark.parametrize(
    ("column", "array", "encoding", "message"),
    [
        ("small", pa.array([1, 300], pa.int64()), "int8", "300 does not fit int8"),
        (
            "shape",
            pa.array([[1.0, 2.0], [1.0]], pa.list_(pa.float32())),
            "ndarray:float32:2",
            "shape",
        ),
        ("pic", pa.array([b"not a jpeg"], pa.binary()), "jpeg", "not a jpeg"),
        ("frac", pa.array([1.5], pa.float64()), "int32", "non-integral"),
    ],
)
def test_values_that_do_not_fit_name_the_column(
    tmp_path: Path, column: str, array: pa.Array, encoding: str, message: str
) -> None:
    with pytest.raises(EncodingError, match=rf"column '{column}'.*{message}"):
        write_mds(pa.table({column: array}), str(tmp_path), DatasetSpec(columns={column: encoding}))
    assert not (tmp_path / "index.json").exists()
    assert not [n for n in os.listdir(tmp_path) if ".mds" in n]


def test_unsupported_type_names_the_column(tmp_path: Path) -> None:
    with pytest.raises(EncodingError, match="column 'n'"):
        write_mds(pa.table({"n": pa.array([None, None], pa.null())}), str(tmp_path))


def test_invalid_specs_fail_at_construction() -> None:
    with pytest.raises(SpecError, match="compression"):
        DatasetSpec(compression="lz4")
    with pytest.raises(SpecError, match="zstd"):
        DatasetSpec(compression="zstd:99")
    with pytest.raises(SpecError, match="hash"):
        DatasetSpec(hashes=["crc9"])
    with pytest.raises(SpecError, match="column 'x'"):
        DatasetSpec(columns={"x": "float128"})
    with pytest.raises(SpecError, match="shard_size"):
        DatasetSpec(shard_size="5TiB")
    with pytest.raises(SpecError):
        DatasetSpec(unknown_field=1)  # type: ignore[call-arg]
    assert DatasetSpec(hashes=["xxh64", "md5"]).hashes == ["md5", "xxh64"]
    assert parse_size("64MiB") == parse_size("64mb") == 1 << 26
    assert DatasetSpec.model_validate_json(DatasetSpec(shard_size="1KiB").model_dump_json())


def test_compression_families_round_trip() -> None:
    data = b"spark-dl " * 1000
    for name in compression_names():
        codec = parse_compression(name)
        assert codec is not None
        assert codec.decompress(codec.compress(data), len(data)) == data
        with pytest.raises(ValueError, match=r"more than|promises"):
            codec.decompress(codec.compress(data), len(data) - 10)


def _written(tmp_path: Path, **spec: object) -> tuple[Path, dict]:
    write_mds(_table(100), str(tmp_path), DatasetSpec(shard_size="4KiB", **spec))  # type: ignore[arg-type]
    return tmp_path, json.loads((tmp_path / "index.json").read_text())


def test_truncated_shard_names_the_file(tmp_path: Path) -> None:
    path, index = _written(tmp_path)
    name = index["shards"][1]["raw_data"]["basename"]
    data = (path / name).read_bytes()
    (path / name).write_bytes(data[:-5])
    with pytest.raises(ShardError, match=name):
        list(open_dataset(path).iter_batches(batch_size=1000))


def test_flipped_offsets_name_the_file(tmp_path: Path) -> None:
    path, index = _written(tmp_path)
    name = index["shards"][0]["raw_data"]["basename"]
    data = bytearray((path / name).read_bytes())
    data[8:12] = np.uint32(10**9).tobytes()
    (path / name).write_bytes(bytes(data))
    with pytest.raises(ShardError, match=name):
        list(open_dataset(path).iter_batches(batch_size=1000))


def test_hash_mismatch_is_detected(tmp_path: Path) -> None:
    path, index = _written(tmp_path, hashes=["xxh64"], compression="zstd")
    name = index["shards"][2]["zip_data"]["basename"]
    data = bytearray((path / name).read_bytes())
    data[-1] ^= 0xFF
    (path / name).write_bytes(bytes(data))
    with pytest.raises(HashMismatchError, match=name):
        list(open_dataset(path).iter_batches(batch_size=1000, verify_hashes=True))
    with pytest.raises(ShardError, match=name):  # unverified: zstd's own checks still fail it
        list(open_dataset(path).iter_batches(batch_size=1000))


@pytest.mark.parametrize(
    "basename", ["../escape.mds", "/etc/passwd", "s3://other/x.mds", "a/../../b"]
)
def test_index_paths_outside_the_dataset_are_refused(tmp_path: Path, basename: str) -> None:
    path, index = _written(tmp_path)
    index["shards"][0]["raw_data"]["basename"] = basename
    (path / "index.json").write_text(json.dumps(index))
    with pytest.raises(DatasetError, match="outside the dataset"):
        open_dataset(path)


def test_failed_write_keeps_the_previous_dataset(tmp_path: Path) -> None:
    path = str(tmp_path)
    write_mds(pa.table({"x": pa.array([1, 2, 3], pa.int64())}), path)

    def batches():
        yield pa.record_batch({"x": pa.array([7, 8], pa.int64())})
        raise RuntimeError("source failed mid-way")

    with pytest.raises(RuntimeError, match="mid-way"):
        write_mds(batches(), path, DatasetSpec(shard_size=64), mode="overwrite")
    assert open_dataset(path).to_arrow()["x"].to_pylist() == [1, 2, 3]
    assert sorted(n for n in os.listdir(path) if ".mds" in n) == ["shard.00000.mds"]


def test_pandas_and_batch_iterators_are_accepted(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    write_mds(pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}), str(tmp_path / "pd"))
    assert len(open_dataset(tmp_path / "pd")) == 2
    batches = (pa.record_batch({"a": pa.array([i], pa.int64())}) for i in range(5))
    write_mds(batches, str(tmp_path / "it"))
    assert open_dataset(tmp_path / "it").to_arrow()["a"].to_pylist() == [0, 1, 2, 3, 4]


def test_core_imports_without_pyspark(tmp_path: Path) -> None:
    """The training-node core must run where pyspark cannot be imported at all."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('pyspark', 'py4j', 'delta'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import pyarrow as pa, spark_dl_core\n"
        f"spark_dl_core.write_mds(pa.table({{'x': [1, 2]}}), {str(tmp_path)!r})\n"
        f"print(len(spark_dl_core.open_dataset({str(tmp_path)!r})))\n"
        "assert not [m for m in sys.modules if m.startswith(('pyspark', 'py4j'))]\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "2"


MAP_CASES = [
    (pa.string(), pa.int64(), [[("a", 1)], [], None, [("b", None), ("a", 3)]]),
    (pa.int32(), pa.string(), [[(1, "x"), (-2, "y")], [], [(0, None)]]),
    (pa.int64(), pa.float64(), [[(2**62, 0.5)], []]),
    (pa.bool_(), pa.int8(), [[(True, 1), (False, 0)], []]),
    (pa.float64(), pa.string(), [[(1.5, "a"), (-0.0, "b")]]),
    (pa.date32(), pa.int32(), [[(dt.date(2020, 1, 2), 1)], []]),
    (pa.decimal128(6, 2), pa.int32(), [[(decimal.Decimal("1.50"), 1)]]),
    (pa.binary(), pa.int32(), [[(b"\xff\x00", 1)]]),
    (pa.timestamp("us", "UTC"), pa.int32(), [[(dt.datetime(2024, 5, 1, 3, tzinfo=dt.UTC), 1)]]),
]


@pytest.mark.parametrize("case", MAP_CASES, ids=lambda c: f"{c[0]}->{c[1]}")
def test_maps_round_trip_exactly(tmp_path: Path, case: tuple[Any, Any, list[Any]]) -> None:
    key, item, rows = case
    table = pa.table({"m": pa.array(rows, pa.map_(key, item))})
    write_mds(table, str(tmp_path), DatasetSpec(nulls="mask"))
    ds = open_dataset(tmp_path)
    assert ds.to_arrow().equals(table)
    (batch,) = ds.iter_batches(batch_size=16)
    want = table.column("m").to_pylist(maps_as_pydicts="strict")
    assert list(batch["m"]) == want  # dicts with keys of the map's key type, {} when empty
    assert [type(k) for m in batch["m"] if m for k in m] == [type(k) for m in want if m for k in m]


def test_maps_nested_in_structs_and_lists_round_trip(tmp_path: Path) -> None:
    t = pa.struct(
        [("m", pa.map_(pa.int16(), pa.string())), ("ms", pa.list_(pa.map_(pa.int8(), pa.int8())))]
    )
    table = pa.table(
        {"s": pa.array([{"m": [(1, "a")], "ms": [[], [(3, 4)]]}, {"m": [], "ms": []}], t)}
    )
    write_mds(table, str(tmp_path))
    ds = open_dataset(tmp_path)
    assert ds.to_arrow().equals(table)
    (batch,) = ds.iter_batches(batch_size=4)
    assert list(batch["s"]) == [{"m": {1: "a"}, "ms": [{}, {3: 4}]}, {"m": {}, "ms": []}]


ALL_BYTES = bytes(range(256))
NESTED_BINARY = pa.table(
    {
        "lb": pa.array([[ALL_BYTES, b""], [b"\x80\xff"]], pa.list_(pa.binary())),
        "sb": pa.array(
            [{"b": ALL_BYTES, "x": 1}, {"b": b"\xc3(", "x": 2}],
            pa.struct([("b", pa.binary()), ("x", pa.int32())]),
        ),
        "mb": pa.array([[("k", ALL_BYTES)], [("k", b"\xfe")]], pa.map_(pa.string(), pa.binary())),
        "deep": pa.array(
            [[{"m": [("a", [b"\x00\x9f", ALL_BYTES])]}], []],
            pa.list_(pa.struct([("m", pa.map_(pa.string(), pa.list_(pa.binary())))])),
        ),
    }
)


def test_bytes_nested_in_lists_structs_and_maps_round_trip_exactly(tmp_path: Path) -> None:
    """Bytes inside a json column are stored as latin-1 text (one character per byte, as
    before); every reader turns them back into the same bytes by the recorded type."""
    write_mds(NESTED_BINARY, str(tmp_path))
    ds = open_dataset(tmp_path)
    assert ds.to_arrow().equals(NESTED_BINARY)
    want = NESTED_BINARY.to_pylist(maps_as_pydicts="strict")
    (batch,) = ds.iter_batches(batch_size=4)
    assert [{c: batch[c][i] for c in NESTED_BINARY.column_names} for i in range(2)] == want
    assert [ds[i] for i in range(2)] == want
    assert list(ds["sb"]) == [w["sb"] for w in want]
    # Stored as before (what older datasets hold and Mosaic's json reads): latin-1 text.
    stored = ds.decode(ds.load_shard(0), np.arange(2), columns=["lb"])["lb"]
    assert list(stored) == [[ALL_BYTES.decode("latin-1"), ""], ["\x80\xff"]]


NESTED_TEXT_LEAVES = pa.table(
    {
        "md": pa.array(
            [[("a", decimal.Decimal("1.25"))], [("b", None)]],
            pa.map_(pa.string(), pa.decimal128(5, 2)),
        ),
        "ld": pa.array([[decimal.Decimal("-0.5"), None], []], pa.list_(pa.decimal128(4, 1))),
        "s": pa.array(
            [
                {"d": dt.date(2020, 1, 2), "t": dt.time(12, 0, 1, 500000), "x": 1},
                {"d": None, "t": None, "x": 2},
            ],
            pa.struct([("d", pa.date32()), ("t", pa.time64("us")), ("x", pa.int32())]),
        ),
        "lts": pa.array(
            [[dt.datetime(2020, 1, 1, 1, 2, 3, 4, tzinfo=dt.timezone.utc)], []],
            pa.list_(pa.timestamp("us", "UTC")),
        ),
        "mts": pa.array(
            [[(dt.date(2021, 3, 4), [dt.datetime(2020, 1, 1)])], []],
            pa.map_(pa.date32(), pa.list_(pa.timestamp("ms"))),
        ),
    }
)


def test_decimals_dates_and_times_nested_in_json_read_with_their_types(tmp_path: Path) -> None:
    """Decimals, dates, times and timestamps inside a json column are stored as text; every
    reader (ds[i], the loaders' batches, to_arrow) gives them back as Arrow's values, not
    as that text."""
    write_mds(NESTED_TEXT_LEAVES, str(tmp_path))
    ds = open_dataset(tmp_path)
    assert ds.to_arrow().equals(NESTED_TEXT_LEAVES)
    want = NESTED_TEXT_LEAVES.to_pylist(maps_as_pydicts="strict")
    assert [ds[i] for i in range(2)] == want
    assert ds[0]["md"] == {"a": decimal.Decimal("1.25")}
    (batch,) = ds.iter_batches(batch_size=4)
    assert [{c: batch[c][i] for c in NESTED_TEXT_LEAVES.column_names} for i in range(2)] == want


def test_map_with_a_duplicate_key_is_refused_naming_column_and_row(tmp_path: Path) -> None:
    m = pa.array([[("a", 1)], [("b", 1), ("b", 2)]], pa.map_(pa.string(), pa.int64()))
    with pytest.raises(EncodingError, match=r"column 'tags'.*key 'b' twice.*row 1 of the data"):
        write_mds(pa.table({"tags": m}), str(tmp_path))
    assert not (tmp_path / "index.json").exists()


def test_maps_written_before_keys_were_typed_still_read() -> None:
    """Older datasets stored an empty map as ``[]`` and int keys as text."""
    from spark_dl_core.ops.arrow import numpy_to_arrow

    stored = np.empty(2, dtype=object)
    stored[:] = [{"1": "a"}, []]
    t = pa.map_(pa.int32(), pa.string())
    assert numpy_to_arrow(stored, t).to_pylist() == [[(1, "a")], []]


def test_booleans_read_as_numpy_bool(tmp_path: Path) -> None:
    table = pa.table(
        {
            "flag": [True, False],
            "flags": pa.array([[True, False], [False, False]], pa.list_(pa.bool_(), 2)),
            "ragged": pa.array([[True], []]),
        }
    )
    write_mds(table, str(tmp_path))
    (batch,) = open_dataset(tmp_path).iter_batches(batch_size=2)
    assert batch["flag"].dtype == np.bool_ and batch["flag"].tolist() == [True, False]
    assert batch["flags"].dtype == np.bool_ and batch["flags"].shape == (2, 2)
    assert [v.dtype for v in batch["ragged"]] == [np.bool_, np.bool_]


def test_columns_take_a_list_a_tuple_or_one_name(tmp_path: Path) -> None:
    from spark_dl_core.loaders.settings import LoaderSettings

    write_mds(pa.table({"x": [1], "s": ["a"], "xs": [2]}), str(tmp_path))
    ds = open_dataset(tmp_path)
    (one,) = ds.iter_batches(batch_size=4, columns="xs")
    assert list(one) == ["xs"]  # the column named "xs", not "x" and "s"
    (two,) = ds.iter_batches(batch_size=4, columns=("s", "x"))
    assert list(two) == ["s", "x"]
    assert ds.to_arrow(columns="xs").column_names == ["xs"]
    assert list(ds.read(np.arange(1), columns="s")) == ["s"]
    assert LoaderSettings(columns="xs").columns == ("xs",)  # type: ignore[arg-type]
    for bad in ({"x"}, 5, ["x", 3], {"x": 1}):
        with pytest.raises(SpecError, match="column"):
            list(ds.iter_batches(batch_size=4, columns=bad))
    with pytest.raises(SpecError, match="not set"):
        ds.to_arrow(columns={"x"})  # type: ignore[arg-type]


def test_write_mds_inputs(tmp_path: Path) -> None:
    import pandas as pd

    rows = [{"a": 1, "b": "x"}, {"a": 2, "b": None}]
    write_mds(rows, str(tmp_path / "rows"), DatasetSpec(nulls="mask"))
    assert open_dataset(tmp_path / "rows").to_arrow().equals(pa.Table.from_pylist(rows))
    write_mds(pd.DataFrame({"a": [1, 2]}), str(tmp_path / "pandas"))
    table = pa.table({"a": [1, 2, 3]})
    batches = iter(table.to_batches(max_chunksize=1))
    assert write_mds(batches, str(tmp_path / "iter")).num_samples == 3
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches())
    assert write_mds(reader, str(tmp_path / "reader")).num_samples == 3
    for bad, named in [
        ({"a": [1]}, "not dict"),
        ("abc", "not str"),
        (5, "not int"),
        ([1, 2], "got int"),
        (iter(rows), "got dict; a list of dicts is read as rows"),
        ([[table]], "got list"),
        ([{"a": 1}, {"a": "x"}], "list of dicts is not a table"),
    ]:
        with pytest.raises(SpecError, match=named):
            write_mds(bad, str(tmp_path / "bad"))
    assert not (tmp_path / "bad").exists() or not (tmp_path / "bad" / "index.json").exists()


def test_paths_that_are_not_datasets_say_why(tmp_path: Path) -> None:
    write_mds(pa.table({"a": [1]}), str(tmp_path / "ds"))
    cases = [
        (None, SpecError, "not NoneType"),
        ("", SpecError, "path is empty"),
        (str(tmp_path / "ds" / "index.json"), DatasetError, "open the dataset directory"),
        (str(tmp_path / "ds" / "spark_dl.json"), DatasetError, "is a file, not a dataset dir"),
        (str(tmp_path / "missing"), DatasetError, "missing does not exist"),
        (str(tmp_path), DatasetError, "no dataset is committed"),
    ]
    for path, kind, words in cases:
        with pytest.raises(kind, match=words):
            open_dataset(path)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="not NoneType"):
        write_mds(pa.table({"a": [1]}), None)  # type: ignore[arg-type]


def test_random_access_gives_the_loaders_types(tmp_path: Path) -> None:
    table = pa.table(
        {"b": [True, False], "m": pa.array([[(1, "a")], []], pa.map_(pa.int32(), pa.string()))}
    )
    write_mds(table, str(tmp_path))
    ds = open_dataset(tmp_path)
    assert ds[0] == {"b": True, "m": {1: "a"}} and isinstance(ds[0]["b"], np.bool_)
    assert ds[[0, 1]]["b"].dtype == np.bool_ and list(ds[[0, 1]]["m"]) == [{1: "a"}, {}]


def test_bad_image_and_array_values_name_their_row(tmp_path: Path) -> None:
    """An empty or 1-byte jpeg value (also inside list[jpeg]) and a null inside an array
    named no row."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, format="JPEG")
    j = out.getvalue()
    cases = [
        ({"img": pa.array([j, j, b"", j])}, {"img": "jpeg"}, r"0 byte.*jpeg.*row 2 of"),
        ({"img": pa.array([j, b"\xff"])}, {"img": "jpeg"}, r"1 byte.*jpeg.*row 1 of"),
        ({"img": pa.array([[j], [j, j], [b"\x89"]])}, {"img": "list[png]"}, r"png.*row 2 of"),
        ({"a": pa.array([[1], [2], [3, None]])}, {}, r"null elements.*'json'.*row 2 of"),
        ({"a": pa.array([[[1]], [[None]]])}, {}, r"null elements.*row 1 of"),
    ]
    for k, (columns, spec, message) in enumerate(cases):
        with pytest.raises(EncodingError, match=message):
            write_mds(pa.table(columns), str(tmp_path / str(k)), DatasetSpec(columns=spec))


def test_a_shard_built_from_chunks_equals_one_built_from_their_concatenation() -> None:
    """The writer hands its pending chunks to ``build_shard`` (each copied once into place):
    the bytes are those of the joined samples, fixed-width and variable alike."""
    from spark_dl_core.format.buffers import Pieces
    from spark_dl_core.format.shard import build_shard

    rng = np.random.default_rng(0)
    sizes = [rng.integers(0, 9, n) for n in (3, 1, 5)]
    chunks = []
    for s in sizes:
        offsets = np.concatenate([[0], np.cumsum(s)]).astype(np.int64)
        chunks.append(Pieces(rng.integers(0, 255, int(offsets[-1]), dtype=np.uint8), offsets))
    joined_sizes = np.concatenate(sizes)
    joined = Pieces(
        np.concatenate([c.data for c in chunks]),
        np.concatenate([[0], np.cumsum(joined_sizes)]).astype(np.int64),
    )
    assert build_shard(chunks, 9, b"{}").tobytes() == build_shard(joined, 9, b"{}").tobytes()
    fixed = [Pieces(np.arange(8 * n, dtype=np.uint8), width=8) for n in (2, 3)]
    whole = Pieces(np.concatenate([c.data for c in fixed]), width=8)
    assert build_shard(fixed, 5, b"{}").tobytes() == build_shard(whole, 5, b"{}").tobytes()


def _shards_both_ways(table: pa.Table, spec: DatasetSpec) -> tuple[Any, bytes]:
    """``ShardWriter.one_shard``'s answer and the bytes write() + finish() give."""
    from spark_dl_core.writer import ShardWriter

    class Memory:
        def __init__(self) -> None:
            self.files: dict[str, bytes] = {}

        def write_bytes(self, name: str, data: Any) -> None:
            self.files[name] = bytes(data)

    writer = ShardWriter(Memory(), spec)  # type: ignore[arg-type]
    writer.start(table.schema)
    whole = writer.one_shard(table)
    for batch in table.to_batches():
        writer.write(batch)
    infos = writer.finish()
    assert len(infos) == 1
    if whole is not None:
        assert whole[1] == (infos[0].shapes or {})
    return whole, writer.store.files[infos[0].raw_data.basename]  # type: ignore[attr-defined]


def test_a_shard_of_alike_rows_is_written_once_with_the_writers_bytes() -> None:
    """``one_shard`` (the in-place reader's conversion of a row group) lays fixed-width
    columns and arrays of one shape straight into the shard: its bytes are the writer's,
    over several batches, with a null mask column and an explicit fixed ndarray too."""
    n = 300
    rng = np.random.default_rng(1)
    emb = rng.random((n, 4), dtype=np.float32)
    grid = rng.integers(0, 300, (n, 2, 3)).tolist()  # uint16 shape widths: 300 > 255
    table = pa.table(
        {
            "id": pa.array(np.arange(n), pa.int64()),
            "emb": pa.array(emb.tolist(), pa.list_(pa.float32())),
            "grid": pa.array(grid, pa.list_(pa.list_(pa.int32()))),
            "big": pa.array([[0] * 300] * n, pa.list_(pa.int16())),
            "code": pa.array([f"c{i % 10}" for i in range(n)]),  # strings of one length
            "when": pa.array(np.arange(n).astype("datetime64[us]")),
            "flag": pa.array(np.arange(n) % 2 == 0),
            "fixed": pa.array(emb.tolist(), pa.list_(pa.float32(), 4)),
        }
    )
    cases = [
        (table, DatasetSpec()),
        (pa.Table.from_batches(table.to_batches(max_chunksize=70)), DatasetSpec()),
        (table, DatasetSpec(nulls="mask")),
        (table, DatasetSpec(columns={"fixed": "ndarray:float32:4", "emb": "ndarray"})),
    ]
    for data, spec in cases:
        whole, written = _shards_both_ways(data, spec)
        assert whole is not None
        assert whole[0].tobytes() == written


def test_a_shard_of_rows_that_differ_is_left_to_the_writer() -> None:
    """Ragged arrays, strings of other lengths, nulls, shapes that change between batches:
    ``one_shard`` declines (None) and the writer's chunked path writes them."""
    ragged = pa.table({"v": pa.array([[1.0], [1.0, 2.0]], pa.list_(pa.float32()))})
    texts = pa.table({"s": ["a", "bb"]})
    nulls = pa.table({"x": pa.array([1, None], pa.int64())})
    shapes = pa.Table.from_batches(
        [
            pa.record_batch({"v": pa.array([[1.0, 2.0]], pa.list_(pa.float32()))}),
            pa.record_batch({"v": pa.array([[1.0, 2.0, 3.0]], pa.list_(pa.float32()))}),
        ]
    )
    for data, spec in (
        (ragged, DatasetSpec()),
        (texts, DatasetSpec()),
        (nulls, DatasetSpec(nulls="mask")),
        (shapes, DatasetSpec()),
    ):
        whole, _ = _shards_both_ways(data, spec)
        assert whole is None
