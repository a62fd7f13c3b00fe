"""Audio columns read: decode and crop ops, seeded windows, batch forms, fast decoding paths."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from media_helpers import FORMATS, OPS, _encode, _tone

from spark_dl_core import open_dataset, write_mds

sf = pytest.importorskip("soundfile")
av = pytest.importorskip("av")


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
