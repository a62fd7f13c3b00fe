"""Read-time audio and video decoding: encoded bytes to batches of samples or frames.

``audio_decode`` (+ ``audio_crop``) turns WAV / FLAC / OGG / MP3 bytes into float32 in
[-1, 1], channels first, through libsndfile (``soundfile``; MP3 through FFmpeg) and the
SoX resampler (``soxr``); a crop decodes only its window (the file is seeked before
decoding and resampling; an MP3 is decoded whole and cut). ``video_decode`` turns video
bytes into uint8 RGB frames through FFmpeg (PyAV); the image ops after it (``resize``,
``center_crop``, ``random_resized_crop``, ``horizontal_flip``, ``normalize``, ``to_chw``)
apply to every frame of a clip with one plan per clip: the image pipeline's box and flip
(:func:`~spark_dl_core.media.images.plan_boxes`),
each frame's box resampled as images are. Random windows, boxes and flips come from the
same per-sample generators as the image ops (fingerprint, seed, epoch, global sample
index), so they are reproducible on any world size and after resume. Both need the
``media`` extra; they are imported only when such an op is used.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import struct
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from ..errors import DatasetError, SpecError, optional_import
from ..format.buffers import Jagged
from ..ops.read import alloc_typed
from ..ops.registry import register_op
from ..ops.transforms import (
    AudioCrop,
    AudioDecode,
    CenterCrop,
    HorizontalFlip,
    Normalize,
    RandomResizedCrop,
    Resize,
    ToCHW,
    VideoDecode,
    sample_rngs,
)
from .image_plans import fixes_size, plan_boxes
from .images import _resample, finish_batch, new_bytes, scratch_bytes

Where = Callable[[int, str], str]
# Image ops that apply to every frame of a decoded video column (one plan per clip).
FRAME_GEOMETRY = (Resize, CenterCrop, RandomResizedCrop, HorizontalFlip)
# A clip's encoded bytes: bytes, or a view of a shard's memory (no copy)
Buffer = bytes | memoryview


class MediaError(DatasetError):
    """A clip that cannot be decoded; the message names column, shard and sample."""


def _need(module: str) -> Any:
    return optional_import(module, "audio/video ops")


def _start(mode: str, free: int, rng: np.random.Generator | None) -> int:
    """Where a window starts when ``free`` positions are left over."""
    if free <= 0 or mode == "begin":
        return 0
    if mode == "center":
        return free // 2
    assert rng is not None
    return int(rng.integers(0, free + 1))


class AudioPipeline:
    """``audio_decode`` and an optional ``audio_crop`` of one column."""

    kind = "audio"
    on_device = False
    column = ""

    def __init__(self, decode: AudioDecode) -> None:
        self.decode = decode
        # here, not in each DataLoader worker of each pass (av: MP3)
        _need("soundfile"), _need("soxr"), _need("av")
        self.crop: AudioCrop | None = None

    @property
    def fixed_size(self) -> bool:
        """Whether every clip has one length: a padded crop at one ``sample_rate`` (without
        one, each clip's window has its own rate's samples). The channel count is the
        clips' own (decode with ``mono`` where it differs)."""
        crop = self.crop
        return crop is not None and crop.pad and self.decode.sample_rate is not None

    def add(self, op: AudioCrop) -> None:
        """Take the column's ``audio_crop`` (the only op audio columns take)."""
        if self.crop is not None:
            raise SpecError(f"audio_crop on column {self.column!r} is listed twice")
        self.crop = op

    def run(
        self,
        raws: Sequence[Buffer],
        key: bytes,
        index: np.ndarray,
        where: Where,
        alloc: Any = None,
    ) -> Any:
        crop, target = self.crop, self.decode.sample_rate
        rngs = sample_rngs(key, index) if crop is not None and crop.start == "random" else None
        clips = []
        for i, raw in enumerate(raws):
            rng = rngs[i] if rngs else None
            # Plain PCM / float WAV: the window straight from the bytes (no copy of the rest);
            # MP3 decoded whole by FFmpeg; anything else (FLAC, OGG, unusual WAV) through
            # libsndfile.
            layout = _wav_layout(raw)
            if layout is not None:
                data, rate = _wav_window(raw, layout, crop, rng), layout.rate
            elif _is_mp3(raw):
                data, rate = _mp3_window(raw, crop, rng, i, where)
            else:
                data, rate = _sf_window(raw, crop, rng, i, where)
            if self.decode.mono and data.shape[1] > 1:
                data = _mono(data)
            if target is not None and target != rate and len(data):
                data = _need("soxr").resample(data, rate, target, quality="HQ")
                rate = target
            if crop is not None:
                length = round(crop.seconds * rate)
                if len(data) > length:
                    data = data[:length]
                elif len(data) < length and crop.pad:
                    data = np.concatenate(
                        [data, np.zeros((length - len(data), data.shape[1]), np.float32)]
                    )
            clips.append(np.ascontiguousarray(data.T, dtype=np.float32))  # [C, T]
        return self._batch(clips, where, alloc)

    def _batch(self, clips: list[np.ndarray], where: Where, alloc: Any = None) -> Any:
        """``[B, C, T]`` when every clip has one shape (in ``alloc``'s memory when given: in
        DataLoader workers shared memory, sent to the main process as it is, see
        :func:`~spark_dl_core.ops.read.alloc_typed`); mono clips of other lengths as a
        ragged batch ``[B, T]``; else an object array of ``[C, T]`` clips."""
        channels = {c.shape[0] for c in clips}
        if len(channels) > 1:
            first = clips[0].shape[0]
            i = next(i for i, c in enumerate(clips) if c.shape[0] != first)
            raise MediaError(
                where(
                    i,
                    f"has {clips[i].shape[0]} channel(s), the batch's first clip {first}: "
                    "decode with mono=True",
                )
            )
        if len({c.shape for c in clips}) <= 1:
            if not clips:
                return np.zeros((0, 1, 0), np.float32)
            if alloc is None:
                return np.stack(clips)
            out = alloc_typed(alloc, (len(clips), *clips[0].shape), np.float32)
            for i, clip in enumerate(clips):
                out[i] = clip
            return out
        if channels == {1}:
            lengths = np.array([c.shape[1] for c in clips], dtype=np.int64)
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            return Jagged(np.concatenate([c[0] for c in clips]), offsets)
        out = np.empty(len(clips), dtype=object)
        out[:] = clips
        return out


