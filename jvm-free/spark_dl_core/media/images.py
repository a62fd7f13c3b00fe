"""The read-time image pipeline: decode once, one fused crop-and-resize, batch ops.

For each image column the loader's transforms (``image_decode``, ``resize``,
``center_crop``, ``random_resized_crop``, ``horizontal_flip``, ``normalize``, ``to_chw``)
compile into an :class:`ImagePipeline`. Per batch it

1. reads each image's size from its header (no decode) and *plans* every sample: the box
   of the source image that ends up in the output, the output size, and the flip
   (:func:`plan_boxes`). Random draws come from a generator keyed by (dataset fingerprint,
   seed, epoch, global sample index), so a sample gets the same crop on any world size,
   worker count and after resume. The same plan drives the CPU and the GPU path;
2. decodes each image once. A JPEG is decoded by the optional C extension
   ``spark_dl_core.media._jpeg`` (libjpeg-turbo) *only over the box*: the columns and rows the
   crop needs, at the smallest DCT scale (1/8, 1/4, 1/2, 1) that keeps the box at least
   as large as the output. Without the extension (or for other formats) the whole image
   is decoded, at reduced scale where possible (simplejpeg's ``min_height``/
   ``min_width``, or PIL's ``draft``);
3. resamples the box to the output size, bilinear and antialiased: with torch's uint8
   kernel when torch is installed (the box rounded to whole pixels and cropped, exactly
   as :meth:`ImagePipeline.transform_tensors` does on a device), else with PIL (the
   fractional box, reading the pixels around it);
4. applies ``normalize`` (float32) and ``to_chw`` to the whole batch.

See docs/images.md for the decoders' measured speed.
"""

from __future__ import annotations

import importlib.util
import math
import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..errors import SpecError
from ..format.buffers import ImageList
from ..ops.read import alloc_typed
from ..ops.registry import register_op
from ..ops.transforms import (
    ImageDecode,
    Normalize,
    ToCHW,
)
from ..ops.transforms import augment_key as augment_key  # where image code has always found it
from ..ops.transforms import sample_rngs as sample_rngs  # where media code has found it
from .image_codec import JPEG_MAGIC as _JPEG
from .image_codec import image_size
from .image_codec import jpeg_ext as _jpeg
from .image_codec import pil as _pil
from .image_decode import ImageError, count_decodes, decode_image, region_scale, scaled_size
from .image_device import _batchable, crop_batch, device_decoder, gpu_decoder_available
from .image_plans import Plan as Plan
from .image_plans import fixes_size, pixel_box, plan_boxes, plan_exact, run_steps


def new_bytes(shape: tuple[int, ...]) -> np.ndarray:
    """A fresh uint8 array: the allocator outside DataLoader workers."""
    return np.empty(shape, np.uint8)


_torch_resize: Any = False  # False: not looked up yet; None: torch is not installed


_RESAMPLER_LOCK = threading.Lock()


def _resampler() -> Any:
    """torch's ``interpolate`` when torch is installed (it has a uint8 antialiased
    bilinear kernel, ~3x faster than PIL here), else None (PIL). Looked up once under a
    lock: video clips are decoded on two threads, and one that saw the lookup unfinished
    resampled its clips with PIL (other values) while torch was still importing."""
    global _torch_resize
    if _torch_resize is False:
        with _RESAMPLER_LOCK:
            if _torch_resize is False:
                _torch_resize = _find_interpolate()
    return _torch_resize


def _find_interpolate() -> Any:
    if importlib.util.find_spec("torch") is None:
        return None
    try:
        import torch.nn.functional as functional
    except Exception:  # pragma: no cover - a broken torch install: PIL resamples
        return None
    return functional.interpolate


def _margin(box: tuple[float, float, float, float], out: tuple[int, int]) -> int:
    """Pixels around ``box`` that PIL's antialiased bilinear filter reads (its support)."""
    if _resampler() is not None:
        return 0  # torch resamples the cropped box alone
    bw, bh = box[2] - box[0], box[3] - box[1]
    return math.ceil(max(bw / out[1], bh / out[0], 1.0)) + 1


