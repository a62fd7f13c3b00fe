"""The read-time image pipeline (issue #9): ops, reproducible crops, one decode, errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image

from spark_dl_core import DatasetSpec, open_dataset, write_mds
from spark_dl_core.errors import SpecError
from spark_dl_core.media import image_decode
from spark_dl_core.media import images as image_module
from spark_dl_core.media.images import ImageError, ImagePipeline, decode_image, plan_boxes
from spark_dl_core.ops.transforms import RandomResizedCrop, parse_transforms

N = 48
TRAIN = [
    {"op": "image_decode", "column": "image"},
    {"op": "random_resized_crop", "column": "image", "size": 32},
    {"op": "horizontal_flip", "column": "image", "p": 0.5},
]


def _jpeg(w: int, h: int, seed: int, quality: int = 90) -> bytes:
    rng = np.random.default_rng(seed)
    # smooth content with a gradient: the pixel values say where a crop came from
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None, None]
    base = np.concatenate([np.broadcast_to(x, (h, w, 1)), np.broadcast_to(y, (h, w, 1))], axis=2)
    blue = np.full((h, w, 1), float(rng.integers(0, 255)), np.float32)
    pixels = np.concatenate([base, blue], axis=2).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def _table(n: int = N) -> pa.Table:
    sizes = [(64 + 8 * (i % 5), 48 + 4 * (i % 7)) for i in range(n)]
    return pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "image": pa.array([_jpeg(w, h, i) for i, (w, h) in enumerate(sizes)], pa.binary()),
            "caption": pa.array([f"image {i}" for i in range(n)]),
            "label": np.arange(n, dtype=np.int64) % 3,
        }
    )


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("images") / "ds"
    write_mds(_table(), str(path), DatasetSpec(columns={"image": "jpeg"}, shard_size="32KiB"))
    return path


def _by_id(batches: Any) -> dict[int, np.ndarray]:
    out = {}
    for b in batches:
        for i, image in zip(b["id"].tolist(), b["image"]):
            out[i] = np.asarray(image)
    return out


def test_ops_as_dicts_give_one_uint8_batch(written: Path) -> None:
    ds = open_dataset(written)
    assert ds.num_shards > 1
    batches = list(ds.to_torch(batch_size=16, transforms=TRAIN))
    assert len(batches) == 3
    for b in batches:
        assert b["image"].dtype == torch.uint8 and b["image"].shape == (16, 32, 32, 3)


def test_normalize_and_to_chw_make_float32_nchw(written: Path) -> None:
    ops = [
        {"op": "image_decode", "column": "image"},
        {"op": "resize", "column": "image", "size": 40},
        {"op": "center_crop", "column": "image", "size": [24, 30]},
        {"op": "normalize", "column": "image", "mean": [0.5, 0.5, 0.5], "std": [0.25] * 3},
        {"op": "to_chw", "column": "image"},
    ]
    ds = open_dataset(written)
    (b, *_) = list(ds.to_torch(batch_size=16, transforms=ops))
    assert b["image"].dtype == torch.float32 and b["image"].shape == (16, 3, 24, 30)
    assert float(b["image"].min()) >= -2.01 and float(b["image"].max()) <= 2.01


NORM = {"op": "normalize", "column": "image", "mean": [0.485, 0.456, 0.406]}
NORM["std"] = [0.229, 0.224, 0.225]
CHW = {"op": "to_chw", "column": "image"}


@pytest.mark.parametrize(
    "extra",
    [[NORM], [NORM, CHW], [CHW], [{**NORM, "mean": 0.5, "std": 0.25}, CHW]],
    ids=["normalize", "normalize-chw", "chw", "scalar-normalize-chw"],
)
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_worker_normalized_batches_are_written_into_shared_memory(
    extra: list[dict[str, Any]], mode: str
) -> None:
    """In a DataLoader worker a normalized (or channels-first) image batch is written into
    the worker's shared memory and sent as that tensor, with the values of the whole-array
    expression: a batch in private memory is copied into a fresh shared segment when sent
    (8-12 ms a tensor), and building it took 70-100 ms of CPU for 64 images of 224 px."""
    from spark_dl_core.loaders.torch_loader.shared import _shared_bytes
    from spark_dl_core.loaders.torch_loader.tensors import to_tensors

    if mode == "L" and extra[0]["op"] == "normalize" and isinstance(extra[0]["mean"], list):
        extra = [{**extra[0], "mean": [0.5], "std": [0.25]}, *extra[1:]]
    raws = [_jpeg(64 + 8 * i, 48 + 4 * i, i) for i in range(5)]
    decode = {**TRAIN[0], "mode": mode}
    ops = parse_transforms([decode, *TRAIN[1:], *extra])
    pipeline = ImagePipeline.from_op(ops[0], "image")
    for op in ops[1:]:
        pipeline.add(op)
    plain = ImagePipeline.from_op(ops[0], "image")
    for op in ops[1:3]:
        plain.add(op)
    index, key, where = np.arange(5), b"n" * 16, lambda i, m: m
    pixels = plain.run(raws, key, index, where)  # uint8 [B, H, W, C]
    want = pixels
    if pipeline.normalize is not None:
        mean = np.asarray(pipeline.normalize.mean, np.float32) * np.float32(255)
        std = np.asarray(pipeline.normalize.std, np.float32) * np.float32(255)
        want = (pixels.astype(np.float32) - mean) / std
    if pipeline.chw:
        want = np.ascontiguousarray(want.transpose(0, 3, 1, 2))
    private = pipeline.run(raws, key, index, where)
    shared = pipeline.run(raws, key, index, where, _shared_bytes)
    for got in (private, shared):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)  # bit for bit
    tensor = to_tensors({"image": shared})["image"]
    assert tensor.is_shared() and tensor.data_ptr() == shared.ctypes.data  # nothing to copy
    assert tensor.is_contiguous()


def test_normalized_batches_from_workers_equal_in_process_ones(written: Path) -> None:
    """Normalized channels-first batches from 2 workers (in their reused shared memory)
    equal the in-process ones, batches kept or dropped."""
    ds = open_dataset(written)
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "seed": 5}
    kw["transforms"] = [*TRAIN, NORM, CHW]
    want = _by_id(ds.to_torch(num_workers=0, **kw))
    kept = list(ds.to_torch(num_workers=2, **kw))
    assert kept[0]["image"].dtype == torch.float32 and kept[0]["image"].shape == (4, 3, 32, 32)
    got = _by_id(kept)
    for b in ds.to_torch(num_workers=2, **kw):
        got.update({i: image.copy() for i, image in _by_id([b]).items()})
        del b
    assert sorted(got) == sorted(want) == list(range(N))
    for i in range(N):
        np.testing.assert_array_equal(got[i], want[i])


def test_grayscale_and_exact_resize(written: Path) -> None:
    ops = [
        {"op": "image_decode", "column": "image", "mode": "L"},
        {"op": "resize", "column": "image", "size": [20, 10]},
    ]
    (b, *_) = list(open_dataset(written).iter_batches(batch_size=8, transforms=ops))
    assert b["image"].shape == (8, 20, 10, 1) and b["image"].dtype == np.uint8


def test_same_crops_on_any_worker_count_world_size_and_resume(written: Path) -> None:
    ds = open_dataset(written)
    kw: dict[str, Any] = {"batch_size": 8, "shuffle": True, "seed": 5, "transforms": TRAIN}
    one = _by_id(ds.to_torch(num_workers=0, **kw))
    two = _by_id(ds.to_torch(num_workers=2, **kw))
    ranks: dict[int, np.ndarray] = {}
    for rank in range(2):
        ranks.update(_by_id(ds.to_torch(rank=rank, world_size=2, **kw)))
    assert sorted(one) == list(range(N))
    for i in range(N):
        np.testing.assert_array_equal(one[i], two[i])
        np.testing.assert_array_equal(one[i], ranks[i])
    loader = ds.to_torch(**kw)
    it = iter(loader)
    first = _by_id([next(it), next(it)])
    state = loader.state_dict()
    del it
    resumed = ds.to_torch(**kw)
    resumed.load_state_dict(state)
    rest = _by_id(resumed)
    assert set(first).isdisjoint(rest) and len(first) + len(rest) == N
    for i, image in {**first, **rest}.items():
        np.testing.assert_array_equal(image, one[i])
    other_epoch = ds.to_torch(epoch=1, **kw)
    assert any(not np.array_equal(one[i], image) for i, image in _by_id(other_epoch).items())


def test_each_sample_is_decoded_once(written: Path) -> None:
    ds = open_dataset(written)
    before = image_decode.decode_count()
    seen = sum(len(b["id"]) for b in ds.to_torch(batch_size=10, transforms=TRAIN))
    assert seen == N
    assert image_decode.decode_count() - before == N


def test_reduced_scale_decode_when_the_target_is_smaller() -> None:
    raw = _jpeg(640, 480, 0)
    assert decode_image(raw, "RGB").shape == (480, 640, 3)
    small = decode_image(raw, "RGB", at_least=(100, 100))
    assert small.shape[0] >= 100 and small.shape[1] >= 100 and small.shape[0] <= 240
    pipeline = ImagePipeline(
        "image", geometry=parse_transforms([{"op": "resize", "column": "image", "size": [60, 80]}])
    )
    plan = pipeline.plan([raw], b"k" * 32, np.array([0]), lambda i, m: m)
    out = pipeline.run_cpu([raw], plan, lambda i, m: m)
    full = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB").resize((80, 60), Image.BILINEAR))
    assert out.shape == (1, 60, 80, 3)
    assert np.abs(out[0].astype(int) - full.astype(int)).mean() < 4


def test_corrupt_image_names_column_shard_and_sample(tmp_path: Path) -> None:
    table = _table(12)
    images = table.column("image").to_pylist()
    images[7] = images[7][:200]  # truncated JPEG
    table = table.set_column(1, "image", pa.array(images, pa.binary()))
    write_mds(table, str(tmp_path / "bad"), DatasetSpec(columns={"image": "jpeg"}))
    ds = open_dataset(tmp_path / "bad")
    pattern = r"column 'image', shard '.*shard\.00000\.mds', sample 7"
    with pytest.raises(ImageError, match=pattern):
        list(ds.to_torch(batch_size=4, transforms=TRAIN))
    with pytest.raises(ImageError, match=pattern):  # across the worker boundary too
        list(ds.to_torch(batch_size=4, transforms=TRAIN, num_workers=1))


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ([{"op": "image_decode", "column": "picture"}], "image_decode names column 'picture'"),
        (
            [{"op": "normalize", "column": "caption", "mean": 0.5, "std": 0.2}],
            "normalize on column 'caption': it holds 'str'",
        ),
        (
            [{"op": "image_decode", "column": "caption"}],
            "image_decode on column 'caption': it stores 'str'",
        ),
        (
            [{"op": "resize", "column": "image", "size": 8}],
            "resize on column 'image' needs an image_decode",
        ),
        ([{"op": "flip", "column": "image"}], "unknown transform op 'flip'"),
        (
            [{"op": "random_resized_crop", "column": "image", "size": 0}],
            "random_resized_crop on column 'image' is not valid: random_resized_crop.size: .*>= 1",
        ),
        (
            [{"op": "center_crop", "column": "image", "size": -4}],
            "center_crop on column 'image' is not valid: center_crop.size: .*>= 1",
        ),
        (
            [{"op": "random_resized_crop", "column": "image", "size": 8, "scale": [1, 0.5]}],
            "random_resized_crop on column 'image' is not valid: .*scale: .*low <= high",
        ),
        (
            [{"op": "random_resized_crop", "column": "image", "size": 8, "ratio": [0, 1]}],
            "random_resized_crop on column 'image' is not valid: random_resized_crop.ratio",
        ),
    ],
)
def test_bad_ops_are_refused_before_any_data_is_read(
    written: Path, monkeypatch: pytest.MonkeyPatch, ops: list[dict[str, Any]], message: str
) -> None:
    ds = open_dataset(written)

    def no_reads(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("data was read")

    monkeypatch.setattr(type(ds), "load_shard", no_reads)
    with pytest.raises(SpecError, match=message):
        ds.to_torch(batch_size=4, transforms=ops)
    with pytest.raises(SpecError, match=message):
        ds.to_tf(batch_size=4, transforms=ops)


def test_tf_gets_the_same_pipeline(written: Path) -> None:
    ds = open_dataset(written)
    tfds = ds.to_tf(batch_size=16, columns=["id", "image"], transforms=TRAIN)
    got = {}
    for b in tfds:
        assert b["image"].shape[1:] == (32, 32, 3) and b["image"].dtype.name == "uint8"
        got.update(zip(b["id"].numpy().tolist(), b["image"].numpy()))
    ours = _by_id(ds.iter_batches(batch_size=16, transforms=TRAIN))
    for i in range(N):
        np.testing.assert_array_equal(got[i], ours[i])


def test_cuda_without_a_gpu_is_a_clear_error(written: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(SpecError, match="device='cuda', but torch sees no CUDA device"):
        open_dataset(written).to_torch(batch_size=4, transforms=TRAIN, device="cuda")


def test_cpu_and_device_paths_share_crop_boxes() -> None:
    """The plan is computed once; the torch (GPU) path executes the same boxes and flips."""
    raws = [_jpeg(96, 64, i) for i in range(6)]
    pipeline = ImagePipeline(
        "image",
        geometry=[
            RandomResizedCrop(column="image", size=24, scale=(0.3, 0.9)),
            *parse_transforms([{"op": "horizontal_flip", "column": "image", "p": 0.5}]),
        ],
    )
    plan = pipeline.plan(raws, b"s" * 32, np.arange(6), lambda i, m: m)
    again = plan_boxes(plan.sources, pipeline.geometry, b"s" * 32, np.arange(6))
    np.testing.assert_array_equal(plan.boxes, again.boxes)
    assert plan.flips.any() and not plan.flips.all()
    cpu = pipeline.run_cpu(raws, plan, lambda i, m: m)
    decoded = [
        torch.from_numpy(np.asarray(Image.open(io.BytesIO(r)).convert("RGB")).copy()).permute(
            2, 0, 1
        )
        for r in raws
    ]
    device = pipeline.transform_tensors(decoded, plan).numpy()
    assert device.shape == cpu.shape == (6, 24, 24, 3)
    # Same boxes and flips: the gradient images agree up to resampling differences.
    assert np.abs(device.astype(int) - cpu.astype(int)).mean() < 6


def test_write_time_reencode_to_a_maximum_side(tmp_path: Path) -> None:
    small, big = _jpeg(60, 40, 1), _jpeg(400, 300, 2)
    table = pa.table({"image": pa.array([small, big], pa.binary())})
    spec = DatasetSpec(
        columns={"image": "jpeg"},
        transforms=[{"op": "reencode_image", "column": "image", "max_side": 100, "quality": 80}],
    )
    write_mds(table, str(tmp_path / "w"), spec)
    (b,) = list(open_dataset(tmp_path / "w").iter_batches(batch_size=2))
    assert b["image"][0] == small  # already small enough: bytes untouched
    assert Image.open(io.BytesIO(b["image"][1])).size == (100, 75)


@pytest.mark.parametrize("cut", ["truncated", "garbage"])
def test_reencode_image_of_an_undecodable_image_names_column_and_row(
    tmp_path: Path, cut: str
) -> None:
    """It raised SpecError where reencode_audio / reencode_video raise ReencodeError."""
    from spark_dl_core.errors import EncodingError, ReencodeError

    big = _jpeg(400, 300, 2)
    bad = big[: len(big) // 2] if cut == "truncated" else b"\xff\xd8 not an image at all"
    table = pa.table({"image": pa.array([big, big, bad], pa.binary())})
    op = {"op": "reencode_image", "column": "image", "max_side": 100}
    with pytest.raises(ReencodeError, match=r"column 'image'.*does not decode.*row 2 of the data"):
        write_mds(table, str(tmp_path / "w"), DatasetSpec(transforms=[op]))
    assert issubclass(ReencodeError, EncodingError)


def test_spark_write_reencodes_in_the_executors(classic_spark: Any, tmp_path: Path) -> None:
    import spark_dl

    spark_dl.register(classic_spark)
    df = classic_spark.createDataFrame(
        [(i, _jpeg(300 + 10 * i, 200, i)) for i in range(4)], "id long, image binary"
    )
    spec = {
        "columns": {"image": "jpeg"},
        "transforms": [{"op": "reencode_image", "column": "image", "max_side": 64}],
    }
    path = str(tmp_path / "spark")
    df.write.format("mds").option("spec", json.dumps(spec)).save(path)
    ds = open_dataset(path)
    for b in ds.iter_batches(batch_size=4):
        for raw in b["image"]:
            assert max(Image.open(io.BytesIO(raw)).size) == 64


@pytest.mark.parametrize("workers", [0, 1])
def test_decode_only_gives_a_list_of_images_in_every_batch(written: Path, workers: int) -> None:
    """No size-fixing op: always a list of [H, W, C] tensors, whatever sizes a batch holds."""
    ds = open_dataset(written)
    want = {i: raw for i, raw in enumerate(_table().column("image").to_pylist())}
    for b in ds.to_torch(batch_size=5, num_workers=workers, transforms=TRAIN[:1]):
        assert isinstance(b["image"], list) and len(b["image"]) == len(b["id"])
        for i, image in zip(b["id"].tolist(), b["image"]):
            full = np.asarray(Image.open(io.BytesIO(want[i])).convert("RGB"))
            assert image.dtype == torch.uint8 and tuple(image.shape) == full.shape
            assert np.abs(image.numpy().astype(int) - full.astype(int)).mean() < 2
    (numpy_batch, *_) = list(ds.iter_batches(batch_size=5, transforms=TRAIN[:1]))
    assert numpy_batch["image"].dtype == object and numpy_batch["image"][0].ndim == 3


def _segment(tensor: torch.Tensor) -> int:
    """The shared-memory segment (inode) a worker's tensor lies in, seen from here."""
    import os

    fd, _ = tensor.untyped_storage()._share_fd_cpu_()
    return os.fstat(fd).st_ino


