"""The dataset card: what a person looks at before training on a dataset.

Schema with encodings, lineage (a pinned Delta table, or a mixture's sources and their
shares), per-column statistics from a bounded sample, a thumbnail grid for image columns
(shrunk by the ``reencode_image`` op's code, :func:`image_codec.reencode_array`), waveforms
for audio columns and frame strips for video columns (with the ``media`` extra). One
self-contained HTML page: styles inline, pictures as data URIs or inline SVG, no network.
Also :func:`describe_value`, the short text a binary value shows as (``<jpeg 400x300, 73
KB>``, ``<wav 16000 Hz 1 ch 2.50 s, 78 KB>``).
:func:`notebook_card` is :class:`Dataset`'s notebook view (``_repr_html_``; the package face
hands it to the dataset room).
"""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Any

import numpy as np
import pyarrow as pa

from .media.image_codec import image_size, reencode_array
from .sources.dataset import Dataset

SAMPLE_ROWS = 512  # the bounded sample statistics come from
SAMPLE_SHARDS = 8  # ...read from at most this many shards, spread over the dataset
THUMBNAILS = 16  # per image column
THUMB_SIDE = 96
BINS = 12
WAVEFORMS = 6  # per audio column
WAVE_WIDTH, WAVE_HEIGHT = 240, 40
WAVE_SECONDS = 30  # a waveform shows at most this much of a clip: bounded decoding
CLIPS = 3  # frame strips per video column
STRIP_FRAMES = 6
FRAME_HEIGHT = 64
MAX_STRIP_DECODE = 600  # frames decoded at most to find a strip's frames
AUDIO_KINDS = ("wav", "flac", "ogg", "mp3", "m4a")
VIDEO_KINDS = ("mp4", "webm", "avi")  # containers: one without a video stream holds audio
_AUDIO_BRANDS = (b"M4A ", b"M4B ", b"M4P ")  # ftyp brands of audio-only MPEG-4 files

_MAGIC = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF8", "gif"),
    (b"RIFF", "webp"),  # checked further below
    (b"BM", "bmp"),
)


def image_kind(raw: bytes) -> str | None:
    """``jpeg``/``png``/``gif``/``webp``/``bmp`` from the leading bytes, else None."""
    for magic, kind in _MAGIC:
        if raw.startswith(magic):
            if kind == "webp" and raw[8:12] != b"WEBP":
                return None
            return kind
    return None


def media_kind(raw: bytes) -> str | None:
    """``wav``/``flac``/``ogg``/``mp3``/``m4a`` or ``mp4``/``webm`` (also Matroska)/``avi``
    from the leading bytes, else None. A container kind may still hold audio only: see
    :func:`media_track`."""
    if raw[:4] == b"RIFF" and raw[8:12] == b"WAVE":
        return "wav"
    if raw[:4] == b"RIFF" and raw[8:12] == b"AVI ":
        return "avi"
    if raw[4:8] == b"ftyp" and raw[8:12] in _AUDIO_BRANDS:
        return "m4a"
    if raw.startswith(b"fLaC"):
        return "flac"
    if raw.startswith(b"OggS"):
        return "ogg"
    if raw.startswith(b"ID3") or (
        len(raw) > 1 and raw[0] == 0xFF and raw[1] & 0xE0 == 0xE0 and raw[1] != 0xD8
    ):
        return "mp3"
    if raw[4:8] == b"ftyp":
        return "mp4"
    if raw.startswith(b"\x1a\x45\xdf\xa3"):
        return "webm"
    return None


def media_track(raw: bytes) -> tuple[str, str] | None:
    """(kind, ``"audio"`` or ``"video"``) of a media value, else None. A container
    (``mp4``, ``webm``, ``avi``) without a video stream is audio (an ``.m4a`` saved with
    a generic brand, an Opus ``.webm``): PyAV reads its stream list, no decoding."""
    kind = media_kind(raw)
    if kind is None:
        return None
    if kind in AUDIO_KINDS:
        return kind, "audio"
    try:
        import av

        with av.open(io.BytesIO(raw), mode="r") as container:
            if not container.streams.video and container.streams.audio:
                return ("m4a" if kind == "mp4" else kind), "audio"
    except Exception:  # no media extra, or a damaged header: the container's usual kind
        pass
    return kind, "video"


