"""The dataset card (``spark-dl show``, ``Dataset._repr_html_``) and short binary values."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from spark_dl.cli import main
from spark_dl_core import Source, mix, open_dataset, write_mds
from spark_dl_core.card import card_html, column_stats, describe_value, sample_indices

Image = pytest.importorskip("PIL.Image")

N = 40


def _jpeg(h: int, w: int, channel: int = 0) -> bytes:
    pixels = np.zeros((h, w, 3), np.uint8)
    pixels[..., channel] = 200
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG")
    return out.getvalue()


def _png(h: int, w: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((h, w), 90, np.uint8)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture
def ds_path(tmp_path: Path) -> str:
    path = str(tmp_path / "ds")
    table = pa.table(
        {
            "img": pa.array([_jpeg(100 + i, 300, i % 3) for i in range(N)], pa.binary()),
            "label": np.arange(N) % 4,
            "text": [None if i % 5 == 0 else "w" * i for i in range(N)],
            "tokens": [np.arange(i % 9, dtype=np.int32) for i in range(N)],
            "blob": pa.array([b"\x00\x01" * (i + 1) for i in range(N)], pa.binary()),
        }
    )
    spec = {"columns": {"img": "jpeg"}, "shard_size": "16KiB", "nulls": "mask"}
    write_mds(table, path, spec, source={"table": "s3://lake/events", "version": 7})
    return path


def test_describe_value_says_what_binary_is() -> None:
    raw = _jpeg(300, 400)
    assert describe_value(raw) == f"<jpeg 400x300, {len(raw) / 1024:.1f} KB>"
    assert describe_value(b"x" * 812) == "<bytes, 812 B>"
    assert describe_value(_png(10, 20)).startswith("<png 20x10, ")
    assert describe_value(b"x" * 75_000) == "<bytes, 73 KB>"
    assert describe_value(b"\xff\xd8\xff broken").startswith("<jpeg, ")


def test_statistics_from_a_bounded_sample(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    assert ds.num_shards > 3
    stats = column_stats(ds, np.arange(N))
    assert set(stats) == {"img", "label", "text", "tokens", "blob"}  # no null masks
    assert stats["label"]["kind"] == "number"
    assert (stats["label"]["min"], stats["label"]["max"]) == (0, 3)
    assert stats["label"]["mean"] == pytest.approx(np.mean(np.arange(N) % 4))
    present = [i for i in range(N) if i % 5]
    assert stats["text"]["nulls"] == N - len(present)  # counted, and left out of the lengths
    assert stats["text"]["min"] == min(present) and stats["text"]["max"] == max(present)
    assert sum(c for _, _, c in stats["text"]["histogram"]) == len(present)
    assert stats["tokens"]["kind"] == "sequence" and stats["tokens"]["max"] == 8
    assert stats["img"]["kind"] == "image" and stats["img"]["formats"] == ["jpeg"]
    assert stats["img"]["width"] == (300, 300) and stats["img"]["height"] == (100, 100 + N - 1)
    assert stats["blob"]["kind"] == "bytes" and stats["blob"]["max"] == 2 * N
    # a large dataset is sampled from a few shards, not read whole
    picked = sample_indices(ds, rows=10, shards=3)
    assert len(picked) <= 10
    shards = set(np.searchsorted(ds.shard_offsets, picked, side="right") - 1)
    assert len(shards) <= 3 and 0 in shards and ds.num_shards - 1 in shards


def test_card_is_one_self_contained_page(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    page = card_html(ds, thumbs=6)
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)=["']?(https?:|//)|<link|<script|url\(""", page)
    for name, encoding in (("img", "jpeg"), ("tokens", "ndarray:int32"), ("text", "str")):
        assert f'data-column="{name}"' in page and f"<code>{encoding}</code>" in page
    assert "s3://lake/events@7</code> → " in page  # lineage: table@version -> dataset
    thumbs = re.findall(r'<img class="thumb"[^>]*src="data:image/jpeg;base64,([^"]+)"', page)
    assert len(thumbs) == 6
    for data in thumbs:
        with Image.open(io.BytesIO(base64.b64decode(data))) as image:
            assert max(image.size) <= 96 and image.format == "JPEG"
    fragment = ds._repr_html_()
    assert "<html" not in fragment and fragment.count('class="thumb"') == 12