def _sf_window(
    raw: Buffer, crop: AudioCrop | None, rng: np.random.Generator | None, i: int, where: Where
) -> tuple[np.ndarray, int]:
    """A clip (or its crop window) through libsndfile, seeked to the window: ``[T, C]``."""
    sf = _need("soundfile")
    try:
        with sf.SoundFile(io.BytesIO(raw)) as f:
            rate, frames = f.samplerate, f.frames
            if crop is not None:
                window = math.ceil(crop.seconds * rate)
                data = _sf_read(sf, f, _start(crop.start, frames - window, rng), window)
            else:
                data = _sf_read(sf, f, 0, frames)
    except (RuntimeError, ValueError, TypeError) as exc:  # libsndfile's errors
        raise MediaError(where(i, f"audio_decode: {exc}")) from None
    return data, rate


def _sf_read(sf: Any, f: Any, start: int, count: int) -> np.ndarray:
    """Up to ``count`` frames from frame ``start`` of an open SoundFile as float32 ``[T, C]``:
    one libsndfile seek (none at 0, where a file opens) and one read, as soundfile's
    ``seek`` + ``read`` give them. soundfile's read also asks libsndfile for the position
    twice and seeks to it again after reading, and in a FLAC a seek searches the stream
    and decodes a frame: 12 % of a FLAC window's time (measured)."""
    lib, ffi, handle = (
        getattr(sf, "_snd", None),
        getattr(sf, "_ffi", None),
        getattr(f, "_file", None),
    )
    count = max(0, min(count, f.frames - start))
    if lib is None or ffi is None or handle is None:  # a soundfile without these: its own calls
        f.seek(start)
        return f.read(count, dtype="float32", always_2d=True)
    if start and lib.sf_seek(handle, start, 0) != start:
        raise RuntimeError(f"seek to frame {start}: {_sf_error(lib, ffi, handle)}")
    out = np.empty((count, f.channels), np.float32)
    got = lib.sf_readf_float(handle, ffi.cast("float *", out.ctypes.data), count)
    if lib.sf_error(handle):
        raise RuntimeError(_sf_error(lib, ffi, handle))
    return out[:got]


def _sf_error(lib: Any, ffi: Any, handle: Any) -> str:
    """libsndfile's message for the last error on ``handle``."""
    return str(ffi.string(lib.sf_strerror(handle)).decode("utf-8", "replace"))