def _resample(
    pixels: np.ndarray,
    box: tuple[float, float, float, float],
    out: tuple[int, int],
    flip: bool = False,
    into: np.ndarray | None = None,
) -> np.ndarray:
    """The ``box`` of ``pixels`` resampled (bilinear, antialiased) to ``out=(h, w)`` and
    mirrored with ``flip``: ``[H, W, C]``, written into ``into`` when given."""
    h, w, channels = pixels.shape
    interpolate = _resampler()
    if into is None:
        into = np.empty((*out, channels), dtype=np.uint8)
    if interpolate is not None:
        import torch

        left, top, right, bottom = pixel_box(box, h, w)
        region = pixels[top:bottom, left:right]
        if not region.flags.writeable:  # PIL's pixels: torch warns on read-only memory
            region = region.copy()
        crop = torch.from_numpy(region)  # [H, W, C]
        target = torch.from_numpy(into)
        if tuple(crop.shape[:2]) == out:
            target.copy_(crop.flip(1) if flip else crop)  # (numpy's mirrored copy is slow)
            return into
        tensor = crop.permute(2, 0, 1)[None]
        if not tensor.is_contiguous(memory_format=torch.channels_last):
            tensor = tensor.contiguous(memory_format=torch.channels_last)
        resized = interpolate(
            tensor, size=out, mode="bilinear", antialias=True, align_corners=False
        )[0]
        hwc = resized.permute(1, 2, 0)
        if not hwc.is_contiguous() and _jpeg is not None and into.flags.c_contiguous:
            # torch left [C, H, W] planes: interleave (and mirror) them in one pass
            _jpeg.interleave(resized.contiguous().numpy(), into, channels, *out, flip)
        else:
            target.copy_(hwc.flip(1) if flip else hwc)
        return into
    image_module = _pil()
    image = image_module.fromarray(pixels[:, :, 0] if channels == 1 else pixels)
    if box != (0.0, 0.0, float(w), float(h)) or out != (h, w):
        image = image.resize((out[1], out[0]), image_module.BILINEAR, box=box)
    if flip:
        image = image.transpose(image_module.Transpose.FLIP_LEFT_RIGHT)
    into[...] = np.asarray(image).reshape(*out, channels)
    return into


def _region_resample(
    raw: bytes,
    mode: str,
    box: tuple[float, float, float, float],
    source: tuple[int, int],
    out: tuple[int, int],
    flip: bool = False,
    into: np.ndarray | None = None,
) -> np.ndarray:
    """Decode only the part of a JPEG that ``box`` (source pixels) needs, at the smallest
    DCT scale that keeps it at least ``out``, and resample it to ``out`` (see _resample)."""
    assert _jpeg is not None
    scale = region_scale(box, source, out)
    full_h, full_w = source
    sh, sw = scaled_size(full_h, scale), scaled_size(full_w, scale)
    sx, sy = sw / full_w, sh / full_h
    scaled = (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)
    left, top, right, bottom = pixel_box(scaled, sh, sw)
    margin = _margin(scaled, out)
    left, top = max(left - margin, 0), max(top - margin, 0)
    right, bottom = min(right + margin, sw), min(bottom + margin, sh)
    channels = 3 if mode == "RGB" else 1
    buffer, x, y, width, height = _jpeg.decode(
        raw, scale, left, top, right - left, bottom - top, channels == 1
    )
    pixels = np.frombuffer(buffer, np.uint8, count=height * width * channels)
    pixels = pixels.reshape(height, width, channels)
    shifted = (scaled[0] - x, scaled[1] - y, scaled[2] - x, scaled[3] - y)
    return _resample(pixels, shifted, out, flip, into)


# --------------------------------------------------------------------------- pipeline


_ONCE = {"to_chw": "chw", "normalize": "normalize"}  # ops a pipeline takes once: its field


