"""The data both sides of the Mosaic interop tests write, and how their values compare.

MDS interoperability with Mosaic Streaming (mosaicml-streaming 0.13.0), both ways. Mosaic runs
in its own environment (``make mosaic-env``) through ``tests/interop``'s oracle:
(a) ``test_interop_mosaic_written``: datasets written by Mosaic's ``MDSWriter`` (every
encoding, several compressions, hashes and shards) read back equal through ``open_dataset``;
(b) ``test_interop_mosaic_reads_ours``: datasets written by ``write_mds`` (every Arrow type we
map, and explicit encodings) read back equal through Mosaic's ``StreamingDataset``, validating
hashes; (c) ``test_interop_mosaic_same_bytes``: for the same samples and settings our
``index.json`` and shard files are byte-identical to Mosaic's.

The side process starts twice a run: once for all that Mosaic writes, for (a) and (c) (the
session-scoped fixture in this folder's ``conftest.py``), once for all that it reads (b).
"""

from __future__ import annotations

import io
import math
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from PIL import Image

if TYPE_CHECKING:
    from tests.interop import oracle as oracle
else:
    try:
        from tests.interop import oracle as oracle
    except ImportError:  # run as `pytest`, not `python -m pytest`: only tests/ is on sys.path
        from interop import oracle as oracle


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


def shard_files(path: Path) -> list[str]:
    """The shard files (not the lengths files spark-dl writes beside some, which Mosaic's
    readers never see: index.json does not name them)."""
    return sorted(
        p.name
        for p in path.iterdir()
        if p.name.startswith("shard.") and not p.name.endswith(".lengths")
    )


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