def _is_mp3(raw: Buffer) -> bool:
    """Whether the bytes are MP3: an ID3v2 tag or an MPEG audio layer III frame first."""
    head = bytes(memoryview(raw)[:3])
    if head == b"ID3":
        return True
    return len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0 and head[1] & 6 == 2


def _mp3_window(
    raw: Buffer, crop: AudioCrop | None, rng: np.random.Generator | None, i: int, where: Where
) -> tuple[np.ndarray, int]:
    """An MP3 clip (or its crop window) ``[T, C]``, cut from a decode of the whole clip by
    FFmpeg. Not libsndfile: its length of a VBR file without a Xing header is a guess from
    the first frame's bitrate (reads stop there, or windows run past the end into zeros),
    its seeks land hundreds of samples off, and reads in pieces give other samples than
    one whole read."""
    av = _need("av")
    parts: list[np.ndarray] = []
    rate = 0
    try:
        with av.open(io.BytesIO(raw), format="mp3", metadata_errors="replace") as container:
            if not container.streams.audio:
                raise ValueError("no audio stream")
            for frame in container.decode(container.streams.audio[0]):
                rate = frame.sample_rate
                parts.append(_frame_samples(frame))
    except (av.FFmpegError, ValueError) as exc:
        raise MediaError(where(i, f"audio_decode: {exc}")) from None
    if not parts:
        raise MediaError(where(i, "audio_decode: the MP3 clip has no audio frames"))
    data = np.concatenate(parts)
    if crop is not None:
        window = math.ceil(crop.seconds * rate)
        start = _start(crop.start, len(data) - window, rng)
        data = data[start : start + window]
    return data, rate


def _frame_samples(frame: Any) -> np.ndarray:
    """One decoded audio frame as float32 ``[T, C]`` (FFmpeg's MP3 decoder gives floats)."""
    values = frame.to_ndarray()
    if not frame.format.is_planar:
        values = values.reshape(-1, len(frame.layout.channels)).T
    if values.dtype.kind != "f":
        raise ValueError(f"decoded samples are {frame.format.name}, not floats")
    return np.ascontiguousarray(values.T, dtype=np.float32)


class WavLayout(NamedTuple):
    """Where a plain WAV file's samples lie: what :func:`_wav_window` needs."""

    rate: int
    channels: int
    bits: int  # 16, 24 or 32
    floating: bool  # IEEE float (32-bit) rather than signed integers
    data: int  # byte offset of the first frame
    frames: int


_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE
# The GUID of WAVE_FORMAT_EXTENSIBLE's sub-format, after its 2-byte format tag.
_GUID_TAIL = bytes.fromhex("000000001000800000aa00389b71")


def _wav_layout(raw: Buffer) -> WavLayout | None:
    """A RIFF/WAVE file of 16/24/32-bit PCM or 32-bit float whose chunks all lie within
    the bytes: where its samples are. None for anything else (other formats, unusual or
    inconsistent headers), which libsndfile then reads or refuses as before. Every field is
    bounds-checked here, so no header can make the caller read outside ``raw``."""
    view = memoryview(raw).cast("B") if not isinstance(raw, bytes) else raw
    size = len(view)
    if size < 12 or bytes(view[:4]) != b"RIFF" or bytes(view[8:12]) != b"WAVE":
        return None
    at, fmt = 12, None
    while at + 8 <= size:
        chunk, length = bytes(view[at : at + 4]), int.from_bytes(view[at + 4 : at + 8], "little")
        body = at + 8
        if chunk == b"fmt ":
            if length < 16 or body + length > size or fmt is not None:
                return None
            tag, channels, rate, _, align, bits = struct.unpack_from("<HHIIHH", view, body)
            if tag == _EXTENSIBLE:
                if length < 40 or bytes(view[body + 26 : body + 40]) != _GUID_TAIL:
                    return None
                valid, sub = struct.unpack_from("<HxxxxH", view, body + 18)
                if valid != bits:
                    return None
                tag = sub
            usable = (tag == _PCM and bits in (16, 24, 32)) or (tag == _FLOAT and bits == 32)
            if not usable or channels < 1 or rate < 1 or align != channels * bits // 8:
                return None
            fmt = (rate, channels, bits, tag == _FLOAT)
        elif chunk == b"data":
            if fmt is None or length == 0 or body + length > size:
                return None
            frames = length // (fmt[1] * fmt[2] // 8)
            return WavLayout(*fmt, data=body, frames=frames) if frames else None
        at = body + length + (length & 1)  # chunks are padded to an even length
    return None