@pytest.mark.parametrize("ops", [TRAIN, TRAIN[:1]], ids=["crop", "decode-only"])
def test_worker_buffers_are_reused_only_once_dropped(written: Path, ops: Any) -> None:
    """Workers decode into shared memory they reuse once the main process has freed every
    tensor over it: batches the user keeps are never overwritten."""
    ds = open_dataset(written)
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "seed": 3, "transforms": ops}
    want = _by_id(ds.to_torch(num_workers=0, **kw))

    def flat(batch: dict[str, Any]) -> torch.Tensor:
        image = batch["image"]
        return image if isinstance(image, torch.Tensor) else image[0]

    kept = list(ds.to_torch(num_workers=2, **kw))  # every batch held: nothing reused
    assert len({_segment(flat(b)) for b in kept}) == len(kept) == N // 4
    got = _by_id(kept)
    seen = set()
    for b in ds.to_torch(num_workers=2, **kw):  # each batch dropped after use
        seen.add(_segment(flat(b)))
        got.update({i: image.copy() for i, image in _by_id([b]).items()})
        del b
    assert len(seen) < N // 4  # segments came back and were decoded into again
    for i in range(N):
        np.testing.assert_array_equal(got[i], want[i])


def _center_crop_reference(image: np.ndarray, size: Any, fill: int = 0) -> np.ndarray:
    """torchvision's ``F.center_crop``: sides larger than the image padded with ``fill``
    ((crop - side) // 2 before, the rest after), then the crop at round((side - crop) / 2)."""
    ch, cw = (size, size) if isinstance(size, int) else size
    h, w = image.shape[:2]
    if cw > w or ch > h:
        left, top = max(cw - w, 0) // 2, max(ch - h, 0) // 2
        right, bottom = (max(cw - w, 0) + 1) // 2, (max(ch - h, 0) + 1) // 2
        image = np.pad(image, ((top, bottom), (left, right), (0, 0)), constant_values=fill)
        h, w = image.shape[:2]
    y, x = round((h - ch) / 2), round((w - cw) / 2)
    return image[y : y + ch, x : x + cw]