def audio_facts(raw: bytes) -> tuple[int, int, float]:
    """(sample rate, channels, seconds) from the header: libsndfile where it reads the
    format (wav, flac, ogg, mp3), else the first audio stream through PyAV (AAC in m4a…)."""
    import soundfile

    try:
        info = soundfile.info(io.BytesIO(raw))
        return int(info.samplerate), int(info.channels), float(info.frames) / info.samplerate
    except soundfile.LibsndfileError:
        pass
    import av

    with av.open(io.BytesIO(raw), mode="r") as container:
        stream = container.streams.audio[0]
        return int(stream.rate), int(stream.channels), _seconds(container, stream)


def _seconds(container: Any, stream: Any) -> float:
    """A stream's duration, else the container's, in seconds (0.0 when neither says)."""
    base = stream.time_base
    seconds = float(stream.duration * base) if stream.duration and base else 0.0
    if not seconds and container.duration:
        seconds = container.duration / 1_000_000
    return seconds


def video_facts(raw: bytes) -> tuple[int, int, float]:
    """(width, height, seconds) of the first video stream, from the container (PyAV)."""
    import av

    with av.open(io.BytesIO(raw), mode="r") as container:
        stream = container.streams.video[0]
        width, height = int(stream.codec_context.width), int(stream.codec_context.height)
        return width, height, _seconds(container, stream)


def describe_value(raw: bytes | bytearray | memoryview) -> str:
    """A binary value as a person wants to see it in a listing: ``<jpeg 400x300, 73 KB>``
    (width x height read from the header, no decode), ``<wav 16000 Hz 1 ch 2.50 s, 78
    KB>``, ``<mp4 320x240 3.20 s, 1.2 MB>`` (from the header, where the ``media`` extra is
    installed), else ``<bytes, 812 B>``."""
    data = bytes(raw)
    size = human_size(len(data))
    kind = image_kind(data)
    if kind is not None:
        try:
            h, w = image_size(data)
            return f"<{kind} {w}x{h}, {size}>"
        except Exception:  # a damaged or unsupported header: still say what it is
            return f"<{kind}, {size}>"
    track = media_track(data)
    if track is not None:
        kind, medium = track
        try:
            if medium == "audio":
                rate, channels, seconds = audio_facts(data)
                what = f"{rate} Hz {channels} ch"
            else:
                width, height, seconds = video_facts(data)
                what = f"{width}x{height}"
            return f"<{kind} {what} {seconds:.2f} s, {size}>"
        except Exception:  # no decoder library here, or a damaged header
            return f"<{kind}, {size}>"
    return f"<bytes, {size}>"


# --------------------------------------------------------------------------- the sample


def sample_indices(ds: Dataset, rows: int = SAMPLE_ROWS, shards: int = SAMPLE_SHARDS) -> np.ndarray:
    """At most ``rows`` stored samples from at most ``shards`` shards spread evenly over
    the dataset: bounded reading however large it is."""
    offsets = ds.shard_offsets
    count = len(offsets) - 1
    if count == 0 or rows <= 0:
        return np.zeros(0, dtype=np.int64)
    picked = np.unique(np.linspace(0, count - 1, min(shards, count)).round().astype(np.int64))
    per = max(1, math.ceil(rows / len(picked)))
    parts = [
        np.arange(offsets[s], min(offsets[s] + per, offsets[s + 1]), dtype=np.int64) for s in picked
    ]
    return np.concatenate(parts)[:rows]


def _histogram(values: np.ndarray) -> list[tuple[float, float, int]]:
    if not len(values):
        return []
    lo, hi = float(values.min()), float(values.max())
    bins = 1 if lo == hi else min(BINS, max(1, len(np.unique(values))))
    counts, edges = np.histogram(values, bins=bins, range=(lo, hi if hi > lo else lo + 1))
    return [(float(edges[i]), float(edges[i + 1]), int(c)) for i, c in enumerate(counts)]


def _numbers(values: np.ndarray) -> dict[str, Any]:
    as_float = values.astype(np.float64)
    finite = as_float[np.isfinite(as_float)]
    if not len(finite):
        return {}
    return {"min": finite.min().item(), "max": finite.max().item(), "mean": finite.mean().item()}


def _lengths(kind: str, lengths: list[int]) -> dict[str, Any]:
    array = np.asarray(lengths, dtype=np.int64)
    return {"kind": kind, **_numbers(array), "histogram": _histogram(array)}


