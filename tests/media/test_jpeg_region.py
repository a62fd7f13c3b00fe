"""Region JPEG decoding (the optional C extension spark_dl_core.media._jpeg) and its use in the
CPU image pipeline: the pixels a region decode returns are exactly a full decode's."""

from __future__ import annotations

import io
import threading
from typing import Any

import numpy as np
import pytest
from PIL import Image

from spark_dl_core.media import image_decode
from spark_dl_core.media import images as image_module
from spark_dl_core.media.images import ImageError, ImagePipeline, pixel_box, region_scale
from spark_dl_core.ops.transforms import parse_transforms

try:
    from spark_dl_core.media import _jpeg
except ImportError:  # built at install only where a compiler and libjpeg-turbo headers exist
    _jpeg = None  # type: ignore[assignment]

pytestmark = pytest.mark.skipif(
    _jpeg is None,
    reason="the C extension spark_dl_core.media._jpeg was not built "
    "(no C compiler or libjpeg-turbo headers when the package was installed)",
)

H, W = 157, 203  # not a multiple of any MCU size


def _pixels(h: int = H, w: int = W, seed: int = 0) -> np.ndarray:
    """A gradient with noise: every pixel differs from its neighbours, so an offset shows."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) % 64 * 4.0], axis=2)
    noise = np.random.default_rng(seed).normal(0, 20, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _jpeg_bytes(subsampling: int = 2, progressive: bool = False, **kw: Any) -> bytes:
    out = io.BytesIO()
    image = Image.fromarray(_pixels(**kw))
    image.save(out, "JPEG", quality=90, subsampling=subsampling, progressive=progressive)
    return out.getvalue()


def _decode(raw: bytes, scale: int = 8, region: tuple[int, int, int, int] = (0, 0, 0, 0), *,
            gray: bool = False) -> tuple[np.ndarray, int, int]:  # fmt: skip
    assert _jpeg is not None
    buffer, left, top, width, height = _jpeg.decode(raw, scale, *region, gray=gray)
    channels = 1 if gray else 3
    return np.frombuffer(buffer, np.uint8).reshape(height, width, channels), left, top


def _scaled(n: int, scale: int) -> int:
    return -(-n * scale // 8)


# 4:2:0, 4:2:2 and 4:4:4 (Pillow's subsampling 2, 1, 0), baseline and progressive
FORMATS = [(2, False), (1, False), (0, False), (2, True)]


@pytest.mark.parametrize(("subsampling", "progressive"), FORMATS)
def test_full_decode_equals_pillow_at_every_scale(subsampling: int, progressive: bool) -> None:
    raw = _jpeg_bytes(subsampling, progressive)
    assert _jpeg is not None and _jpeg.header(raw) == (H, W, 3)
    full, _, _ = _decode(raw)
    np.testing.assert_array_equal(full, np.asarray(Image.open(io.BytesIO(raw)).convert("RGB")))
    for scale in (1, 2, 4):  # Pillow's draft: the same libjpeg DCT scaling
        image = Image.open(io.BytesIO(raw))
        image.draft("RGB", (W * scale // 8, H * scale // 8))
        scaled, _, _ = _decode(raw, scale)
        assert scaled.shape == (_scaled(H, scale), _scaled(W, scale), 3)
        np.testing.assert_array_equal(scaled, np.asarray(image.convert("RGB")))
    # gray is the luma plane libjpeg decodes (not Pillow's RGB -> L conversion)
    image = Image.open(io.BytesIO(raw))
    image.draft("YCbCr", image.size)
    luma = np.asarray(image)[:, :, :1]
    np.testing.assert_array_equal(_decode(raw, gray=True)[0], luma)


BOXES = [  # fractions of the scaled image: x, y, width, height
    (0.0, 0.0, 0.5, 0.5),  # top-left corner
    (0.5, 0.6, 0.5, 0.4),  # bottom-right corner
    (0.31, 0.27, 0.33, 0.41),  # interior, not on iMCU boundaries
    (0.0, 0.4, 1.0, 0.2),  # full-width band
    (0.9, 0.0, 0.1, 1.0),  # right edge, full height
    (0.47, 0.53, 0.0, 0.0),  # to the bottom-right edge (0: to the edge)
]


@pytest.mark.parametrize(("subsampling", "progressive"), FORMATS)
@pytest.mark.parametrize("gray", [False, True])
def test_region_equals_full_decode_sliced(subsampling: int, progressive: bool, gray: bool) -> None:
    """Pixel-exact: the region's pixels are the full decode's at the same scale, also next
    to the region's edges (the decoder widens the crop so upsampling sees real neighbours)."""
    raw = _jpeg_bytes(subsampling, progressive)
    for scale in (1, 2, 3, 4, 5, 8):
        full, _, _ = _decode(raw, scale, gray=gray)
        sh, sw = full.shape[:2]
        for fx, fy, fw, fh in BOXES:
            x, y = min(int(fx * sw), sw - 1), min(int(fy * sh), sh - 1)
            w, h = min(int(fw * sw), sw - x), min(int(fh * sh), sh - y)
            region, left, top = _decode(raw, scale, (x, y, w, h), gray=gray)
            want_w, want_h = w or sw - x, h or sh - y
            assert top == y and left <= x and region.shape[0] == want_h
            assert left + region.shape[1] >= x + want_w
            got = region[:, x - left : x - left + want_w]
            np.testing.assert_array_equal(got, full[y : y + want_h, x : x + want_w])


