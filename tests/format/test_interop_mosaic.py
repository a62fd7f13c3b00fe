"""MDS interoperability with Mosaic Streaming (mosaicml-streaming 0.13.0), both ways.

Mosaic runs in its own environment (``make mosaic-env``) through ``tests/interop``'s oracle:
(a) datasets written by Mosaic's ``MDSWriter`` (every encoding, several compressions, hashes
and shards) read back equal through ``open_dataset``; (b) datasets written by ``write_mds``
(every Arrow type we map, and explicit encodings) read back equal through Mosaic's
``StreamingDataset``, validating hashes; (c) for the same samples and settings our
``index.json`` and shard files are byte-identical to Mosaic's.

The side process starts twice for the whole module (module-scoped fixtures batch the work).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import pickle
import shutil
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from spark_dl_core import DatasetSpec, open_dataset, write_mds

if TYPE_CHECKING:
    from tests.interop import oracle
else:
    try:
        from tests.interop import oracle
    except ImportError:  # run as `pytest`, not `python -m pytest`: only tests/ is on sys.path
        from interop import oracle

pytestmark = pytest.mark.mosaic

N = 240  # rows per dataset
SIZE_LIMIT = 1 << 14  # small shards: every dataset spans several
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SIGNATURE = b"\xff\xd8"

# ------------------------------------------------------------------------------ test data


def _image(seed: int) -> Image.Image:
    """A tiny RGB image; two sizes alternate so per-batch image shapes differ."""
    rng = np.random.default_rng(seed)
    height, width = (4, 6) if seed % 2 else (5, 3)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


def _encode(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


IMAGES = [_image(seed) for seed in range(24)]
PNGS = [_encode(image, "PNG") for image in IMAGES]
JPEGS = [_encode(image, "JPEG") for image in IMAGES]


def pil_blob(png: bytes) -> bytes:
    """Mosaic's ``pil`` layout for an image: [width, height, len(mode)] u32, mode, pixels."""
    image = Image.open(io.BytesIO(png))
    mode = image.mode.encode()
    header = np.array([image.width, image.height, len(mode)], dtype="<u4").tobytes()
    return header + mode + image.tobytes()


def pixels(encoded: bytes) -> np.ndarray:
    """HWC uint8 pixels of an encoded (PNG/JPEG) or ``pil``-blob image."""
    if encoded.startswith((PNG_SIGNATURE, JPEG_SIGNATURE)):
        image = Image.open(io.BytesIO(encoded))
        image.load()
        return np.asarray(image)
    width, height, mode_size = np.frombuffer(encoded[:12], "<u4")
    mode = encoded[12 : 12 + int(mode_size)].decode()
    return np.asarray(Image.frombytes(mode, (int(width), int(height)), encoded[12 + mode_size :]))


def png_as_mosaic_stores_it(png: bytes) -> bytes:
    """Mosaic's ``png`` encoder re-saves the PIL image (same Pillow pinned on both sides)."""
    return _encode(Image.open(io.BytesIO(png)), "PNG")


SCALARS = [
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
]
ND_DTYPES = SCALARS  # the value dtypes Mosaic's ndarray encoding knows

# Mosaic-written dataset (a): one column per encoding.
MOSAIC_COLUMNS: dict[str, str] = {
    "bytes": "bytes",
    "str": "str",
    "int": "int",
    **{f"s_{name}": name for name in SCALARS},
    "str_int": "str_int",
    "str_float": "str_float",
    "str_decimal": "str_decimal",
    "nd_any": "ndarray",  # dtype and shape per sample
    "nd_dtype": "ndarray:int16",  # fixed dtype, shape per sample
    "nd_same": "ndarray:uint8",  # fixed dtype, every sample (2, 3): batches stack
    "nd_fixed": "ndarray:float32:3,4",  # fixed dtype and shape: fixed-width column
    "nd_fixed1": "ndarray:float64:5",
    "pil": "pil",
    "jpeg": "jpeg",
    "png": "png",
    "list_pil": "list[pil]",
    "list_jpeg": "list[jpeg]",
    "list_png": "list[png]",
    "jpeg_array": "jpeg_array",
    "json": "json",
    "pickled": "pkl",
}


