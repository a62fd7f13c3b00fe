"""Audio files as bytes at write time: the ``reencode_audio`` op's work.

Runs where the rows are written (in Spark's executors for ``df.write.format("mds")``):
each clip is decoded with libsndfile (``soundfile``), mixed down with ``mono``, resampled
with the SoX resampler (``soxr``, high quality) and encoded again as FLAC, WAV (16-bit PCM)
or OGG/Vorbis, so the stored dataset holds training-ready audio. A clip already in the
target format, rate and channel count keeps its bytes. Needs the ``media`` extra.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import ReencodeError, optional_import
from ..ops.registry import register_op

# format name -> (libsndfile's container, its subtype)
FORMATS = {"flac": ("FLAC", "PCM_16"), "wav": ("WAV", "PCM_16"), "ogg": ("OGG", "VORBIS")}
# FLAC's header says 0 samples only as "length unknown": libsndfile writes no bytes at all
# for an empty clip, and cannot read an empty FLAC written by hand (every read fails).
_EMPTY_FLAC = (
    "reencode_audio: the clip has no samples (or none left after resampling) and FLAC "
    "cannot store an empty clip that reads back; drop such rows or use format='wav' / 'ogg'"
)


def _need(module: str) -> Any:
    return optional_import(module, "reencode_audio")


def reencode_audio(op: Any, array: pa.Array) -> pa.Array:
    """``array``'s clips (binary) re-encoded as ``op`` says; nulls stay null. A clip that
    does not decode raises :class:`ReencodeError` naming the column and its row."""
    sf = _need("soundfile")
    container, subtype = FORMATS[op.format]
    out: list[bytes | None] = []
    for row, raw in enumerate(array.to_pylist()):
        if raw is None:
            out.append(None)
            continue
        try:
            with sf.SoundFile(io.BytesIO(raw)) as f:
                rate, channels, kept = f.samplerate, f.channels, f.format
                target = op.sample_rate or rate
                if kept == container and target == rate and (channels == 1 or not op.mono):
                    out.append(raw)  # already what the op asks for: the bytes stay
                    continue
                data = f.read(dtype="float32", always_2d=True)
        except (RuntimeError, ValueError, TypeError) as exc:  # libsndfile's errors
            raise ReencodeError(
                op.column, f"reencode_audio: the clip does not decode: {exc}", row
            ) from None
        if op.mono and data.shape[1] > 1:
            data = data.mean(axis=1, keepdims=True, dtype=np.float32)
        if target != rate and len(data):
            data = _need("soxr").resample(data, rate, target, quality="HQ")
        if not len(data) and container == "FLAC":
            raise ReencodeError(op.column, _EMPTY_FLAC, row)
        buffer = io.BytesIO()
        # resampling may overshoot full scale a little: clip rather than wrap around
        sf.write(buffer, np.clip(data, -1.0, 1.0), target, format=container, subtype=subtype)
        out.append(buffer.getvalue())
    return pa.array(out, type=array.type)


register_op("reencode_audio", reencode_audio)
