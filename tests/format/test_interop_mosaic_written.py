"""(a) Mosaic -> us: datasets Mosaic's MDSWriter wrote read back equal through open_dataset."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mosaic_helpers import (
    MOSAIC_COLUMNS,
    MOSAIC_CONFIGS,
    MOSAIC_SAMPLES,
    SCALARS,
    N,
    _config_id,
    _encode,
    assert_same,
    oracle,
    pil_blob,
    pixels,
    shard_files,
)
from PIL import Image

from spark_dl_core import open_dataset

pytestmark = pytest.mark.mosaic


def png_as_mosaic_stores_it(png: bytes) -> bytes:
    """Mosaic's ``png`` encoder re-saves the PIL image (same Pillow pinned on both sides)."""
    return _encode(Image.open(io.BytesIO(png)), "PNG")


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