def _scalar_value(dtype: str, i: int, rng: np.random.Generator) -> Any:
    np_type = np.dtype(dtype)
    if np_type.kind == "f":
        specials = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.5]
        value = specials[i] if i < len(specials) else float(rng.normal() * 100)
        return float(np_type.type(value))  # exactly representable in the column's dtype
    info = np.iinfo(np_type)
    if i < 3:
        return [int(info.min), int(info.max), 0][i]
    return int(rng.integers(int(info.min), int(info.max), endpoint=True, dtype=np_type))


def mosaic_samples() -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    samples = []
    for i in range(N):
        k = i % len(IMAGES)
        dtype = ND_DTYPES[i % len(ND_DTYPES)]
        sample: dict[str, Any] = {
            "bytes": rng.bytes(i % 7),
            "str": "" if i == 0 else f"row {i} ü€ {'x' * (i % 5)}",
            "int": [-(1 << 63), (1 << 63) - 1][i]
            if i < 2
            else int(rng.integers(-(10**15), 10**15)),
            "str_int": int(rng.integers(-(10**12), 10**12)),
            "str_float": [math.inf, -0.0, 1e-300, 0.1][i] if i < 4 else float(rng.normal() * 1e6),
            "str_decimal": Decimal(f"{i - 100}.{i:04d}") if i % 3 else Decimal("-1.5E+7"),
            "nd_any": (rng.normal(size=(i % 3 + 1, i % 2 + 1)) * 50).astype(dtype),
            "nd_dtype": rng.integers(-300, 300, size=i % 5 + 1).astype(np.int16),
            "nd_same": rng.integers(0, 256, size=(2, 3)).astype(np.uint8),
            "nd_fixed": rng.normal(size=(3, 4)).astype(np.float32),
            "nd_fixed1": rng.normal(size=5),
            "pil": PNGS[k],
            "jpeg": JPEGS[k],
            "png": PNGS[(k + 1) % len(IMAGES)],
            "list_pil": [PNGS[(k + j) % len(IMAGES)] for j in range(i % 3 + 1)],
            "list_jpeg": [JPEGS[(k + j) % len(IMAGES)] for j in range(i % 2 + 1)],
            "list_png": [PNGS[(k + j) % len(IMAGES)] for j in range((i + 1) % 3 + 1)],
            "jpeg_array": [JPEGS[(k + j) % len(IMAGES)] for j in range(i % 3 + 1)],
            "json": {"i": i, "tags": ["a", "b"][: i % 3], "x": {"y": i / 4, "z": None}},
            "pickled": {"i": i, "tuple": (i, "x"), "dec": Decimal(i), "set": frozenset({i})},
        }
        for name in SCALARS:
            sample[f"s_{name}"] = _scalar_value(name, i, rng)
        samples.append(sample)
    return samples


MOSAIC_SAMPLES = mosaic_samples()

# (compression, hashes) for the Mosaic-written datasets: every family, every hash named.
MOSAIC_CONFIGS: list[tuple[str | None, list[str]]] = [
    (None, ["sha1", "xxh64"]),
    ("zstd", ["xxh3_64"]),
    ("zstd:7", ["md5", "xxh128"]),
    ("gz", ["sha1"]),
    ("bz2", ["xxh64"]),
    ("br", ["xxh128"]),
    ("snappy", ["md5", "xxh3_64"]),
]


def _config_id(config: tuple[str | None, list[str]]) -> str:
    return f"{config[0] or 'raw'}-{'+'.join(config[1])}"


def expected_ours(encoding: str, given: Any, images: str) -> Any:
    """What our reader yields for one Mosaic-written value (``images`` = "bytes"/"numpy")."""
    if encoding in ("pil", "jpeg", "png"):
        store: dict[str, Callable[[bytes], bytes]] = {
            "pil": pil_blob,
            "jpeg": bytes,
            "png": png_as_mosaic_stores_it,
        }
        stored = store[encoding](given)
        return stored if images == "bytes" else pixels(stored)
    if encoding.startswith("list[") or encoding == "jpeg_array":
        kind = "jpeg" if encoding == "jpeg_array" else encoding[5:-1]
        return [expected_ours(kind, item, images) for item in given]
    if encoding in SCALARS:
        return np.dtype(encoding).type(given)
    return given


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


# ------------------------------------------------------------------------------ comparisons


