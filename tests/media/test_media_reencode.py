"""Write-time re-encoding of audio and video columns: reencode_audio, reencode_video."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from media_helpers import _encode, _tone, _video

from spark_dl_core import SpecError, open_dataset, write_mds

sf = pytest.importorskip("soundfile")
av = pytest.importorskip("av")


# ------------------------------------------------------------------ write side: reencode_audio


def _clips_to_reencode() -> list[bytes]:
    return [
        _encode(_tone(44_100, 1.5, 2), 44_100, "WAV", None),  # stereo WAV at 44.1 kHz
        _encode(_tone(16_000, 0.7, 1), 16_000, "FLAC", None),  # already 16 kHz mono FLAC
        _encode(_tone(22_050, 1.2, 2), 22_050, "OGG", "VORBIS"),
        _encode(_tone(48_000, 0.9, 1), 48_000, "FLAC", None),
    ]


REENCODE = {"op": "reencode_audio", "column": "audio", "sample_rate": 16_000, "mono": True}


def test_reencode_audio_at_write_time(tmp_path: Path) -> None:
    from spark_dl_core import DatasetSpec

    clips = _clips_to_reencode()
    table = pa.table({"id": np.arange(4), "audio": clips})
    write_mds(table, str(tmp_path / "flac"), DatasetSpec(transforms=[REENCODE]))
    (batch,) = list(open_dataset(tmp_path / "flac").iter_batches(batch_size=4))
    assert batch["audio"][1] == clips[1]  # already as asked: its bytes are kept
    for i, raw in enumerate(batch["audio"]):
        info = sf.info(io.BytesIO(raw))
        assert (info.format, info.samplerate, info.channels) == ("FLAC", 16_000, 1)
        assert abs(info.frames - round(16_000 * [1.5, 0.7, 1.2, 0.9][i])) <= 1
        data, _ = sf.read(io.BytesIO(raw), dtype="float32")
        spectrum = np.abs(np.fft.rfft(data[: 16_000 // 2]))  # 0.5 s: bins of 2 Hz
        assert abs(2 * int(np.argmax(spectrum)) - 440) <= 2, i
    for fmt, name in (("wav", "WAV"), ("ogg", "OGG")):
        op = {"op": "reencode_audio", "column": "audio", "format": fmt}
        write_mds(table, str(tmp_path / fmt), DatasetSpec(transforms=[op]))
        stored = next(iter(open_dataset(tmp_path / fmt).iter_batches(batch_size=4)))["audio"]
        infos = [sf.info(io.BytesIO(raw)) for raw in stored]
        assert [i.format for i in infos] == [name] * 4
        assert [i.samplerate for i in infos] == [44_100, 16_000, 22_050, 48_000]  # rates kept
        assert [i.channels for i in infos] == [2, 1, 2, 1]


def test_reencode_audio_refuses_bad_bytes_and_columns(tmp_path: Path) -> None:
    from spark_dl_core.errors import ReencodeError

    clips = _clips_to_reencode()
    clips[2] = b"RIFF\x00\x00not a clip"
    table = pa.table({"id": np.arange(4), "audio": clips})
    with pytest.raises(ReencodeError, match=r"column 'audio'.*does not decode.*row 2 of the data"):
        write_mds(table, str(tmp_path / "bad"), {"transforms": [REENCODE]})
    with pytest.raises(SpecError, match="reencode_audio on column 'id': needs audio bytes"):
        write_mds(table, str(tmp_path / "ids"), {"transforms": [{**REENCODE, "column": "id"}]})
    with pytest.raises(SpecError, match=r"reencode_audio\.format"):
        write_mds(table, str(tmp_path / "mp3"), {"transforms": [{**REENCODE, "format": "mp3"}]})


def test_reencode_audio_of_an_empty_clip(tmp_path: Path) -> None:
    """A valid empty WAV: WAV and OGG store a clip that reads back as 0 samples; FLAC cannot
    (libsndfile wrote 0 bytes that failed only when read) and refuses it at write time."""
    from spark_dl_core.errors import ReencodeError

    empty = _encode(np.zeros((0, 2), np.float32), 44_100, "WAV", None)
    clips = [_encode(_tone(44_100, 0.5, 2), 44_100, "WAV", None), empty]
    table = pa.table({"id": np.arange(2), "audio": clips})
    with pytest.raises(ReencodeError, match=r"column 'audio'.*no samples.*FLAC.*row 1 of"):
        write_mds(table, str(tmp_path / "flac"), {"transforms": [REENCODE]})
    decode = [{"op": "audio_decode", "column": "audio", "sample_rate": 16_000, "mono": True}]
    for fmt in ("wav", "ogg"):
        path = str(tmp_path / fmt)
        write_mds(table, path, {"transforms": [{**REENCODE, "format": fmt}]})
        (stored,) = list(open_dataset(path).iter_batches(batch_size=2))
        data, rate = sf.read(io.BytesIO(stored["audio"][1]), dtype="float32")
        assert (len(data), rate) == (0, 16_000)
        (batch,) = list(open_dataset(path).iter_batches(batch_size=2, transforms=decode))
        assert [len(a) for a in batch["audio"]] == [8_000, 0]


def test_spark_write_reencodes_audio_in_the_executors(classic_spark: Any, tmp_path: Path) -> None:
    import json

    import spark_dl

    spark_dl.register(classic_spark)
    clips = _clips_to_reencode()
    df = classic_spark.createDataFrame(list(enumerate(clips)), "id long, audio binary")
    spec = json.dumps({"transforms": [{**REENCODE, "format": "ogg"}]})
    path = str(tmp_path / "spark")
    df.coalesce(2).write.format("mds").option("spec", spec).save(path)
    ds = open_dataset(path)
    for batch in ds.iter_batches(batch_size=4):
        for raw in batch["audio"]:
            info = sf.info(io.BytesIO(raw))
            assert (info.format, info.samplerate, info.channels) == ("OGG", 16_000, 1)
    bad = classic_spark.createDataFrame([(0, clips[0]), (1, b"garbage")], "id long, audio binary")
    with pytest.raises(Exception, match=r"ReencodeError: column 'audio'.*row 1 of partition 0"):
        bad.coalesce(1).write.format("mds").option("spec", spec).save(str(tmp_path / "bad"))
    assert not (tmp_path / "bad" / "index.json").exists()


# ------------------------------------------------------------------ write side: reencode_video

REENCODE_VIDEO = {"op": "reencode_video", "column": "video", "size": 32, "gop": 4}


def _mpeg4_mkv(frames: int) -> bytes:
    """An MPEG-4 part 2 clip in Matroska (another codec and container), 12 fps, 40 x 40."""
    out = io.BytesIO()
    with av.open(out, mode="w", format="matroska") as container:
        stream = container.add_stream("mpeg4", rate=12)
        stream.width, stream.height, stream.pix_fmt = 40, 40, "yuv420p"
        for k in range(frames):
            pixels = np.full((40, 40, 3), 8 * k, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def _stream_facts(raw: bytes) -> tuple[str, int, int, list[str], list[int]]:
    """(codec, height, width, picture types, gray level of each frame) of a stored clip."""
    with av.open(io.BytesIO(raw)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
        context = stream.codec_context
        kinds = [("I" if f.key_frame else "") + "?IPB"[int(f.pict_type)] for f in frames]
        levels = [int(f.to_ndarray(format="rgb24").mean().round()) for f in frames]
        return context.name, context.height, context.width, kinds, levels


def test_reencode_video_at_write_time(tmp_path: Path) -> None:
    from spark_dl_core import DatasetSpec

    clips = [_video(30, 80, 48), None, _video(13, 48, 64), _mpeg4_mkv(20)]
    table = pa.table({"id": np.arange(4), "video": pa.array(clips, pa.binary())})
    write_mds(table, str(tmp_path / "v"), DatasetSpec(transforms=[REENCODE_VIDEO], nulls="mask"))
    ds = open_dataset(tmp_path / "v")
    (batch,) = ds.iter_batches(batch_size=4)
    stored = batch["video"]
    assert list(batch["video__isnull"]) == [0, 1, 0, 0]  # a null stays null
    sizes = {0: (32, 54), 2: (42, 32), 3: (32, 32)}  # shorter side 32, the other even
    counts = {0: 30, 2: 13, 3: 20}
    for i, (h, w) in sizes.items():
        codec, height, width, kinds, levels = _stream_facts(stored[i])
        assert (codec, height, width) == ("h264", h, w)
        assert len(kinds) == counts[i]
        # a keyframe every 4 frames (IDR: video_decode can start there), no B-frames
        keys = [k for k, kind in enumerate(kinds) if kind == "II"]
        assert all(kind in ("II", "P") for kind in kinds), kinds
        assert keys[0] == 0 and np.diff([*keys, len(kinds)]).max() <= 4, kinds
        if i == 0:  # no scene cuts: a keyframe exactly every 4 frames
            assert keys == list(range(0, 30, 4))
        source = _stream_facts(clips[i])[4]  # type: ignore[arg-type]
        assert np.abs(np.array(levels) - source).max() <= 3, (i, levels, source)
    # read back as clips of the stored size: 8 frames at stride 2 from the middle (seeked
    # to a keyframe), the frames decoding the whole stored clip gives
    ops = [
        {"op": "video_decode", "column": "video", "num_frames": 8, "stride": 2, "start": "center"}
    ]
    for i in sizes:
        write_mds(pa.table({"video": [stored[i]]}), str(tmp_path / f"r{i}"))
        (batch,) = open_dataset(tmp_path / f"r{i}").iter_batches(batch_size=1, transforms=ops)
        frames = batch["video"]
        assert frames.shape == (1, 8, *sizes[i], 3) and frames.dtype == np.uint8
        with av.open(io.BytesIO(stored[i])) as container:
            every = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        first = max(0, counts[i] - 15) // 2
        picked = [min(first + 2 * k, counts[i] - 1) for k in range(8)]
        assert np.array_equal(frames[0], np.stack([every[k] for k in picked])), i
    # the same input gives the same bytes, in another process too
    again = write_mds(
        table, str(tmp_path / "again"), DatasetSpec(transforms=[REENCODE_VIDEO], nulls="mask")
    )
    assert again.fingerprint == open_dataset(tmp_path / "v").fingerprint
    (repeat,) = [b["video"] for b in open_dataset(tmp_path / "again").iter_batches(batch_size=4)]
    assert list(repeat) == list(stored)
    import hashlib
    import subprocess
    import sys

    (tmp_path / "clip0").write_bytes(clips[0])  # type: ignore[arg-type]
    script = (
        "import hashlib, sys, pyarrow as pa\n"
        "from spark_dl_core.ops.transforms import parse_transforms\n"
        "from spark_dl_core.media.video_codec import reencode_video\n"
        f"op = parse_transforms([{REENCODE_VIDEO!r}])[0]\n"
        "raw = open(sys.argv[1], 'rb').read()\n"
        "print(hashlib.sha256(reencode_video(op, pa.array([raw])).to_pylist()[0]).hexdigest())\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "clip0")],
        check=True,
        capture_output=True,
        text=True,
    )
    assert run.stdout.strip() == hashlib.sha256(stored[0]).hexdigest()


def test_reencode_video_frame_rate_and_length() -> None:
    from spark_dl_core.media.video_codec import reencode_video
    from spark_dl_core.ops.transforms import parse_transforms

    clip = _video(30)  # 10 fps, frame k at gray level 8 k
    for fps, max_frames, want in ((5, None, list(range(0, 30, 2))), (5, 6, [0, 2, 4, 6, 8, 10])):
        op = {"op": "reencode_video", "column": "v", "fps": fps, "max_frames": max_frames}
        (raw,) = reencode_video(parse_transforms([op])[0], pa.array([clip])).to_pylist()
        with av.open(io.BytesIO(raw)) as container:
            assert container.streams.video[0].average_rate == fps
        _, height, width, _, levels = _stream_facts(raw)
        assert (height, width) == (48, 64)  # no size: frames as they are
        assert len(levels) == len(want)
        assert all(abs(level - 8 * k) <= 3 for k, level in zip(want, levels)), levels
    op = {"op": "reencode_video", "column": "v", "fps": 25, "size": [20, 30]}  # 2.5 x each
    (raw,) = reencode_video(parse_transforms([op])[0], pa.array([clip])).to_pylist()
    _, height, width, _, levels = _stream_facts(raw)
    assert (height, width, len(levels)) == (20, 30, 75)
    assert all(abs(level - 8 * (n * 10 // 25)) <= 3 for n, level in enumerate(levels)), levels


def test_reencode_video_refuses_bad_bytes_and_columns(tmp_path: Path) -> None:
    from spark_dl_core.errors import ReencodeError

    clips = [_video(10), _video(12), _video(8)[:300], _video(9)]
    table = pa.table({"id": np.arange(4), "video": clips})
    with pytest.raises(ReencodeError, match=r"column 'video'.*does not decode.*row 2 of the data"):
        write_mds(table, str(tmp_path / "bad"), {"transforms": [REENCODE_VIDEO]})
    audio_only = pa.table({"video": [_encode(_tone(16_000, 0.3, 1), 16_000, "WAV", None)]})
    with pytest.raises(ReencodeError, match=r"no video stream.*row 0 of the data"):
        write_mds(audio_only, str(tmp_path / "wav"), {"transforms": [REENCODE_VIDEO]})
    with pytest.raises(SpecError, match="reencode_video on column 'id': needs video bytes"):
        write_mds(
            table, str(tmp_path / "ids"), {"transforms": [{**REENCODE_VIDEO, "column": "id"}]}
        )
    for bad in ({"size": 33}, {"size": [32, 0]}, {"gop": 0}, {"crf": 60}, {"fps": 0}):
        with pytest.raises(SpecError, match=r"reencode_video\."):
            write_mds(table, str(tmp_path / "x"), {"transforms": [{**REENCODE_VIDEO, **bad}]})
    assert not (tmp_path / "bad" / "index.json").exists()


def test_spark_write_reencodes_video_in_the_executors(classic_spark: Any, tmp_path: Path) -> None:
    import json

    import spark_dl

    spark_dl.register(classic_spark)
    df = classic_spark.createDataFrame([(0, _video(12)), (1, _video(9))], "id long, video binary")
    spec = json.dumps({"transforms": [REENCODE_VIDEO]})
    df.coalesce(2).write.format("mds").option("spec", spec).save(str(tmp_path / "spark"))
    stored = [
        raw
        for b in open_dataset(tmp_path / "spark").iter_batches(batch_size=2)
        for raw in b["video"]
    ]
    assert sorted((*_stream_facts(raw)[:3], len(_stream_facts(raw)[3])) for raw in stored) == [
        ("h264", 32, 42, 9),
        ("h264", 32, 42, 12),
    ]
    bad = classic_spark.createDataFrame([(0, _video(5)), (1, b"garbage")], "id long, video binary")
    with pytest.raises(Exception, match=r"ReencodeError: column 'video'.*row 1 of partition 0"):
        bad.coalesce(1).write.format("mds").option("spec", spec).save(str(tmp_path / "bad"))
    assert not (tmp_path / "bad" / "index.json").exists()
