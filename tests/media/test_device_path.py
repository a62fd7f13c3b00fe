"""The device image path (``to_torch(device=...)``): workers ship encoded images and their
plan, the main process decodes each batch in one call on the device and runs the plan there.

CI has no GPU, so each test runs twice: on ``cpu``, with the device decode swapped for the
workers' CPU decoder (every line of the device path but the nvjpeg call runs), and on
``cuda`` with nvjpeg where a CUDA device is present (skipped, saying so, where none is).
Both are compared with the worker (CPU) path, which CI covers everywhere else.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image

from spark_dl_core import DatasetSpec, open_dataset, write_mds
from spark_dl_core.loaders import frameworks
from spark_dl_core.loaders.torch_loader import loader as torch_loader_module
from spark_dl_core.ops import registry as op_registry

N = 40
CROP = [
    {"op": "image_decode", "column": "image"},
    {"op": "random_resized_crop", "column": "image", "size": 24},
    {"op": "horizontal_flip", "column": "image", "p": 0.5},
]
FULL = [
    *CROP,
    {"op": "normalize", "column": "image", "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3]},
    {"op": "to_chw", "column": "image"},
]
PADDED = [
    {"op": "image_decode", "column": "image"},
    {"op": "center_crop", "column": "image", "size": 80},  # larger than every image: padded
]
DECODE_ONLY = [{"op": "image_decode", "column": "image"}]

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(
            not torch.cuda.is_available(),
            reason="needs a CUDA device with torchvision's nvjpeg decode (CI has none); "
            "the cpu case runs the same path with the host decoder",
        ),
    ),
]


def _image(w: int, h: int, seed: int, fmt: str) -> bytes:
    """A smooth gradient (so a crop's pixels say where it came from) plus noise."""
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None, None]
    base = np.concatenate([np.broadcast_to(x, (h, w, 1)), np.broadcast_to(y, (h, w, 1))], axis=2)
    blue = np.full((h, w, 1), float(rng.integers(0, 255)), np.float32)
    pixels = np.concatenate([base, blue], axis=2) + rng.normal(0, 2, (h, w, 3))
    out = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(out, format=fmt, quality=92)
    return out.getvalue()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """JPEGs of several sizes, a few PNGs among them (nvjpeg cannot read those)."""
    sizes = [(40 + 8 * (i % 5), 32 + 6 * (i % 4)) for i in range(N)]
    images = [_image(w, h, i, "PNG" if i % 9 == 4 else "JPEG") for i, (w, h) in enumerate(sizes)]
    table = pa.table({"id": np.arange(N, dtype=np.int64), "image": pa.array(images, pa.binary())})
    path = tmp_path_factory.mktemp("device") / "ds"
    write_mds(table, str(path), DatasetSpec(columns={"image": "pil"}, shard_size="24KiB"))
    return path