def assert_same(got: Any, want: Any, where: str) -> None:
    """Equal values and types, NaN equal to NaN, numpy arrays equal in dtype and shape."""
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), f"{where}: {type(got)} is not an ndarray"
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
        np.testing.assert_array_equal(got, want, err_msg=where)
    elif isinstance(want, np.generic):
        assert np.asarray(got).dtype == want.dtype, (
            f"{where}: {np.asarray(got).dtype} != {want.dtype}"
        )
        if want.dtype.kind != "f":
            assert got == want, f"{where}: {got!r} != {want!r}"
        elif np.isnan(want):
            assert np.isnan(got), f"{where}: {got!r} != nan"
        else:
            same_sign = np.signbit(got) == np.signbit(want)
            assert got == want and same_sign, f"{where}: {got!r} != {want!r}"
    elif isinstance(want, float):
        assert isinstance(got, float | np.floating), f"{where}: {type(got)} is not a float"
        if math.isnan(want):
            assert math.isnan(got), f"{where}: {got!r} != nan"
        else:
            assert got == want and math.copysign(1, got) == math.copysign(1, want), (
                f"{where}: {got!r} != {want!r}"
            )
    elif isinstance(want, list):
        assert isinstance(got, list), f"{where}: {type(got)} is not a list"
        assert len(got) == len(want), f"{where}: {len(got)} items != {len(want)}"
        for j, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{j}]")
    else:
        assert type(got) is type(want) or (isinstance(want, int) and isinstance(got, np.integer)), (
            f"{where}: {type(got)} is not {type(want)}"
        )
        assert got == want, f"{where}: {got!r} != {want!r}"


def read_ours(
    path: Path, images: str = "bytes", verify_hashes: bool = True, batch_size: int = 37
) -> tuple[dict[str, list[Any]], list[dict[str, np.ndarray]]]:
    """Every sample through our public reader: values per column, and the raw batches."""
    ds = open_dataset(path, allow_unsafe=True)
    batches = list(
        ds.iter_batches(
            batch_size=batch_size, shuffle=False, images=images, verify_hashes=verify_hashes
        )
    )
    values: dict[str, list[Any]] = {name: [] for name in ds.columns}
    for batch in batches:
        assert set(batch) == set(ds.columns)
        for name, array in batch.items():
            assert isinstance(array, np.ndarray), f"{name}: batch value is {type(array)}"
            values[name].extend(list(array))
    return values, batches


def check_batch_types(batch: Mapping[str, np.ndarray], columns: Mapping[str, str]) -> None:
    """The reader's array contract: numeric columns numeric, the rest object arrays."""
    n = len(next(iter(batch.values())))
    for name, encoding in columns.items():
        array = batch[name]
        assert len(array) == n, name
        if encoding in SCALARS:
            assert array.dtype == np.dtype(encoding) and array.shape == (n,), name
        elif encoding in ("int", "str_int"):
            assert array.dtype == np.int64 and array.shape == (n,), name
        elif encoding == "str_float":
            assert array.dtype == np.float64 and array.shape == (n,), name
        elif encoding.startswith("ndarray:") and encoding.count(":") == 2:
            _, dtype, shape = encoding.split(":")
            dims = tuple(int(d) for d in shape.split(","))
            assert array.dtype == np.dtype(dtype) and array.shape == (n, *dims), name
        elif encoding.startswith("ndarray"):
            if array.dtype != object:  # stacked: every sample of the batch has one shape
                assert array.ndim >= 2, name
        else:
            assert array.dtype == object, f"{name} ({encoding}): dtype {array.dtype}"


