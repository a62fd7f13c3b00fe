"""Audio and video columns: read-time decode ops, seeded windows, batch forms, bad input."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def _torch_clips(batch: Any) -> list[np.ndarray]:
    """A torch batch's clips as ``[C, T]`` arrays: a dense ``[B, C, T]`` tensor, a jagged
    ``[B, T*]`` one of mono clips, or an object array of clips of several lengths."""
    audio = batch["audio"]
    if not hasattr(audio, "unbind"):
        return list(audio)
    return [row.numpy().reshape(-1, row.shape[-1]) for row in audio.unbind()]


def _tf_clips(batch: Any) -> list[np.ndarray]:
    audio = batch["audio"]
    return [audio[i].to_tensor().numpy() for i in range(int(audio.nrows()))]


@pytest.mark.parametrize(
    "crop", [None, {"seconds": 1.0, "pad": False}], ids=["whole", "unpadded_crop"]
)
def test_tf_gets_mono_clips_of_different_lengths_ragged_as_torch(
    audio: str, crop: dict[str, Any] | None
) -> None:
    """WAV, FLAC and VBR OGG / MP3 clips of 0.5 to 2.8 s: torch's batches are jagged
    ``[B, T*]`` where lengths differ; tf's (one signature) a RaggedTensor ``[B, 1, T*]``
    of the same values in every batch."""
    tf = pytest.importorskip("tensorflow")
    pytest.importorskip("torch")
    ops: list[dict[str, Any]] = [
        {"op": "audio_decode", "column": "audio", "sample_rate": 8_000, "mono": True}
    ]
    if crop is not None:
        ops.append({"op": "audio_crop", "column": "audio", "start": "begin", **crop})
    ds = open_dataset(audio)
    settings: dict[str, Any] = {"batch_size": 6, "shuffle": True, "seed": 1, "transforms": ops}
    torch_batches = list(ds.to_torch(**settings))
    tfds = ds.to_tf(**settings)
    assert isinstance(tfds.element_spec["audio"], tf.RaggedTensorSpec)
    tf_batches = list(tfds)
    assert any(b["audio"].is_nested for b in torch_batches)  # lengths differ in a batch
    lengths = set()
    for t, f in zip(torch_batches, tf_batches, strict=True):
        assert f["id"].numpy().tolist() == t["id"].numpy().tolist()
        for want, got in zip(_torch_clips(t), _tf_clips(f), strict=True):
            assert got.shape == want.shape and got.shape[0] == 1
            np.testing.assert_array_equal(got, want)
            lengths.add(got.shape[1])
    assert len(lengths) > 3


def test_tf_gets_stereo_clips_of_other_rates_and_lengths_ragged(tmp_path: Path) -> None:
    """Stereo clips of their own rates, cropped with padding but not resampled: each window
    has its rate's samples, so no one length (and a batch of several is an object array in
    torch); tf gives ``[B, 2, T*]`` with the same values."""
    tf = pytest.importorskip("tensorflow")
    pytest.importorskip("torch")
    rates = [16_000, 22_050, 44_100, 48_000]
    clips = [
        _encode(_tone(rate, 0.3 + 0.1 * i, 2), rate, *FORMATS[i % 2])
        for i, rate in enumerate(rates)
    ]
    write_mds(pa.table({"id": np.arange(4), "audio": clips}), str(tmp_path / "ds"))
    ds = open_dataset(tmp_path / "ds")
    ops = [
        {"op": "audio_decode", "column": "audio"},
        {"op": "audio_crop", "column": "audio", "seconds": 0.5, "start": "center"},
    ]
    torch_batches = list(ds.to_torch(batch_size=2, transforms=ops))
    tf_batches = list(ds.to_tf(batch_size=2, transforms=ops))
    got = [clip for b in tf_batches for clip in _tf_clips(b)]
    want = [clip for b in torch_batches for clip in _torch_clips(b)]
    assert [c.shape for c in got] == [(2, rate // 2) for rate in rates]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert tf is not None


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


def test_a_batchs_clips_decode_on_two_threads_as_one_by_one(tmp_path: Path) -> None:
    """A batch's clips are decoded on the process's two decoding threads (a forked child
    makes its own), in order: the same frames as clips decoded one at a time, and a batch
    with bad clips names the first of them."""
    import multiprocessing
    import threading

    from spark_dl_core.media.clips import MediaError, VideoPipeline
    from spark_dl_core.ops.pipelines import compile_read_ops
    from spark_dl_core.ops.transforms import parse_transforms

    ops = [
        {"op": "video_decode", "column": "v", "num_frames": 3, "stride": 3, "start": "random"},
        {"op": "random_resized_crop", "column": "v", "size": [24, 24]},
    ]
    pipeline = compile_read_ops(parse_transforms(ops), {"v": "bytes"})[0]["v"]
    assert isinstance(pipeline, VideoPipeline)
    raws = [_video(n, 64 + 16 * (n % 2), 48) for n in (12, 25, 9, 30, 17)]
    index = np.arange(10, 15)
    batch = pipeline.run(raws, b"t" * 16, index, lambda i, m: m)
    names = {t.name for t in threading.enumerate()}
    if (os.cpu_count() or 1) > 1:
        assert {"spark-dl-video_0", "spark-dl-video_1"} <= names
    for i, raw in enumerate(raws):
        alone = pipeline.run([raw], b"t" * 16, index[i : i + 1], lambda i, m: m)
        assert np.array_equal(batch[i], alone[0]), i
    bad = [raws[0], raws[1], b"not a clip", raws[2], b"nor this"]
    with pytest.raises(MediaError, match=r"^sample 2: video_decode"):
        pipeline.run(bad, b"t" * 16, index, lambda i, m: f"sample {i}: {m}")
    # a child forked after the threads started decodes on threads of its own
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        child = pool.apply_async(pipeline.run, (raws, b"t" * 16, index, _where_plain))
        assert np.array_equal(child.get(timeout=60), batch)


def _where_plain(i: int, message: str) -> str:
    return message


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
    with pytest.raises(SpecError, match="audio_crop on column 'audio' needs an audio_decode of it"):
        ds.to_torch(batch_size=4, transforms=[crop])
    with pytest.raises(SpecError, match=r"audio_decode on column 'seconds'.*not encoded bytes"):
        ds.to_torch(batch_size=4, transforms=[{"op": "audio_decode", "column": "seconds"}])
    with pytest.raises(SpecError, match="seconds"):
        ds.to_torch(batch_size=4, transforms=[{**OPS[0]}, {**crop, "seconds": 0}])
    cast = {"op": "cast", "column": "video", "to": "float32"}
    with pytest.raises(
        SpecError, match="cast on video column 'video': video columns take normalize"
    ):
        open_dataset(video).to_torch(
            batch_size=2, transforms=[{"op": "video_decode", "column": "video"}, cast]
        )
    from spark_dl_core.media.clips import MediaError

    broken = str(tmp_path / "broken")
    write_mds(pa.table({"id": [0, 1], "audio": [b"RIFF-not-really", b"\x00" * 10]}), broken)
    with pytest.raises(MediaError, match=r"column 'audio', shard .*shard\.00000\.mds.*sample 0"):
        list(open_dataset(broken).iter_batches(batch_size=2, transforms=OPS))


# ------------------------------------------------------------------ image ops on video frames


def _gradient_video(frames: int, width: int, height: int) -> bytes:
    """A still H.264 clip of a gradient (red grows to the right, green downwards): where a
    crop came from and which way it faces show in its pixels; every frame is the same."""
    x = np.linspace(0, 255, width)[None, :]
    y = np.linspace(0, 255, height)[:, None]
    planes = [np.broadcast_to(x, (height, width)), np.broadcast_to(y, (height, width))]
    pixels = np.stack([*planes, np.full((height, width), 96.0)], axis=2).astype(np.uint8)
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for _ in range(frames):
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


@pytest.fixture(scope="module")
def stills(tmp_path_factory: pytest.TempPathFactory) -> str:
    """10 still clips, landscape and portrait, 12 to 21 frames."""
    clips = [_gradient_video(12 + i, *((96, 64) if i % 2 else (64, 80))) for i in range(10)]
    path = str(tmp_path_factory.mktemp("stills") / "ds")
    write_mds(pa.table({"id": np.arange(10), "video": clips}), path, {"shard_size": 6_000})
    return path


FRAME_OPS = [
    {"op": "video_decode", "column": "video", "num_frames": 4, "stride": 2},
    {"op": "random_resized_crop", "column": "video", "size": [24, 32], "scale": [0.2, 0.6]},
    {"op": "horizontal_flip", "column": "video"},
]


def _clips(batches: Any) -> dict[int, np.ndarray]:
    return {int(i): np.asarray(v) for b in batches for i, v in zip(b["id"], b["video"])}


def test_frame_ops_one_box_per_clip_the_same_on_any_world_size(stills: str) -> None:
    ds = open_dataset(stills)
    assert ds.num_shards > 1
    one = _clips(ds.iter_batches(batch_size=4, shuffle=True, seed=5, transforms=FRAME_OPS))
    assert sorted(one) == list(range(10))
    assert all(c.shape == (4, 24, 32, 3) and c.dtype == np.uint8 for c in one.values())
    for world in (2, 3):
        split: dict[int, np.ndarray] = {}
        for rank in range(world):
            batches = ds.iter_batches(
                batch_size=2,
                shuffle=True,
                seed=5,
                rank=rank,
                world_size=world,
                transforms=FRAME_OPS,
                even_batches=False,
            )
            split.update(_clips(batches))
        assert sorted(split) == sorted(one)
        assert all(np.array_equal(split[i], one[i]) for i in one), world
    # one box and one flip per clip: the frames of a still clip stay alike (codec noise
    # aside), while clips' crops differ from one another and from epoch to epoch
    for clip in one.values():
        assert np.abs(clip.astype(int) - clip[:1]).mean() < 2.0
    later = _clips(
        ds.iter_batches(batch_size=4, shuffle=True, seed=5, epoch=1, transforms=FRAME_OPS)
    )
    moved = [np.abs(later[i].astype(int) - one[i]).mean() for i in one]
    assert sum(m > 4 for m in moved) >= 5, moved


def test_frame_ops_flip_mirrors_every_frame(stills: str) -> None:
    ds = open_dataset(stills)
    base = [
        {"op": "video_decode", "column": "video", "num_frames": 3, "start": "begin"},
        {"op": "resize", "column": "video", "size": [32, 40]},
    ]
    plain = _clips(ds.iter_batches(batch_size=5, transforms=base))
    flip = {"op": "horizontal_flip", "column": "video", "p": 1.0}
    mirrored = _clips(ds.iter_batches(batch_size=5, transforms=[*base, flip]))
    for i, clip in plain.items():
        assert np.array_equal(mirrored[i], clip[:, :, ::-1])
        red = clip[0, :, :, 0].astype(int)
        assert red[:, -1].mean() > red[:, 0].mean() + 100  # red grows to the right...
        assert mirrored[i][0, :, 0, 0].mean() > mirrored[i][0, :, -1, 0].mean() + 100  # ...or left
    # p=0.5: some clips flipped, some not, decided per clip and seeded
    half = [*base, {"op": "horizontal_flip", "column": "video"}]
    got = _clips(ds.iter_batches(batch_size=5, seed=2, transforms=half))
    flipped = {i for i in got if np.array_equal(got[i], mirrored[i])}
    kept = {i for i in got if np.array_equal(got[i], plain[i])}
    assert flipped and kept and flipped | kept == set(got)


def test_frame_ops_normalize_and_chw_shapes_dtypes_and_frameworks(stills: str) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    ds = open_dataset(stills)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    norm = {"op": "normalize", "column": "video", "mean": mean, "std": std}
    chw = {"op": "to_chw", "column": "video"}
    raw = _clips(ds.iter_batches(batch_size=4, seed=9, transforms=FRAME_OPS))
    normed = _clips(ds.iter_batches(batch_size=4, seed=9, transforms=[*FRAME_OPS, norm]))
    assert normed[0].dtype == np.float32 and normed[0].shape == (4, 24, 32, 3)
    want = (raw[0].astype(np.float32) / 255 - np.float32(mean)) / np.float32(std)
    assert np.allclose(normed[0], want, atol=1e-5)
    ops = [*FRAME_OPS, norm, chw]
    numpy = list(ds.iter_batches(batch_size=4, shuffle=True, seed=9, transforms=ops))
    assert numpy[0]["video"].shape == (4, 4, 3, 24, 32)
    loader = ds.to_torch(batch_size=4, shuffle=True, seed=9, num_workers=2, transforms=ops)
    batches = list(loader)
    assert batches[0]["video"].dtype == torch.float32
    assert tuple(batches[0]["video"].shape) == (4, 4, 3, 24, 32)
    tf_batches = list(ds.to_tf(batch_size=4, shuffle=True, seed=9, transforms=ops))
    assert len(batches) == len(tf_batches) == len(numpy)
    for t, f, n in zip(batches, tf_batches, numpy):
        assert np.array_equal(t["id"].numpy(), n["id"])
        assert np.array_equal(t["video"].numpy(), n["video"])
        assert np.array_equal(f["video"].numpy(), n["video"])
    for extra, shape in (([], (4, 4, 24, 32, 3)), ([chw], (4, 4, 3, 24, 32))):
        ops = [*FRAME_OPS, *extra]  # uint8: decoded into the workers' shared memory
        workers = list(ds.to_torch(batch_size=4, seed=9, num_workers=2, transforms=ops))
        alone = list(ds.iter_batches(batch_size=4, seed=9, transforms=ops))
        assert workers[0]["video"].dtype == torch.uint8
        assert tuple(workers[0]["video"].shape) == shape
        for t, n in zip(workers, alone, strict=True):
            assert np.array_equal(t["video"].numpy(), n["video"])


@pytest.mark.parametrize("chw", [False, True])
def test_worker_normalized_video_batches_are_written_into_shared_memory(
    stills: str, chw: bool
) -> None:
    """A normalized video batch is written into the worker's shared memory (sent as it is)
    with the values of the whole-array expression on the uint8 frames."""
    from spark_dl_core.loaders.torch_loader.shared import _shared_bytes
    from spark_dl_core.loaders.torch_loader.tensors import to_tensors
    from spark_dl_core.media.clips import VideoPipeline
    from spark_dl_core.ops.transforms import parse_transforms

    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    norm = {"op": "normalize", "column": "video", "mean": mean, "std": std}
    extra = [norm, {"op": "to_chw", "column": "video"}] if chw else [norm]
    raws = next(r["video"] for r in open_dataset(stills).iter_batches(batch_size=3))[:3]

    def pipeline(ops: list[dict[str, Any]]) -> Any:
        parsed = parse_transforms(ops)
        out = VideoPipeline(parsed[0])
        for op in parsed[1:]:
            out.add(op)
        return out

    index, key, where = np.arange(3), b"v" * 16, _where_plain
    frames = pipeline(FRAME_OPS).run(list(raws), key, index, where)
    want = (frames.astype(np.float32) - np.float32(mean) * 255) / (np.float32(std) * 255)
    if chw:
        want = np.ascontiguousarray(want.transpose(0, 1, 4, 2, 3))
    normed = pipeline([*FRAME_OPS, *extra])
    for alloc in (None, _shared_bytes):
        got = normed.run(list(raws), key, index, where, alloc)
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    tensor = to_tensors({"video": got})["video"]
    assert tensor.is_shared() and tensor.data_ptr() == got.ctypes.data


def test_frame_ops_refused_naming_the_column(stills: str) -> None:
    ds = open_dataset(stills)
    decode = FRAME_OPS[0]
    norm = {"op": "normalize", "column": "video", "mean": [0.5, 0.5], "std": 0.5}
    with pytest.raises(SpecError, match=r"normalize on video column 'video': mean has 2 values"):
        ds.to_torch(batch_size=2, transforms=[decode, norm])
    late = [decode, {"op": "to_chw", "column": "video"}, FRAME_OPS[2]]
    with pytest.raises(SpecError, match="horizontal_flip on video column 'video' must come"):
        ds.to_torch(batch_size=2, transforms=late)
    image = {"op": "image_decode", "column": "video"}
    with pytest.raises(SpecError, match="image_decode on column 'video' is decoded as video"):
        ds.to_torch(batch_size=2, transforms=[decode, image])
    chw = {"op": "to_chw", "column": "video"}  # a second one did nothing, silently
    with pytest.raises(SpecError, match="to_chw on video column 'video' is listed twice"):
        ds.to_torch(batch_size=2, transforms=[decode, chw, chw])


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


# -- the fast paths give what the general ones give


def _soundfile_reference(raw: bytes, crop: dict[str, object] | None, rng: object) -> np.ndarray:
    """What audio_decode (16 kHz mono) + audio_crop gave through libsndfile alone."""
    import math

    import soxr

    from spark_dl_core.media.clips import _start

    with sf.SoundFile(io.BytesIO(raw)) as f:
        rate, frames = f.samplerate, f.frames
        if crop is not None:
            window = math.ceil(float(crop["seconds"]) * rate)  # type: ignore[arg-type]
            f.seek(_start(str(crop["start"]), frames - window, rng))  # type: ignore[arg-type]
            data = f.read(min(window, frames), dtype="float32", always_2d=True)
        else:
            data = f.read(dtype="float32", always_2d=True)
    if data.shape[1] > 1:
        data = data.mean(axis=1, keepdims=True, dtype=np.float32)
    if rate != 16_000:
        data = soxr.resample(data, rate, 16_000, quality="HQ")
    if crop is not None:
        length = round(float(crop["seconds"]) * 16_000)  # type: ignore[arg-type]
        data = data[:length]
        data = np.concatenate([data, np.zeros((length - len(data), 1), np.float32)])
    return np.ascontiguousarray(data.T)


def _assert_windows_equal_soundfile(raws: list[bytes], key: bytes, label: str) -> None:
    """Cropped mono 16 kHz windows (random, begin, center) and whole clips (every channel)
    from the audio pipeline equal soundfile's reading of the same bytes."""
    from spark_dl_core.media.clips import AudioPipeline
    from spark_dl_core.media.images import sample_rngs
    from spark_dl_core.ops.transforms import parse_transforms

    index = np.arange(len(raws))
    decode = {"op": "audio_decode", "column": "a", "sample_rate": 16_000, "mono": True}
    for start in ("random", "begin", "center"):
        crop = {"op": "audio_crop", "column": "a", "seconds": 1.0, "start": start}
        pipeline = AudioPipeline(parse_transforms([decode])[0])
        pipeline.crop = parse_transforms([crop])[0]
        got = pipeline.run([memoryview(r) for r in raws], key, index, lambda i, m: m)
        rngs = sample_rngs(key, index)
        for i, raw in enumerate(raws):
            want = _soundfile_reference(raw, crop, rngs[i] if start == "random" else None)
            assert np.array_equal(got[i], want), (label, start, i)
    whole_clips = {**decode, "mono": False, "sample_rate": None}
    pipeline = AudioPipeline(parse_transforms([whole_clips])[0])
    for raw in raws:  # whole clips, every channel
        whole = pipeline.run([raw], key, index[:1], lambda i, m: m)[0]
        assert np.array_equal(whole, sf.read(io.BytesIO(raw), dtype="float32", always_2d=True)[0].T)