@dataclass
class ImagePipeline:
    """The ops of one image column, compiled: decode mode, geometry, batch ops."""

    column: str
    mode: str = "RGB"
    geometry: list[Any] = field(default_factory=list)
    normalize: Normalize | None = None
    chw: bool = False
    exact: bool = False  # full-resolution decode, ops one by one as torchvision
    kind: ClassVar[str] = "image"
    on_device: ClassVar[bool] = True  # run_torch decodes a batch on a torch device

    @classmethod
    def from_op(cls, op: ImageDecode, column: str) -> ImagePipeline:
        """The pipeline ``image_decode`` starts on ``column`` (the registered factory)."""
        if op.exact and _resampler() is None:
            raise SpecError(
                f"image_decode on column {column!r}: exact=True resamples as "
                "torchvision does, with torch; install torch"
            )
        return cls(column, op.mode, exact=op.exact)

    def add(self, op: Any) -> None:
        """Take an op after the decode: geometry (before ``normalize`` / ``to_chw``),
        ``normalize`` (one value or one per channel), ``to_chw``."""
        if isinstance(op, ToCHW | Normalize) and getattr(self, _ONCE[op.op]):
            raise SpecError(f"{op.op} on column {self.column!r} is listed twice; give it once")
        if isinstance(op, ToCHW):
            self.chw = True
        elif isinstance(op, Normalize):
            for name in ("mean", "std"):
                value = getattr(op, name)
                if isinstance(value, list) and len(value) not in (1, self.channels):
                    raise SpecError(
                        f"normalize on column {self.column!r}: {name} has {len(value)} values, "
                        f"the image has {self.channels} channel(s)"
                    )
            self.normalize = op
        elif self.normalize is not None or self.chw:
            raise SpecError(f"{op.op} on column {self.column!r} must come before normalize/to_chw")
        else:
            self.geometry.append(op)

    def run(
        self, raws: list[Any], key: bytes, index: np.ndarray, where: Any, alloc: Any = new_bytes
    ) -> Any:
        """A batch decoded and transformed on the CPU (see :meth:`run_cpu`)."""
        return self.run_cpu(raws, self.plan(raws, key, index, where), where, alloc)

    @property
    def channels(self) -> int:
        return 3 if self.mode == "RGB" else 1

    @property
    def fixed_size(self) -> bool:
        """Whether every output has one size (a dense batch); otherwise batches are lists
        of images (see :func:`fixes_size`)."""
        return fixes_size(self.geometry)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32 if self.normalize is not None else np.uint8)

    def plan(self, raws: list[bytes], key: bytes, indices: np.ndarray, where: Any) -> Plan:
        sizes = np.zeros((len(raws), 2), dtype=np.int64)
        for i, raw in enumerate(raws):
            try:
                sizes[i] = image_size(raw)
            except Exception as exc:
                why = "the value is empty (a null stored by nulls='mask'?)" if not len(raw) else exc
                raise ImageError(where(i, f"image header does not read: {why}")) from None
        return (plan_exact if self.exact else plan_boxes)(sizes, self.geometry, key, indices)

    def run_cpu(self, raws: list[bytes], plan: Plan, where: Any, alloc: Any = new_bytes) -> Any:
        """Decode and transform a batch on the CPU: one array, or a list when sizes differ.

        ``alloc(shape)`` makes the uint8 output (DataLoader workers allocate shared memory,
        so a decoded batch crosses to the main process without another copy).
        """
        n = len(raws)
        if not self.geometry and not plan.flips.any():
            return self._decode_only(raws, plan, where, alloc)
        batch: np.ndarray | None = None
        if self.fixed_size:
            assert plan.out is not None
            shape = (n, *plan.out, self.channels)
            # uint8 pixels that normalize / to_chw rewrite are scratch; the output goes in alloc
            finished = self.normalize is not None or self.chw
            batch = scratch_bytes(shape) if finished else alloc(shape)
        images: list[np.ndarray] = []
        for i, raw in enumerate(raws):
            if plan.steps is not None:
                images.append(self._run_exact(raw, plan.steps[i], where, i, batch))
                continue
            x0, y0, x1, y1 = plan.boxes[i]
            oh, ow = (int(v) for v in plan.sizes[i])
            flip = bool(plan.flips[i])
            into = batch[i] if batch is not None else None
            region = plan.region(i)
            whole = into
            if region is not None:  # padded: fill, then the image goes into its region
                whole = np.empty((oh, ow, self.channels), np.uint8) if into is None else into
                whole.fill(plan.fill)
                top, left, bottom, right = region
                into, oh, ow = whole[top:bottom, left:right], bottom - top, right - left
            region_error: str | None = None
            if self.geometry and _jpeg is not None and raw[:2] == _JPEG:
                box = (float(x0), float(y0), float(x1), float(y1))
                source = (int(plan.sources[i][0]), int(plan.sources[i][1]))
                try:
                    pixels = _region_resample(raw, self.mode, box, source, (oh, ow), flip, into)
                except ValueError as exc:  # e.g. CMYK: the whole-image path may still read it
                    region_error = str(exc)
                else:
                    count_decodes(1)
                    if batch is None:
                        images.append(pixels if whole is None else whole)
                    continue
            # Reduced-scale decode keeps the box at least as large as the output.
            box_w, box_h = x1 - x0, y1 - y0
            full_h, full_w = (int(v) for v in plan.sources[i])
            at_least = None
            if self.geometry and box_w > ow and box_h > oh:
                at_least = (
                    math.ceil(full_h * oh / box_h),
                    math.ceil(full_w * ow / box_w),
                )
            try:
                pixels = decode_image(raw, self.mode, at_least)
            except Exception as exc:
                message = region_error or str(exc)
                raise ImageError(where(i, f"image does not decode: {message}")) from None
            if self.geometry:
                ph, pw = pixels.shape[:2]
                sx, sy = pw / full_w, ph / full_h
                box = (x0 * sx, y0 * sy, x1 * sx, y1 * sy)
                pixels = _resample(pixels, box, (oh, ow), flip, into)
            elif into is not None:
                into[...] = pixels[:, ::-1] if flip else pixels
            else:
                pixels = np.ascontiguousarray(pixels[:, ::-1] if flip else pixels)
            if batch is None:
                images.append(pixels if whole is None else whole)
        if batch is None:
            shapes = np.array([image.shape for image in images], dtype=np.int64).reshape(n, 3)
            flat = np.concatenate([image.reshape(-1) for image in images]) if n else images
            listed = ImageList(np.asarray(flat, dtype=np.uint8), shapes)
            if self.normalize is not None or self.chw:
                return self._finish_each(listed)
            return listed
        return self._finish(batch, alloc)

    def _run_exact(
        self,
        raw: bytes,
        steps: tuple[tuple[Any, ...], ...],
        where: Any,
        i: int,
        batch: np.ndarray | None,
    ) -> np.ndarray:
        """One sample of ``exact=True``: full-resolution decode, then its steps in order."""
        import torch

        try:
            pixels = decode_image(raw, self.mode)
        except Exception as exc:
            raise ImageError(where(i, f"image does not decode: {exc}")) from None
        if not pixels.flags.writeable:  # PIL's buffer: torch wants memory it may write
            pixels = pixels.copy()
        image = run_steps(torch.from_numpy(pixels).permute(2, 0, 1), steps)
        hwc = image.permute(1, 2, 0).numpy()
        if batch is None:
            return np.ascontiguousarray(hwc)
        batch[i] = hwc
        return batch[i]

    def _decode_only(
        self, raws: list[bytes], plan: Plan, where: Any, alloc: Any = new_bytes
    ) -> Any:
        """Full-size decode straight into one buffer (sizes are known from the headers)."""
        shapes = np.concatenate(
            [plan.sources, np.full((len(raws), 1), self.channels, np.int64)], axis=1
        )
        images = ImageList(alloc((int(np.prod(shapes, axis=1).sum()),)), shapes)
        offsets = images.offsets()
        for i, raw in enumerate(raws):
            target = images.flat[offsets[i] : offsets[i + 1]]
            try:
                pixels = decode_image(raw, self.mode, into=target)
            except Exception as exc:
                raise ImageError(where(i, f"image does not decode: {exc}")) from None
            if not np.shares_memory(pixels, target):  # PIL (png…): copy in
                if pixels.size != target.size:
                    raise ImageError(where(i, f"decoded to {pixels.shape}, header said more"))
                target[:] = pixels.reshape(-1)
        if self.normalize is not None or self.chw:
            return self._finish_each(images)
        return images

    def _finish_each(self, images: ImageList) -> np.ndarray:
        out = images.to_objects()
        for i, image in enumerate(out):
            out[i] = self._finish(image[None])[0]
        return out

    def _finish(self, batch: np.ndarray, alloc: Any = new_bytes) -> np.ndarray:
        """normalize and to_chw on a whole ``[B, H, W, C]`` batch, written into ``alloc``'s
        memory (a DataLoader worker's reused shared memory: see :func:`finish_batch`)."""
        return finish_batch(batch, self.normalize, self.chw, alloc)

    @staticmethod
    def device_missing(device: str) -> str | None:
        """What this machine lacks to decode images on ``device`` (None: nothing)."""
        if str(device).startswith("cuda") and not gpu_decoder_available():
            return "torchvision's decode_jpeg is not importable"
        return None

    def run_torch(self, raws: list[bytes], plan: Plan, device: str) -> Any:
        """The same plan on a torch device: one batched decode call there, then the crops.

        The decode comes from :func:`device_decoder` (on CUDA: torchvision's batched
        ``decode_jpeg``); everything after it is :meth:`transform_tensors`.
        """
        decoded = device_decoder(device)(raws, self.mode, device)
        count_decodes(len(decoded))
        return self.transform_tensors(decoded, plan)

    def transform_tensors(self, images: list[Any], plan: Plan, batched: bool = True) -> Any:
        """Crop, resize and flip ``[C, H, W]`` uint8 tensors by ``plan`` (any device).

        A batch of one output size without padding takes one sampling call for all its
        crops (:func:`crop_batch`; ``batched=False`` runs the per-image path instead).
        """
        import torch
        import torch.nn.functional as functional

        if batched and _batchable(plan, len(images)) and self.geometry:
            return self._finish_tensor(crop_batch(images, plan))
        out = []
        for i, image in enumerate(images):
            if plan.steps is not None:
                out.append(run_steps(image, plan.steps[i]))
                continue
            x0, y0, x1, y1 = plan.boxes[i]
            oh, ow = (int(v) for v in plan.sizes[i])
            region = plan.region(i)
            if self.geometry:  # the CPU path's crop: the box rounded to whole pixels
                left, top, right, bottom = pixel_box(
                    (x0, y0, x1, y1), int(image.shape[-2]), int(image.shape[-1])
                )
                crop = image[:, top:bottom, left:right].float()[None]
                size = (
                    (oh, ow) if region is None else (region[2] - region[0], region[3] - region[1])
                )
                image = functional.interpolate(
                    crop, size=size, mode="bilinear", antialias=True, align_corners=False
                )[0]
                image = image.round().clamp(0, 255).to(torch.uint8)
            if plan.flips[i]:
                image = image.flip(-1)
            if region is not None:  # padded as the CPU path pads
                canvas = torch.full(
                    (image.shape[0], oh, ow), plan.fill, dtype=torch.uint8, device=image.device
                )
                canvas[:, region[0] : region[2], region[1] : region[3]] = image
                image = canvas
            out.append(image)
        if not self.fixed_size and len({tuple(image.shape) for image in out}) > 1:
            return [self._finish_tensor(image[None])[0] for image in out]  # as the CPU path
        if not out:
            return self._finish_tensor(torch.empty((0, self.channels, 0, 0), dtype=torch.uint8))
        return self._finish_tensor(torch.stack(out))

    def _finish_tensor(self, batch: Any) -> Any:
        """normalize and to_chw on a ``[B, C, H, W]`` uint8 tensor (any device)."""
        import torch

        if self.normalize is not None:
            shape = (1, -1, 1, 1)
            mean = torch.tensor(self.normalize.mean, device=batch.device).reshape(shape) * 255
            std = torch.tensor(self.normalize.std, device=batch.device).reshape(shape) * 255
            batch = (batch.float() - mean) / std
        return batch if self.chw else batch.permute(0, 2, 3, 1).contiguous()