def _png(w: int, h: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize("kind", ["jpeg", "png"])
@pytest.mark.parametrize(
    ("w", "h", "size", "fill"),
    [(60, 40, 128, 0), (60, 40, (30, 100), 7), (61, 41, (128, 50), 255), (100, 80, 64, 0)],
)
def test_center_crop_larger_than_the_image_pads_as_torchvision(
    kind: str, w: int, h: int, size: Any, fill: int
) -> None:
    raw = _jpeg(w, h, 1) if kind == "jpeg" else _png(w, h, 1)
    decoded = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))
    want = _center_crop_reference(decoded, size, fill)
    ops = parse_transforms([{"op": "center_crop", "column": "image", "size": size, "fill": fill}])
    pipeline = ImagePipeline("image", geometry=ops)
    plan = pipeline.plan([raw, raw], b"s" * 32, np.arange(2), lambda i, m: m)
    cpu = pipeline.run_cpu([raw, raw], plan, lambda i, m: m)
    np.testing.assert_array_equal(cpu[0], want)  # no resampling: the very pixels, padded
    tensor = torch.from_numpy(decoded.copy()).permute(2, 0, 1)
    device = pipeline.transform_tensors([tensor, tensor], plan).numpy()
    np.testing.assert_array_equal(device[1], want)