@pytest.mark.parametrize("subtype", ["PCM_16", "PCM_24", "PCM_32", "FLOAT"])
def test_wav_windows_read_from_the_bytes_equal_libsndfile(subtype: str) -> None:
    from spark_dl_core.media.clips import _wav_layout

    rng = np.random.default_rng(5)
    raws = []
    for channels, rate, seconds in [(1, 16_000, 0.7), (2, 44_100, 2.3), (6, 22_050, 1.6)]:
        wave = rng.uniform(-1, 1, (round(rate * seconds), channels)).astype(np.float32)
        raws.append(_encode(wave, rate, "WAV", subtype))
        assert _wav_layout(raws[-1]) is not None  # the fast path reads these
    _assert_windows_equal_soundfile(raws, b"k" * 16, subtype)


@pytest.mark.parametrize(
    ("fmt", "subtype"), [("FLAC", "PCM_16"), ("FLAC", "PCM_24"), ("OGG", "VORBIS")]
)
def test_libsndfile_windows_equal_soundfiles_seek_and_read(fmt: str, subtype: str) -> None:
    """FLAC / OGG windows are read with one libsndfile seek and read (not soundfile's read,
    which seeks again after reading): the same samples as soundfile's seek + read."""
    from spark_dl_core.media.clips import _wav_layout

    rng = np.random.default_rng(7)
    raws = []
    for channels, rate, seconds in [(1, 48_000, 2.7), (2, 22_050, 0.6), (1, 44_100, 1.0)]:
        wave = rng.uniform(-1, 1, (round(rate * seconds), channels)).astype(np.float32)
        raws.append(_encode(wave, rate, fmt, subtype))
        assert _wav_layout(raws[-1]) is None  # through libsndfile
    _assert_windows_equal_soundfile(raws, b"s" * 16, fmt)


