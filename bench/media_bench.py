"""Audio and video loading against a file-per-clip PyTorch Dataset doing the same decode.

Workloads (ANCHORS.md): 400 audio clips of 1.5-6 s at 16-48 kHz, WAV and FLAC, decoded to a
1 s window at 16 kHz mono, batch 32, 2 workers; 48 H.264 clips of 40-85 frames, 8 frames at
stride 2 resized to 112 x 112, batch 32, 2 workers. Each case runs in a fresh process with
torch imported before the clock; the first pass (cold) and a second (warm) are reported:

- ``audio_ours``: ``to_torch(transforms=[audio_decode, audio_crop], num_workers=2)``
- ``audio_files``: a Dataset over one file per clip: ``soundfile`` reads the seeked 1 s
  window, ``soxr.resample`` to 16 kHz, mean to mono (the anchor)
- ``video_ours``: ``to_torch(transforms=[video_decode, resize], num_workers=2)``
- ``video_files``: a Dataset over one file per clip: PyAV decodes from the start, keeps 8
  frames at stride 2, resizes each in FFmpeg's scaler (the anchor)

- ``audio_limit`` / ``video_limit``: the decode alone, the physical ceiling of this machine
  for the workload: spark-dl's audio / video pipeline (the same ops) in a 2-process pool
  started before the clock, over the clips' bytes preloaded in memory, in chunks of 8 clips
  (both cores busy to the end), no loader, no I/O, the decoded clips left in the pool

Prepared at write time (the same clips, re-encoded once when the dataset is written with
``write_mds`` in one process; that one-off cost is measured and printed, and the ratios are
against the same file-per-clip anchors, which decode the original files):

- ``audio_prepared``: the 400 clips written with ``reencode_audio`` to 16 kHz mono WAV, read
  with the same ops as ``audio_ours``
- ``video_prepared``: the 48 clips written with ``reencode_video`` (shorter side 128, a
  keyframe at most every 8 frames), read with the same ops as ``video_ours``

Usage: ``python bench/media_bench.py [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BATCH = 32
AUDIO_OPS = [
    {"op": "audio_decode", "column": "audio", "sample_rate": 16_000, "mono": True},
    {"op": "audio_crop", "column": "audio", "seconds": 1.0, "start": "random"},
]
VIDEO_OPS = [
    {"op": "video_decode", "column": "video", "num_frames": 8, "stride": 2, "start": "begin"},
    {"op": "resize", "column": "video", "size": [112, 112]},
]
PREPARE = {
    "audio": {
        "op": "reencode_audio",
        "column": "audio",
        "sample_rate": 16_000,
        "mono": True,
        "format": "wav",
    },
    "video": {"op": "reencode_video", "column": "video", "size": 128, "gop": 8},
}


def make_data(directory: Path) -> None:
    import av
    import numpy as np
    import pyarrow as pa
    import soundfile as sf

    from spark_dl_core import write_mds

    if (directory / "done").exists():
        return
    rng = np.random.default_rng(0)
    (directory / "audio_files").mkdir(parents=True, exist_ok=True)
    clips = []
    for i in range(400):
        rate = int(rng.choice([16_000, 22_050, 44_100, 48_000]))
        seconds = float(rng.uniform(1.5, 6.0))
        wave = rng.uniform(-0.5, 0.5, (int(rate * seconds), 1 + i % 2)).astype(np.float32)
        fmt = "WAV" if i % 2 else "FLAC"
        out = io.BytesIO()
        sf.write(out, wave, rate, format=fmt)
        clips.append(out.getvalue())
        (directory / "audio_files" / f"{i:04}.{fmt.lower()}").write_bytes(out.getvalue())
    write_mds(pa.table({"audio": clips}), str(directory / "audio"), mode="overwrite")
    (directory / "video_files").mkdir(exist_ok=True)
    videos = []
    for i in range(48):
        frames = int(rng.integers(40, 86))
        out = io.BytesIO()
        with av.open(out, mode="w", format="mp4") as container:
            stream = container.add_stream("libx264", rate=25)
            stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
            for k in range(frames):
                pixels = rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)
                pixels[:, :, 0] = k
                for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        videos.append(out.getvalue())
        (directory / "video_files" / f"{i:04}.mp4").write_bytes(out.getvalue())
    write_mds(pa.table({"video": videos}), str(directory / "video"), mode="overwrite")
    (directory / "done").write_text("ok")


def prepare(directory: Path) -> dict[str, float]:
    """The prepared datasets written from the original files' bytes; seconds each took."""
    import pyarrow as pa

    from spark_dl_core import DatasetSpec, write_mds

    took = {}
    for kind, op in PREPARE.items():
        clips = [p.read_bytes() for p in sorted((directory / f"{kind}_files").iterdir())]
        start = time.perf_counter()
        spec = DatasetSpec(transforms=[op])
        path = str(directory / f"{kind}_prepared")
        write_mds(pa.table({kind: clips}), path, spec, mode="overwrite")
        took[kind] = time.perf_counter() - start
        stored = sum(f.stat().st_size for f in Path(path).iterdir())
        print(f"{kind}: {sum(map(len, clips)) / 1e6:.1f} MB of files -> {stored / 1e6:.1f} MB")
    return took