def _wav_window(
    raw: Buffer, wav: WavLayout, crop: AudioCrop | None, rng: np.random.Generator | None
) -> np.ndarray:
    """The crop window (or the whole clip) of a plain WAV as float32 ``[T, C]``, scaled as
    libsndfile scales (integers by 1 / 2^(bits-1), exactly), reading only those bytes."""
    start, count = 0, wav.frames
    if crop is not None:
        window = math.ceil(crop.seconds * wav.rate)
        start = _start(crop.start, wav.frames - window, rng)
        count = min(window, wav.frames)
    width = wav.bits // 8
    at = wav.data + start * width * wav.channels
    if wav.floating:
        values = np.frombuffer(raw, "<f4", count * wav.channels, at)
        return values.astype(np.float32).reshape(count, wav.channels)
    if wav.bits == 24:  # 3-byte samples: widened to int32's top bytes, as libsndfile does
        packed = np.frombuffer(raw, np.uint8, count * wav.channels * 3, at).reshape(-1, 3)
        wide = np.zeros((len(packed), 4), np.uint8)
        wide[:, 1:] = packed
        values = wide.view("<i4")[:, 0]
    else:
        values = np.frombuffer(raw, "<i2" if wav.bits == 16 else "<i4", count * wav.channels, at)
    scale = np.float32(2.0 ** -(31 if wav.bits == 24 else wav.bits - 1))
    # cast to float32 and scaled in one pass: what astype(float32) * scale gives
    return np.multiply(values, scale, dtype=np.float32).reshape(count, wav.channels)


def _mono(data: np.ndarray) -> np.ndarray:
    """``data.mean(axis=1, keepdims=True, dtype=float32)`` of ``[T, C]``, computed as numpy
    does for a few channels (summed in order, then divided) without its slow short-axis
    reduction. From 8 channels on numpy sums pairwise: then numpy's own mean."""
    if data.shape[1] >= 8:
        return data.mean(axis=1, keepdims=True, dtype=np.float32)
    total = data[:, 0] + data[:, 1]
    for c in range(2, data.shape[1]):
        total += data[:, c]
    total /= np.float32(data.shape[1])
    return total[:, None]