def test_worker_audio_batches_are_decoded_into_shared_memory() -> None:
    """In a DataLoader worker a cropped audio batch is written into the worker's shared
    memory and sent as that tensor: a batch in private memory is copied into a fresh
    shared segment when sent (8-12 ms a batch, whatever its size)."""
    torch = pytest.importorskip("torch")
    from spark_dl_core.loaders.torch_loader.shared import _shared_bytes
    from spark_dl_core.loaders.torch_loader.tensors import to_tensors
    from spark_dl_core.media.clips import AudioPipeline
    from spark_dl_core.ops.transforms import parse_transforms

    raws = [
        _encode(_tone(rate, 1.3, channels), rate, fmt, None)
        for rate, channels, fmt in [(44_100, 2, "WAV"), (16_000, 1, "FLAC"), (22_050, 1, "WAV")]
    ]
    ops = parse_transforms(
        [
            {"op": "audio_decode", "column": "a", "sample_rate": 16_000, "mono": True},
            {"op": "audio_crop", "column": "a", "seconds": 1.0, "start": "random"},
        ]
    )
    pipeline = AudioPipeline(ops[0])
    pipeline.add(ops[1])
    index = np.arange(3)
    private = pipeline.run(raws, b"w" * 16, index, lambda i, m: m)
    shared = pipeline.run(raws, b"w" * 16, index, lambda i, m: m, _shared_bytes)
    assert shared.shape == private.shape == (3, 1, 16_000)
    assert shared.dtype == np.float32 and np.array_equal(shared, private)
    tensor = to_tensors({"a": shared})["a"]
    assert tensor.is_shared() and tensor.dtype == torch.float32
    assert tensor.data_ptr() == shared.ctypes.data  # the same memory: nothing to copy
    assert not to_tensors({"a": private})["a"].is_shared()