def test_single_pixel_regions_and_the_last_pixel() -> None:
    raw = _jpeg_bytes()
    full, _, _ = _decode(raw)
    for x, y in [(0, 0), (W - 1, H - 1), (101, 77), (W - 1, 0)]:
        region, left, _ = _decode(raw, 8, (x, y, 1, 1))
        np.testing.assert_array_equal(region[:, x - left], full[y, x][None])


def test_decode_into_a_caller_buffer() -> None:
    assert _jpeg is not None
    raw = _jpeg_bytes()
    out = np.zeros(H * W * 3 + 10, np.uint8)
    buffer, left, top, width, height = _jpeg.decode(raw, out=out)
    assert buffer is out and (left, top, width, height) == (0, 0, W, H)
    np.testing.assert_array_equal(out[: H * W * 3].reshape(H, W, 3), _decode(raw)[0])
    with pytest.raises(ValueError, match="out holds 100 bytes"):
        _jpeg.decode(raw, out=np.zeros(100, np.uint8))
    with pytest.raises(ValueError, match="outside the"):
        _jpeg.decode(raw, 8, W, 0, 1, 1)
    with pytest.raises(ValueError, match="outside the"):
        _jpeg.decode(raw, 4, 0, 0, W, 1)  # W pixels wide only at full scale
    with pytest.raises(ValueError, match=r"scale must be 1\.\.8"):
        _jpeg.decode(raw, 9)


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        (lambda raw: raw[:200], "Premature end of JPEG file"),
        (lambda raw: raw[: len(raw) // 2], "Premature end of JPEG file"),
        (lambda raw: b"not a jpeg" * 20, "Not a JPEG file"),
        (lambda raw: b"", "empty JPEG data"),
    ],
)
def test_corrupt_data_raises_libjpegs_message(cut: Any, message: str) -> None:
    """Never a process exit, never gray-filled pixels for a truncated file."""
    assert _jpeg is not None
    with pytest.raises(ValueError, match=message):
        _jpeg.decode(cut(_jpeg_bytes()))