_scratch = threading.local()  # per thread: uint8 pixels that normalize / to_chw then rewrite


def scratch_bytes(shape: tuple[int, ...]) -> np.ndarray:
    """A uint8 array of ``shape`` in this thread's scratch buffer, reused batch after batch
    (fresh pages cost their first write). Overwritten by the thread's next call: only for
    pixels that :func:`finish_batch` rewrites before the batch leaves."""
    need = int(np.prod(shape, dtype=np.int64))
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None or buffer.size < need:
        buffer = _scratch.buffer = np.empty(need, np.uint8)
    return buffer[:need].reshape(shape)


def finish_batch(
    batch: np.ndarray, normalize: Normalize | None, chw: bool, alloc: Any = new_bytes
) -> np.ndarray:
    """``normalize`` (float32: ``(x - 255 mean) / (255 std)``) and ``to_chw`` (channels
    moved before the last two axes) of a uint8 ``[..., H, W, C]`` batch, written straight
    into one array from ``alloc`` (:func:`~spark_dl_core.ops.read.alloc_typed`). In
    DataLoader workers that is reused shared memory, which reaches the main process as it
    is; a private result would be copied into a fresh shared segment when sent, and was
    built through two float temporaries and a transposed copy (70-100 ms of CPU for 64
    images of 224 px, against about 10 ms this way). Channel by channel, each write is
    contiguous with ``to_chw``; the values are those of the whole-array expression."""
    if normalize is None and not chw:
        return batch
    dtype = np.float32 if normalize is not None else np.uint8
    *lead, h, w, c = batch.shape
    out = alloc_typed(alloc, (*lead, c, h, w) if chw else batch.shape, dtype)
    hwc = np.moveaxis(out, -3, -1) if chw else out  # out seen as [..., H, W, C]
    if normalize is None:
        for k in range(c):
            hwc[..., k] = batch[..., k]
        return out
    mean = np.asarray(normalize.mean, dtype=np.float32) * np.float32(255)
    std = np.asarray(normalize.std, dtype=np.float32) * np.float32(255)
    if not chw:
        np.subtract(batch, mean, out=out, dtype=np.float32)
        np.divide(out, std, out=out, dtype=np.float32)
        return out
    means, stds = np.broadcast_to(mean, (c,)), np.broadcast_to(std, (c,))
    for k in range(c):
        plane = hwc[..., k]
        np.subtract(batch[..., k], means[k], out=plane, dtype=np.float32)
        np.divide(plane, stds[k], out=plane, dtype=np.float32)
    return out


register_op("image_decode", ImagePipeline.from_op)