class VideoPipeline:
    """``video_decode`` of one column, then the image ops on every frame: geometry
    (``resize``, ``center_crop``, ``random_resized_crop``, ``horizontal_flip``) planned once
    per clip, ``normalize`` and ``to_chw`` on the whole batch."""

    kind = "video"
    on_device = False

    def __init__(self, decode: VideoDecode, column: str = "") -> None:
        self.decode = decode
        _need("av")  # imported where the loader is built, not in each worker of each pass
        self.column = column
        self.geometry: list[Resize | CenterCrop | RandomResizedCrop | HorizontalFlip] = []
        self.normalize: Normalize | None = None
        self.chw = False

    @property
    def fixed_size(self) -> bool:
        """Whether every clip has one shape (frames cropped or resized to an exact size)."""
        return fixes_size(self.geometry)

    def add(self, op: Any) -> None:
        """Take a frame op of this column (the registry's compiler passes only ops that
        apply to video), refusing geometry after ``normalize`` / ``to_chw`` and a
        ``normalize`` that does not fit RGB frames."""
        column = self.column
        if isinstance(op, FRAME_GEOMETRY):
            if self.normalize is not None or self.chw:
                raise SpecError(
                    f"{op.op} on video column {column!r} must come before normalize/to_chw"
                )
            self.geometry.append(op)
        elif isinstance(op, Normalize):
            if self.normalize is not None:
                raise SpecError(f"normalize on video column {column!r} is listed twice")
            for name in ("mean", "std"):
                value = getattr(op, name)
                if isinstance(value, list) and len(value) not in (1, 3):
                    raise SpecError(
                        f"normalize on video column {column!r}: {name} has {len(value)} "
                        "values, the frames have 3 channels (RGB)"
                    )
            self.normalize = op
        elif isinstance(op, ToCHW):
            if self.chw:
                raise SpecError(f"to_chw on video column {column!r} is listed twice; give it once")
            self.chw = True

    def run(
        self, raws: list[bytes], key: bytes, index: np.ndarray, where: Where, alloc: Any = None
    ) -> np.ndarray:
        op = self.decode
        rngs = sample_rngs(key, index) if op.start == "random" else None

        def clip(i: int) -> np.ndarray:
            return self._clip(raws[i], rngs[i] if rngs else None, key, int(index[i]), i, where)

        if len(raws) > 1 and _DECODE_THREADS > 1:  # in order; the first clip's error first
            clips = list(_decoders().map(clip, range(len(raws))))
        else:
            clips = [clip(i) for i in range(len(raws))]
        shapes = {c.shape for c in clips}
        if len(shapes) > 1:
            raise MediaError(
                where(
                    0,
                    f"video_decode: frames of this batch differ in size {sorted(shapes)}; "
                    "resize to an exact size or center_crop after it",
                )
            )
        if not clips:
            return self._finish(np.zeros((0, op.num_frames, 0, 0, 3), np.uint8))
        return self._batch(clips, alloc)

    def _clip(
        self,
        raw: Buffer,
        rng: np.random.Generator | None,
        key: bytes,
        sample: int,
        i: int,
        where: Where,
    ) -> np.ndarray:
        """One clip's picked frames through the geometry ``[T, H, W, C]``."""
        av = _need("av")
        try:
            frames = self._frames(av, raw, rng)
        except (av.FFmpegError, ValueError, IndexError) as exc:
            raise MediaError(where(i, f"video_decode: {exc}")) from None
        if not frames:
            raise MediaError(where(i, "video_decode: the clip has no video frames"))
        return self._shape(frames, key, sample)

    def _frames(self, av: Any, raw: Buffer, rng: np.random.Generator | None) -> list[Any]:
        """The picked frames (PyAV VideoFrames). H.264 clips whose packets carry timestamps
        decode only what the picks need (see :func:`_h264_frames`); other clips decode from
        the start up to the last pick. Both give the same frames."""
        # Metadata tags are not needed: non-UTF-8 ones (latin-1 titles) must not stop a decode.
        with av.open(io.BytesIO(raw), metadata_errors="replace") as container:
            stream = container.streams.video[0]
            total = int(stream.frames or 0)
            decoded = None
            if total <= 0:  # the container does not say: count by decoding
                decoded = list(container.decode(stream))
                total = len(decoded)
            wanted = self._wanted(total, rng)
            if decoded is None and stream.codec_context.name == "h264":
                packets = [p for p in container.demux(stream) if p.size]
                picked = _h264_frames(stream, packets, total, wanted)
                if picked is not None:
                    return picked
                # not as expected: decode in order
                with av.open(io.BytesIO(raw), metadata_errors="replace") as again:
                    return _in_order(again.decode(again.streams.video[0]), wanted)
            if decoded is None:
                return _in_order(container.decode(stream), wanted)
            return _in_order(iter(decoded), wanted)

    def _wanted(self, total: int, rng: np.random.Generator | None) -> list[int]:
        """The frame numbers picked from a clip of ``total`` frames (the last repeats)."""
        op = self.decode
        first = _start(op.start, total - (op.num_frames - 1) * op.stride - 1, rng)
        return [min(first + k * op.stride, total - 1) for k in range(op.num_frames)]

    def _shape(self, frames: list[Any], key: bytes, sample: int) -> np.ndarray:
        """One clip's frames ``[T, H, W, C]`` through the geometry, planned once for the
        clip: the image ops' box, flip and output size (:func:`plan_boxes`, random draws
        from the sample's generator), then every frame's RGB pixels cropped to the box and
        resampled in one step as the image pipeline resamples (bilinear, antialiased)."""
        if not self.geometry:
            return np.stack([f.to_ndarray(format="rgb24") for f in frames])
        h, w = frames[0].height, frames[0].width
        plan = plan_boxes(np.array([[h, w]]), self.geometry, frame_key(key), np.array([sample]))
        oh, ow = (int(v) for v in plan.sizes[0])
        out = np.empty((len(frames), oh, ow, 3), np.uint8)
        region = plan.region(0)
        top, left, bottom, right = region if region is not None else (0, 0, oh, ow)
        if region is not None:  # a crop larger than the frame: padded around it
            out.fill(plan.fill)
        x0, y0, x1, y1 = (float(v) for v in plan.boxes[0])
        flip = bool(plan.flips[0])
        for t, frame in enumerate(frames):
            pixels = frame.to_ndarray(format="rgb24")
            fh, fw = pixels.shape[:2]
            sx, sy = fw / w, fh / h  # a frame of another size (mid-stream change): its box
            box = (x0 * sx, y0 * sy, x1 * sx, y1 * sy)
            _resample(
                pixels, box, (bottom - top, right - left), flip, out[t, top:bottom, left:right]
            )
        return out

    def _batch(self, clips: list[np.ndarray], alloc: Any) -> np.ndarray:
        """The clips as one batch. A uint8 batch goes into ``alloc``'s buffer (in DataLoader
        workers the reused shared memory images use, so it reaches the main process
        uncopied), laid out ``[B, T, C, H, W]`` there directly with ``to_chw``; a
        normalized batch is written there as float32 (:func:`finish_batch`)."""
        if self.normalize is not None:
            stacked = np.stack(clips, out=scratch_bytes((len(clips), *clips[0].shape)))
            return self._finish(stacked, new_bytes if alloc is None else alloc)
        if alloc is None:
            return self._finish(np.stack(clips))
        t, h, w, c = clips[0].shape
        out = alloc((len(clips), t, c, h, w) if self.chw else (len(clips), t, h, w, c))
        for i, clip in enumerate(clips):
            out[i] = clip.transpose(0, 3, 1, 2) if self.chw else clip
        return out

    def _finish(self, batch: np.ndarray, alloc: Any = new_bytes) -> np.ndarray:
        """``normalize`` (float32, values scaled to [0, 1] first, as for images) and
        ``to_chw`` (``[B, T, C, H, W]``) on a whole ``[B, T, H, W, C]`` batch, in
        ``alloc``'s memory (:func:`~spark_dl_core.media.images.finish_batch`)."""
        return finish_batch(batch, self.normalize, self.chw, alloc)