def test_mono_mix_equals_numpy_mean() -> None:
    from spark_dl_core.media.clips import _mono

    rng = np.random.default_rng(0)
    for channels in (2, 3, 5, 7, 8, 12):
        data = rng.standard_normal((1000, channels)).astype(np.float32)
        assert np.array_equal(_mono(data), data.mean(axis=1, keepdims=True, dtype=np.float32))


def _wav(chunks: list[tuple[bytes, bytes]], riff_size: int | None = None) -> bytes:
    body = b"WAVE" + b"".join(
        tag + len(data).to_bytes(4, "little") + data + b"\0" * (len(data) % 2)
        for tag, data in chunks
    )
    size = len(body) if riff_size is None else riff_size
    return b"RIFF" + size.to_bytes(4, "little") + body


def _fmt(channels: int = 1, rate: int = 8000, bits: int = 16, tag: int = 1) -> bytes:
    import struct

    align = channels * bits // 8
    return struct.pack("<HHIIHH", tag, channels, rate, rate * align, align, bits)


def test_odd_and_broken_wav_headers_read_as_libsndfile_or_refuse_naming_the_sample(
    tmp_path: Path,
) -> None:
    from spark_dl_core.media.clips import MediaError, _wav_layout

    pcm = (np.arange(-300, 301, dtype=np.int16) * 100).tobytes()
    good = _wav([(b"fmt ", _fmt()), (b"data", pcm)])
    odd_chunk = _wav([(b"fmt ", _fmt()), (b"note", b"abc"), (b"data", pcm)])  # padded chunk
    odd_data = _wav([(b"fmt ", _fmt()), (b"data", pcm[:-1])])  # half a frame at the end
    layouts = [_wav_layout(c) for c in (good, odd_chunk, odd_data)]
    assert [x.frames if x else None for x in layouts] == [601, 601, 600]
    past_end = good[:-40]  # the data chunk says more than the file holds
    truncated = good[:30]  # inside the fmt chunk
    no_data = _wav([(b"fmt ", _fmt())])
    twelve_bits = _wav([(b"fmt ", _fmt(bits=12)), (b"data", pcm)])
    bad_align = _wav([(b"fmt ", _fmt()[:12] + b"\x03\x00\x10\x00"), (b"data", pcm)])
    for broken in (past_end, truncated, no_data, twelve_bits, bad_align, b"RIFF", b""):
        assert _wav_layout(broken) is None  # left to libsndfile, which reads or refuses it
    clips = [good, odd_chunk, odd_data, past_end, truncated, no_data, twelve_bits, bad_align]
    ops = [{"op": "audio_decode", "column": "audio", "sample_rate": None, "mono": True}]
    for i, raw in enumerate(clips):
        path = str(tmp_path / f"wav{i}")
        write_mds(pa.table({"id": [i], "audio": [raw]}), path)
        rows = open_dataset(path).iter_batches(batch_size=1, transforms=ops, columns=["audio"])
        try:
            want = sf.read(io.BytesIO(raw), dtype="float32", always_2d=True)[0].T
        except (RuntimeError, ValueError, TypeError):
            with pytest.raises(MediaError, match=r"column 'audio', shard .*wav.*sample 0 "):
                next(iter(rows))
        else:
            assert np.array_equal(next(iter(rows))["audio"][0], want), i