def shard_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.startswith("shard."))


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def side_written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One side process: Mosaic writes (a) and (c) datasets and reads one of (a) back."""
    oracle.require_mosaic()
    root = tmp_path_factory.mktemp("mosaic-written")
    jobs = [
        oracle.write_job(
            root / f"a-{_config_id(config)}",
            MOSAIC_COLUMNS,
            MOSAIC_SAMPLES,
            compression=config[0],
            hashes=config[1],
            size_limit=SIZE_LIMIT,
        )
        for config in MOSAIC_CONFIGS
    ]
    jobs.append(oracle.read_job(root / f"a-{_config_id(MOSAIC_CONFIGS[0])}", allow_unsafe=True))
    for compression in SAME_BYTES_COMPRESSIONS:
        jobs.append(
            oracle.write_job(
                root / f"c-{compression or 'raw'}",
                SAME_BYTES_COLUMNS,
                same_bytes_mosaic_samples(),
                compression=compression,
                hashes=SAME_BYTES_HASHES,
                size_limit=SAME_BYTES_SIZE_LIMIT,
            )
        )
    results = oracle.mosaic_batch(jobs)
    return {"root": root, "mosaic_read": results[len(MOSAIC_CONFIGS)]}


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


# ------------------------------------------------------------------------------ (a) Mosaic -> us


@pytest.mark.parametrize("config", MOSAIC_CONFIGS, ids=_config_id)
def test_mosaic_written_reads_equal(
    side_written: dict[str, Any], config: tuple[str | None, list[str]]
) -> None:
    path = side_written["root"] / f"a-{_config_id(config)}"
    assert len(shard_files(path)) > 2, "size_limit should have made several shards"
    ds = open_dataset(path, allow_unsafe=True)
    assert len(ds) == N
    assert ds.columns == MOSAIC_COLUMNS
    for images in ("bytes", "numpy"):
        values, batches = read_ours(path, images=images)
        check_batch_types(batches[0], MOSAIC_COLUMNS)
        for name, encoding in MOSAIC_COLUMNS.items():
            assert len(values[name]) == N, name
            for i, given in enumerate(MOSAIC_SAMPLES):
                want = expected_ours(encoding, given[name], images)
                assert_same(values[name][i], want, f"{name} ({encoding}, images={images}) row {i}")


def test_mosaic_written_batch_layouts(side_written: dict[str, Any]) -> None:
    """Fixed-width and uniform columns come as stacked arrays, per the reader contract."""
    path = side_written["root"] / f"a-{_config_id(MOSAIC_CONFIGS[1])}"
    _, batches = read_ours(path, images="numpy", batch_size=N)
    (batch,) = batches
    assert batch["nd_same"].shape == (N, 2, 3) and batch["nd_same"].dtype == np.uint8
    assert batch["nd_fixed"].shape == (N, 3, 4) and batch["nd_fixed"].dtype == np.float32
    assert batch["nd_any"].dtype == object  # shapes and dtypes differ between samples
    assert batch["int"].dtype == np.int64 and batch["str_int"].dtype == np.int64
    assert all(isinstance(v, Decimal) for v in batch["str_decimal"])
    assert all(isinstance(v, list) for v in batch["jpeg_array"])


def test_mosaic_written_agrees_with_mosaic_reader(side_written: dict[str, Any]) -> None:
    """Our reader and Mosaic's decode the same Mosaic-written files to the same values."""
    path = side_written["root"] / f"a-{_config_id(MOSAIC_CONFIGS[0])}"
    theirs = side_written["mosaic_read"]
    assert len(theirs) == N
    ours_bytes, _ = read_ours(path, images="bytes")
    ours_numpy, _ = read_ours(path, images="numpy")
    for i, sample in enumerate(theirs):
        assert set(sample) == set(MOSAIC_COLUMNS)
        for name, encoding in MOSAIC_COLUMNS.items():
            where = f"{name} ({encoding}) row {i}"
            value = sample[name]
            if isinstance(value, oracle.MosaicImage) or (
                isinstance(value, list) and value and isinstance(value[0], oracle.MosaicImage)
            ):
                images = value if isinstance(value, list) else [value]
                got_numpy = (
                    ours_numpy[name][i] if isinstance(value, list) else [ours_numpy[name][i]]
                )
                got_bytes = (
                    ours_bytes[name][i] if isinstance(value, list) else [ours_bytes[name][i]]
                )
                assert_same(got_numpy, [image.array() for image in images], where)
                for image, stored in zip(images, got_bytes, strict=True):
                    if image.encoded is not None:  # jpeg/png: Mosaic decoded these bytes
                        assert stored == image.encoded, where
            elif encoding in ("int", "str_int"):
                assert_same(ours_bytes[name][i], np.int64(value), where)
            else:
                assert_same(ours_bytes[name][i], value, where)


def test_mosaic_written_pkl_needs_allow_unsafe(side_written: dict[str, Any]) -> None:
    path = side_written["root"] / f"a-{_config_id(MOSAIC_CONFIGS[0])}"
    with pytest.raises(Exception, match="pickled"):  # the error names the column
        next(iter(open_dataset(path).iter_batches(batch_size=8)))


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