# Clips of a batch decoded at once: FFmpeg's demuxing, decoding and scaling and torch's
# resampling run without the GIL, so a DataLoader worker whose batch is the last of a pass
# (or a loader without workers) uses a second core instead of leaving it idle. 2 threads:
# where every worker has a batch, each worker's second thread only shares its core.
_DECODE_THREADS = min(2, os.cpu_count() or 1)
_POOL: tuple[int, ThreadPoolExecutor] | None = None


def _decoders() -> ThreadPoolExecutor:
    """This process's clip decoding threads (a forked worker makes its own: threads do not
    survive a fork)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), ThreadPoolExecutor(_DECODE_THREADS, "spark-dl-video"))
    return _POOL[1]


def _in_order(frames: Any, wanted: list[int]) -> list[Any]:
    """The ``wanted`` frames of decoded ``frames``, decoding no further than the last one;
    containers may count more frames than they hold: picks past the end repeat the last."""
    decoded = []
    for frame in frames:
        decoded.append(frame)
        if len(decoded) > wanted[-1]:
            break
    last = len(decoded) - 1
    return [decoded[min(w, last)] for w in wanted] if decoded else []


def _h264_frames(
    stream: Any, packets: list[Any], total: int, wanted: list[int]
) -> list[Any] | None:
    """The ``wanted`` frames (numbers in presentation order) of an H.264 clip in MP4 / MKV
    framing, decoding only what they need: from the last IDR keyframe at or before the
    first pick (nothing before an IDR is referred to after it), after the parameter sets
    (SPS / PPS) that earlier packets carry in-band (a spliced or ``avc3`` clip changes them
    mid-stream: decoded with the header's alone its frames come out wrong, without an
    error), skipping packets that are not picked and that no other frame refers to
    (``nal_ref_idc`` 0, no parameter set). None when the clip is not as this assumes (a
    packet per frame, distinct timestamps, length-prefixed NAL units, every pick decoded)
    or the decode does not check out (:func:`_decoded_from`): the caller then decodes in
    order."""
    length_size = _avcc_length_size(stream.codec_context.extradata)
    pts = [p.pts for p in packets]
    if length_size is None or len(packets) != total or None in pts or len(set(pts)) != total:
        return None
    parsed = [_nal_units(p, length_size) for p in packets]
    units = [u for u in parsed if u is not None]
    if len(units) != total:
        return None
    order = sorted(pts)
    want = {order[w] for w in wanted}
    first = order[wanted[0]]
    start = 0
    for i, (packet, nals) in enumerate(zip(packets, units)):
        if packet.pts <= first and packet.is_keyframe and _is_idr(nals):
            start = i
    if any(p.pts >= packets[start].pts for p in packets[:start]):
        start = 0  # a frame before the IDR shown after it: not a clean start
    feed = [p for p, u in zip(packets[start:], units[start:]) if p.pts in want or _needed(u)]
    sets = [bytes(n) for u in units[:start] for n in u if n[0] & 0x1F in _PARAMETER_SETS]
    return _decoded_from(stream.codec_context, feed, sets, length_size, want, order, wanted)


# NAL unit types of parameter sets: SPS, PPS, SPS extension, subset SPS
_PARAMETER_SETS = (7, 8, 13, 15)


def _decoded_from(
    context: Any,
    feed: list[Any],
    sets: list[bytes],
    length_size: int,
    want: set[int],
    order: list[int],
    wanted: list[int],
) -> list[Any] | None:
    """Decode ``feed`` (an IDR packet first, the in-band parameter sets ``sets`` put in
    front of its NAL units): the picks, or None unless the decode checks out (no decoder
    error, no frame marked corrupt, the IDR shown first, frames in increasing time, every
    pick decoded), so that a start that is not clean costs a decode from the clip's start,
    never wrong frames."""
    import av  # present: the caller demuxed with it

    got: dict[int, Any] = {}
    shown: list[int] = []
    try:
        if sets:  # the decoder's parameter state as a decode from the clip's start has it
            head = b"".join(len(n).to_bytes(length_size, "big") + n for n in sets)
            idr = av.Packet(head + bytes(feed[0]))
            idr.pts, idr.dts, idr.time_base = feed[0].pts, feed[0].dts, feed[0].time_base
            idr.is_keyframe = True
            feed = [idr, *feed[1:]]
        for packet in [*feed, None]:
            for frame in context.decode(packet):
                if frame.is_corrupt or (shown and frame.pts <= shown[-1]):
                    return None
                shown.append(frame.pts)
                if frame.pts in want:
                    got[frame.pts] = frame
            if len(got) == len(want):
                break
    except av.FFmpegError:
        return None
    if len(got) != len(want) or shown[0] != feed[0].pts:
        return None
    return [got[order[w]] for w in wanted]


def _avcc_length_size(extradata: bytes | None) -> int | None:
    """Bytes of each NAL unit's length prefix in MP4 / MKV H.264 (``avcC``), else None."""
    if not extradata or len(extradata) < 7 or extradata[0] != 1:
        return None
    return (extradata[4] & 3) + 1