def _h264(frames: int, gop: int, bframes: int) -> bytes:
    out = io.BytesIO()
    rng = np.random.default_rng(frames)
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=10, options={"bf": str(bframes)})
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.codec_context.gop_size = gop
        for k in range(frames):
            pixels = np.full((48, 64, 3), (7 * k) % 256, np.uint8)
            pixels[:24, :32] = rng.integers(0, 255, (24, 32, 3))
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def test_h264_clips_decode_from_the_keyframe_skipping_unreferenced_frames() -> None:
    from spark_dl_core.media.clips import VideoPipeline, _h264_frames, _in_order
    from spark_dl_core.ops.transforms import parse_transforms

    clips = [_h264(60, 12, 3), _h264(45, 8, 2), _h264(30, 30, 0), _h264(6, 12, 3)]
    for settings in ({"num_frames": 8, "stride": 2}, {"num_frames": 5, "stride": 3}):
        for start in ("random", "center", "begin"):
            op = {"op": "video_decode", "column": "v", **settings, "start": start}
            pipeline = VideoPipeline(parse_transforms([op])[0])
            for raw in clips:
                for seed in range(4):
                    got = pipeline._frames(av, memoryview(raw), np.random.default_rng(seed))
                    with av.open(io.BytesIO(raw)) as container:
                        stream = container.streams.video[0]
                        wanted = pipeline._wanted(stream.frames, np.random.default_rng(seed))
                        want = _in_order(container.decode(stream), wanted)
                    assert len(got) == len(want)
                    for a, b in zip(got, want):
                        assert np.array_equal(
                            a.to_ndarray(format="rgb24"), b.to_ndarray(format="rgb24")
                        )
    with av.open(io.BytesIO(clips[0])) as container:  # the fast path ran (no fallback)
        stream = container.streams.video[0]
        packets = [p for p in container.demux(stream) if p.size]
        picked = _h264_frames(stream, packets, stream.frames, [40, 42, 44])
        assert picked is not None and [f.pts for f in picked] == sorted(f.pts for f in picked)