# ------------------------------------------------------------------------------ (c) same bytes

# The table's columns are put in sorted order: MDSWriter stores columns sorted by name.
SAME_BYTES_COLUMNS: dict[str, str] = {
    "a_bytes": "bytes",
    "b_str": "str",
    "c_int": "int",
    **{f"d_{name}": name for name in SCALARS},
    "e_bool": "uint8",
    "f_str_int": "str_int",
    "g_str_float": "str_float",
    "h_str_decimal": "str_decimal",
    "i_nd_dtype": "ndarray:int32",
    "j_nd_fixed": "ndarray:float32:4",
    "k_nd_any": "ndarray",
    "l_json": "json",
    "m_jpeg": "jpeg",
    "n_png": "png",
    "o_pil": "pil",
    "p_list_jpeg": "list[jpeg]",
    "q_list_png": "list[png]",
    "r_list_pil": "list[pil]",
    "s_jpeg_array": "jpeg_array",
    "t_pkl": "pkl",
}
SAME_BYTES_COMPRESSIONS: list[str | None] = [None, "zstd", "zstd:7", "gz", "bz2", "br", "snappy"]
SAME_BYTES_HASHES = sorted(["sha1", "md5", "xxh64", "xxh3_64", "xxh128"])  # MDSWriter: sorted
SAME_BYTES_SIZE_LIMIT = 1 << 13
SAME_BYTES_N = 120


def same_bytes_table() -> pa.Table:
    rng = np.random.default_rng(3)
    n = SAME_BYTES_N
    k = [i % len(IMAGES) for i in range(n)]
    lists = [[(j + m) % len(IMAGES) for m in range(i % 3 + 1)] for i, j in enumerate(k)]
    columns: dict[str, pa.Array] = {
        "a_bytes": pa.array([rng.bytes(i % 11) for i in range(n)], pa.binary()),
        "b_str": pa.array([f"text {i} ∑ {'y' * (i % 6)}" for i in range(n)]),
        "c_int": pa.array(rng.integers(-(2**62), 2**62, size=n), pa.int64()),
    }
    for name in SCALARS:
        values = [_scalar_value(name, i, rng) for i in range(n)]
        columns[f"d_{name}"] = pa.array(np.array(values, dtype=name))
    columns["e_bool"] = pa.array([i % 2 == 0 for i in range(n)])
    columns["f_str_int"] = pa.array(rng.integers(-(10**9), 10**9, size=n), pa.int64())
    columns["g_str_float"] = pa.array(rng.normal(size=n) * 1e3, pa.float64())
    columns["h_str_decimal"] = pa.array(
        [Decimal(f"{i - 60}.{i % 100:02d}") for i in range(n)], pa.decimal128(8, 2)
    )
    columns["i_nd_dtype"] = pa.array(
        [rng.integers(-1000, 1000, size=i % 5 + 1).tolist() for i in range(n)],
        pa.list_(pa.int32()),
    )
    vectors = rng.normal(size=(n, 4)).astype(np.float32)
    columns["j_nd_fixed"] = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), 4)
    columns["k_nd_any"] = pa.array(
        [rng.integers(0, 100, size=(i % 3 + 1,)).tolist() for i in range(n)],
        pa.list_(pa.uint16()),
    )
    columns["l_json"] = pa.array(
        [{"id": i, "name": f"n{i}", "tags": ["t"] * (i % 3)} for i in range(n)],
        pa.struct([("id", pa.int64()), ("name", pa.string()), ("tags", pa.list_(pa.string()))]),
    )
    columns["m_jpeg"] = pa.array([JPEGS[j] for j in k], pa.binary())
    columns["n_png"] = pa.array([PNGS[j] for j in k], pa.binary())
    columns["o_pil"] = pa.array([pil_blob(PNGS[j]) for j in k], pa.binary())
    columns["p_list_jpeg"] = pa.array(
        [[JPEGS[m] for m in ms] for ms in lists], pa.list_(pa.binary())
    )
    columns["q_list_png"] = pa.array([[PNGS[m] for m in ms] for ms in lists], pa.list_(pa.binary()))
    columns["r_list_pil"] = pa.array(
        [[pil_blob(PNGS[m]) for m in ms] for ms in lists], pa.list_(pa.binary())
    )
    columns["s_jpeg_array"] = pa.array(
        [[JPEGS[m] for m in ms] for ms in lists], pa.list_(pa.binary())
    )
    columns["t_pkl"] = pa.array([f"pickled {i}" for i in range(n)])
    return pa.table(columns).select(sorted(columns))  # MDSWriter's column order


