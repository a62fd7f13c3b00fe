"""Read-time audio and video decoding: encoded bytes to batches of samples or frames.

``audio_decode`` (+ ``audio_crop``) turns WAV / FLAC / OGG / MP3 bytes into float32 in
[-1, 1], channels first, through libsndfile (``soundfile``) and the SoX resampler
(``soxr``); a crop decodes only its window (the file is seeked before decoding and
resampling). ``video_decode`` (+ ``resize`` / ``center_crop`` per frame) turns video bytes
into uint8 RGB frames through FFmpeg (PyAV), scaling each frame in FFmpeg's scaler.
Random windows come from the same per-sample generators as the image ops (fingerprint,
seed, epoch, global sample index), so they are reproducible on any world size and after
resume. Both need the ``media`` extra; they are imported only when such an op is used.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import DatasetError, MissingDependencyError, SpecError
from .format.buffers import Jagged
from .images import sample_rngs
from .transforms import AudioCrop, AudioDecode, CenterCrop, Resize, VideoDecode

Where = Callable[[int, str], str]
_BYTES = ("bytes",)


class MediaError(DatasetError):
    """A clip that cannot be decoded; the message names column, shard and sample."""


def _need(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError:
        raise MissingDependencyError(
            f"audio/video ops need {module!r}: pip install 'spark-dl-core[media]'"
        ) from None


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

    def __init__(self, decode: AudioDecode) -> None:
        self.decode = decode
        self.crop: AudioCrop | None = None

    def run(self, raws: list[bytes], key: bytes, index: np.ndarray, where: Where) -> Any:
        sf = _need("soundfile")
        crop, target = self.crop, self.decode.sample_rate
        rngs = sample_rngs(key, index) if crop is not None and crop.start == "random" else None
        clips = []
        for i, raw in enumerate(raws):
            try:
                with sf.SoundFile(io.BytesIO(raw)) as f:
                    rate, frames = f.samplerate, f.frames
                    if crop is not None:
                        window = math.ceil(crop.seconds * rate)
                        f.seek(_start(crop.start, frames - window, rngs[i] if rngs else None))
                        data = f.read(min(window, frames), dtype="float32", always_2d=True)
                    else:
                        data = f.read(dtype="float32", always_2d=True)
            except (RuntimeError, ValueError, TypeError) as exc:  # libsndfile's errors
                raise MediaError(where(i, f"audio_decode: {exc}")) from None
            if self.decode.mono and data.shape[1] > 1:
                data = data.mean(axis=1, keepdims=True, dtype=np.float32)
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
        return self._batch(clips, where)

    def _batch(self, clips: list[np.ndarray], where: Where) -> Any:
        """``[B, C, T]`` when every clip has one shape; mono clips of other lengths as a
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
            return np.stack(clips)
        if channels == {1}:
            lengths = np.array([c.shape[1] for c in clips], dtype=np.int64)
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            return Jagged(np.concatenate([c[0] for c in clips]), offsets)
        out = np.empty(len(clips), dtype=object)
        out[:] = clips
        return out