def test_decoder_libraries_and_numpy_ma_load_where_the_loader_is_built(audio: str) -> None:
    """DataLoader workers are forked for every pass: what they import costs every pass."""
    import subprocess
    import sys

    code = (
        "import sys; from spark_dl_core import open_dataset; "
        f"open_dataset({audio!r}).to_torch(batch_size=4, num_workers=2, transforms={OPS!r}); "
        "print(sorted(m for m in ('soundfile', 'soxr', 'numpy.ma') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[-2] == "['numpy.ma', 'soundfile', 'soxr']"


def _moving(frames: int, seed: int, gop: int, options: dict[str, str]) -> bytes:
    """An H.264 MP4 of a texture moving across 64x48 frames (motion-predicted frames, so a
    missing or wrong reference shows), encoded by libx264 with ``options``."""
    rng = np.random.default_rng(seed)
    texture = rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=25, options=options)
        stream.width, stream.height = 64, 48
        stream.pix_fmt = "yuv444p" if options.get("profile") == "high444" else "yuv420p"
        stream.codec_context.gop_size = gop
        for k in range(frames):
            y, x = (3 * k) % 48, (5 * k) % 64
            frame = av.VideoFrame.from_ndarray(texture[y : y + 48, x : x + 64], format="rgb24")
            frame.pts = k
            if k % 9 == 0 and options.get("forced"):
                frame.pict_type = av.video.frame.PictureType.I
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def _param_sets(extradata: bytes) -> list[bytes]:
    """The SPS and PPS NAL units of an ``avcC`` header."""
    at, units = 6, []
    for count in (extradata[5] & 0x1F, None):
        if count is None:
            count, at = extradata[at], at + 1
        for _ in range(count):
            size = int.from_bytes(extradata[at : at + 2], "big")
            units.append(extradata[at + 2 : at + 2 + size])
            at += 2 + size
    return units


def _spliced(first: bytes, second: bytes) -> bytes:
    """Two encodes joined in one MP4 without re-encoding, as cutting tools join clips: the
    header holds the first's parameter sets, the second's travel in-band in its first
    packet (its PPS differs: another quantizer)."""
    out = io.BytesIO()
    with (
        av.open(io.BytesIO(first)) as a,
        av.open(io.BytesIO(second)) as b,
        av.open(out, "w", format="mp4") as joined,
    ):
        target = joined.add_stream_from_template(a.streams.video[0])
        end = 0
        for packet in a.demux(a.streams.video[0]):
            if packet.size:
                end = max(end, packet.pts + packet.duration)
                packet.stream = target
                joined.mux(packet)
        source = b.streams.video[0]
        head = b"".join(
            len(n).to_bytes(4, "big") + n for n in _param_sets(source.codec_context.extradata)
        )
        for k, packet in enumerate(p for p in b.demux(source) if p.size):
            moved = av.Packet((head if k == 0 else b"") + bytes(packet))
            moved.pts, moved.dts = packet.pts + end, packet.dts + end
            moved.time_base, moved.is_keyframe = packet.time_base, packet.is_keyframe
            moved.stream = target
            joined.mux(moved)
    return out.getvalue()