def test_rows_above_a_truncation_still_decode() -> None:
    """A region stops reading after its last row: a baseline file cut below it is fine."""
    raw = _jpeg_bytes(progressive=False)
    top, _, _ = _decode(raw[: len(raw) // 2], 8, (0, 0, W, 16))
    np.testing.assert_array_equal(top, _decode(raw)[0][:16])


def test_threads_decode_in_parallel_with_the_same_result() -> None:
    raws = [_jpeg_bytes(seed=i) for i in range(4)]
    want = [_decode(raw)[0] for raw in raws]
    got: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        for _ in range(5):
            got[i] = _decode(raws[i])[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(4):
        np.testing.assert_array_equal(got[i], want[i])


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("flip", [False, True])
def test_interleave_planes(channels: int, flip: bool) -> None:
    assert _jpeg is not None
    planes = np.random.default_rng(0).integers(0, 256, (channels, 9, 13), dtype=np.uint8)
    out = np.empty((9, 13, channels), np.uint8)
    _jpeg.interleave(planes, out, channels, 9, 13, flip)
    want = planes.transpose(1, 2, 0)
    np.testing.assert_array_equal(out, want[:, ::-1] if flip else want)


# --------------------------------------------------------------------------- pipeline

GEOMETRY = [
    {"op": "random_resized_crop", "column": "image", "size": 48, "scale": [0.1, 1.0]},
    {"op": "horizontal_flip", "column": "image", "p": 0.5},
]


def _run(pipeline: ImagePipeline, raws: list[bytes]) -> Any:
    plan = pipeline.plan(raws, b"r" * 32, np.arange(len(raws)), lambda i, m: m)
    return plan, pipeline.run_cpu(raws, plan, lambda i, m: f"sample {i}: {m}")


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_pipeline_region_path_equals_full_decode_then_crop(mode: str) -> None:
    """With torch resampling, decoding only the region changes no pixel: the output equals
    a full decode at the same DCT scale, the box rounded to pixels, cropped and resampled."""
    raws = [_jpeg_bytes(seed=i, h=240 + 16 * i, w=320 - 8 * i) for i in range(12)]
    pipeline = ImagePipeline("image", mode=mode, geometry=parse_transforms(GEOMETRY))
    before = image_decode.decode_count()
    plan, out = _run(pipeline, raws)
    assert image_decode.decode_count() - before == len(raws)
    assert out.shape == (12, 48, 48, 1 if mode == "L" else 3)
    scales = set()
    for i, raw in enumerate(raws):
        box = tuple(float(v) for v in plan.boxes[i])
        source = (int(plan.sources[i][0]), int(plan.sources[i][1]))
        scale = region_scale(box, source, (48, 48))  # type: ignore[arg-type]
        scales.add(scale)
        full, _, _ = _decode(raw, scale, gray=mode == "L")
        sy, sx = full.shape[0] / source[0], full.shape[1] / source[1]
        scaled = (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)
        want = image_module._resample(full, scaled, (48, 48), bool(plan.flips[i]))
        np.testing.assert_array_equal(out[i], want)
    assert len(scales) > 1  # the crops exercised more than one DCT scale


def test_pipeline_agrees_with_the_whole_image_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Region decode + torch vs the pipeline without the extension and with PIL."""
    raws = [_jpeg_bytes(seed=i, h=240, w=320) for i in range(8)]
    pipeline = ImagePipeline("image", geometry=parse_transforms(GEOMETRY))
    _, new = _run(pipeline, raws)
    monkeypatch.setattr(image_module, "_jpeg", None)
    monkeypatch.setattr(image_decode, "_jpeg", None)
    monkeypatch.setattr(image_module, "_torch_resize", None)
    _, old = _run(pipeline, raws)
    diff = np.abs(new.astype(int) - old.astype(int))
    # same boxes and flips; the crop is rounded to whole decoded pixels (up to half a pixel
    # at 1/8 scale = 4 source pixels) and the kernels differ: noisy pixels move a little
    assert diff.mean() < 8


def test_pil_resampling_with_a_region_equals_the_whole_image(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without torch, PIL resamples the fractional box; the margin decoded around the box
    covers its filter, so region and whole decodes give the same pixels."""
    raws = [_jpeg_bytes(seed=i, h=200, w=260) for i in range(6)]
    pipeline = ImagePipeline("image", geometry=parse_transforms(GEOMETRY))
    monkeypatch.setattr(image_module, "_torch_resize", None)
    plan, out = _run(pipeline, raws)
    for i, raw in enumerate(raws):
        box = tuple(float(v) for v in plan.boxes[i])
        scale = region_scale(box, (200, 260), (48, 48))  # type: ignore[arg-type]
        full, _, _ = _decode(raw, scale)
        sy, sx = full.shape[0] / 200, full.shape[1] / 260
        scaled = (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)
        want = image_module._resample(full, scaled, (48, 48), bool(plan.flips[i]))
        assert np.abs(out[i].astype(int) - want.astype(int)).max() <= 1


def test_cmyk_jpeg_falls_back_and_corrupt_jpeg_names_the_sample() -> None:
    out = io.BytesIO()
    Image.fromarray(_pixels(120, 160)).convert("CMYK").save(out, "JPEG")
    cmyk = out.getvalue()
    pipeline = ImagePipeline("image", geometry=parse_transforms(GEOMETRY))
    _, batch = _run(pipeline, [_jpeg_bytes(), cmyk])  # libjpeg refuses CMYK -> RGB
    assert batch.shape == (2, 48, 48, 3)
    whole = ImagePipeline(  # needs every row: a cut anywhere after the header shows
        "image", geometry=parse_transforms([{"op": "resize", "column": "image", "size": [40, 50]}])
    )
    raw = _jpeg_bytes()
    with pytest.raises(ImageError, match=r"sample 1: image does not decode: Premature end"):
        _run(whole, [raw, raw[: len(raw) * 2 // 3]])


def test_region_scale_and_pixel_box() -> None:
    assert region_scale((0, 0, 400, 400), (400, 400), (50, 50)) == 1
    assert region_scale((0, 0, 400, 400), (400, 400), (51, 50)) == 2
    assert region_scale((0, 0, 300, 300), (400, 400), (224, 224)) == 8
    assert region_scale((0, 0, 100, 100), (400, 400), (224, 224)) == 8  # upscaling
    assert pixel_box((1.5, 2.49, 10.5, 3.0), 20, 20) == (2, 2, 11, 3)
    assert pixel_box((19.7, 0.2, 19.9, 0.3), 20, 20) == (19, 0, 20, 1)  # at least a pixel