class VideoPipeline:
    """``video_decode`` of one column, then ``resize`` / ``center_crop`` on every frame."""

    def __init__(self, decode: VideoDecode) -> None:
        self.decode = decode
        self.geometry: list[Resize | CenterCrop] = []

    def run(self, raws: list[bytes], key: bytes, index: np.ndarray, where: Where) -> np.ndarray:
        av = _need("av")
        op = self.decode
        rngs = sample_rngs(key, index) if op.start == "random" else None
        clips = []
        for i, raw in enumerate(raws):
            try:
                frames = self._frames(av, raw, rngs[i] if rngs else None)
            except (av.FFmpegError, ValueError, IndexError) as exc:
                raise MediaError(where(i, f"video_decode: {exc}")) from None
            if not frames:
                raise MediaError(where(i, "video_decode: the clip has no video frames"))
            clips.append(np.stack([self._shape(f) for f in frames]))
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
            return np.zeros((0, op.num_frames, 0, 0, 3), np.uint8)
        return np.stack(clips)

    def _frames(self, av: Any, raw: bytes, rng: np.random.Generator | None) -> list[Any]:
        """The picked frames (PyAV VideoFrames), decoded from the start up to the last."""
        op = self.decode
        span = (op.num_frames - 1) * op.stride + 1
        with av.open(io.BytesIO(raw)) as container:
            stream = container.streams.video[0]
            total = int(stream.frames or 0)
            decoded = None
            if total <= 0:  # the container does not say: count by decoding
                decoded = list(container.decode(stream))
                total = len(decoded)
            first = _start(op.start, total - span, rng)
            wanted = [min(first + k * op.stride, total - 1) for k in range(op.num_frames)]
            if decoded is None:
                decoded = []
                for frame in container.decode(stream):
                    decoded.append(frame)
                    if len(decoded) > wanted[-1]:
                        break
            last = len(decoded) - 1  # containers may count more frames than they hold
            return [decoded[min(w, last)] for w in wanted] if decoded else []

    def _shape(self, frame: Any) -> np.ndarray:
        """One frame through the geometry: resize (FFmpeg's scaler), center crop."""
        h, w = frame.height, frame.width
        for g in self.geometry:
            if isinstance(g, Resize):
                if isinstance(g.size, int):
                    scale = g.size / min(h, w)
                    h, w = max(1, round(h * scale)), max(1, round(w * scale))
                else:
                    h, w = int(g.size[0]), int(g.size[1])
                frame = frame.reformat(width=w, height=h, interpolation="BILINEAR")
        pixels = frame.to_ndarray(format="rgb24")
        for g in self.geometry:
            if isinstance(g, CenterCrop):
                ch, cw = (g.size, g.size) if isinstance(g.size, int) else g.size
                pixels = _center_crop(pixels, int(ch), int(cw))
        return pixels


def _center_crop(pixels: np.ndarray, h: int, w: int) -> np.ndarray:
    """The central ``h x w``, zero-padded where the frame is smaller (as torchvision)."""
    out = np.zeros((h, w, pixels.shape[2]), np.uint8)
    ih, iw = pixels.shape[:2]
    top, left = (ih - h) // 2, (iw - w) // 2
    src = pixels[max(0, top) : max(0, top) + min(h, ih), max(0, left) : max(0, left) + min(w, iw)]
    dt, dl = max(0, -top), max(0, -left)
    out[dt : dt + src.shape[0], dl : dl + src.shape[1]] = src
    return out


def compile_media(
    transforms: list[Any], columns: dict[str, str]
) -> tuple[dict[str, AudioPipeline | VideoPipeline], list[Any]]:
    """Take the audio and video ops (and the frame ops of decoded video columns) out of a
    loader's transforms, as per-column pipelines; the rest go on to the image pipelines.
    Refuses, before any data is read, an op on a missing column or a column that does not
    hold bytes, a crop before its decode, and image ops video frames do not support."""
    pipelines: dict[str, AudioPipeline | VideoPipeline] = {}
    rest: list[Any] = []
    for op in transforms:
        column = getattr(op, "column", None)
        pipeline = pipelines.get(column) if column is not None else None
        if isinstance(op, (AudioDecode, VideoDecode)):
            if column not in columns:
                raise SpecError(
                    f"{op.op} names column {column!r}, which the dataset does not have "
                    f"(it has {sorted(columns)})"
                )
            if columns[column] not in _BYTES:
                raise SpecError(
                    f"{op.op} on column {column!r}: it stores {columns[column]!r}, not encoded "
                    "bytes (write the files' bytes as a binary column)"
                )
            if pipeline is not None:
                raise SpecError(f"{op.op} on column {column!r} is listed twice")
            is_audio = isinstance(op, AudioDecode)
            pipelines[column] = AudioPipeline(op) if is_audio else VideoPipeline(op)  # type: ignore[arg-type]
        elif isinstance(op, AudioCrop):
            if not isinstance(pipeline, AudioPipeline) or pipeline.crop is not None:
                raise SpecError(
                    f"audio_crop on column {column!r} needs one audio_decode of it before"
                )
            pipeline.crop = op
        elif isinstance(pipeline, VideoPipeline):
            if not isinstance(op, (Resize, CenterCrop)):
                raise SpecError(
                    f"{op.op} on video column {column!r}: frames take resize and center_crop"
                )
            pipeline.geometry.append(op)
        elif isinstance(pipeline, AudioPipeline):
            raise SpecError(
                f"{op.op} on audio column {column!r}: after audio_decode only audio_crop applies"
            )
        else:
            rest.append(op)
    return pipelines, rest