def test_padded_crops_through_resize_and_flip_in_a_loader(tmp_path: Path) -> None:
    """A small image under resize + center_crop + flip: padding, mirrored, never stretched."""
    raws = [_jpeg(40, 30, i) for i in range(4)]
    write_mds(
        pa.table({"image": pa.array(raws)}), str(tmp_path), DatasetSpec(columns={"image": "jpeg"})
    )
    ops = [
        {"op": "image_decode", "column": "image"},
        {"op": "resize", "column": "image", "size": 60},  # 80 x 60
        {"op": "center_crop", "column": "image", "size": 100},
        {"op": "horizontal_flip", "column": "image", "p": 1.0},
    ]
    (batch,) = open_dataset(tmp_path).to_torch(batch_size=4, transforms=ops, num_workers=1)
    images = batch["image"].numpy()
    assert images.shape == (4, 100, 100, 3)
    assert not images[:, :20].any() and not images[:, 80:].any()  # rows 20..79 hold the image
    assert not images[:, :, :10].any() and not images[:, :, 90:].any()  # columns 10..89
    resized = np.asarray(
        Image.open(io.BytesIO(raws[0])).convert("RGB").resize((80, 60), Image.BILINEAR)
    )
    inside = images[0, 20:80, 10:90].astype(int)
    assert np.abs(inside - resized[:, ::-1]).mean() < 3  # the image itself, mirrored


