"""Image ops on video frames: one crop box and flip per clip, normalize, to_chw, refusals."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from media_helpers import _where_plain

from spark_dl_core import SpecError, open_dataset, write_mds

pytest.importorskip("soundfile")
av = pytest.importorskip("av")


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