@pytest.fixture
def on_device(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    """The device a test's loader decodes on; ``cpu`` is routed through the device path."""
    device = request.param
    if device == "cpu":  # check_device keeps "cpu" for the workers; take the device path
        real = torch_loader_module.check_device

        def check(wanted: Any, *args: Any) -> str | None:
            return "cpu" if wanted == "cpu" else real(wanted, *args)

        monkeypatch.setattr(torch_loader_module, "check_device", check)
    return device


def _by_id(loader: Any) -> tuple[list[int], dict[int, Any]]:
    order, images = [], {}
    for batch in loader:
        ids = batch["id"].tolist()
        order += ids
        values = batch["image"]
        for i, image in zip(ids, values if isinstance(values, list) else list(values)):
            images[i] = image
    return order, images


def _loaders(path: Path, device: str, transforms: list[dict], workers: int) -> tuple[Any, Any]:
    ds = open_dataset(path)
    settings = dict(batch_size=8, shuffle=True, seed=3, num_workers=workers, transforms=transforms)
    return ds.to_torch(**settings), ds.to_torch(device=device, **settings)


@pytest.mark.parametrize("on_device", DEVICES, indirect=True)
@pytest.mark.parametrize("workers", [0, 2])
def test_device_crops_match_the_worker_path(written: Path, on_device: str, workers: int) -> None:
    cpu_loader, device_loader = _loaders(written, on_device, CROP, workers)
    cpu_order, cpu = _by_id(cpu_loader)
    order, got = _by_id(device_loader)
    assert order == cpu_order and sorted(order) == list(range(N))
    for i in range(N):
        assert got[i].device.type == on_device and got[i].dtype == torch.uint8
        assert tuple(got[i].shape) == tuple(cpu[i].shape) == (24, 24, 3)
        # Same boxes and flips; the CPU path decodes the box at a reduced DCT scale, so the
        # resampled pixels differ slightly, never by a wrong box or a missed flip.
        diff = (got[i].cpu().int() - cpu[i].int()).abs().float()
        assert diff.mean() < 4, f"sample {i}: mean difference {diff.mean():.2f}"


@pytest.mark.parametrize("on_device", DEVICES, indirect=True)
def test_device_normalize_and_chw(written: Path, on_device: str) -> None:
    cpu_loader, device_loader = _loaders(written, on_device, FULL, 0)
    cpu_batches, batches = list(cpu_loader), list(device_loader)
    assert len(batches) == len(cpu_batches) == N // 8
    for ours, theirs in zip(batches, cpu_batches):
        image = ours["image"]
        assert image.device.type == on_device and image.dtype == torch.float32
        assert tuple(image.shape) == tuple(theirs["image"].shape) == (8, 3, 24, 24)
        assert (image.cpu() - theirs["image"]).abs().mean() < 4 / (255 * 0.2)


@pytest.mark.parametrize("on_device", DEVICES, indirect=True)
def test_device_padded_crop_equals_the_worker_path(written: Path, on_device: str) -> None:
    """No resampling here: a padded center crop is the decoded pixels plus fill, so the
    host decoder gives the same pixels as the workers; nvjpeg differs by IDCT rounding."""
    cpu_loader, device_loader = _loaders(written, on_device, PADDED, 2)
    _, cpu = _by_id(cpu_loader)
    _, got = _by_id(device_loader)
    for i in range(N):
        assert tuple(got[i].shape) == (80, 80, 3)
        ours, theirs = got[i].cpu().int(), cpu[i].int()
        if on_device == "cpu":
            assert torch.equal(ours, theirs), f"sample {i}"
        else:
            assert (ours - theirs).abs().float().mean() < 2, f"sample {i}"


@pytest.mark.parametrize("on_device", DEVICES, indirect=True)
def test_device_decode_only_gives_each_image_its_size(written: Path, on_device: str) -> None:
    """Images of different sizes and no crop: a list of ``[H, W, C]`` tensors, as the
    workers' path gives, JPEG and PNG alike."""
    cpu_loader, device_loader = _loaders(written, on_device, DECODE_ONLY, 0)
    _, cpu = _by_id(cpu_loader)
    _, got = _by_id(device_loader)
    for i in range(N):
        assert tuple(got[i].shape) == tuple(cpu[i].shape)
        diff = (got[i].cpu().int() - cpu[i].int()).abs()
        if on_device == "cpu":
            assert int(diff.max()) == 0, f"sample {i}"
        else:  # nvjpeg upsamples chroma another way: measured mean 1.8-2.1, max 6 on an H200
            assert float(diff.float().mean()) < 3 and int(diff.max()) <= 12, f"sample {i}"


@pytest.mark.parametrize("on_device", DEVICES, indirect=True)
def test_device_path_resumes_exactly(written: Path, on_device: str) -> None:
    ds = open_dataset(written)
    settings = dict(batch_size=4, shuffle=True, seed=5, transforms=CROP, device=on_device)
    whole = [b["id"].tolist() for b in ds.to_torch(**settings)]
    loader = ds.to_torch(**settings)
    seen = []
    for step, batch in enumerate(loader):
        seen.append(batch["id"].tolist())
        if step == 2:
            state = loader.state_dict()
            break
    resumed = ds.to_torch(**settings)
    resumed.load_state_dict(state)
    rest = [b["id"].tolist() for b in resumed]
    assert seen + rest == whole


def test_every_registered_module_imports() -> None:
    """Each module the op and framework registries name exists and registers its names (a
    wrong module path there otherwise fails only on the machine that first uses it)."""
    for op, module in op_registry.IMPLEMENTATION_MODULES.items():
        importlib.import_module(module)
        assert op_registry.implementation(op) is not None, op
    for name, module in frameworks.ADAPTER_MODULES.items():
        if name.startswith("tf"):
            pytest.importorskip("tensorflow")
        importlib.import_module(module)
        assert frameworks.adapter(name) is not None, name


def test_check_device_on_a_cuda_machine_finds_the_decoder(
    written: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check a CUDA machine runs (its decoder lookup once imported from a wrong package),
    run here with torch told a GPU is present."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ds = open_dataset(written)
    check = torch_loader_module.check_device
    ops = [{"op": "image_decode", "column": "image"}]
    if importlib.util.find_spec("torchvision") is not None:
        assert check("cuda", ops, ds) == "cuda"
    else:  # the CPU torch build here has no torchvision: said, and the workers decode
        with pytest.warns(UserWarning, match="torchvision's decode_jpeg is not importable"):
            assert check("cuda", ops, ds) is None
    assert check("cuda:1", None, ds) is None  # nothing decodes there: workers do the rest


@pytest.mark.parametrize("size", [24, 56, 120])  # down 1-5x (beyond the supersampling cap), up
def test_batched_crops_agree_with_the_per_image_resampler(size: int) -> None:
    """One ``grid_sample`` for the batch approximates the per-image antialiased resize: the
    same boxes and flips, values a fraction of a level apart on average (measured on photo-
    like 375-500 px JPEGs: mean 0.2-0.4, upscales exact)."""
    from spark_dl_core.media.image_device import decode_on_host
    from spark_dl_core.media.images import ImagePipeline
    from spark_dl_core.ops.transforms import parse_transforms

    raws = [_image(60 + 7 * i, 50 + 5 * (i % 6), i, "JPEG") for i in range(12)]
    ops = parse_transforms(
        [
            {"op": "random_resized_crop", "column": "image", "size": size},
            {"op": "horizontal_flip", "column": "image", "p": 0.5},
        ]
    )
    pipeline = ImagePipeline("image", geometry=ops)
    plan = pipeline.plan(raws, b"k" * 32, np.arange(12), lambda i, m: m)
    assert plan.flips.any() and not plan.flips.all()
    images = decode_on_host(raws, "RGB", "cpu")
    one_by_one = pipeline.transform_tensors(images, plan, batched=False).int()
    batched = pipeline.transform_tensors(images, plan).int()
    assert batched.shape == one_by_one.shape == (12, size, size, 3)
    diff = (batched - one_by_one).abs().float()
    assert diff.mean() < 1.0 and diff.flatten().quantile(0.99) <= 6