def test_image_pipelines_warn_nothing() -> None:
    """PIL decodes to read-only arrays; torch would warn on every worker's first batch."""
    code = (
        "import io, numpy as np, warnings\n"
        "from PIL import Image\n"
        "from spark_dl_core.media.images import ImagePipeline\n"
        "from spark_dl_core.ops.transforms import parse_transforms\n"
        "warnings.simplefilter('error')\n"
        "out = io.BytesIO()\n"
        "Image.fromarray(np.zeros((40, 50, 3), np.uint8)).save(out, format='PNG')\n"
        "raws = [out.getvalue()]\n"
        "ops = parse_transforms([{'op': 'center_crop', 'column': 'i', 'size': 20}])\n"
        "pipeline = ImagePipeline('i', geometry=ops)\n"
        "plan = pipeline.plan(raws, b's' * 32, np.arange(1), None)\n"
        "pipeline.run_cpu(raws, plan, None)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and "Warning" not in proc.stderr, proc.stderr[-2000:]


def test_cmyk_jpegs_decode_as_pil_does(tmp_path: Path) -> None:
    pixels = np.random.default_rng(3).integers(0, 256, (40, 48, 4), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "CMYK").save(out, format="JPEG", quality=95)
    raw = out.getvalue()
    for mode in ("RGB", "L"):
        want = np.asarray(Image.open(io.BytesIO(raw)).convert(mode))
        got = decode_image(raw, mode)
        np.testing.assert_array_equal(got.reshape(want.shape), want)
    rgb = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))
    write_mds(
        pa.table({"image": pa.array([raw] * 2)}),
        str(tmp_path),
        DatasetSpec(columns={"image": "jpeg"}),
    )
    ops = [
        {"op": "image_decode", "column": "image"},
        {"op": "center_crop", "column": "image", "size": 20},
    ]
    (batch,) = open_dataset(tmp_path).iter_batches(batch_size=2, transforms=ops)
    np.testing.assert_array_equal(batch["image"][1], rgb[10:30, 14:34])
    (whole,) = open_dataset(tmp_path).iter_batches(batch_size=2, transforms=ops[:1])
    np.testing.assert_array_equal(whole["image"][0], rgb)