def column_stats(ds: Dataset, indices: np.ndarray | None = None) -> dict[str, dict[str, Any]]:
    """Per stored column, from the sample: ``kind`` (number, bool, text, bytes, image,
    sequence, other), ``nulls``, min/max/mean of the values or of their lengths (text,
    bytes, sequences; ``histogram`` of lengths), image sizes, and ``sampled`` rows."""
    if indices is None:
        indices = sample_indices(ds)
    masks = {p.null_mask: p.name for p in ds.plans or [] if p.null_mask}
    names = [n for n in ds.layout.names if n not in masks]
    batch = ds.read(indices, images="bytes") if len(indices) else {}
    null_rows = {masks[m]: np.asarray(batch[m]).astype(bool) for m in masks if m in batch}
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        values = batch.get(name)
        stats: dict[str, Any] = {"sampled": len(indices), "nulls": 0}
        if values is not None and name in null_rows:  # statistics of the values present
            stats["nulls"] = int(null_rows[name].sum())
            values = values[~null_rows[name]]
        elif isinstance(values, np.ndarray) and values.dtype == object:  # json: None is null
            present = np.fromiter((v is not None for v in values), bool, len(values))
            stats["nulls"] = int(len(values) - present.sum())
            values = values[present]
        if values is None or not len(values):
            out[name] = {"kind": "other", **stats}
            continue
        values = np.asarray(values) if not isinstance(values, np.ndarray) else values
        if values.dtype == bool:
            stats.update(kind="bool", true=int(values.sum()))
        elif values.dtype.kind in "iuf" and values.ndim == 1:
            stats.update(kind="number", **_numbers(values), histogram=_histogram(values))
        elif values.dtype.kind in "iuf":
            stats.update(_lengths("sequence", [int(np.prod(values.shape[1:]))] * len(values)))
        else:
            stats.update(_object_stats(list(values)))
        out[name] = stats
    return out


def _object_stats(items: list[Any]) -> dict[str, Any]:
    present = [v for v in items if v is not None]
    if present and all(isinstance(v, str) for v in present):
        return _lengths("text", [len(v) for v in present])
    if present and all(isinstance(v, (bytes, bytearray, memoryview)) for v in present):
        raws = [bytes(v) for v in present]
        kinds = {image_kind(r) for r in raws}
        if None not in kinds:
            sizes = []
            for raw in raws:
                try:
                    sizes.append(image_size(raw))
                except Exception:
                    continue
            stats = _lengths("image", [len(r) for r in raws])
            stats["formats"] = sorted(k for k in kinds if k)
            if sizes:
                hs, ws = np.asarray(sizes).T
                stats["width"] = (int(ws.min()), int(ws.max()))
                stats["height"] = (int(hs.min()), int(hs.max()))
            return stats
        tracks = [media_track(r) for r in raws]
        media = {t[1] if t else None for t in tracks}
        if len(media) == 1 and None not in media:
            return _media_stats(raws, {t[0] for t in tracks if t}, media.pop() == "audio")
        return _lengths("bytes", [len(r) for r in raws])
    if present and all(isinstance(v, np.ndarray) for v in present):
        return _lengths("sequence", [int(v.size) for v in present])
    if present and all(isinstance(v, (list, tuple, dict)) for v in present):
        return _lengths("sequence", [len(v) for v in present])
    return {"kind": "other"}


def _media_stats(raws: list[bytes], kinds: set[str], audio: bool) -> dict[str, Any]:
    """Sizes of an audio or video column, and the durations, rates and frame sizes its
    headers give (where the ``media`` extra is installed)."""
    stats = _lengths("audio" if audio else "video", [len(r) for r in raws])
    stats["formats"] = sorted(kinds)
    facts = []
    for raw in raws:
        try:
            facts.append(audio_facts(raw) if audio else video_facts(raw))
        except Exception:  # no decoder here, or a damaged header: sizes still count
            continue
    if facts:
        a, b, seconds = np.asarray(facts, dtype=np.float64).T
        stats["seconds"] = (float(seconds.min()), float(seconds.max()))
        if audio:
            stats["sample_rates"] = sorted({int(r) for r in a})
            stats["channels"] = sorted({int(c) for c in b})
        else:
            stats["width"] = (int(a.min()), int(a.max()))
            stats["height"] = (int(b.min()), int(b.max()))
    return stats


