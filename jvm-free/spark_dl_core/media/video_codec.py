"""Video files as bytes at write time: the ``reencode_video`` op's work.

Runs where the rows are written (in Spark's executors for ``df.write.format("mds")``):
each clip is decoded with FFmpeg (PyAV), optionally re-timed to ``fps`` and cut to
``max_frames``, its frames scaled in FFmpeg's scaler to ``size`` and encoded again as
H.264 in MP4 (yuv420p) with keyframes (IDR) at most ``gop`` frames apart and no
B-frames, so a read-time ``video_decode`` starts close to any clip start and decodes few
frames. The encoder runs on one thread without macroblock-tree rate control, gets the
pixels alone (not the decoded frames' picture types or side data) and no timestamp comes
from the clock, so the same clip gives the same bytes on any machine with the same FFmpeg.
Only the first video stream is kept. Needs the ``media`` extra.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import pyarrow as pa

from ..errors import ReencodeError, optional_import
from ..ops.registry import register_op

DEFAULT_RATE = Fraction(25)  # a stream that declares no frame rate


def _av() -> Any:
    return optional_import("av", "reencode_video")


def _even(side: float) -> int:
    return max(2, 2 * round(side / 2))


def target_size(size: Any, height: int, width: int) -> tuple[int, int]:
    """``(h, w)`` of the stored frames: ``size`` an int is the shorter side (aspect kept,
    the other side rounded to even), ``(h, w)`` exact, None the frame's own (even)."""
    if size is None:
        return _even(height), _even(width)
    if isinstance(size, int):
        if height <= width:
            return size, _even(width * size / height)
        return _even(height * size / width), size
    return int(size[0]), int(size[1])


def _retimed(frames: Iterator[Any], fps: Fraction, source_rate: Fraction) -> Iterator[Any]:
    """``frames`` at ``fps``: output frame k (at k / fps from the first frame) is the last
    source frame shown at or before that time (frames dropped or repeated)."""
    step = 1 / fps
    k = 0
    origin: Fraction | None = None
    previous, last = None, Fraction(0)
    for index, frame in enumerate(frames):
        at = frame.pts * frame.time_base if frame.pts is not None else index / source_rate
        if origin is None:
            origin = at
        at -= origin
        while previous is not None and k * step < at:
            yield previous
            k += 1
        previous, last = frame, at
    end = last + 1 / source_rate  # the last frame is shown for one source frame
    while previous is not None and k * step < end:
        yield previous
        k += 1


def _reencode_clip(av: Any, op: Any, raw: bytes) -> bytes:
    out = io.BytesIO()
    with av.open(io.BytesIO(raw), mode="r", metadata_errors="replace") as source:
        if not source.streams.video:
            raise ValueError("it has no video stream")
        stream = source.streams.video[0]
        source_rate = Fraction(stream.average_rate or stream.guessed_rate or DEFAULT_RATE)
        rate = Fraction(op.fps).limit_denominator(1001) if op.fps else source_rate
        frames: Iterator[Any] = source.decode(stream)
        if op.fps:
            frames = _retimed(frames, rate, source_rate)
        with av.open(out, mode="w", format="mp4") as target:
            encoder: Any = None
            for count, frame in enumerate(itertools.islice(frames, op.max_frames)):
                if encoder is None:
                    height, width = target_size(op.size, frame.height, frame.width)
                    encoder = target.add_stream("libx264", rate=rate)
                    encoder.width, encoder.height, encoder.pix_fmt = width, height, "yuv420p"
                    context = encoder.codec_context
                    context.thread_count = 1  # x264's output depends on its thread count
                    context.gop_size = op.gop
                    context.max_b_frames = 0
                    # x264's macroblock-tree rate control gives different bytes from run
                    # to run on the same frames (measured, one thread): off
                    encoder.options = {
                        "crf": str(op.crf),
                        "bf": "0",
                        "threads": "1",
                        "x264-params": "mbtree=0",
                    }
                scaled = frame.reformat(
                    width=width, height=height, format="yuv420p", interpolation="BICUBIC"
                )
                # a new frame of the pixels alone: the decoded frame's picture type, side
                # data and quality would otherwise steer the encoder
                scaled = av.VideoFrame.from_ndarray(scaled.to_ndarray(), format="yuv420p")
                scaled.pts, scaled.time_base = count, 1 / rate
                for packet in encoder.encode(scaled):
                    target.mux(packet)
            if encoder is None:
                raise ValueError("it has no video frames")
            for packet in encoder.encode():
                target.mux(packet)
    return out.getvalue()


def reencode_video(op: Any, array: pa.Array) -> pa.Array:
    """``array``'s clips (binary) re-encoded as ``op`` says; nulls stay null. A clip that
    does not decode raises :class:`ReencodeError` naming the column and its row."""
    av = _av()
    out: list[bytes | None] = []
    for row, raw in enumerate(array.to_pylist()):
        if raw is None:
            out.append(None)
            continue
        try:
            out.append(_reencode_clip(av, op, raw))
        except (av.FFmpegError, ValueError, OSError) as exc:  # FFmpeg's errors, ours
            raise ReencodeError(
                op.column, f"reencode_video: the clip does not decode: {exc}", row
            ) from None
    return pa.array(out, type=array.type)


register_op("reencode_video", reencode_video)