def test_mixture_card_shows_each_source_and_its_share(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_mds(pa.table({"x": np.arange(30)}), a)
    write_mds(pa.table({"x": np.arange(10)}), b)
    page = card_html(mix([Source(a, choose=30), Source(b, choose=10)]))
    assert "Lineage: mixture" in page and "75.0%" in page and "25.0%" in page


def test_show_and_inspect_commands(
    ds_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "card.html"
    assert main(["show", ds_path, "--html", str(out)]) == 0
    assert out.read_text().count('class="thumb"') == 16
    capsys.readouterr()
    assert main(["show", ds_path, "--rows", "20"]) == 0
    text = capsys.readouterr().out
    assert "statistics from 20 sampled rows" in text
    assert re.search(r"img: jpeg, image, nulls 0; size \d+(\.\d)?–\d+(\.\d)? KB, mean ", text)
    assert main(["inspect", ds_path, "--samples", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["sample_rows"]
    assert re.fullmatch(r"<jpeg 300x101, \d\.\d KB>", rows[1]["img"])
    assert rows[0]["blob"] == "<bytes, 2 B>"
    assert "base64" not in json.dumps(rows)


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


@pytest.mark.slow
def test_card_renders_its_thumbnails_in_a_headless_browser(ds_path: str, tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium on PATH: `make browser-env` installs Debian's package")
    page = card_html(open_dataset(ds_path), thumbs=8)
    # what the browser made of the page, written into the DOM it dumps
    probe = (
        "<script>window.addEventListener('load',()=>{const t=[...document.images]"
        ".filter(i=>i.classList.contains('thumb'));document.body.dataset.thumbs="
        "t.filter(i=>i.complete&&i.naturalWidth>0).length+'/'+t.length;"
        "document.body.dataset.rows=document.querySelectorAll('tr[data-column]').length})"
        "</script>"
    )
    (tmp_path / "card.html").write_text(page.replace("</body>", probe + "</body>"))
    done = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=5000",
            "--dump-dom",
            (tmp_path / "card.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'data-thumbs="8/8"' in done.stdout
    assert 'data-rows="5"' in done.stdout


def _render(browser: str, page: str, probe: str, where: Path) -> str:
    """The DOM a headless Chromium made of ``page`` after ``probe`` (a script) ran."""
    (where / "card.html").write_text(page.replace("</body>", probe + "</body>"))
    done = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=5000",
            "--dump-dom",
            (where / "card.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_histograms_sit_beside_their_labels_and_a_bad_image_is_a_placeholder(
    tmp_path: Path,
) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium on PATH: `make browser-env` installs Debian's package")
    path, _ = _card_with_a_broken_image(tmp_path)
    table = pa.table({"n": np.arange(30) * 517, "text": ["w" * i for i in range(30)]})
    write_mds(table, str(tmp_path / "more"))
    page = card_html(open_dataset(path), thumbs=8) + card_html(open_dataset(str(tmp_path / "more")))
    # each histogram must start right of its own label's text and overlap it vertically
    probe = (
        "<script>window.addEventListener('load',()=>{let ok=0,bad=[];"
        "for(const s of document.querySelectorAll('.stat')){const h=s.querySelector('.hist');"
        "if(!h)continue;const l=s.querySelector('.label').getBoundingClientRect(),"
        "r=h.getBoundingClientRect();if(r.left>=l.right&&r.top<l.bottom&&r.bottom>l.top&&"
        "r.width>0)ok++;else bad.push(s.textContent)}"
        "const m=[...document.querySelectorAll('.missing')].filter(e=>e.offsetWidth>0);"
        "const t=[...document.images].filter(i=>i.classList.contains('thumb'));"
        "document.body.dataset.hist=ok+'/'+bad.length;document.body.dataset.missing=m.length;"
        "document.body.dataset.thumbs=t.filter(i=>i.complete&&i.naturalWidth>0).length})"
        "</script>"
    )
    dom = _render(browser, page, probe, tmp_path)
    assert 'data-hist="3/0"' in dom  # img sizes, n, text lengths: all beside their text
    assert 'data-missing="1"' in dom and 'data-thumbs="7"' in dom


def _wav(seconds: float, rate: int, fmt: str = "WAV") -> bytes:
    soundfile = pytest.importorskip("soundfile")
    t = np.arange(int(seconds * rate)) / rate
    out = io.BytesIO()
    soundfile.write(out, (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate, format=fmt)
    return out.getvalue()


def _mp4(frames: int, colour: int) -> bytes:
    av = pytest.importorskip("av")
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for k in range(frames):
            pixels = np.zeros((48, 64, 3), np.uint8)
            pixels[..., colour] = 40 + 4 * k
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def test_audio_and_video_columns_get_facts_waveforms_and_frame_strips(tmp_path: Path) -> None:
    clips = [
        _wav(1.0 + i / 4, 16_000 if i % 2 else 22_050, "WAV" if i % 2 else "FLAC") for i in range(4)
    ]
    videos = [_mp4(10 + 5 * i, i % 3) for i in range(4)]
    path = str(tmp_path / "media")
    write_mds(pa.table({"audio": pa.array(clips, pa.binary()), "video": videos}), path)

    assert describe_value(clips[1]) == "<wav 16000 Hz 1 ch 1.25 s, 39 KB>"
    assert describe_value(clips[0]).startswith("<flac 22050 Hz 1 ch 1.00 s, ")
    assert describe_value(videos[0]).startswith("<mp4 64x48 0.40 s, ")
    assert describe_value(b"RIFF\x00\x00\x00\x00WAVEjunk") == "<wav, 16 B>"  # damaged: no crash

    stats = column_stats(open_dataset(path))
    assert stats["audio"]["kind"] == "audio"
    assert stats["audio"]["formats"] == ["flac", "wav"]
    assert stats["audio"]["sample_rates"] == [16_000, 22_050]
    assert stats["audio"]["seconds"] == pytest.approx((1.0, 1.75))
    assert stats["video"]["kind"] == "video"
    assert stats["video"]["width"] == (64, 64) and stats["video"]["height"] == (48, 48)

    page = card_html(open_dataset(path))
    audio = re.search(r'data-kind="audio">(.*?)</div>', page)
    assert audio is not None and audio.group(1).count('<svg class="wave"') == 4
    strips = re.findall(r'<div class="strip">(.*?)</div>', page)
    assert len(strips) == 3
    first = re.findall(r'src="data:image/jpeg;base64,([^"]+)"', strips[0])
    assert len(first) == 6
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(first[0]))).convert("RGB"))
    assert pixels.shape[0] == 64 and pixels[..., 0].mean() > pixels[..., 1].mean() + 20  # red
    assert "no preview" not in page


def _aac(seconds: float, rate: int, fmt: str) -> bytes:
    """A sine tone as AAC in an MPEG-4 container: ``ipod`` writes an .m4a (brand M4A),
    ``mp4`` an audio-only .mp4 (brand isom), which only its stream list tells apart."""
    av = pytest.importorskip("av")
    out = io.BytesIO()
    t = np.arange(int(seconds * rate)) / rate
    with av.open(out, mode="w", format=fmt) as container:
        stream = container.add_stream("aac", rate=rate, layout="mono")
        for k in range(0, len(t), 1024):
            tone = (0.5 * np.sin(2 * np.pi * 440 * t[k : k + 1024])).astype(np.float32)
            frame = av.AudioFrame.from_ndarray(tone[None, :], format="fltp", layout="mono")
            frame.sample_rate, frame.pts = rate, k
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def _avi(frames: int, colour: int) -> bytes:
    av = pytest.importorskip("av")
    out = io.BytesIO()
    with av.open(out, mode="w", format="avi") as container:
        stream = container.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for k in range(frames):
            pixels = np.zeros((48, 64, 3), np.uint8)
            pixels[..., colour] = 60 + 4 * k
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def test_m4a_is_audio_and_avi_is_video(tmp_path: Path) -> None:
    m4a = [_aac(1.0 + i / 4, 22_050, "ipod") for i in range(3)]
    plain = _aac(0.5, 16_000, "mp4")  # audio-only .mp4: no video stream, so audio
    assert m4a[0][4:12] == b"ftypM4A " and plain[8:12] != b"M4A "
    avis = [_avi(10 + 5 * i, i % 3) for i in range(4)]
    path = str(tmp_path / "media")
    write_mds(pa.table({"audio": pa.array([*m4a, plain], pa.binary()), "video": avis}), path)

    assert re.fullmatch(r"<m4a 22050 Hz 1 ch 1\.0\d s, \d+(\.\d)? KB>", describe_value(m4a[0]))
    assert describe_value(plain).startswith("<m4a 16000 Hz 1 ch ")
    assert re.fullmatch(r"<avi 64x48 0\.40 s, \d+(\.\d)? KB>", describe_value(avis[0]))

    stats = column_stats(open_dataset(path))
    assert stats["audio"]["kind"] == "audio" and stats["audio"]["formats"] == ["m4a"]
    assert stats["audio"]["sample_rates"] == [16_000, 22_050]
    assert stats["video"]["kind"] == "video" and stats["video"]["formats"] == ["avi"]
    assert stats["video"]["width"] == (64, 64) and stats["video"]["seconds"][0] == 0.4

    page = card_html(open_dataset(path))
    assert "no preview" not in page and "IndexError" not in page
    audio = re.search(r'data-kind="audio">(.*?)</div>', page)
    assert audio is not None and audio.group(1).count('<svg class="wave"') == 4
    polygon = re.search(r'<polygon points="([^"]+)"', audio.group(1))
    assert polygon is not None  # a real envelope: the tone reaches about ±0.5
    ys = [float(p.split(",")[1]) for p in polygon.group(1).split()]
    assert max(ys) - min(ys) > 15
    strips = re.findall(r'<div class="strip">(.*?)</div>', page)
    assert len(strips) == 3 and all(s.count("<img") == 6 for s in strips)


def _broken_jpeg() -> bytes:
    """A real photo-sized JPEG cut off a third of the way through (a failed upload)."""
    pixels = np.random.default_rng(3).integers(0, 255, (240, 320, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG")
    return out.getvalue()[: len(out.getvalue()) // 3]


def _card_with_a_broken_image(tmp_path: Path) -> tuple[str, int]:
    images = [_jpeg(150 + i, 200, i % 3) for i in range(8)]
    images[5] = _broken_jpeg()
    path = str(tmp_path / "photos")
    write_mds(pa.table({"img": pa.array(images, pa.binary())}), path, {"columns": {"img": "jpeg"}})
    return path, 5


def test_one_undecodable_image_gets_a_placeholder_not_an_empty_grid(tmp_path: Path) -> None:
    path, bad = _card_with_a_broken_image(tmp_path)
    page = card_html(open_dataset(path), thumbs=8)
    assert "no thumbnails" not in page
    assert page.count('class="thumb"') == 7
    missing = re.findall(r'<div class="missing" data-row="(\d+)" title="([^"]*)"', page)
    assert [int(r) for r, _ in missing] == [bad] and "truncated" in missing[0][1]


def test_numbers_read_as_people_write_them(tmp_path: Path) -> None:
    from spark_dl_core.card import human_number, human_range

    assert [human_number(v) for v in (0, 3, 1.619, 7363.2, 15000.0, 0.0012, 2.5e15)] == [
        "0",
        "3",
        "1.62",
        "7,363",
        "15,000",
        "0.0012",
        "2.5×10¹⁵",
    ]
    assert human_range(9348, 15000, size=True) == "9.1–15 KB"
    assert human_range(800, 1_300_000, size=True) == "800 B–1.2 MB"
    blobs = [bytes(9348 + (15000 - 9348) * i // 9) for i in range(10)]
    path = str(tmp_path / "sizes")
    write_mds(
        pa.table({"blob": pa.array(blobs, pa.binary()), "x": np.linspace(0, 1.5e4, 10)}), path
    )
    page = card_html(open_dataset(path))
    assert "size 9.1–15 KB, mean 12 KB" in page and "0–15,000, mean 7,500" in page
    labels = re.findall(r'<span class="label">([^<]*)</span>', page)
    assert len(labels) == 2 and not any(re.search(r"\d[eE][+-]?\d", t) for t in labels)


def test_a_null_image_is_shown_as_null_not_as_undecodable(tmp_path: Path) -> None:
    """A nullable image column written with nulls='mask' stores a null as empty bytes: the
    card says null there, and draws the images present."""
    images: list[bytes | None] = [_jpeg(150 + i, 200, i % 3) for i in range(6)]
    images[2] = None
    path = str(tmp_path / "photos")
    table = pa.table({"img": pa.array(images, pa.binary())})
    write_mds(table, path, {"columns": {"img": "jpeg"}, "nulls": "mask"})
    page = card_html(open_dataset(path), thumbs=6)
    assert page.count('class="thumb"') == 5
    missing = re.findall(r'<div class="missing" data-row="(\d+)" title="([^"]*)">([^<]*)<', page)
    assert missing == [("2", "null", "null")]


def test_a_masked_null_image_is_written_and_named_when_decoded(tmp_path: Path) -> None:
    """nulls='mask' on a jpeg column: the null is stored empty (no signature to check), read
    back as null by Arrow; decoding it fails naming the row and saying it is empty. An
    empty value that is not a masked null is still refused when written."""
    from spark_dl_core.errors import EncodingError
    from spark_dl_core.media.images import ImageError

    images: list[bytes | None] = [_jpeg(40 + i, 30, 0) for i in range(4)]
    images[1] = None
    path = str(tmp_path / "photos")
    write_mds(
        pa.table({"img": pa.array(images, pa.binary())}),
        path,
        {"columns": {"img": "jpeg"}, "nulls": "mask"},
    )
    ds = open_dataset(path)
    assert ds.to_arrow().column("img").to_pylist() == images
    decode = [{"op": "image_decode", "column": "img"}]
    with pytest.raises(ImageError, match=r"sample 1 .*the value is empty"):
        list(ds.iter_batches(batch_size=4, transforms=decode))
    images[1] = b""
    with pytest.raises(EncodingError, match="0 byte"):
        write_mds(
            pa.table({"img": pa.array(images, pa.binary())}),
            str(tmp_path / "e"),
            {"columns": {"img": "jpeg"}, "nulls": "mask"},
        )