@pytest.mark.parametrize("exact", [False, True])
def test_exif_orientation_is_not_applied(exact: bool, tmp_path: Path) -> None:
    """As torchvision's ``decode_jpeg`` (``apply_exif_orientation=False``): a phone photo
    stored landscape with "rotate 90" in its EXIF decodes as stored (docs/images.md)."""
    pixels = np.zeros((20, 40, 3), np.uint8)
    pixels[:, :20] = 255  # left half white, as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", exif=exif.tobytes(), quality=95)
    path = str(tmp_path / "exif")
    write_mds(pa.table({"image": pa.array([out.getvalue()])}), path, {"columns": {"image": "jpeg"}})
    op = {"op": "image_decode", "column": "image", "exact": exact}
    batch = next(open_dataset(path).iter_batches(batch_size=1, transforms=[op]))
    image = np.asarray(batch["image"][0])
    assert image.shape == (20, 40, 3)
    assert image[:, :15].mean() > 200 and image[:, 25:].mean() < 50


def _segment_end(raw: bytes, marker: int) -> int:
    """Where the header segment ``0xFF marker`` of a JPEG ends."""
    at = raw.index(bytes([0xFF, marker]))
    return at + 2 + int.from_bytes(raw[at + 2 : at + 4], "big")


def _warning_jpegs() -> dict[str, bytes]:
    """A PIL-written JPEG and copies edited so libjpeg warns (junk bytes before a marker)
    or reads an ICC profile's APP2 segment after SOF; PIL decodes all to the same pixels."""
    pixels = np.random.default_rng(5).integers(0, 256, (44, 60, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    raw = out.getvalue()
    from PIL import ImageCms

    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    app2 = b"ICC_PROFILE\x00\x01\x01" + icc
    app2 = b"\xff\xe2" + (len(app2) + 2).to_bytes(2, "big") + app2
    dqt, sof, eoi = raw.index(b"\xff\xdb"), _segment_end(raw, 0xC0), raw.rindex(b"\xff\xd9")
    return {
        "clean": raw,
        "junk before DQT": raw[:dqt] + b"\x12\x34" + raw[dqt:],
        "junk before EOI": raw[:eoi] + b"\x00\x01\x02" + raw[eoi:],
        "ICC after SOF": raw[:sof] + app2 + raw[sof:],
    }


JPEG_PATHS = {
    "decode only": [{"op": "image_decode", "column": "image"}],
    "crop": [
        {"op": "image_decode", "column": "image"},
        {"op": "center_crop", "column": "image", "size": [20, 28]},
    ],
    "resize": [
        {"op": "image_decode", "column": "image"},
        {"op": "resize", "column": "image", "size": [22, 30]},
    ],
    "exact": [
        {"op": "image_decode", "column": "image", "exact": True},
        {"op": "center_crop", "column": "image", "size": 24},
    ],
    "exact decode only": [{"op": "image_decode", "column": "image", "exact": True}],
}


@pytest.mark.parametrize("extension", [True, False])
def test_jpegs_with_harmless_libjpeg_warnings_decode_on_every_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extension: bool
) -> None:
    """Warnings are not errors, as in PIL: such files gave pixels through the crop path
    (the C extension) but ImageError through decode-only and exact=True (simplejpeg)."""
    if not extension:  # a build without the optional C extension: simplejpeg, then PIL
        from spark_dl_core.media import image_codec

        monkeypatch.setattr(image_module, "_jpeg", None)

        monkeypatch.setattr(image_decode, "_jpeg", None)
        monkeypatch.setattr(image_codec, "jpeg_ext", None)
    raws = _warning_jpegs()
    want = np.asarray(Image.open(io.BytesIO(raws["clean"])).convert("RGB"))
    for raw in raws.values():  # the edits change no pixel of PIL's decode
        np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(raw)).convert("RGB")), want)
    write_mds(pa.table({"image": list(raws.values())}), str(tmp_path), mode="overwrite")
    for path, ops in JPEG_PATHS.items():
        (batch,) = open_dataset(tmp_path).iter_batches(batch_size=len(raws), transforms=ops)
        for i, name in enumerate(raws):  # same boxes: every sample has the same size
            np.testing.assert_array_equal(batch["image"][i], batch["image"][0], f"{path}: {name}")
        crops = {"crop": want[12:32, 16:44], "exact": want[10:34, 18:42]}
        expected = want if path.endswith("decode only") else crops.get(path)
        if expected is not None:  # resize: resampled, compared with the clean file above
            np.testing.assert_array_equal(batch["image"][0], expected, path)


