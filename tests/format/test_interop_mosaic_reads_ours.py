"""(b) us -> Mosaic: datasets write_mds wrote read back equal through Mosaic's StreamingDataset."""

from __future__ import annotations

import json
import pickle
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from mosaic_helpers import (
    IMAGES,
    JPEGS,
    PNGS,
    SCALARS,
    SIZE_LIMIT,
    N,
    _config_id,
    _scalar_value,
    assert_same,
    oracle,
    pil_blob,
    pixels,
)

from spark_dl_core import DatasetSpec, open_dataset, write_mds

pytestmark = pytest.mark.mosaic


# Arrow table for our writer (b): every Arrow type we map, plus explicit encodings.
OUR_SPEC_COLUMNS: dict[str, str] = {
    "as_int": "int",
    "as_str_int": "str_int",
    "as_str_float": "str_float",
    "as_str_decimal": "str_decimal",
    "as_ndarray": "ndarray",
    "as_pkl": "pkl",
    "jpeg": "jpeg",
    "png": "png",
    "pil": "pil",
    "list_jpeg": "list[jpeg]",
    "list_png": "list[png]",
    "list_pil": "list[pil]",
    "jpeg_array": "jpeg_array",
}
# Encodings our writer must choose (inferred) or take from the spec, per column.
OUR_ENCODINGS: dict[str, str] = {
    **{f"a_{name}": name for name in SCALARS},
    "a_bool": "uint8",
    "a_string": "str",
    "a_binary": "bytes",
    "a_vector": "ndarray:float32:4",
    "a_grid": "ndarray:int16:2,3",
    "a_seq": "ndarray:int32",
    "a_matrix": "ndarray:float64",
    "a_struct": "json",
    "a_map": "json",
    "a_strings": "json",
    "a_decimal": "str_decimal",
    **OUR_SPEC_COLUMNS,
}


def our_table() -> pa.Table:
    rng = np.random.default_rng(11)
    columns: dict[str, pa.Array] = {}
    for name in SCALARS:
        values = [_scalar_value(name, i, rng) for i in range(N)]
        columns[f"a_{name}"] = pa.array(np.array(values, dtype=name))
    columns["a_bool"] = pa.array([i % 3 == 0 for i in range(N)])
    columns["a_string"] = pa.array(["" if i == 0 else f"s{i} ü€" * (i % 4) for i in range(N)])
    columns["a_binary"] = pa.array([rng.bytes(i % 9) for i in range(N)], pa.binary())
    vectors = rng.normal(size=(N, 4)).astype(np.float32)
    columns["a_vector"] = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), 4)
    grid = rng.integers(-999, 999, size=(N, 2, 3)).astype(np.int16)
    inner = pa.FixedSizeListArray.from_arrays(pa.array(grid.reshape(-1)), 3)
    columns["a_grid"] = pa.FixedSizeListArray.from_arrays(inner, 2)
    columns["a_seq"] = pa.array(
        [rng.integers(-(2**31), 2**31, size=i % 6 + 1).tolist() for i in range(N)],
        pa.list_(pa.int32()),
    )
    columns["a_matrix"] = pa.array(
        [rng.normal(size=(i % 3 + 1, 2)).tolist() for i in range(N)],
        pa.list_(pa.list_(pa.float64())),
    )
    columns["a_struct"] = pa.array(
        [{"id": i, "name": f"n{i}", "score": i / 8} for i in range(N)],
        pa.struct([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())]),
    )
    columns["a_map"] = pa.array(
        [[(f"k{j}", i * j) for j in range(i % 3 + 1)] for i in range(N)],
        pa.map_(pa.string(), pa.int32()),
    )
    columns["a_strings"] = pa.array([["x", "y", "z"][: i % 4] for i in range(N)])
    columns["a_decimal"] = pa.array(
        [Decimal(f"{i * 7 - 500}.{i % 1000:03d}") for i in range(N)], pa.decimal128(12, 3)
    )
    columns["as_int"] = pa.array(rng.integers(-(10**15), 10**15, size=N), pa.int64())
    columns["as_str_int"] = pa.array(rng.integers(-(10**12), 10**12, size=N), pa.int64())
    columns["as_str_float"] = pa.array(rng.normal(size=N) * 1e5, pa.float64())
    columns["as_str_decimal"] = pa.array([f"{i}.{i % 7}e{i % 5}" for i in range(N)])
    columns["as_ndarray"] = pa.array(
        [rng.integers(0, 9, size=i % 4 + 1).tolist() for i in range(N)], pa.list_(pa.int16())
    )
    columns["as_pkl"] = pa.array([f"pickled {i}" for i in range(N)])
    k = [i % len(IMAGES) for i in range(N)]
    columns["jpeg"] = pa.array([JPEGS[j] for j in k], pa.binary())
    columns["png"] = pa.array([PNGS[j] for j in k], pa.binary())
    columns["pil"] = pa.array([pil_blob(PNGS[j]) for j in k], pa.binary())
    lists = [[(j + m) % len(IMAGES) for m in range(i % 3 + 1)] for i, j in enumerate(k)]
    columns["list_jpeg"] = pa.array([[JPEGS[m] for m in ms] for ms in lists], pa.list_(pa.binary()))
    columns["list_png"] = pa.array([[PNGS[m] for m in ms] for ms in lists], pa.list_(pa.binary()))
    columns["list_pil"] = pa.array(
        [[pil_blob(PNGS[m]) for m in ms] for ms in lists], pa.list_(pa.binary())
    )
    columns["jpeg_array"] = pa.array(
        [[JPEGS[m] for m in ms] for ms in lists], pa.list_(pa.binary())
    )
    return pa.table(columns)