def test_h264_picks_equal_a_full_decode_for_b_frames_idrs_open_gop_and_spliced_clips() -> None:
    """Every pick, from any start, is the frame a plain decode of the whole clip gives; a
    clip whose parameter sets change mid-stream (in-band, after an IDR) decoded from a later
    keyframe used to come out as wrong pixels without an error."""
    from spark_dl_core.media.clips import VideoPipeline, _h264_frames, _in_order
    from spark_dl_core.ops.transforms import parse_transforms

    high444 = {"profile": "high444", "bf": "3"}
    clips = {
        "high444, IDR every 8": _moving(50, 1, 8, high444),
        "high444, forced keyframes": _moving(50, 2, 250, {**high444, "forced": "1"}),
        "high444, open GOP": _moving(50, 3, 10, {**high444, "x264-params": "open-gop=1"}),
        "yuv420p, IDR every 7": _moving(40, 4, 7, {"bf": "4"}),
        "spliced": _spliced(
            _moving(30, 5, 8, {**high444, "x264-params": "qp=30"}),
            _moving(40, 6, 8, {**high444, "x264-params": "qp=12"}),
        ),
    }
    for name, raw in clips.items():
        with av.open(io.BytesIO(raw)) as container:
            full = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
            total = container.streams.video[0].frames
        assert total == len(full), name
        for settings in ({"num_frames": 6, "stride": 3}, {"num_frames": 3, "stride": 1}):
            for start in ("random", "center", "begin"):
                op = {"op": "video_decode", "column": "v", **settings, "start": start}
                pipeline = VideoPipeline(parse_transforms([op])[0])
                for seed in range(6 if start == "random" else 1):
                    got = pipeline._frames(av, memoryview(raw), np.random.default_rng(seed))
                    wanted = pipeline._wanted(total, np.random.default_rng(seed))
                    for frame, w in zip(got, wanted, strict=True):
                        assert np.array_equal(frame.to_ndarray(format="rgb24"), full[w]), name
    with av.open(io.BytesIO(clips["spliced"])) as container:  # decoded from a later IDR
        stream = container.streams.video[0]
        packets = [p for p in container.demux(stream) if p.size]
        picked = _h264_frames(stream, packets, stream.frames, [60, 61])
        assert picked is not None
    with av.open(io.BytesIO(clips["spliced"])) as container:
        want = _in_order(container.decode(video=0), [60, 61])
    assert all(
        np.array_equal(a.to_ndarray(format="rgb24"), b.to_ndarray(format="rgb24"))
        for a, b in zip(picked, want)
    )


def _vbr_mp3(seconds: float, rate: int, channels: int, quality: int, xing: bool) -> bytes:
    """A VBR MP3 by libmp3lame (``-q:a quality``) of a chirp with bursts of noise (frames of
    very different bitrates); ``xing=False`` leaves out the Xing header, as streamed and cut
    files lack it."""
    rng = np.random.default_rng(rate + channels)
    t = np.arange(round(rate * seconds)) / rate
    chirp = 0.3 * np.sin(2 * np.pi * 440 * t * (1 + t)) * (t % 1.3 > 0.4)
    signal = (chirp + 0.2 * rng.standard_normal(len(t)) * (t % 1 > 0.5)).astype(np.float32)
    layout = "stereo" if channels == 2 else "mono"
    planes = np.stack([signal, np.roll(signal, 100)][:channels])
    out = io.BytesIO()
    with av.open(out, "w", format="mp3", options={} if xing else {"write_xing": "0"}) as mp3:
        stream = mp3.add_stream("libmp3lame", rate=rate, layout=layout)
        stream.codec_context.qscale = True  # VBR
        stream.options = {"global_quality": str(quality * 118)}  # FF_QP2LAMBDA
        for at in range(0, planes.shape[1], 1152):
            chunk = np.ascontiguousarray(planes[:, at : at + 1152])
            frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout=layout)
            frame.sample_rate, frame.pts = rate, at
            for packet in stream.encode(frame):
                mp3.mux(packet)
        for packet in stream.encode():
            mp3.mux(packet)
    return out.getvalue()


