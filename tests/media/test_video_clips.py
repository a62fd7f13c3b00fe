"""Video columns read: frame picks, seeded windows, decoding threads, H.264 keyframe seeks."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from media_helpers import _video, _where_plain

from spark_dl_core import open_dataset, write_mds

pytest.importorskip("soundfile")
av = pytest.importorskip("av")


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
