"""Images on a torch device: a batch decoded there (on CUDA by torchvision's nvjpeg
``decode_jpeg``, on the CPU by :func:`~.image_decode.decode_image`) and all its crops
resized and flipped in one ``grid_sample`` (:func:`crop_batch`), by the same plan as the
CPU path (:mod:`.image_plans`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import SpecError
from .image_codec import JPEG_MAGIC as _JPEG
from .image_decode import decode_image
from .image_plans import Plan, pixel_box


def _batchable(plan: Plan, n: int) -> bool:
    """Whether every crop of the batch has one output size and no padding."""
    if plan.steps is not None or n < 2 or plan.out is None:
        return False
    return all(plan.region(i) is None for i in range(n))


_SUPERSAMPLE = 4  # most sub-samples per output pixel and axis (downscales beyond 4x alias)


def crop_batch(images: list[Any], plan: Plan) -> Any:
    """All crops of a batch, resized to ``plan.out`` and flipped, in one ``grid_sample``.

    The device path's fast form of the per-image crop and antialiased resize: the images
    share one zero-padded canvas; each output pixel averages ``k x k`` bilinear samples spread
    over its footprint in the source (``k`` the batch's largest downscale, at most
    :data:`_SUPERSAMPLE`), which approximates the antialiased bilinear filter closely (see
    tests/media/test_device_path.py for the measured difference). Boxes are the CPU path's
    whole-pixel boxes (:func:`pixel_box`). Returns ``[B, C, H, W]`` uint8.
    """
    import torch
    import torch.nn.functional as functional

    n = len(images)
    device = images[0].device
    assert plan.out is not None
    oh, ow = plan.out
    heights = [int(image.shape[-2]) for image in images]
    widths = [int(image.shape[-1]) for image in images]
    canvas = torch.zeros(
        (n, int(images[0].shape[0]), max(heights), max(widths)), dtype=torch.float32, device=device
    )
    for i, image in enumerate(images):
        canvas[i, :, : heights[i], : widths[i]] = image
    boxes = np.array(
        [pixel_box(tuple(plan.boxes[i]), heights[i], widths[i]) for i in range(n)], np.float64
    )  # left, top, right, bottom
    scale_x = (boxes[:, 2] - boxes[:, 0]) / ow
    scale_y = (boxes[:, 3] - boxes[:, 1]) / oh
    k = int(min(max(math.ceil(float(max(scale_x.max(), scale_y.max()))), 1), _SUPERSAMPLE))
    # Sample positions in source pixel-edge coordinates: output pixel j's footprint is
    # [left + j * scale, left + (j + 1) * scale), sampled at k evenly spaced points.
    steps = (np.arange(ow * k) + 0.5) / k
    # Clipped to the box's outer pixel centres: the crop's border, as when cropping first.
    xs = boxes[:, :1] + steps[None, :] * scale_x[:, None]  # (n, ow*k)
    xs = np.clip(xs, boxes[:, :1] + 0.5, boxes[:, 2:3] - 0.5)
    steps = (np.arange(oh * k) + 0.5) / k
    ys = boxes[:, 1:2] + steps[None, :] * scale_y[:, None]  # (n, oh*k)
    ys = np.clip(ys, boxes[:, 1:2] + 0.5, boxes[:, 3:4] - 0.5)
    width, height = canvas.shape[-1], canvas.shape[-2]
    gx = torch.as_tensor(xs / width * 2 - 1, dtype=torch.float32, device=device)
    gy = torch.as_tensor(ys / height * 2 - 1, dtype=torch.float32, device=device)
    grid = torch.stack(
        [gx[:, None, :].expand(n, oh * k, ow * k), gy[:, :, None].expand(n, oh * k, ow * k)], -1
    )
    sampled = functional.grid_sample(
        canvas, grid, mode="bilinear", padding_mode="border", align_corners=False
    )
    if k > 1:
        sampled = functional.avg_pool2d(sampled, k)
    out = sampled.round_().clamp_(0, 255).to(torch.uint8)
    flips = torch.as_tensor(plan.flips[:n], device=device)
    if bool(plan.flips[:n].any()):
        out = torch.where(flips[:, None, None, None], out.flip(-1), out)
    return out


DeviceDecode = Callable[[list[Any], str, str], list[Any]]


def _torchvision_decoder() -> Any:
    try:
        from torchvision.io import decode_jpeg
    except Exception as exc:  # ImportError, or a build that does not match torch
        raise ImportError(f"GPU image decode needs torchvision's decode_jpeg: {exc}") from None
    return decode_jpeg


def gpu_decoder_available() -> bool:
    try:
        _torchvision_decoder()
    except ImportError:
        return False
    return True


def _as_bytes(raw: Any) -> bytes:
    """An image's bytes from ``bytes``, a numpy array or a CPU torch tensor."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return bytes(raw)
    numpy = getattr(raw, "numpy", None)  # a torch tensor
    return (numpy() if numpy is not None else np.asarray(raw)).tobytes()