def _nal_units(packet: Any, length_size: int) -> list[memoryview] | None:
    """The NAL units of one length-prefixed H.264 packet (views, no copy); None when they
    do not parse."""
    data = memoryview(packet).cast("B")
    at, units = 0, []
    while at < len(data):
        if at + length_size >= len(data):
            return None
        size = int.from_bytes(data[at : at + length_size], "big")
        at += length_size
        if size == 0 or at + size > len(data):
            return None
        units.append(data[at : at + size])
        at += size
    return units


def _is_idr(nals: list[memoryview]) -> bool:
    """Whether a packet's coded slices are IDR slices (a point a decode can start at)."""
    kinds = [n[0] & 0x1F for n in nals if 1 <= n[0] & 0x1F <= 5]
    return bool(kinds) and all(k == 5 for k in kinds)


def _needed(nals: list[memoryview]) -> bool:
    """Whether a packet must be decoded even when not picked: a slice another frame may
    refer to (``nal_ref_idc`` not 0), a parameter set, or NAL units of no slice at all."""
    slices = [n for n in nals if 1 <= n[0] & 0x1F <= 5]
    if not slices or any(n[0] & 0x1F in _PARAMETER_SETS for n in nals):
        return True
    return any((n[0] >> 5) & 3 for n in slices)


def frame_key(key: bytes) -> bytes:
    """The key of a clip's frame-op draws: derived from the loader's (fingerprint, seed,
    epoch) key, so the box and flip do not reuse the draws that picked the clip's start."""
    return hashlib.sha256(b"spark-dl-video-frames:" + key).digest()


def _audio(op: AudioDecode, column: str) -> AudioPipeline:
    pipeline = AudioPipeline(op)
    pipeline.column = column
    return pipeline


# The decode ops' implementations, found by op name (spark_dl_core.ops.registry).
register_op("audio_decode", _audio)
register_op("video_decode", VideoPipeline)
