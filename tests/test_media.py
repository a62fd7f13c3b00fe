"""Audio and video columns: read-time decode ops, seeded windows, batch forms, bad input."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import SpecError, open_dataset, write_mds

sf = pytest.importorskip("soundfile")
av = pytest.importorskip("av")

RATES = [16_000, 44_100, 48_000, 22_050]
FORMATS = [("WAV", None), ("FLAC", None), ("OGG", "VORBIS"), ("MP3", "MPEG_LAYER_III")]


def _tone(rate: int, seconds: float, channels: int, freq: float = 440.0) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    mono = 0.5 * np.sin(2 * np.pi * freq * t)
    return np.stack([mono] * channels, axis=1).astype(np.float32)


def _encode(signal: np.ndarray, rate: int, fmt: str, subtype: str | None) -> bytes:
    out = io.BytesIO()
    sf.write(out, signal, rate, format=fmt, subtype=subtype)
    return out.getvalue()


@pytest.fixture(scope="module")
def audio(tmp_path_factory: pytest.TempPathFactory) -> str:
    """24 clips: 4 formats x rates 16-48 kHz, mono and stereo, 0.5 to 2.8 s."""
    clips, seconds = [], []
    for i in range(24):
        fmt, subtype = FORMATS[i % 4]
        rate, length = RATES[(i // 4) % 4], 0.5 + 0.1 * i
        clips.append(_encode(_tone(rate, length, 1 + i % 2), rate, fmt, subtype))
        seconds.append(length)
    table = pa.table({"id": np.arange(24), "audio": clips, "seconds": seconds})
    path = str(tmp_path_factory.mktemp("audio") / "ds")
    write_mds(table, path)
    return path


OPS = [
    {"op": "audio_decode", "column": "audio", "sample_rate": 16_000, "mono": True},
    {"op": "audio_crop", "column": "audio", "seconds": 1.0, "start": "random"},
]


def _by_id(batches: list[dict[str, np.ndarray]]) -> dict[int, np.ndarray]:
    return {int(i): a for b in batches for i, a in zip(b["id"], b["audio"])}


def test_cropped_audio_is_one_float_tensor_reproducible_per_sample(audio: str) -> None:
    torch = pytest.importorskip("torch")
    ds = open_dataset(audio)
    batches = list(ds.to_torch(batch_size=8, shuffle=True, seed=3, transforms=OPS))
    first = batches[0]["audio"]
    assert first.dtype == torch.float32 and tuple(first.shape) == (8, 1, 16_000)
    assert float(first.abs().max()) <= 1.0
    again = _by_id([{k: v.numpy() for k, v in b.items()} for b in batches])
    ranks = {}
    for r in range(2):  # another world size: the same window for the same sample
        ranks.update(
            _by_id(
                list(
                    ds.iter_batches(
                        batch_size=8,
                        shuffle=True,
                        seed=3,
                        rank=r,
                        world_size=2,
                        transforms=OPS,
                        even_batches=False,
                    )
                )
            )
        )
    assert sorted(ranks) == sorted(again)
    assert all(np.array_equal(ranks[i], again[i]) for i in again)
    other = _by_id(
        list(ds.iter_batches(batch_size=8, shuffle=True, seed=3, epoch=1, transforms=OPS))
    )
    long_clips = [i for i in range(24) if 0.5 + 0.1 * i > 1.2]
    assert any(not np.array_equal(other[i], again[i]) for i in long_clips)  # new windows


def test_decoded_values_resampling_and_padding(audio: str) -> None:
    ds = open_dataset(audio)
    ops = [
        {"op": "audio_decode", "column": "audio", "sample_rate": 16_000, "mono": True},
        {"op": "audio_crop", "column": "audio", "seconds": 1.0, "start": "begin"},
    ]
    got = _by_id(list(ds.iter_batches(batch_size=24, transforms=ops)))
    # clip 0: 16 kHz WAV mono, 0.5 s: the samples themselves, then zeros to 1 s
    want = _tone(16_000, 0.5, 1)[:, 0]
    assert np.allclose(got[0][0, :8000], want, atol=1e-4)
    assert not got[0][0, 8000:].any()
    # clip 17 (44.1 kHz FLAC stereo, 2.2 s) resampled to 16 kHz: still a 440 Hz tone
    spectrum = np.abs(np.fft.rfft(got[17][0]))
    assert abs(int(np.argmax(spectrum)) - 440) <= 1  # 1 s window: bins are 1 Hz
    # every format decodes to about the same tone (lossy ones within their error)
    for i in range(4):
        peak = int(np.argmax(np.abs(np.fft.rfft(got[i + 8][0]))))
        assert abs(peak - 440) <= 2, (FORMATS[i], peak)


def test_uncropped_mono_clips_are_ragged(audio: str) -> None:
    torch = pytest.importorskip("torch")
    ds = open_dataset(audio)
    ops = [{"op": "audio_decode", "column": "audio", "sample_rate": 8_000, "mono": True}]
    batch = next(iter(ds.to_torch(batch_size=6, transforms=ops)))
    assert batch["audio"].is_nested
    lengths = [row.numel() for row in batch["audio"].unbind()]
    assert lengths == [round(8_000 * (0.5 + 0.1 * i)) for i in range(6)]
    assert torch is not None


def test_tf_gets_the_same_cropped_audio(audio: str) -> None:
    pytest.importorskip("tensorflow")
    ds = open_dataset(audio)
    tf_batches = list(ds.to_tf(batch_size=8, shuffle=True, seed=3, transforms=OPS))
    numpy_batches = list(ds.iter_batches(batch_size=8, shuffle=True, seed=3, transforms=OPS))
    assert tuple(tf_batches[0]["audio"].shape) == (8, 1, 16_000)
    for a, b in zip(tf_batches, numpy_batches):
        assert np.array_equal(a["audio"].numpy(), b["audio"])


def _video(frames: int, width: int = 64, height: int = 48) -> bytes:
    """An H.264 clip whose frame k is a flat gray of level 8 k (to tell frames apart)."""
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


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> str:
    clips = [_video(n, 64 + 16 * (n % 2), 48) for n in (20, 25, 5, 30)]
    path = str(tmp_path_factory.mktemp("video") / "ds")
    write_mds(pa.table({"id": np.arange(4), "video": clips}), path)
    return path


def test_video_frames_at_a_stride_resized_per_frame(video: str) -> None:
    torch = pytest.importorskip("torch")
    ds = open_dataset(video)
    ops = [
        {"op": "video_decode", "column": "video", "num_frames": 4, "stride": 2, "start": "begin"},
        {"op": "resize", "column": "video", "size": [32, 40]},
    ]
    batch = next(iter(ds.to_torch(batch_size=4, transforms=ops)))
    clips = batch["video"]
    assert clips.dtype == torch.uint8 and tuple(clips.shape) == (4, 4, 32, 40, 3)
    levels = clips.float().mean(dim=(2, 3, 4))
    assert torch.allclose(levels[0], torch.tensor([0.0, 16, 32, 48]), atol=3)
    # a 5-frame clip repeats its last frame for the picks beyond it (0, 2, 4, 4)
    assert torch.allclose(levels[2], torch.tensor([0.0, 16, 32, 32]), atol=3)


def test_random_video_windows_are_seeded(video: str) -> None:
    ds = open_dataset(video)
    ops = [
        {"op": "video_decode", "column": "video", "num_frames": 3, "stride": 1},
        {"op": "resize", "column": "video", "size": 24},
        {"op": "center_crop", "column": "video", "size": 24},
    ]
    a = _by_id_video(ds, ops, epoch=0)
    assert a[0].shape == (3, 24, 24, 3)
    assert all(np.array_equal(a[i], b) for i, b in _by_id_video(ds, ops, epoch=0).items())
    later = [_by_id_video(ds, ops, epoch=e) for e in (1, 2, 3)]
    assert any(not np.array_equal(a[3], other[3]) for other in later)


def _by_id_video(ds: object, ops: list[dict[str, object]], epoch: int) -> dict[int, np.ndarray]:
    out = {}
    for b in ds.iter_batches(batch_size=2, seed=1, epoch=epoch, transforms=ops):  # type: ignore[attr-defined]
        out.update({int(i): v for i, v in zip(b["id"], b["video"])})
    return out


def test_bad_media_ops_and_bytes_are_refused_naming_column(
    audio: str, video: str, tmp_path: Path
) -> None:
    ds = open_dataset(audio)
    crop = {"op": "audio_crop", "column": "audio", "seconds": 1.0}
    with pytest.raises(SpecError, match="audio_crop on column 'audio' needs one audio_decode"):
        ds.to_torch(batch_size=4, transforms=[crop])
    with pytest.raises(SpecError, match=r"audio_decode on column 'seconds'.*not encoded bytes"):
        ds.to_torch(batch_size=4, transforms=[{"op": "audio_decode", "column": "seconds"}])
    with pytest.raises(SpecError, match="seconds"):
        ds.to_torch(batch_size=4, transforms=[{**OPS[0]}, {**crop, "seconds": 0}])
    flip = {"op": "horizontal_flip", "column": "video"}
    with pytest.raises(SpecError, match="video column 'video': frames take resize"):
        open_dataset(video).to_torch(
            batch_size=2, transforms=[{"op": "video_decode", "column": "video"}, flip]
        )
    from spark_dl_core.media import MediaError

    broken = str(tmp_path / "broken")
    write_mds(pa.table({"id": [0, 1], "audio": [b"RIFF-not-really", b"\x00" * 10]}), broken)
    with pytest.raises(MediaError, match=r"column 'audio', shard .*shard\.00000\.mds.*sample 0"):
        list(open_dataset(broken).iter_batches(batch_size=2, transforms=OPS))