OUR_TABLE = our_table()

# (compression, hashes, the hash Mosaic validates) for our datasets read by Mosaic.
OUR_CONFIGS: list[tuple[str | None, list[str], str]] = [
    (None, ["md5", "sha1", "xxh64"], "xxh64"),
    ("zstd", ["xxh3_64"], "xxh3_64"),
    ("zstd:7", ["xxh128", "md5"], "md5"),
    ("gz", ["xxh128"], "xxh128"),
    ("bz2", ["sha1"], "sha1"),
    ("br", ["xxh64"], "xxh64"),
    ("snappy", ["md5"], "md5"),
]


def _leaf_dtype(t: pa.DataType) -> np.dtype[Any]:
    while pa.types.is_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return np.dtype(t.to_pandas_dtype())


def expected_mosaic(name: str, encoding: str, value: Any) -> Any:
    """What Mosaic's reader yields (after the oracle's conversion) for one table value."""
    if encoding in SCALARS:
        return np.dtype(encoding).type(value)
    if encoding in ("int", "str_int"):
        return int(value)
    if encoding == "str_float":
        return float(value)
    if encoding == "str_decimal":
        return Decimal(value)
    if encoding.startswith("ndarray"):
        return np.array(value, dtype=_leaf_dtype(OUR_TABLE.schema.field(name).type))
    if encoding == "json":
        if isinstance(value, list) and value and isinstance(value[0], tuple):
            return {str(k): v for k, v in value}  # Arrow maps are JSON objects
        return value
    return value  # str, bytes, pkl'd str; images are compared by the caller