def _spread(indices: np.ndarray, count: int) -> np.ndarray:
    return indices[:: max(1, len(indices) // count)][:count] if len(indices) else indices


def waveform_svg(raw: bytes, width: int = WAVE_WIDTH, height: int = WAVE_HEIGHT) -> str:
    """A clip's waveform as inline SVG: the min/max envelope of its first
    ``WAVE_SECONDS`` seconds (channels averaged) over ``width`` columns."""
    seconds, wave = _mono_samples(raw)
    if not len(wave):
        wave = np.zeros(1, np.float32)
    edges = np.linspace(0, len(wave), min(width, len(wave)) + 1).astype(np.int64)
    lows = np.minimum.reduceat(wave, edges[:-1])
    highs = np.maximum.reduceat(wave, edges[:-1])
    xs = np.linspace(0, width, len(lows))
    mid = height / 2

    def y(v: np.ndarray) -> np.ndarray:
        return mid - np.clip(v, -1, 1) * (mid - 1)

    top = " ".join(f"{x:.1f},{v:.1f}" for x, v in zip(xs, y(highs)))
    bottom = " ".join(f"{x:.1f},{v:.1f}" for x, v in zip(xs[::-1], y(lows)[::-1]))
    return (
        f'<svg class="wave" width="{width}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{seconds:.2f} s</title>'
        f'<line x1="0" y1="{mid}" x2="{width}" y2="{mid}" stroke="#ccc"/>'
        f'<polygon points="{top} {bottom}" fill="#5b8def"/></svg>'
    )


def _mono_samples(raw: bytes) -> tuple[float, np.ndarray]:
    """(clip seconds, its first ``WAVE_SECONDS`` seconds as mono float32): libsndfile where
    it reads the format, else PyAV (AAC in m4a, Opus in webm…)."""
    import soundfile

    try:
        with soundfile.SoundFile(io.BytesIO(raw)) as f:
            seconds = f.frames / f.samplerate
            data = f.read(min(f.frames, WAVE_SECONDS * f.samplerate), dtype="float32")
            return seconds, data.mean(axis=1) if data.ndim == 2 else data
    except soundfile.LibsndfileError:
        pass
    import av

    with av.open(io.BytesIO(raw), mode="r") as container:
        stream = container.streams.audio[0]
        seconds, limit = _seconds(container, stream), WAVE_SECONDS * int(stream.rate)
        mono = av.AudioResampler(format="flt", layout="mono", rate=int(stream.rate))
        parts: list[np.ndarray] = []
        for frame in container.decode(stream):
            parts += [f.to_ndarray().reshape(-1) for f in mono.resample(frame)]
            if sum(len(p) for p in parts) >= limit:
                break
    data = np.concatenate(parts)[:limit] if parts else np.zeros(0, np.float32)
    return seconds, data.astype(np.float32, copy=False)


def frame_strip(raw: bytes, frames: int = STRIP_FRAMES, height: int = FRAME_HEIGHT) -> list[bytes]:
    """JPEGs of ``frames`` frames spread evenly over a clip (decoding at most
    ``MAX_STRIP_DECODE`` frames), each scaled to ``height`` pixels high in FFmpeg's scaler."""
    import av
    from PIL import Image

    with av.open(io.BytesIO(raw), mode="r") as container:
        stream = container.streams.video[0]
        total = min(int(stream.frames or MAX_STRIP_DECODE), MAX_STRIP_DECODE)
        wanted = set(np.linspace(0, max(0, total - 1), frames).round().astype(int).tolist())
        picked = []
        for k, frame in enumerate(container.decode(stream)):
            if k in wanted:
                w = max(1, round(frame.width * height / frame.height))
                picked.append(frame.reformat(width=w, height=height).to_ndarray(format="rgb24"))
            if k >= max(wanted):
                break
    out = []
    for pixels in picked:
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=80)
        out.append(buffer.getvalue())
    return out


# The reason a masked null image (nulls='mask': stored empty) has no thumbnail.
NULL_IMAGE = "null"


def thumbnails(
    ds: Dataset, column: str, indices: np.ndarray, count: int = THUMBNAILS
) -> list[tuple[int, bytes | None, str]]:
    """Up to ``count`` (sample, JPEG thumbnail, why not) triples of an image column, each
    shrunk to fit ``THUMB_SIDE`` pixels by the ``reencode_image`` op's code. An image that
    does not decode gets ``None`` and the reason, so one bad value costs one picture."""
    picked = indices[:: max(1, len(indices) // count)][:count] if len(indices) else indices
    if not len(picked):
        return []
    mask = next((p.null_mask for p in ds.plans or [] if p.name == column and p.null_mask), None)
    batch = ds.read(picked, [column] + ([mask] if mask else []), images="bytes")
    nulls = np.asarray(batch[mask], bool) if mask else np.zeros(len(picked), bool)
    return [
        (int(i), None, NULL_IMAGE) if null else _thumbnail(int(i), bytes(r), column)
        for i, r, null in zip(picked, batch[column], nulls)
        if r is not None
    ]


def _thumbnail(row: int, raw: bytes, column: str) -> tuple[int, bytes | None, str]:
    """One thumbnail, or None and why (one undecodable image must not hide the others)."""
    try:
        small = reencode_array(pa.array([raw], pa.binary()), THUMB_SIDE, 80, column)[0].as_py()
        if small == raw:  # already small enough, so passed through undecoded: decode it here
            _decode_error(raw, raise_it=True)
        return row, small, ""
    except Exception:
        return row, None, _decode_error(raw) or "does not decode"


def _decode_error(raw: bytes, raise_it: bool = False) -> str:
    """Why PIL cannot decode ``raw`` ("" when it can): the reason a placeholder shows."""
    from .media.image_codec import pil

    try:
        with pil().open(io.BytesIO(raw)) as image:
            image.load()
        return ""
    except Exception as exc:
        if raise_it:
            raise
        return f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- numbers for people

_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
_UNITS = ((1024**3, "GB"), (1024**2, "MB"), (1024, "KB"))


def human_number(value: float) -> str:
    """A number as people write it: ``3``, ``1.62``, ``7,363``, ``15,000``, ``0.0012``;
    a power of ten only far outside that (``2.5×10¹⁵``), never ``1.5e+04``."""
    x = float(value)
    if not math.isfinite(x):
        return str(x)
    a = abs(x)
    if a == 0:
        return "0"
    if a >= 1e15 or a < 1e-4:
        mantissa, exponent = f"{x:.2e}".split("e")
        return f"{float(mantissa):g}×10{str(int(exponent)).translate(_SUPERSCRIPT)}"
    if a >= 100:
        return f"{round(x):,}"
    return f"{float(f'{x:.3g}'):g}"


def _size_unit(n: float) -> tuple[float, str]:
    return next(((d, u) for d, u in _UNITS if n >= d), (1, "B"))


def _in_unit(n: float, divisor: float) -> str:
    v = n / divisor
    return f"{v:.1f}" if divisor > 1 and v < 10 else f"{v:.0f}"


def human_size(n: float) -> str:
    """Bytes as people write them: ``812 B``, ``9.1 KB``, ``15 KB``, ``1.2 MB``."""
    divisor, unit = _size_unit(n)
    return f"{_in_unit(n, divisor)} {unit}"


def human_range(lo: float, hi: float, size: bool = False) -> str:
    """``9.1–15 KB`` (one unit when both ends share it), ``800 B–1.2 MB``, ``0–3``; one
    value when both ends read the same."""
    if not size:
        a, b = human_number(lo), human_number(hi)
        return a if a == b else f"{a}–{b}"
    (_, u0), (d1, u1) = _size_unit(lo), _size_unit(hi)
    if u0 != u1:
        return f"{human_size(lo)}–{human_size(hi)}"
    a, b = _in_unit(lo, d1), _in_unit(hi, d1)
    return f"{a} {u1}" if a == b else f"{a}–{b} {u1}"


_MEASURE = {  # what a min/max/mean of each kind is of: (label, unit, is a byte size)
    "number": ("", "", False),
    "text": ("length ", " characters", False),
    "sequence": ("length ", "", False),
    "bytes": ("size ", "", True),
    "image": ("size ", "", True),
    "audio": ("size ", "", True),
    "video": ("size ", "", True),
}


def stats_lines(stats: dict[str, Any]) -> list[tuple[str, list[tuple[float, float, int]]]]:
    """A column's sample statistics as lines a person reads (``size 9.1–15 KB, mean 12
    KB``, ``jpeg, 300 × 100–139 px``), each with the histogram it describes (or [])."""
    kind = stats.get("kind", "other")
    lines: list[tuple[str, list[tuple[float, float, int]]]] = []
    if "min" in stats and kind in _MEASURE:
        label, unit, size = _MEASURE[kind]
        mean = human_size(stats["mean"]) if size else human_number(stats["mean"])
        span = human_range(stats["min"], stats["max"], size)
        lines.append((f"{label}{span}{unit}, mean {mean}", stats.get("histogram", [])))
    if kind == "bool":
        lines.append((f"true {stats['true']} of {stats['sampled']}", []))
    if kind in ("image", "video") and "width" in stats:
        (w0, w1), (h0, h1) = stats["width"], stats["height"]
        pixels = f"{human_range(w0, w1)} × {human_range(h0, h1)} px"
        lines.append((f"{'/'.join(stats['formats'])}, {pixels}", []))
    if kind in ("audio", "video") and "seconds" in stats:
        s0, s1 = stats["seconds"]
        span = f"{s0:.2f} s" if f"{s0:.2f}" == f"{s1:.2f}" else f"{s0:.2f}–{s1:.2f} s"
        rates = stats.get("sample_rates")
        hz = f", {'/'.join(map(str, rates))} Hz" if rates else ""
        channels = stats.get("channels")
        ch = f", {'/'.join(map(str, channels))} ch" if channels else ""
        head = "" if kind == "video" else f"{'/'.join(stats['formats'])}, "
        lines.append((f"{head}{span}{hz}{ch}", []))
    return lines


# --------------------------------------------------------------------------- the page

_STYLE = """
.sdl-card{font-family:system-ui,-apple-system,Segoe UI,sans-serif;font-size:13px;color:#222;
max-width:1100px}
.sdl-card h2{font-size:18px;margin:4px 0}.sdl-card h3{font-size:14px;margin:14px 0 4px}
.sdl-card table{border-collapse:collapse}.sdl-card td,.sdl-card th{border:1px solid #ddd;
padding:3px 8px;text-align:left;vertical-align:top}.sdl-card th{background:#f4f4f4}
.sdl-card .muted{color:#777}.sdl-card code{font-size:12px}
.sdl-card .stat{display:flex;align-items:center;gap:10px;min-height:18px}
.sdl-card .stat .label{min-width:14em}.sdl-card .stat .hist{flex:none;display:block}
.sdl-card .grid{display:flex;flex-wrap:wrap;gap:6px}.sdl-card figure{margin:0;text-align:center}
.sdl-card figure img{display:block;max-width:96px;max-height:96px;border:1px solid #ccc}
.sdl-card .missing{box-sizing:border-box;width:96px;height:72px;border:1px dashed #c66;
background:#fbeeee;color:#933;font-size:10px;padding:3px;overflow:hidden;text-align:left;
overflow-wrap:anywhere}
.sdl-card figcaption{font-size:11px;color:#666}
.sdl-card .strip{display:flex;gap:2px;margin-bottom:6px}.sdl-card .strip img{height:64px}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _svg_histogram(histogram: list[tuple[float, float, int]], size: bool = False) -> str:
    """Bars of a histogram with a tooltip per bar (its range and count, as people write
    them); drawn beside the line it belongs to, never over text."""
    if not histogram:
        return ""
    top = max(c for _, _, c in histogram) or 1
    width, height, bar = 12 * len(histogram), 24, 12
    rects = "".join(
        f'<rect x="{i * bar}" y="{height - max(1, round(c / top * height))}" width="{bar - 1}" '
        f'height="{max(1, round(c / top * height))}" fill="#5b8def">'
        f"<title>{_e(human_range(lo, hi, size))}: {c}</title></rect>"
        for i, (lo, hi, c) in enumerate(histogram)
    )
    return (
        f'<svg class="hist" width="{width}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg">{rects}</svg>'
    )


def _stats_cell(stats: dict[str, Any]) -> str:
    """One row per statistic: its text, and to its right the histogram it describes."""
    size = _MEASURE.get(stats.get("kind", "other"), ("", "", False))[2]
    return "".join(
        f'<div class="stat"><span class="label">{_e(text)}</span>'
        f"{_svg_histogram(histogram, size)}</div>"
        for text, histogram in stats_lines(stats)
    )


def _schedule_html(ds: Dataset, stats: dict[str, Any] | None) -> str:
    """A scheduled mixture's stages: start, end, weights and each source's samples over
    the stage; the stage a loader's ``stats`` reports is marked."""
    table: list[dict[str, Any]] = getattr(ds, "stage_table", list)()
    if not table:
        return ""
    now = (stats or {}).get("stage")
    rows = "".join(_stage_row(t, t["stage"] == now) for t in table)
    return (
        "<h3>Schedule</h3><table><tr><th>stage</th><th>from sample</th><th>to sample</th>"
        f"<th>weights</th><th>samples per source</th></tr>{rows}</table>"
    )


def _stage_row(t: dict[str, Any], current: bool) -> str:
    end = "" if t["end"] is None else f"{t['end']:,}"
    weights = ", ".join(f"{n} {w:g}" for n, w in t["weights"].items())
    counts = ", ".join(f"{n} {c:,}" for n, c in t["counts"].items())
    per_epoch = ' <span class="muted">per epoch</span>' if t["end"] is None else ""
    mark = (' class="current"', " ◀ now") if current else ("", "")
    return (
        f'<tr data-stage="{t["stage"]}"{mark[0]}><td>{t["stage"]}{mark[1]}</td>'
        f"<td>{t['start']:,}</td><td>{end}</td><td>{_e(weights)}</td>"
        f"<td>{_e(counts)}{per_epoch}</td></tr>"
    )


def _delivered_html(stats: dict[str, Any] | None) -> str:
    """What a loader's ``stats()`` says a mixture's pass delivered, per source."""
    sources = (stats or {}).get("sources")
    if not sources or stats is None:
        return ""
    total = sum(sources.values()) or 1
    rows = "".join(
        f'<tr data-source="{_e(n)}"><td>{_e(n)}</td><td>{c:,}</td>'
        f"<td>{100 * c / total:.1f}%</td></tr>"
        for n, c in sources.items()
    )
    stage = stats.get("stage")
    where = f"epoch {stats.get('epoch')}"
    if stage is not None:
        where += f", stage {stage} (from sample {stats.get('stage_start', 0):,})"
    return (
        f"<h3>Delivered this pass</h3><p>{_e(where)}</p><table><tr><th>source</th>"
        f"<th>samples</th><th>share</th></tr>{rows}</table>"
    )


def _lineage_html(ds: Dataset, stats: dict[str, Any] | None = None) -> str:
    lineage = getattr(ds, "lineage", None)
    if isinstance(lineage, list) and lineage:  # a mixture: each source and its share
        total = sum(int(s.get("per_epoch", 0)) for s in lineage) or 1
        rows = "".join(
            f"<tr><td>{_e(s.get('name'))}</td><td><code>{_e(s.get('path'))}</code></td>"
            f"<td>{int(s.get('per_epoch', 0))}</td>"
            f"<td>{100 * int(s.get('per_epoch', 0)) / total:.1f}%</td></tr>"
            for s in lineage
        )
        return (
            "<h3>Lineage: mixture</h3><table><tr><th>source</th><th>path</th>"
            f"<th>samples per epoch</th><th>share</th></tr>{rows}</table>"
            + _schedule_html(ds, stats)
            + _delivered_html(stats)
        )
    source = ds.source
    if not source:
        return '<h3>Lineage</h3><p class="muted">none recorded</p>'
    table, version = source.get("table"), source.get("version")
    head = ""
    if table is not None:
        at = f"@{version}" if version is not None else ""
        head = f"<p><code>{_e(table)}{_e(at)}</code> → <code>{_e(ds.shown)}</code></p>"
    rest = "".join(
        f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>"
        for k, v in source.items()
        if k not in ("table", "version")
    )
    return f"<h3>Lineage</h3>{head}" + (f"<table>{rest}</table>" if rest else "")


def card_html(
    ds: Dataset,
    rows: int = SAMPLE_ROWS,
    thumbs: int = THUMBNAILS,
    *,
    page: bool = True,
    stats: dict[str, Any] | None = None,
) -> str:
    """The card of ``ds`` as HTML: a whole page (``page=True``) or a fragment for a
    notebook cell. Statistics and thumbnails come from at most ``rows`` samples.
    ``stats``: a loader's ``stats()`` over a mixture, whose per-source delivered counts
    and current stage the card shows (``card_html(m, stats=loader.stats())``)."""
    indices = sample_indices(ds, rows)
    sampled = column_stats(ds, indices)
    plans = {p.name: p for p in ds.plans or []}
    stored = sum(int(b) for b in ds.shards.stored_bytes) if ds.num_shards else 0
    compression = ds.shards[0].compression if ds.num_shards else None
    head = (
        f"<h2>{_e(ds.shown)}</h2><p>{len(ds)} samples · {ds.num_shards} shard(s) · "
        f"{_e(human_size(stored))} stored"
        + (f" ({_e(compression)})" if compression else "")
        + f' · fingerprint <code title="{_e(ds.fingerprint)}">{_e(ds.fingerprint[:12])}</code>'
        + f' · <span class="muted">statistics from {len(indices)} sampled rows</span></p>'
    )
    schema_rows = []
    for name, st in sampled.items():
        plan = plans.get(name)
        arrow = str(plan.arrow_type) if plan is not None else ""
        nullable = "masked" if plan is not None and plan.null_mask else ""
        schema_rows.append(
            f'<tr data-column="{_e(name)}"><td><b>{_e(name)}</b></td>'
            f"<td><code>{_e(ds.columns.get(name, ''))}</code></td><td>{_e(arrow)}</td>"
            f"<td>{_e(st.get('kind'))}</td><td>{st.get('nulls', 0)}"
            + (f' <span class="muted">({nullable})</span>' if nullable else "")
            + f"</td><td>{_stats_cell(st)}</td></tr>"
        )
    schema = (
        "<h3>Schema and statistics</h3><table><tr><th>column</th><th>encoding</th>"
        "<th>Arrow type</th><th>kind</th><th>nulls</th><th>sample statistics</th></tr>"
        + "".join(schema_rows)
        + "</table>"
    )
    grids = []
    for name, st in sampled.items():
        if st.get("kind") != "image":
            continue
        grids.append(_thumbnail_grid(ds, name, indices, thumbs))
    grids += [
        _media_previews(ds, name, st["kind"], indices)
        for name, st in sampled.items()
        if st.get("kind") in ("audio", "video")
    ]
    body = f'<div class="sdl-card"><style>{_STYLE}</style>{head}{schema}{_lineage_html(ds, stats)}'
    body += "".join(grids) + "</div>"
    if not page:
        return body
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8">'
        f"<title>{_e(ds.shown)}: spark-dl dataset card</title></head><body>{body}</body></html>"
    )


def _thumbnail_grid(ds: Dataset, name: str, indices: np.ndarray, count: int) -> str:
    """An image column's thumbnails; an image that does not decode gets a placeholder
    saying why, in its place. When none decodes for one reason (no image library here)
    that reason is said once."""
    try:
        pictures = thumbnails(ds, name, indices, count)
    except Exception as exc:  # the column cannot be read: say so, keep the rest of the card
        return f'<h3>{_e(name)}</h3><p class="muted">no thumbnails: {_e(exc)}</p>'
    reasons = {why for _, jpeg, why in pictures if jpeg is None}
    if pictures and len(reasons) == 1 and all(jpeg is None for _, jpeg, _ in pictures):
        return f'<h3>{_e(name)}</h3><p class="muted">no thumbnails: {_e(reasons.pop())}</p>'
    figures = "".join(
        f'<figure><img class="thumb" alt="{_e(name)} sample {i}" '
        f'src="data:image/jpeg;base64,{base64.b64encode(jpeg).decode()}">'
        f"<figcaption>#{i}</figcaption></figure>"
        if jpeg is not None
        else f'<figure><div class="missing" data-row="{i}" title="{_e(why)}">'
        f"{'null' if why == NULL_IMAGE else 'does not decode: ' + _e(why)}</div>"
        f"<figcaption>#{i}</figcaption></figure>"
        for i, jpeg, why in pictures
    )
    return f'<h3>{_e(name)}</h3><div class="grid" data-column="{_e(name)}">{figures}</div>'


def _media_previews(ds: Dataset, name: str, kind: str, indices: np.ndarray) -> str:
    """Waveforms of an audio column, or frame strips of a video column, from the sample;
    a clip that cannot be shown says why and the rest still are."""
    picked = _spread(indices, WAVEFORMS if kind == "audio" else CLIPS)
    raws = ds.read(picked, [name], images="bytes")[name] if len(picked) else []
    figures = []
    for i, raw in zip(picked, raws):
        if raw is None:
            continue
        try:
            if kind == "audio":
                inner = waveform_svg(bytes(raw))
            else:
                inner = (
                    '<div class="strip">'
                    + "".join(
                        f'<img class="frame" alt="{_e(name)} sample {int(i)} frame {k}" '
                        f'src="data:image/jpeg;base64,{base64.b64encode(jpeg).decode()}">'
                        for k, jpeg in enumerate(frame_strip(bytes(raw)))
                    )
                    + "</div>"
                )
        except Exception as exc:  # no media extra, or a damaged clip: say so, keep the rest
            inner = f'<p class="muted">no preview: {_e(type(exc).__name__)}: {_e(exc)}</p>'
        figures.append(f"<figure>{inner}<figcaption>#{int(i)}</figcaption></figure>")
    return (
        f'<h3>{_e(name)}</h3><div class="grid" data-column="{_e(name)}" '
        f'data-kind="{kind}">{"".join(figures)}</div>'
    )


def notebook_card(ds: Dataset) -> str:
    """The card (a fragment) in a notebook cell, from a small sample."""
    return card_html(ds, rows=128, thumbs=12, page=False)
