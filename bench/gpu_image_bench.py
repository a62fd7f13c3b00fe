"""Images decoded on the GPU (``to_torch(device="cuda")``) against the CPU worker path.

A training-shaped image epoch: JPEGs of 375-500 x 333-500 px (photo-like: smooth regions,
edges and noise), ``image_decode`` + ``random_resized_crop 224`` + ``horizontal_flip`` +
``normalize`` + ``to_chw``, batch 128, shuffled, every batch delivered on the GPU. Cases,
each timing a first pass (cold: loader built and workers started inside the clock) and a
second (warm):

- ``gpu_wN``: ``device="cuda"``: N workers read and plan, the main process decodes each batch
  in one nvjpeg call and runs the crops there;
- ``cpu_wN``: the CPU path: N workers decode and crop, the batch then moves to the GPU;
- ``nvjpeg_limit``: torchvision's batched ``decode_jpeg`` alone over preloaded bytes, batch
  128, no crops: the decoder's own rate on this GPU;
- ``crops_per_image`` / ``crops_batched``: the main process's share alone (nvjpeg decode, then
  the crops one image at a time or in one ``grid_sample``) over preloaded bytes.

Usage: ``python bench/gpu_image_bench.py [--images 4000] [--workers 4,12] [--json]``. Needs
torch with CUDA and torchvision; prints images/s and the GPU path's ratio to the CPU path.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torchvision  # noqa: F401  (imported before the clock)
from PIL import Image

from spark_dl_core import DatasetSpec, open_dataset, write_mds

BATCH = 128
OPS = [
    {"op": "image_decode", "column": "image"},
    {"op": "random_resized_crop", "column": "image", "size": 224},
    {"op": "horizontal_flip", "column": "image", "p": 0.5},
    {
        "op": "normalize",
        "column": "image",
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
    },
    {"op": "to_chw", "column": "image"},
]


def photo(seed: int) -> bytes:
    """A photo-like JPEG: low-frequency colour fields, a few hard edges, sensor noise."""
    rng = np.random.default_rng(seed)
    w, h = int(rng.integers(375, 501)), int(rng.integers(333, 501))
    coarse = rng.uniform(0, 255, (6, 8, 3)).astype(np.uint8)
    base = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC), np.float32)
    for _ in range(3):
        x0, y0 = int(rng.integers(0, w - 40)), int(rng.integers(0, h - 40))
        base[y0 : y0 + int(rng.integers(20, 120)), x0 : x0 + int(rng.integers(20, 120))] = (
            rng.uniform(0, 255, 3)
        )
    pixels = (base + rng.normal(0, 6, base.shape)).clip(0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=88)
    return out.getvalue()


def make(directory: Path, count: int) -> Path:
    path = directory / "images"
    with multiprocessing.Pool() as pool:
        images = pool.map(photo, range(count), chunksize=64)
    table = pa.table(
        {"label": np.arange(count, dtype=np.int64) % 1000, "image": pa.array(images, pa.binary())}
    )
    write_mds(table, str(path), DatasetSpec(columns={"image": "jpeg"}, shard_size="32MiB"))
    return path


def run_pass(loader: Any) -> tuple[int, float]:
    start, seen = time.perf_counter(), 0
    for batch in loader:
        image = batch["image"]
        if image.device.type != "cuda":
            image = image.to("cuda", non_blocking=True)
        seen += int(image.shape[0])
    torch.cuda.synchronize()
    return seen, time.perf_counter() - start


def case(path: Path, workers: int, device: str | None) -> dict[str, float]:
    start = time.perf_counter()
    ds = open_dataset(path)
    loader = ds.to_torch(
        batch_size=BATCH,
        shuffle=True,
        seed=0,
        num_workers=workers,
        transforms=OPS,
        device=device,
        pin_memory=device is None,
    )
    seen, first = run_pass(loader)
    cold = time.perf_counter() - start
    loader.set_epoch(1)
    seen, warm = run_pass(loader)
    return {"cold_img_s": seen / cold, "warm_img_s": seen / warm, "first_pass_s": first}


def nvjpeg_limit(path: Path) -> dict[str, float]:
    from torchvision.io import decode_jpeg

    raws = [
        torch.frombuffer(bytearray(b), dtype=torch.uint8)
        for b in open_dataset(path).to_arrow().column("image").to_pylist()
    ]
    decode_jpeg(raws[:BATCH], device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for at in range(0, len(raws), BATCH):
        decode_jpeg(raws[at : at + BATCH], device="cuda")
    torch.cuda.synchronize()
    return {"warm_img_s": len(raws) / (time.perf_counter() - start)}


def stage_rates(path: Path) -> dict[str, dict[str, float]]:
    """The main process's share of the device path on preloaded bytes: nvjpeg decode, then
    the crops one image at a time or batched (no workers, no I/O)."""
    from spark_dl_core.media.image_device import decode_with_nvjpeg
    from spark_dl_core.media.images import ImagePipeline
    from spark_dl_core.ops.transforms import parse_transforms

    ops = parse_transforms(OPS)
    pipeline = ImagePipeline("image", geometry=ops[1:3])
    raws = open_dataset(path).to_arrow().column("image").to_pylist()
    batches = [raws[at : at + BATCH] for at in range(0, len(raws) - BATCH + 1, BATCH)]
    plans = [pipeline.plan(b, b"k" * 32, np.arange(len(b)), lambda i, m: m) for b in batches]
    out = {}
    for name, batched in (("crops_per_image", False), ("crops_batched", True)):
        pipeline.transform_tensors(
            decode_with_nvjpeg(batches[0], "RGB", "cuda"), plans[0], batched=batched
        )
        torch.cuda.synchronize()
        start = time.perf_counter()
        for raw, plan in zip(batches, plans):
            images = decode_with_nvjpeg(raw, "RGB", "cuda")
            pipeline.transform_tensors(images, plan, batched=batched)
        torch.cuda.synchronize()
        out[name] = {"warm_img_s": len(batches) * BATCH / (time.perf_counter() - start)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--workers", default="4,12")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_image_bench: torch sees no CUDA device")
    torch.zeros(1, device="cuda")  # CUDA context before the clock
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = make(Path(tmp), args.images)
        results: dict[str, dict[str, float]] = {"nvjpeg_limit": nvjpeg_limit(path)}
        results.update(stage_rates(path))
        for workers in [int(w) for w in args.workers.split(",")]:
            results[f"gpu_w{workers}"] = case(path, workers, "cuda")
            results[f"cpu_w{workers}"] = case(path, workers, None)
    info = {
        "device": torch.cuda.get_device_name(),
        "cpus": os.cpu_count(),
        "images": args.images,
        "results": results,
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return
    print(f"{info['device']}, {info['cpus']} CPUs, {args.images} JPEGs, batch {BATCH}")
    for name, r in results.items():
        cold = f"{r['cold_img_s']:9.0f}" if "cold_img_s" in r else " " * 9
        print(f"{name:14s} cold {cold} img/s   warm {r['warm_img_s']:9.0f} img/s")
    for workers in args.workers.split(","):
        gpu, cpu = results[f"gpu_w{workers}"], results[f"cpu_w{workers}"]
        print(
            f"workers={workers}: gpu/cpu cold {gpu['cold_img_s'] / cpu['cold_img_s']:.2f}x, "
            f"warm {gpu['warm_img_s'] / cpu['warm_img_s']:.2f}x"
        )


if __name__ == "__main__":
    main()
