"""The dataset card: what a person looks at before training on a dataset.

Schema with encodings, lineage (a pinned Delta table, or a mixture's sources and their
shares), per-column statistics from a bounded sample, a thumbnail grid for image columns
(shrunk by the ``reencode_image`` op's code, :func:`image_codec.reencode_array`), waveforms
for audio columns and frame strips for video columns (with the ``media`` extra). One
self-contained HTML page: styles inline, pictures as data URIs or inline SVG, no network.
Also :func:`describe_value`, the short text a binary value shows as (``<jpeg 400x300, 73
KB>``, ``<wav 16000 Hz 1 ch 2.50 s, 78 KB>``).
:func:`install` gives :class:`Dataset` its notebook view (``_repr_html_``).
"""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Any

import numpy as np
import pyarrow as pa

from .dataset import Dataset
from .image_codec import image_size, reencode_array

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
AUDIO_KINDS = ("wav", "flac", "ogg", "mp3")
VIDEO_KINDS = ("mp4", "webm")

_MAGIC = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF8", "gif"),
    (b"RIFF", "webp"),  # checked further below
    (b"BM", "bmp"),
)


def _size_text(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    for unit in ("KB", "MB", "GB"):
        n_units = n / 1024
        if n_units < 1024 or unit == "GB":
            return f"{n_units:.0f} {unit}" if n_units >= 10 else f"{n_units:.1f} {unit}"
        n = int(n_units)
    return f"{n} B"  # pragma: no cover


def image_kind(raw: bytes) -> str | None:
    """``jpeg``/``png``/``gif``/``webp``/``bmp`` from the leading bytes, else None."""
    for magic, kind in _MAGIC:
        if raw.startswith(magic):
            if kind == "webp" and raw[8:12] != b"WEBP":
                return None
            return kind
    return None


def media_kind(raw: bytes) -> str | None:
    """``wav``/``flac``/``ogg``/``mp3`` or ``mp4``/``webm`` (also Matroska) from the
    leading bytes, else None."""
    if raw[:4] == b"RIFF" and raw[8:12] == b"WAVE":
        return "wav"
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


def audio_facts(raw: bytes) -> tuple[int, int, float]:
    """(sample rate, channels, seconds) from the header, through libsndfile."""
    import soundfile

    info = soundfile.info(io.BytesIO(raw))
    return int(info.samplerate), int(info.channels), float(info.frames) / info.samplerate


def video_facts(raw: bytes) -> tuple[int, int, float]:
    """(width, height, seconds) of the first video stream, from the container (PyAV)."""
    import av

    with av.open(io.BytesIO(raw), mode="r") as container:
        stream = container.streams.video[0]
        base = stream.time_base
        seconds = float(stream.duration * base) if stream.duration and base else 0.0
        if not seconds and container.duration:
            seconds = container.duration / 1_000_000
        return int(stream.codec_context.width), int(stream.codec_context.height), seconds


def describe_value(raw: bytes | bytearray | memoryview) -> str:
    """A binary value as a person wants to see it in a listing: ``<jpeg 400x300, 73 KB>``
    (width x height read from the header, no decode), ``<wav 16000 Hz 1 ch 2.50 s, 78
    KB>``, ``<mp4 320x240 3.20 s, 1.2 MB>`` (from the header, where the ``media`` extra is
    installed), else ``<bytes, 812 B>``."""
    data = bytes(raw)
    size = _size_text(len(data))
    kind = image_kind(data)
    if kind is not None:
        try:
            h, w = image_size(data)
            return f"<{kind} {w}x{h}, {size}>"
        except Exception:  # a damaged or unsupported header: still say what it is
            return f"<{kind}, {size}>"
    kind = media_kind(data)
    if kind is not None:
        try:
            if kind in AUDIO_KINDS:
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
        media = {media_kind(r) for r in raws}
        if media <= set(AUDIO_KINDS) or media <= set(VIDEO_KINDS):
            return _media_stats(raws, media)
        return _lengths("bytes", [len(r) for r in raws])
    if present and all(isinstance(v, np.ndarray) for v in present):
        return _lengths("sequence", [int(v.size) for v in present])
    if present and all(isinstance(v, (list, tuple, dict)) for v in present):
        return _lengths("sequence", [len(v) for v in present])
    return {"kind": "other"}


def _media_stats(raws: list[bytes], kinds: set[str | None]) -> dict[str, Any]:
    """Sizes of an audio or video column, and the durations, rates and frame sizes its
    headers give (where the ``media`` extra is installed)."""
    audio = kinds <= set(AUDIO_KINDS)
    stats = _lengths("audio" if audio else "video", [len(r) for r in raws])
    stats["formats"] = sorted(k for k in kinds if k)
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
    import soundfile

    with soundfile.SoundFile(io.BytesIO(raw)) as f:
        seconds = f.frames / f.samplerate
        data = f.read(min(f.frames, WAVE_SECONDS * f.samplerate), dtype="float32", always_2d=True)
    wave = data.mean(axis=1) if len(data) else np.zeros(1, np.float32)
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


def thumbnails(
    ds: Dataset, column: str, indices: np.ndarray, count: int = THUMBNAILS
) -> list[tuple[int, bytes]]:
    """Up to ``count`` (sample, JPEG thumbnail) pairs of an image column, each shrunk to
    fit ``THUMB_SIDE`` pixels by the ``reencode_image`` op's code."""
    picked = indices[:: max(1, len(indices) // count)][:count] if len(indices) else indices
    if not len(picked):
        return []
    raws = ds.read(picked, [column], images="bytes")[column]
    keep = [(int(i), bytes(r)) for i, r in zip(picked, raws) if r is not None]
    if not keep:
        return []
    small = reencode_array(
        pa.array([r for _, r in keep], pa.binary()), THUMB_SIDE, 80, column
    ).to_pylist()
    return [(i, s) for (i, _), s in zip(keep, small) if s is not None]


# --------------------------------------------------------------------------- the page

_STYLE = """
.sdl-card{font-family:system-ui,-apple-system,Segoe UI,sans-serif;font-size:13px;color:#222;
max-width:1100px}
.sdl-card h2{font-size:18px;margin:4px 0}.sdl-card h3{font-size:14px;margin:14px 0 4px}
.sdl-card table{border-collapse:collapse}.sdl-card td,.sdl-card th{border:1px solid #ddd;
padding:3px 8px;text-align:left;vertical-align:top}.sdl-card th{background:#f4f4f4}
.sdl-card .muted{color:#777}.sdl-card code{font-size:12px}
.sdl-card .grid{display:flex;flex-wrap:wrap;gap:6px}.sdl-card figure{margin:0;text-align:center}
.sdl-card figure img{display:block;max-width:96px;max-height:96px;border:1px solid #ccc}
.sdl-card figcaption{font-size:11px;color:#666}
.sdl-card .strip{display:flex;gap:2px;margin-bottom:6px}.sdl-card .strip img{height:64px}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return _e(value)


def _svg_histogram(histogram: list[tuple[float, float, int]]) -> str:
    if not histogram:
        return ""
    top = max(c for _, _, c in histogram) or 1
    width, height, bar = 12 * len(histogram), 28, 12
    rects = "".join(
        f'<rect x="{i * bar}" y="{height - max(1, round(c / top * height))}" width="{bar - 1}" '
        f'height="{max(1, round(c / top * height))}" fill="#5b8def">'
        f"<title>{lo:.4g}–{hi:.4g}: {c}</title></rect>"
        for i, (lo, hi, c) in enumerate(histogram)
    )
    return (
        f'<svg class="hist" width="{width}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg">{rects}</svg>'
    )


def _stats_cell(stats: dict[str, Any]) -> str:
    kind = stats.get("kind", "other")
    parts: list[str] = []
    over = {
        "text": "length ",
        "bytes": "size ",
        "image": "bytes ",
        "audio": "bytes ",
        "video": "bytes ",
        "sequence": "length ",
    }
    if "min" in stats:
        label = over.get(kind, "")
        parts.append(
            f"{label}min {_fmt(stats['min'])} · max {_fmt(stats['max'])} · "
            f"mean {_fmt(stats['mean'])}"
        )
    if kind == "bool":
        parts.append(f"true {stats['true']} of {stats['sampled']}")
    if kind in ("image", "video") and "width" in stats:
        (w0, w1), (h0, h1) = stats["width"], stats["height"]
        parts.append(f"{'/'.join(stats['formats'])}, {w0}–{w1} × {h0}–{h1} px")
    if kind in ("audio", "video") and "seconds" in stats:
        s0, s1 = stats["seconds"]
        rates = stats.get("sample_rates")
        hz = f", {'/'.join(map(str, rates))} Hz" if rates else ""
        channels = stats.get("channels")
        ch = f", {'/'.join(map(str, channels))} ch" if channels else ""
        head = "" if kind == "video" else f"{'/'.join(stats['formats'])}, "
        span = f"{s0:.2f} s" if f"{s0:.2f}" == f"{s1:.2f}" else f"{s0:.2f}–{s1:.2f} s"
        parts.append(f"{head}{span}{hz}{ch}")
    return "<br>".join(_e(p) for p in parts) + _svg_histogram(stats.get("histogram", []))


def _lineage_html(ds: Dataset) -> str:
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
    ds: Dataset, rows: int = SAMPLE_ROWS, thumbs: int = THUMBNAILS, *, page: bool = True
) -> str:
    """The card of ``ds`` as HTML: a whole page (``page=True``) or a fragment for a
    notebook cell. Statistics and thumbnails come from at most ``rows`` samples."""
    indices = sample_indices(ds, rows)
    stats = column_stats(ds, indices)
    plans = {p.name: p for p in ds.plans or []}
    stored = sum(int(b) for b in ds.shards.stored_bytes) if ds.num_shards else 0
    compression = ds.shards[0].compression if ds.num_shards else None
    head = (
        f"<h2>{_e(ds.shown)}</h2><p>{len(ds)} samples · {ds.num_shards} shard(s) · "
        f"{_e(_size_text(stored))} stored"
        + (f" ({_e(compression)})" if compression else "")
        + f' · fingerprint <code title="{_e(ds.fingerprint)}">{_e(ds.fingerprint[:12])}</code>'
        + f' · <span class="muted">statistics from {len(indices)} sampled rows</span></p>'
    )
    schema_rows = []
    for name, st in stats.items():
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
    for name, st in stats.items():
        if st.get("kind") != "image":
            continue
        try:
            pictures = thumbnails(ds, name, indices, thumbs)
        except Exception as exc:  # no image library here: say so, keep the rest
            grids.append(f'<h3>{_e(name)}</h3><p class="muted">no thumbnails: {_e(exc)}</p>')
            continue
        figures = "".join(
            f'<figure><img class="thumb" alt="{_e(name)} sample {i}" '
            f'src="data:image/jpeg;base64,{base64.b64encode(jpeg).decode()}">'
            f"<figcaption>#{i}</figcaption></figure>"
            for i, jpeg in pictures
        )
        grids.append(
            f'<h3>{_e(name)}</h3><div class="grid" data-column="{_e(name)}">{figures}</div>'
        )
    grids += [
        _media_previews(ds, name, st["kind"], indices)
        for name, st in stats.items()
        if st.get("kind") in ("audio", "video")
    ]
    body = f'<div class="sdl-card"><style>{_STYLE}</style>{head}{schema}{_lineage_html(ds)}'
    body += "".join(grids) + "</div>"
    if not page:
        return body
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8">'
        f"<title>{_e(ds.shown)}: spark-dl dataset card</title></head><body>{body}</body></html>"
    )


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


def _repr_html_(self: Dataset) -> str:
    """The card (a fragment) in a notebook cell, from a small sample."""
    return card_html(self, rows=128, thumbs=12, page=False)


def install() -> None:
    """Give :class:`Dataset` (and so mixtures) its notebook view."""
    Dataset._repr_html_ = _repr_html_  # type: ignore[attr-defined]