SAME_BYTES_TABLE = same_bytes_table()


def same_bytes_mosaic_samples() -> list[dict[str, Any]]:
    """The same rows as Mosaic takes them (numpy arrays, PIL-bound images as bytes)."""
    samples = []
    for row in SAME_BYTES_TABLE.to_pylist():
        sample = dict(row)
        sample["e_bool"] = int(row["e_bool"])
        sample["i_nd_dtype"] = np.array(row["i_nd_dtype"], dtype=np.int32)
        sample["j_nd_fixed"] = np.array(row["j_nd_fixed"], dtype=np.float32)
        sample["k_nd_any"] = np.array(row["k_nd_any"], dtype=np.uint16)
        # Mosaic's pil encoder takes a PIL image: give it the PNG of the same pixels.
        sample["o_pil"] = _png_of_blob(row["o_pil"])
        sample["r_list_pil"] = [_png_of_blob(blob) for blob in row["r_list_pil"]]
        samples.append(sample)
    return samples


def _png_of_blob(blob: bytes) -> bytes:
    return _encode(Image.fromarray(pixels(blob), "RGB"), "PNG")


def _decompress(compression: str | None, data: bytes) -> bytes:
    if compression is None:
        return data
    family = compression.split(":")[0]
    if family == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    if family == "gz":
        return gzip.decompress(data)
    if family == "bz2":
        import bz2

        return bz2.decompress(data)
    if family == "br":
        import brotli

        return brotli.decompress(data)
    import cramjam

    return bytes(cramjam.snappy.decompress_raw(data))


def _gzip_neutral_header(data: bytes) -> bytes:
    """A gzip member with its MTIME (bytes 4-7) and OS (byte 9) header fields zeroed.

    Both are informational (RFC 1952): Python's ``gzip.compress``, which MDSWriter calls,
    stamps the current time and OS 255 ("unknown"); a fixed MTIME makes output reproducible.
    """
    return data[:4] + b"\0\0\0\0" + data[8:9] + b"\0" + data[10:]


def _index_without(index: dict[str, Any], drop_zip_hashes: bool) -> dict[str, Any]:
    if drop_zip_hashes:
        for shard in index["shards"]:
            if shard.get("zip_data"):
                shard["zip_data"]["hashes"] = {}
    return index


@pytest.mark.parametrize("compression", SAME_BYTES_COMPRESSIONS, ids=lambda c: c or "raw")
def test_same_bytes_as_mdswriter(
    side_written: dict[str, Any], tmp_path: Path, compression: str | None
) -> None:
    theirs = side_written["root"] / f"c-{compression or 'raw'}"
    ours = tmp_path / "ours"
    spec = DatasetSpec(
        columns=SAME_BYTES_COLUMNS,
        compression=compression,
        hashes=SAME_BYTES_HASHES,
        shard_size=SAME_BYTES_SIZE_LIMIT,
    )
    write_mds(SAME_BYTES_TABLE, str(ours), spec)
    assert shard_files(ours) == shard_files(theirs)
    assert len(shard_files(theirs)) > 2

    # The uncompressed shard contents first: a difference there is an encoding difference.
    for name in shard_files(theirs):
        mine = _decompress(compression, (ours / name).read_bytes())
        reference = _decompress(compression, (theirs / name).read_bytes())
        assert mine == reference, f"{name}: decompressed shard differs from MDSWriter's"

    is_gz = compression is not None and compression.startswith("gz")
    our_index = _index_without(json.loads((ours / "index.json").read_text()), is_gz)
    their_index = _index_without(json.loads((theirs / "index.json").read_text()), is_gz)
    assert our_index == their_index
    if is_gz:  # gzip stamps the write time into each file; everything else must match
        for name in shard_files(theirs):
            assert _gzip_neutral_header((ours / name).read_bytes()) == _gzip_neutral_header(
                (theirs / name).read_bytes()
            ), name
    else:
        assert (ours / "index.json").read_bytes() == (theirs / "index.json").read_bytes()
        for name in shard_files(theirs):
            assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name


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