def test_mp3_windows_equal_a_whole_decode_sample_for_sample() -> None:
    """libsndfile guessed a VBR MP3's length (reads stopped there, or windows ran into
    zeros), its seeks landed hundreds of samples off, and reads in pieces gave other
    samples than a whole read: windows now equal a whole decode's samples exactly."""
    from spark_dl_core.media.clips import AudioPipeline, _start
    from spark_dl_core.media.images import sample_rngs
    from spark_dl_core.ops.transforms import parse_transforms

    raws = [
        _vbr_mp3(3.0, 44_100, 2, 2, True),
        _vbr_mp3(3.0, 44_100, 2, 2, False),
        _vbr_mp3(3.0, 22_050, 1, 6, False),
        _vbr_mp3(2.0, 32_000, 1, 4, True),
    ]
    wholes, rates = [], []
    for raw in raws:
        with av.open(io.BytesIO(raw)) as container:
            frames = list(container.decode(audio=0))
            wholes.append(np.concatenate([f.to_ndarray() for f in frames], axis=1))
            rates.append(frames[0].sample_rate)
    assert wholes[1].shape[1] > 3.0 * 44_100  # the whole clip, not libsndfile's guess
    decode = {"op": "audio_decode", "column": "a", "mono": False}
    pipeline = AudioPipeline(parse_transforms([decode])[0])
    index = np.arange(len(raws))
    for i, raw in enumerate(raws):  # whole clips
        got = pipeline.run([memoryview(raw)], b"k" * 16, index[:1], lambda i, m: m)[0]
        assert np.array_equal(got, wholes[i]), i
    for seconds in (0.5, 1.7, 2.0):
        for start in ("random", "begin", "center"):
            crop = {"op": "audio_crop", "column": "a", "seconds": seconds, "start": start}
            pipeline.crop = parse_transforms([crop])[0]
            for key in (b"k" * 16, b"j" * 16, b"m" * 16):
                rngs = sample_rngs(key, index)
                for i, whole in enumerate(wholes):
                    [got] = pipeline.run(
                        [memoryview(raws[i])], key, index[i : i + 1], lambda i, m: m
                    )
                    window = int(np.ceil(seconds * rates[i]))
                    rng = rngs[i] if start == "random" else None
                    at = _start(start, whole.shape[1] - window, rng)
                    want = whole[:, at : at + window]
                    if want.shape[1] < round(seconds * rates[i]):  # a clip shorter than it
                        pad = round(seconds * rates[i]) - want.shape[1]
                        want = np.pad(want, ((0, 0), (0, pad)))
                    assert np.array_equal(got, want[:, : round(seconds * rates[i])]), (i, at)


def test_tf_gets_clips_of_different_sizes_ragged(video: str) -> None:
    """Clips 64 and 80 pixels wide, one per batch: no one shape, so ragged tensors."""
    tf = pytest.importorskip("tensorflow")
    ds = open_dataset(video)
    ops = [{"op": "video_decode", "column": "video", "num_frames": 3}]
    tfds = ds.to_tf(batch_size=1, shuffle=False, transforms=ops)
    assert isinstance(tfds.element_spec["video"], tf.RaggedTensorSpec)
    got = [np.asarray(b["video"].to_list()[0], dtype=np.uint8) for b in tfds]
    want = [b["video"][0] for b in ds.iter_batches(batch_size=1, shuffle=False, transforms=ops)]
    assert [g.shape for g in got] == [(3, 48, w, 3) for w in (64, 80, 80, 64)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def _latin1_title(clip: bytes) -> bytes:
    """``clip`` remuxed with a title tag, its bytes then patched to latin-1 (as old
    cameras and tools write them): not UTF-8, so PyAV's strict decode of tags failed."""
    out = io.BytesIO()
    with av.open(io.BytesIO(clip)) as source, av.open(out, mode="w", format="mp4") as target:
        target.metadata["title"] = "Cafe ZZZZ"
        stream = target.add_stream_from_template(source.streams.video[0])
        for packet in source.demux(source.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                target.mux(packet)
    raw = out.getvalue()
    assert raw.count(b"ZZZZ") == 1
    return raw.replace(b"ZZZZ", b"cr\xe8m")  # "crème" in latin-1


def test_a_clip_with_non_utf8_metadata_decodes(tmp_path: Path) -> None:
    """A real MP4 whose title tag is latin-1 failed with a bare "'utf-8' codec can't decode"
    from the decoder library; tags are not needed, so it decodes like the clean clip."""
    clean = _video(12)
    tagged = _latin1_title(clean)
    with pytest.raises(UnicodeDecodeError):
        av.open(io.BytesIO(tagged))  # what the library does by default
    path = str(tmp_path / "ds")
    write_mds(pa.table({"id": np.arange(2), "video": [clean, tagged]}), path)
    ops = [{"op": "video_decode", "column": "video", "num_frames": 4, "start": "begin"}]
    (batch,) = list(open_dataset(path).iter_batches(batch_size=2, transforms=ops))
    assert np.array_equal(batch["video"][0], batch["video"][1])
    out = str(tmp_path / "re")
    op = {"op": "reencode_video", "column": "video", "size": 32}
    write_mds(pa.table({"id": np.arange(2), "video": [clean, tagged]}), out, {"transforms": [op]})
    stored = next(iter(open_dataset(out).iter_batches(batch_size=2)))["video"]
    assert len(stored) == 2 and all(len(raw) > 0 for raw in stored)


FIRST_USE = """
import sys
import numpy as np
from spark_dl_core import open_dataset
ops = {ops!r}
def clips():
    ds = open_dataset(sys.argv[1])
    return {{int(i): np.asarray(v) for b in ds.iter_batches(batch_size=4, shuffle=True, seed=5,
            transforms=ops) for i, v in zip(b["id"], b["video"])}}
first, later = clips(), clips()
print(sorted(i for i in first if not np.array_equal(first[i], later[i])))
"""


def test_a_processs_first_video_batch_is_resampled_as_every_later_one(stills: str) -> None:
    """The first batch of a fresh process (torch not yet imported) decodes its clips on two
    threads: both must resample with the same kernel as later batches (one thread used to
    take PIL's while the other was still importing torch)."""
    script = FIRST_USE.format(ops=FRAME_OPS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", script, stills], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
