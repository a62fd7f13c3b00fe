"""Where each image of a batch is cropped, resized and flipped: the per-sample *plans*.

Random draws come from generators keyed by (dataset fingerprint, seed, epoch, global sample
index), so a sample gets the same box on any world size, worker count and after resume. The
same plan drives the CPU pipeline and the device path (``images``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ops.transforms import (
    CenterCrop,
    HorizontalFlip,
    RandomResizedCrop,
    Resize,
    sample_rngs,
)
from ..ops.transforms import augment_key as augment_key  # where image code has always found it


@dataclass(frozen=True)
class Plan:
    """Per sample: source box ``(x0, y0, x1, y1)`` in original pixels, flip, output size;
    with ``inner``, where in the output the box lands (a crop larger than the image is
    padded with ``fill`` around it, as torchvision's ``center_crop`` pads)."""

    boxes: np.ndarray  # (n, 4) float64
    flips: np.ndarray  # (n,) bool
    out: tuple[int, int] | None  # (h, w) shared by the batch, None: each image's own size
    sizes: np.ndarray  # (n, 2) output (h, w) of each sample
    sources: np.ndarray  # (n, 2) original (h, w) of each sample
    inner: np.ndarray | None = None  # (n, 4) (top, left, bottom, right); None: no padding
    fill: int = 0
    steps: tuple[tuple[tuple[Any, ...], ...], ...] | None = None  # exact: ops in order

    def rows(self, start: int, stop: int) -> Plan:
        return Plan(
            self.boxes[start:stop],
            self.flips[start:stop],
            self.out,
            self.sizes[start:stop],
            self.sources[start:stop],
            None if self.inner is None else self.inner[start:stop],
            self.fill,
            self.steps[start:stop] if self.steps is not None else None,
        )

    def region(self, i: int) -> tuple[int, int, int, int] | None:
        """Sample ``i``'s ``(top, left, bottom, right)`` in its output, None: all of it."""
        if self.inner is None:
            return None
        top, left, bottom, right = (int(v) for v in self.inner[i])
        oh, ow = (int(v) for v in self.sizes[i])
        return None if (top, left, bottom, right) == (0, 0, oh, ow) else (top, left, bottom, right)


def _pair(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def _random_box(
    rng: np.random.Generator, w: float, h: float, op: RandomResizedCrop
) -> tuple[float, float, float, float]:
    """torchvision's RandomResizedCrop box (x, y, cw, ch) within a ``w x h`` image."""
    area = w * h
    log_lo, log_hi = math.log(op.ratio[0]), math.log(op.ratio[1])
    cw: float
    ch: float
    for _ in range(10):
        target = area * rng.uniform(op.scale[0], op.scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        cw = float(round(math.sqrt(target * aspect)))
        ch = float(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            x = float(rng.integers(0, int(w - cw) + 1))
            y = float(rng.integers(0, int(h - ch) + 1))
            return x, y, float(cw), float(ch)
    ratio = w / h  # fallback: central crop at the nearest allowed ratio
    if ratio < op.ratio[0]:
        cw, ch = w, float(round(w / op.ratio[0]))
    elif ratio > op.ratio[1]:
        ch, cw = h, float(round(h * op.ratio[1]))
    else:
        cw, ch = w, h
    return (w - cw) / 2, (h - ch) / 2, float(cw), float(ch)


def plan_boxes(sizes: np.ndarray, ops: list[Any], key: bytes, indices: np.ndarray) -> Plan:
    """Compose the geometric ops of each sample into one source box, flip and output size.

    ``sizes`` are the original ``(h, w)``. Computed once per batch; the CPU and the GPU
    path both execute this plan, so they crop identically.
    """
    n = len(sizes)
    boxes = np.zeros((n, 4), dtype=np.float64)
    flips = np.zeros(n, dtype=bool)
    outs = np.zeros((n, 2), dtype=np.int64)
    inner = np.zeros((n, 4), dtype=np.int64)
    padded = False
    fill = 0
    random = any(isinstance(op, (RandomResizedCrop, HorizontalFlip)) for op in ops)
    rngs = sample_rngs(key, indices) if random else []
    for i in range(n):
        h, w = float(sizes[i][0]), float(sizes[i][1])
        x0, y0, bw, bh = 0.0, 0.0, w, h  # source box
        ow, oh = w, h  # current output size
        flip = False
        for op in ops:
            if isinstance(op, Resize):
                if isinstance(op.size, int):
                    s = op.size / min(ow, oh)
                    ow, oh = float(max(1, round(ow * s))), float(max(1, round(oh * s)))
                else:
                    oh, ow = map(float, _pair(op.size))
                continue
            if isinstance(op, HorizontalFlip):
                if rngs[i].random() < op.p:
                    flip = not flip
                continue
            cw: float
            ch: float
            if isinstance(op, CenterCrop):
                # torchvision: a side larger than the image is padded ((crop - side) // 2
                # before it), a smaller one cropped at round((side - crop) / 2)
                ch, cw = map(float, _pair(op.size))
                cx = float(round((ow - cw) / 2)) if cw <= ow else -float((cw - ow) // 2)
                cy = float(round((oh - ch) / 2)) if ch <= oh else -float((ch - oh) // 2)
                if cw > ow or ch > oh:
                    fill = op.fill
                target = _pair(op.size)
            elif isinstance(op, RandomResizedCrop):
                cx, cy, cw, ch = _random_box(rngs[i], ow, oh, op)
                target = _pair(op.size)
            else:
                continue
            if flip:  # crop coordinates are in the mirrored image
                cx = ow - cx - cw
            sx, sy = bw / ow, bh / oh
            x0, y0, bw, bh = x0 + cx * sx, y0 + cy * sy, cw * sx, ch * sy
            oh, ow = float(target[0]), float(target[1])
        outs[i] = (round(oh), round(ow))
        inner[i] = (0, 0, outs[i][0], outs[i][1])
        x1, y1 = x0 + bw, y0 + bh
        if x0 < 0 or y0 < 0 or x1 > w or y1 > h:  # the box reaches past the image: padding
            padded = True
            cx0, cy0, cx1, cy1 = max(x0, 0.0), max(y0, 0.0), min(x1, w), min(y1, h)
            left, right = round((cx0 - x0) / bw * ow), round((cx1 - x0) / bw * ow)
            top, bottom = round((cy0 - y0) / bh * oh), round((cy1 - y0) / bh * oh)
            right, bottom = max(right, left + 1), max(bottom, top + 1)
            if flip:
                left, right = round(ow) - right, round(ow) - left
            inner[i] = (top, left, bottom, right)
            x0, y0, x1, y1 = cx0, cy0, cx1, cy1
        boxes[i] = (x0, y0, x1, y1)
        flips[i] = flip
    fixed = bool(n) and bool(np.all(outs == outs[0]))
    out = (int(outs[0][0]), int(outs[0][1])) if fixed else None
    sources = np.asarray(sizes, dtype=np.int64)
    return Plan(boxes, flips, out, outs, sources, inner if padded else None, fill)


def _torchvision_size(h: int, w: int, size: int | tuple[int, int]) -> tuple[int, int]:
    """torchvision's ``Resize`` output ``(h, w)``: an int sets the shorter side and the
    longer one is truncated (not rounded)."""
    if not isinstance(size, int):
        return _pair(size)
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(size * long / short)
    return (new_long, size) if w <= h else (size, new_long)


def plan_exact(sizes: np.ndarray, ops: list[Any], key: bytes, indices: np.ndarray) -> Plan:
    """``exact=True``: per sample, the ops as torchvision runs them on the full image, one
    after the other (``resize`` to torchvision's size, whole-pixel crops, ``center_crop``
    padding with ``fill`` when the image is smaller). Random draws come from the same
    generators, in the same order, as in :func:`plan_boxes`."""
    n = len(sizes)
    flips = np.zeros(n, dtype=bool)
    outs = np.zeros((n, 2), dtype=np.int64)
    random = any(isinstance(op, (RandomResizedCrop, HorizontalFlip)) for op in ops)
    rngs = sample_rngs(key, indices) if random else []
    steps: list[tuple[tuple[Any, ...], ...]] = []
    for i in range(n):
        h, w = int(sizes[i][0]), int(sizes[i][1])
        todo: list[tuple[Any, ...]] = []
        for op in ops:
            if isinstance(op, HorizontalFlip):
                if rngs[i].random() < op.p:
                    todo.append(("flip",))
                    flips[i] = not flips[i]
                continue
            if isinstance(op, Resize):
                th, tw = _torchvision_size(h, w, op.size)
            elif isinstance(op, CenterCrop):
                th, tw = _pair(op.size)
                if th > h or tw > w:  # torchvision pads with zeros, then crops
                    dw, dh = max(tw - w, 0), max(th - h, 0)
                    pad = (dw // 2, dh // 2, (dw + 1) // 2, (dh + 1) // 2)
                    todo.append(("pad", *pad, op.fill))
                    h, w = h + dh, w + dw
                top, left = round((h - th) / 2.0), round((w - tw) / 2.0)
                todo.append(("crop", top, left, th, tw))
                h, w = th, tw
                continue
            elif isinstance(op, RandomResizedCrop):
                x, y, cw, ch = _random_box(rngs[i], float(w), float(h), op)
                todo.append(("crop", math.floor(y), math.floor(x), int(ch), int(cw)))
                h, w = int(ch), int(cw)
                th, tw = _pair(op.size)
            else:
                continue
            if (th, tw) != (h, w):
                todo.append(("resize", th, tw))
                h, w = th, tw
        steps.append(tuple(todo))
        outs[i] = (h, w)
    fixed = bool(n) and bool(np.all(outs == outs[0]))
    out = (int(outs[0][0]), int(outs[0][1])) if fixed else None
    boxes = np.zeros((n, 4), dtype=np.float64)
    sources = np.asarray(sizes, dtype=np.int64)
    return Plan(boxes, flips, out, outs, sources, steps=tuple(steps))


def _native_uint8() -> bool:
    """Whether torchvision resizes uint8 images on this CPU with torch's uint8 kernel
    (AVX2/AVX512) rather than in float32 rounded back."""
    import torch

    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def run_steps(image: Any, steps: tuple[tuple[Any, ...], ...]) -> Any:
    """Run one sample's ``exact`` steps on a ``[C, H, W]`` uint8 tensor (any device)."""
    import torch
    import torch.nn.functional as functional

    for step in steps:
        if step[0] == "flip":
            image = image.flip(-1)
        elif step[0] == "pad":
            left, top, right, bottom, fill = step[1:]
            image = functional.pad(image, (left, right, top, bottom), value=fill)
        elif step[0] == "crop":
            top, left, h, w = step[1:]
            image = image[:, top : top + h, left : left + w]
        else:
            size = (int(step[1]), int(step[2]))
            native = image.device.type == "cpu" and _native_uint8()
            batch = image[None] if native else image[None].float()
            batch = functional.interpolate(
                batch, size=size, mode="bilinear", antialias=True, align_corners=False
            )
            image = batch[0] if native else batch[0].round_().to(torch.uint8)
    return image


def pixel_box(
    box: tuple[float, float, float, float], height: int, width: int
) -> tuple[int, int, int, int]:
    """``box`` rounded to whole pixels (half up), at least one pixel, inside the image.

    The crop both the CPU path (in decoded pixels) and the device path take.
    """
    left = min(max(math.floor(box[0] + 0.5), 0), width - 1)
    top = min(max(math.floor(box[1] + 0.5), 0), height - 1)
    right = min(max(math.floor(box[2] + 0.5), left + 1), width)
    bottom = min(max(math.floor(box[3] + 0.5), top + 1), height)
    return left, top, right, bottom


def fixes_size(geometry: Sequence[Any]) -> bool:
    """Whether image (or frame) ops give every output one size: the last op that sets the
    size is a crop or an exact resize."""
    for op in reversed(geometry):
        if isinstance(op, (CenterCrop, RandomResizedCrop)):
            return True
        if isinstance(op, Resize):
            return not isinstance(op.size, int)
    return False