def _as_uint8_tensor(raw: Any) -> Any:
    """A 1-D uint8 CPU tensor over an image's bytes (no copy where it already is one)."""
    import torch

    if isinstance(raw, torch.Tensor):
        return raw
    if isinstance(raw, np.ndarray):
        return torch.from_numpy(raw if raw.flags.writeable else raw.copy())
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def decode_on_host(raws: list[Any], mode: str, device: str) -> list[Any]:
    """Each image decoded on the CPU (the workers' decoder) as a ``[C, H, W]`` uint8 tensor
    on ``device``: what the device path does with images its decoder cannot read."""
    import torch

    out = []
    for raw in raws:
        pixels = decode_image(_as_bytes(raw), mode)
        if not pixels.flags.writeable:  # PIL's buffer: torch wants memory it may write
            pixels = pixels.copy()
        out.append(torch.from_numpy(pixels).permute(2, 0, 1).to(device))
    return out


def decode_with_nvjpeg(raws: list[Any], mode: str, device: str) -> list[Any]:
    """JPEGs decoded in one batched ``torchvision.io.decode_jpeg`` call on ``device``; other
    formats (PNG…), and a batch that call refuses, decode on the host and move there."""
    from torchvision.io import ImageReadMode

    decode_jpeg = _torchvision_decoder()
    jpegs = [i for i, raw in enumerate(raws) if _as_bytes(raw[:2]) == _JPEG]
    out: list[Any] = [None] * len(raws)
    if jpegs:
        data = [_as_uint8_tensor(raws[i]) for i in jpegs]
        read_mode = ImageReadMode.RGB if mode == "RGB" else ImageReadMode.GRAY
        try:
            decoded = decode_jpeg(data, mode=read_mode, device=device)
        except RuntimeError:  # e.g. a CMYK or damaged JPEG: the host decoder names it
            decoded = decode_on_host([raws[i] for i in jpegs], mode, device)
        for i, image in zip(jpegs, decoded):
            out[i] = image
    others = [i for i in range(len(raws)) if out[i] is None]
    for i, image in zip(others, decode_on_host([raws[i] for i in others], mode, device)):
        out[i] = image
    return out


# Batch decoders by torch device type. CUDA decodes with nvjpeg; "cpu" decodes with the
# workers' decoder, so tests run every line of the device path but the nvjpeg call.
DEVICE_DECODERS: dict[str, DeviceDecode] = {"cuda": decode_with_nvjpeg, "cpu": decode_on_host}


def device_decoder(device: str) -> DeviceDecode:
    """The batch decoder for a torch device such as ``cuda:1``."""
    kind = str(device).split(":")[0]
    if kind not in DEVICE_DECODERS:
        raise SpecError(
            f"device={device!r}: images decode on {sorted(DEVICE_DECODERS)} devices; "
            "leave device unset to decode on the CPU in the DataLoader workers"
        )
    return DEVICE_DECODERS[kind]