@pytest.mark.parametrize("extension", [True, False])
def test_corrupt_jpegs_still_fail_on_every_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extension: bool
) -> None:
    if not extension:
        from spark_dl_core.media import image_codec

        monkeypatch.setattr(image_module, "_jpeg", None)

        monkeypatch.setattr(image_decode, "_jpeg", None)
        monkeypatch.setattr(image_codec, "jpeg_ext", None)
    raw = _warning_jpegs()["junk before EOI"]
    scan = _segment_end(raw, 0xDA)
    garbage = b"\xff\xd8" + np.random.default_rng(1).integers(0, 256, 600, np.uint8).tobytes()
    truncated = raw[: (scan + len(raw)) // 2]  # cut in the middle of the entropy data
    for bad in (truncated, garbage):
        write_mds(pa.table({"image": [raw, bad]}), str(tmp_path), mode="overwrite")
        for ops in JPEG_PATHS.values():
            with pytest.raises(ImageError, match=r"column 'image', shard '.*', sample 1"):
                list(open_dataset(tmp_path).iter_batches(batch_size=2, transforms=ops))


@pytest.mark.parametrize("twice", ["to_chw", "normalize"])
def test_an_op_the_pipeline_takes_once_is_refused_twice(written: Path, twice: str) -> None:
    """A second to_chw was accepted and did nothing; a second normalize replaced the first."""
    op = {"op": twice, "column": "image"}
    if twice == "normalize":
        op |= {"mean": 0.5, "std": 0.25}
    ops = [
        {"op": "image_decode", "column": "image"},
        {"op": "resize", "column": "image", "size": [8, 8]},
        op,
        op,
    ]
    with pytest.raises(SpecError, match=f"{twice} on column 'image' is listed twice"):
        open_dataset(written).iter_batches(batch_size=8, transforms=ops)


def test_columns_naming_no_column_is_refused(written: Path) -> None:
    """columns=[] yielded empty batches; it is refused naming the setting."""
    ds = open_dataset(written)
    for build in (ds.iter_batches, ds.to_torch):
        with pytest.raises(SpecError, match=r"loader setting columns=\[\]: names no column"):
            build(batch_size=8, columns=[])