@pytest.fixture(scope="module")
def ours_read_by_mosaic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Our datasets (b), and one side process in which Mosaic reads each of them."""
    oracle.require_mosaic()
    root = tmp_path_factory.mktemp("ours-for-mosaic")
    jobs: dict[str, dict[str, Any]] = {}
    paths: dict[str | None, Path] = {}
    for compression, hashes, validate in OUR_CONFIGS:
        path = root / _config_id((compression, hashes))
        spec = DatasetSpec(
            columns=OUR_SPEC_COLUMNS, compression=compression, hashes=hashes, shard_size=SIZE_LIMIT
        )
        write_mds(OUR_TABLE, str(path), spec)
        paths[compression] = path
        jobs[f"read {compression}"] = oracle.read_job(
            path, validate_hash=validate, allow_unsafe=True
        )
    # Mosaic's other local path: remote=None, shards decompressed in place (on a copy).
    jobs["no remote"] = oracle.read_job(paths["zstd:7"], allow_unsafe=True, remote=False)
    jobs["unsafe refused"] = oracle.read_job(paths[None], allow_unsafe=False)
    # A flipped byte must fail Mosaic's check: validation above was not vacuous.
    tampered = root / "tampered"
    shutil.copytree(paths[None], tampered)
    shard = tampered / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    jobs["tampered"] = oracle.read_job(tampered, validate_hash="sha1", allow_unsafe=True)
    results = oracle.mosaic_batch(list(jobs.values()), check=False)
    return {"paths": paths, **dict(zip(jobs, results, strict=True))}


# ------------------------------------------------------------------------------ (b) us -> Mosaic


def test_our_encodings_are_mosaic_encodings(ours_read_by_mosaic: dict[str, Any]) -> None:
    """The index names the inferred / requested encodings, and our reader agrees."""
    path = ours_read_by_mosaic["paths"][None]
    index = json.loads((path / "index.json").read_text())
    assert len(index["shards"]) > 2
    for shard in index["shards"]:
        assert shard["format"] == "mds"
        assert dict(zip(shard["column_names"], shard["column_encodings"], strict=True)) == (
            OUR_ENCODINGS
        )
    assert open_dataset(path).columns == OUR_ENCODINGS


@pytest.mark.parametrize(
    "config", OUR_CONFIGS, ids=lambda c: f"{_config_id((c[0], c[1]))}-validate-{c[2]}"
)
def test_ours_reads_equal_in_mosaic(
    ours_read_by_mosaic: dict[str, Any], config: tuple[str | None, list[str], str]
) -> None:
    samples = ours_read_by_mosaic[f"read {config[0]}"]
    if isinstance(samples, Exception):
        raise AssertionError(f"Mosaic with validate_hash={config[2]!r}: {samples}")
    assert_mosaic_samples_equal(samples, f"validate_hash={config[2]}")


def test_ours_reads_in_mosaic_without_remote(ours_read_by_mosaic: dict[str, Any]) -> None:
    samples = ours_read_by_mosaic["no remote"]
    if isinstance(samples, Exception):
        raise AssertionError(str(samples))
    assert_mosaic_samples_equal(samples, "remote=None")


def test_mosaic_refuses_our_pkl_unless_allowed(ours_read_by_mosaic: dict[str, Any]) -> None:
    refused = ours_read_by_mosaic["unsafe refused"]
    assert isinstance(refused, oracle.MosaicOracleError)
    assert "as_pkl" in str(refused) and "pkl" in str(refused)


def test_mosaic_detects_tampered_shard_by_our_hash(ours_read_by_mosaic: dict[str, Any]) -> None:
    failed = ours_read_by_mosaic["tampered"]
    assert isinstance(failed, oracle.MosaicOracleError)
    assert "Checksum failure" in str(failed) and "shard.00000.mds" in str(failed)


def assert_mosaic_samples_equal(samples: list[dict[str, Any]], how: str) -> None:
    rows = OUR_TABLE.to_pylist()
    assert len(samples) == len(rows)
    for i, (got, row) in enumerate(zip(samples, rows, strict=True)):
        assert set(got) == set(OUR_ENCODINGS), f"{how} row {i}: columns {sorted(got)}"
        for name, encoding in OUR_ENCODINGS.items():
            where = f"Mosaic ({how}) {name} ({encoding}) row {i}"
            value = got[name]
            if encoding in ("jpeg", "png", "pil"):
                _assert_image(value, row[name], encoding, where)
            elif encoding.startswith("list[") or encoding == "jpeg_array":
                kind = "jpeg" if encoding == "jpeg_array" else encoding[5:-1]
                assert isinstance(value, list) and len(value) == len(row[name]), where
                for j, (image, given) in enumerate(zip(value, row[name], strict=True)):
                    _assert_image(image, given, kind, f"{where}[{j}]")
            else:
                assert_same(value, expected_mosaic(name, encoding, row[name]), where)


def _assert_image(image: Any, given: bytes, kind: str, where: str) -> None:
    assert isinstance(image, oracle.MosaicImage), f"{where}: {type(image)}"
    assert_same(image.array(), pixels(given), where)
    if kind in ("jpeg", "png"):
        assert image.encoded == given, f"{where}: Mosaic decoded other bytes than we stored"


def test_pickle_helpers_roundtrip() -> None:
    """The oracle's plain-value conversion keeps numpy dtypes and shapes across processes."""
    values: dict[str, Any] = {
        "a": np.arange(6, dtype=">i4").reshape(2, 3),
        "b": np.float16(1.5),
        "c": [np.uint64(2**64 - 1), Decimal("1.5"), (1, "x")],
    }
    back = oracle.from_plain(pickle.loads(pickle.dumps(oracle.to_plain(values))))
    assert_same(back["a"], values["a"], "a")
    assert_same(back["b"], values["b"], "b")
    assert back["c"][1:] == values["c"][1:] and back["c"][0] == values["c"][0]