class AudioFiles:
    """The anchor: one file per clip, a seeked 1 s window, soxr to 16 kHz mono."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Any:
        import numpy as np
        import soundfile as sf
        import soxr
        import torch

        with sf.SoundFile(self.files[i]) as f:
            window = f.samplerate
            start = np.random.randint(0, max(1, f.frames - window + 1))
            f.seek(start)
            data = f.read(window, dtype="float32", always_2d=True)
            rate = f.samplerate
        data = soxr.resample(data, rate, 16_000).mean(axis=1)
        out = np.zeros(16_000, np.float32)
        out[: min(16_000, len(data))] = data[:16_000]
        return torch.from_numpy(out)[None]


class VideoFiles:
    """The anchor: one file per clip, decoded from the start, 8 frames at stride 2."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Any:
        import av
        import numpy as np
        import torch

        wanted = set(range(0, 16, 2))
        frames = []
        with av.open(str(self.files[i])) as container:
            for k, frame in enumerate(container.decode(video=0)):
                if k in wanted:
                    small = frame.reformat(width=112, height=112, interpolation="BILINEAR")
                    frames.append(small.to_ndarray(format="rgb24"))
                if k >= 14:
                    break
        return torch.from_numpy(np.stack(frames))


_BLOBS: list[bytes] = []


def _load_blobs(kind: str, directory: str) -> None:
    """Pool initializer: the clips' bytes in this process's memory, before the clock."""
    _BLOBS[:] = [p.read_bytes() for p in sorted((Path(directory) / f"{kind}_files").iterdir())]


def _decode_chunk(job: tuple[str, int, int]) -> int:
    """Clips ``first..stop`` through spark-dl's pipeline in a pool process (the limit)."""
    import numpy as np

    from spark_dl_core.ops.pipelines import compile_read_ops
    from spark_dl_core.ops.transforms import parse_transforms

    kind, first, stop = job
    ops = parse_transforms(AUDIO_OPS if kind == "audio" else VIDEO_OPS)
    pipeline = compile_read_ops(ops, {kind: "bytes"})[0][kind]
    index = np.arange(first, stop)
    out = pipeline.run(_BLOBS[first:stop], bytes(16), index, lambda i, m: m)
    return len(out)


def _limit(kind: str, directory: Path) -> dict[str, float]:
    from concurrent.futures import ProcessPoolExecutor

    count = len(list((directory / f"{kind}_files").iterdir()))
    jobs = [(kind, i, min(count, i + 8)) for i in range(0, count, 8)]
    out: dict[str, float] = {}
    with ProcessPoolExecutor(2, initializer=_load_blobs, initargs=(kind, str(directory))) as pool:
        list(pool.map(_decode_chunk, jobs[:2]))  # start the workers before the clock
        for label in ("cold", "warm"):
            start = time.perf_counter()
            out[f"{label}_clips"] = sum(pool.map(_decode_chunk, jobs))
            out[f"{label}_s"] = time.perf_counter() - start
    return out


def run_one(name: str, directory: Path) -> dict[str, float]:
    import torch

    from spark_dl_core import open_dataset

    kind = name.split("_")[0]
    if name.endswith("_limit"):
        return _limit(kind, directory)
    if name.endswith(("_ours", "_prepared")):
        ops = AUDIO_OPS if kind == "audio" else VIDEO_OPS
        stored = kind if name.endswith("_ours") else f"{kind}_prepared"
        ds = open_dataset(str(directory / stored))
        loader: Any = ds.to_torch(batch_size=BATCH, shuffle=True, transforms=ops, num_workers=2)
    else:
        files = sorted((directory / f"{kind}_files").iterdir())
        dataset = AudioFiles(files) if kind == "audio" else VideoFiles(files)
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=2)
    out: dict[str, float] = {}
    for label in ("cold", "warm"):
        start = time.perf_counter()
        clips = 0
        for batch in loader:
            value = batch[kind] if isinstance(batch, dict) else batch
            clips += value.size(0)
        out[f"{label}_s"] = time.perf_counter() - start
        out[f"{label}_clips"] = clips
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, Path(args.dir))))
        return
    directory = Path(tempfile.gettempdir()) / "spark-dl-media-bench"
    directory.mkdir(parents=True, exist_ok=True)
    make_data(directory)
    one_off = prepare(directory)
    names = ["audio_ours", "audio_files", "audio_limit", "video_ours", "video_files", "video_limit"]
    names += ["audio_prepared", "video_prepared"]
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else list(reversed(names)):
            cmd = [sys.executable, __file__, "--one", name, "--dir", str(directory)]
            env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
            if out.returncode:
                raise RuntimeError(f"{name} failed:\n{out.stderr[-3000:]}")
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    rate = {
        name: {
            label: statistics.median(g[f"{label}_clips"] / g[f"{label}_s"] for g in got)
            for label in ("cold", "warm")
        }
        for name, got in runs.items()
    }
    print(f"\nclips/s, medians of {args.rounds} rounds, fresh process each")
    for name, r in rate.items():
        print(f"{name:14} cold {r['cold']:9,.0f}   warm {r['warm']:9,.0f}")
    for kind in ("audio", "video"):
        ours, files = rate[f"{kind}_ours"], rate[f"{kind}_files"]
        limit = rate[f"{kind}_limit"]["warm"]
        print(
            f"{kind}: ours / files  cold {ours['cold'] / files['cold']:.2f}x  "
            f"warm {ours['warm'] / files['warm']:.2f}x (target >= 1.5x)   "
            f"ceiling: limit / files {limit / files['warm']:.2f}x, "
            f"ours / limit {ours['warm'] / limit:.2f}"
        )
    for kind in ("audio", "video"):
        prepared, files = rate[f"{kind}_prepared"], rate[f"{kind}_files"]
        print(
            f"{kind} prepared at write time (one-off cost: {one_off[kind]:.1f} s, write_mds in "
            f"one process): prepared / files  cold {prepared['cold'] / files['cold']:.2f}x  "
            f"warm {prepared['warm'] / files['warm']:.2f}x (the files are the originals)"
        )


if __name__ == "__main__":
    main()
