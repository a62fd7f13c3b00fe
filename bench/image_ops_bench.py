"""Per-image cost of the CPU image pipeline, one process, one thread: decoders x resamplers.

Runs ``ImagePipeline.run_cpu`` directly (no loader, no workers) on the JPEGs of a folder
with the train ops of bench/shapes_bench.py (``image_decode``, ``random_resized_crop``
224, ``horizontal_flip``), in batches, for each way the pipeline can run:

- ``whole+pil``: whole-image decode (simplejpeg, reduced DCT scale) and PIL resample — the
  pipeline before region decoding;
- ``whole+torch``: the same decode, torch's uint8 antialiased bilinear resample;
- ``region+pil`` / ``region+torch``: the C extension decodes only the crop's region;
- ``exact``: ``image_decode(exact=True)``: full-resolution decode, then the ops one after
  the other as torchvision's tensor transforms run them (what torchvision-exact pixels cost).

``--ops eval`` measures ``resize`` 256 + ``center_crop`` 224 instead. Rounds alternate
between variants; the figure is the median ms per image. Without JPEGs at ``--images``,
bench/shapes_bench.py's photo-like ones are made there first.

    python bench/image_ops_bench.py [--images /tmp/shapes-bench/jpg] [--n 640] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as functional

from spark_dl_core.media import image_decode, images
from spark_dl_core.media.images import ImagePipeline, augment_key
from spark_dl_core.ops.transforms import parse_transforms

TRAIN = [
    {"op": "random_resized_crop", "column": "image", "size": 224},
    {"op": "horizontal_flip", "column": "image", "p": 0.5},
]
EVAL = [
    {"op": "resize", "column": "image", "size": 256},
    {"op": "center_crop", "column": "image", "size": 224},
]


_EXTENSION = images._jpeg


def _set(region: bool, resampler: str) -> None:
    if region and _EXTENSION is None:
        raise SystemExit("the C extension spark_dl_core.media._jpeg is not built")
    images._jpeg = image_decode._jpeg = _EXTENSION if region else None
    images._torch_resize = functional.interpolate if resampler == "torch" else None


def _run(pipeline: ImagePipeline, raws: list[bytes], batch: int, key: bytes) -> float:
    start = time.perf_counter()
    for b in range(0, len(raws), batch):
        chunk = raws[b : b + batch]
        indices = np.arange(b, b + len(chunk))
        plan = pipeline.plan(chunk, key, indices, lambda i, m: m)
        pipeline.run_cpu(chunk, plan, lambda i, m: m)
    return (time.perf_counter() - start) / len(raws) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", default="/tmp/shapes-bench/jpg")
    parser.add_argument("--n", type=int, default=640)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", choices=["train", "eval"], default="train")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as in a DataLoader worker
    if not any(Path(args.images).glob("*.jpg")):
        from shapes_bench import make_images

        make_images(Path(args.images).parent, args.n)
    files = sorted(Path(args.images).glob("*.jpg"))[: args.n]
    raws = [f.read_bytes() for f in files]
    geometry = parse_transforms(TRAIN if args.ops == "train" else EVAL)
    pipeline = ImagePipeline("image", geometry=geometry)
    exact = ImagePipeline("image", geometry=geometry, exact=True)
    key = augment_key("bench", 0, 0)
    variants: dict[str, tuple[bool, str]] = {
        "whole+pil": (False, "pil"),
        "whole+torch": (False, "torch"),
        "region+pil": (True, "pil"),
        "region+torch": (True, "torch"),
        "exact": (False, "torch"),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for name, setting in variants.items():  # warm-up
        _set(*setting)
        _run(exact if name == "exact" else pipeline, raws[: args.batch], args.batch, key)
    for _ in range(args.rounds):
        for name, setting in variants.items():
            _set(*setting)
            chosen = exact if name == "exact" else pipeline
            times[name].append(_run(chosen, raws, args.batch, key))
    base = statistics.median(times["whole+pil"])
    print(
        f"{len(raws)} JPEGs from {args.images}, {args.ops} ops, batch {args.batch}, "
        f"{args.rounds} rounds"
    )
    for name, values in times.items():
        ms = statistics.median(values)
        print(f"{name:>13}: {ms:6.3f} ms/img  {1e3 / ms:7.0f} img/s  x{base / ms:4.2f}")
    _check(pipeline, exact, raws[: args.batch], key)


def _check(pipeline: ImagePipeline, exact: ImagePipeline, raws: list[bytes], key: bytes) -> None:
    """How far the new path's (and the default's from exact) pixels are, on one batch."""
    out: dict[str, Any] = {}
    ways = {"old": (False, "pil", pipeline), "new": (True, "torch", pipeline)}
    ways["exact"] = (False, "torch", exact)
    for name, (region, resampler, chosen) in ways.items():
        _set(region, resampler)
        plan = chosen.plan(raws, key, np.arange(len(raws)), lambda i, m: m)
        out[name] = chosen.run_cpu(raws, plan, lambda i, m: m).astype(np.int16)
    for a, b in (("new", "old"), ("new", "exact")):
        diff = np.abs(out[a] - out[b])
        pct = np.percentile(diff, 99)
        print(f"{a} vs {b} pixels: mean |diff| {diff.mean():.2f}, 99th pct {pct}")


if __name__ == "__main__":
    main()
