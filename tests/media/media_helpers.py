"""Tones, H.264 clips, clip formats and audio read ops that the media test modules share."""

from __future__ import annotations

import io

import numpy as np

RATES = [16_000, 44_100, 48_000, 22_050]
FORMATS = [("WAV", None), ("FLAC", None), ("OGG", "VORBIS"), ("MP3", "MPEG_LAYER_III")]


def _tone(rate: int, seconds: float, channels: int, freq: float = 440.0) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    mono = 0.5 * np.sin(2 * np.pi * freq * t)
    return np.stack([mono] * channels, axis=1).astype(np.float32)


def _encode(signal: np.ndarray, rate: int, fmt: str, subtype: str | None) -> bytes:
    import soundfile as sf

    out = io.BytesIO()
    sf.write(out, signal, rate, format=fmt, subtype=subtype)
    return out.getvalue()


OPS = [
    {"op": "audio_decode", "column": "audio", "sample_rate": 16_000, "mono": True},
    {"op": "audio_crop", "column": "audio", "seconds": 1.0, "start": "random"},
]


def _video(frames: int, width: int = 64, height: int = 48) -> bytes:
    """An H.264 clip whose frame k is a flat gray of level 8 k (to tell frames apart)."""
    import av

    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for k in range(frames):
            pixels = np.full((height, width, 3), 8 * k, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def _where_plain(i: int, message: str) -> str:
    return message
