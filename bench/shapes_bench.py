"""Real training shapes: images, token documents, equal-length variable arrays (issue #9).

Cases, each measured in a fresh subprocess (frameworks imported before the clock), in
alternating rounds, each timing its first pass (cold) and its second (warm) separately; the
table shows medians and the ratios the issue targets:

images (~3,000 JPEGs 320-640 x 240-480 px, shuffled epoch, batch 64, 2 workers):
- ``img_ours``: ``ds.to_torch(transforms=[image_decode, random_resized_crop 224,
  horizontal_flip])``
- ``img_files``: one .jpg per file, a PIL torch ``Dataset`` doing the same crop
  (``resize(box=...)``) and flip, DataLoader default collate
- ``img_mosaic``: Mosaic ``StreamingDataset`` (``jpeg`` -> PIL), the same ops in its collate
- ``img_ours_norm``: ``img_ours`` plus ``normalize`` (ImageNet mean / std) and ``to_chw``:
  float32 ``[64, 3, 224, 224]`` batches (against ``img_ours``: what the float batch costs)
- ``img_ours_decode``: decode only (``image_decode``)
- ``img_limit``: the decode limit: the chosen decoder (simplejpeg) in a 2-process pool over
  preloaded bytes, full decode, no I/O; the pixels stay in the pool
- ``img_limit_sent``: the same decode in a 2-worker torch ``DataLoader`` over preloaded
  bytes, each batch of pixels sent to the main process as one tensor: the least work that
  gets full-size decoded images to a training loop

tokens (50,000 int32 documents of 256-4096 tokens, batch 16, in-process):
- ``tok_ours``: ``ds.to_torch(shuffle=True)``: nested jagged tensors
- ``tok_pyarrow``: a pyarrow Parquet loop making one tensor per document (sequential)
- ``tok_mosaic``: Mosaic ``StreamingDataset`` in-process (a sample of the epoch)

equal-length arrays (1M rows of float32[32], shuffled, batch 1024, in-process and 2 workers):
- ``var_w0`` / ``var_w2``: stored as Spark's ``array<float>`` becomes: variable
  ``ndarray:float32``
- ``fix_w0`` / ``fix_w2``: the same values as fixed ``ndarray:float32:32``

Usage: ``python bench/shapes_bench.py [--dir DIR] [--rounds 3] [--images 3000]
[--docs 50000] [--rows 1000000] [--only images,tokens,arrays]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MOSAIC_PYTHON = ROOT / ".venv-mosaic" / "bin" / "python"
IMG_BATCH, TOK_BATCH, ARR_BATCH = 64, 16, 1024
CROP = 224
TRAIN = [
    {"op": "image_decode", "column": "image"},
    {"op": "random_resized_crop", "column": "image", "size": CROP},
    {"op": "horizontal_flip", "column": "image", "p": 0.5},
]
NORMALIZED = [
    *TRAIN,
    {"op": "normalize", "column": "image", "mean": [0.485, 0.456, 0.406]},
    {"op": "to_chw", "column": "image"},
]
NORMALIZED[-2]["std"] = [0.229, 0.224, 0.225]


# --------------------------------------------------------------------------- data


def make_images(directory: Path, count: int) -> None:
    import io

    import numpy as np
    import pyarrow as pa
    from PIL import Image

    from spark_dl_core import DatasetSpec, write_mds

    if (directory / "images.done").exists():
        return
    rng = np.random.default_rng(0)
    files = directory / "jpg"
    files.mkdir(parents=True, exist_ok=True)
    blobs = []
    for i in range(count):
        w, h = int(rng.integers(320, 641)), int(rng.integers(240, 481))
        # smooth colour fields plus grain: photo-like JPEG sizes (~60 KB at these sizes)
        small = rng.integers(0, 256, size=(h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
        base = np.asarray(Image.fromarray(small).resize((w, h), Image.BILINEAR), np.int16)
        grain = rng.integers(-24, 25, size=(h, w, 1), dtype=np.int16)
        pixels = np.clip(base + grain, 0, 255).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="JPEG", quality=85)
        blobs.append(out.getvalue())
        (files / f"{i:05}.jpg").write_bytes(blobs[-1])
    table = pa.table({"image": pa.array(blobs, pa.binary()), "label": np.arange(count) % 1000})
    spec = DatasetSpec(columns={"image": "jpeg"}, shard_size="32MiB")
    write_mds(table, str(directory / "images"), spec)
    (directory / "images.done").write_text(
        json.dumps({"mean_kb": sum(map(len, blobs)) / count / 1e3})
    )


def make_tokens(directory: Path, docs: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_dl_core import DatasetSpec, write_mds

    if (directory / "tokens.done").exists():
        return
    rng = np.random.default_rng(1)
    lengths = rng.integers(256, 4097, size=docs)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = rng.integers(0, 50_000, size=int(offsets[-1]), dtype=np.int32)
    tokens = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values)).cast(
        pa.list_(pa.int32())
    )
    table = pa.table({"tokens": tokens, "doc": np.arange(docs, dtype=np.int64)})
    write_mds(table, str(directory / "tokens"), DatasetSpec(shard_size="64MiB"))
    pq.write_table(table, directory / "tokens.parquet", row_group_size=4096)
    (directory / "tokens.done").write_text("ok")


def make_arrays(directory: Path, rows: int) -> None:
    import numpy as np
    import pyarrow as pa

    from spark_dl_core import DatasetSpec, write_mds

    if (directory / "arrays.done").exists():
        return
    x = np.random.default_rng(2).random((rows, 32), dtype=np.float32)
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * 32)
    variable = pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1)))  # Spark's array<float>
    labels = np.arange(rows, dtype=np.int64)
    spec = DatasetSpec(shard_size="8MiB")
    write_mds(pa.table({"x": variable, "label": labels}), str(directory / "var"), spec)
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 32)
    write_mds(pa.table({"x": fixed, "label": labels}), str(directory / "fix"), spec)
    (directory / "arrays.done").write_text("ok")


# --------------------------------------------------------------------------- cases


def _crop_box(rng: Any, w: int, h: int) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop box, as a hand-written loader would do it."""
    import math

    area = w * h
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            return x, y, x + cw, y + ch
    return 0, 0, w, h


def _timed(make: Any, count: Any) -> dict[str, float]:
    """Two passes over ``make()``'s batches: the first (cold: this process's first epoch)
    and the second (warm: the next epoch), timed separately."""
    out: dict[str, float] = {}
    for prefix in ("", "warm_"):
        start = time.perf_counter()
        first = None
        n = 0
        for b in make():
            first = first or time.perf_counter()
            n += count(b)
        end = time.perf_counter()
        out |= {f"{prefix}seconds": end - start, f"{prefix}samples": n}
        out[f"{prefix}first_batch_s"] = (first or end) - start
    return out


def _setup(made: float) -> dict[str, float]:
    """Seconds from ``open_dataset`` to a loader in hand (workers may start there)."""
    return {"setup_s": time.perf_counter() - made}


def run_one(name: str, directory: Path) -> dict[str, float]:
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    from spark_dl_core import open_dataset

    made = time.perf_counter()  # open + to_torch: setup_s, outside the passes' clocks
    if name in ("img_ours", "img_ours_norm", "img_ours_decode"):
        ds = open_dataset(directory / "images")
        ops = {"img_ours": TRAIN, "img_ours_norm": NORMALIZED}.get(name, TRAIN[:1])
        loader = ds.to_torch(batch_size=IMG_BATCH, shuffle=True, num_workers=2, transforms=ops)
        return _setup(made) | _timed(lambda: loader, lambda b: len(b["label"]))
    if name == "img_files":
        from PIL import Image

        class Files(Dataset):  # type: ignore[type-arg]
            def __init__(self, paths: list[Path]) -> None:
                self.paths = paths

            def __len__(self) -> int:
                return len(self.paths)

            def __getitem__(self, i: int) -> Any:
                rng = np.random.default_rng(i)
                image = Image.open(self.paths[i]).convert("RGB")
                box = _crop_box(rng, *image.size)
                image = image.resize((CROP, CROP), Image.BILINEAR, box=box)
                pixels = np.asarray(image)
                if rng.random() < 0.5:
                    pixels = pixels[:, ::-1]
                return torch.from_numpy(np.ascontiguousarray(pixels)), i

        paths = sorted((directory / "jpg").glob("*.jpg"))
        loader = DataLoader(Files(paths), batch_size=IMG_BATCH, shuffle=True, num_workers=2)
        return _timed(lambda: loader, lambda b: len(b[1]))
    if name == "img_limit":
        from concurrent.futures import ProcessPoolExecutor

        paths = sorted((directory / "jpg").glob("*.jpg"))
        blobs = [p.read_bytes() for p in paths]
        chunks = [blobs[i : i + IMG_BATCH] for i in range(0, len(blobs), IMG_BATCH)]
        with ProcessPoolExecutor(2) as pool:
            list(pool.map(_decode_chunk, chunks[:2]))  # start the workers before the clock
            return _timed(lambda: pool.map(_decode_chunk, chunks), lambda n: n)
    if name == "img_limit_sent":

        class Chunks(Dataset):  # type: ignore[type-arg]
            def __init__(self, chunks: list[list[bytes]]) -> None:
                self.chunks = chunks

            def __len__(self) -> int:
                return len(self.chunks)

            def __getitem__(self, i: int) -> Any:
                import simplejpeg

                pixels = [simplejpeg.decode_jpeg(r, colorspace="RGB") for r in self.chunks[i]]
                flat = np.concatenate([p.reshape(-1) for p in pixels])
                return torch.from_numpy(flat), len(pixels)

        paths = sorted((directory / "jpg").glob("*.jpg"))
        blobs = [p.read_bytes() for p in paths]
        chunks = [blobs[i : i + IMG_BATCH] for i in range(0, len(blobs), IMG_BATCH)]
        sent = DataLoader(Chunks(chunks), batch_size=None, shuffle=True, num_workers=2)
        return _timed(lambda: sent, lambda b: b[1])
    if name == "tok_ours":
        ds = open_dataset(directory / "tokens")
        loader = ds.to_torch(batch_size=TOK_BATCH, shuffle=True)
        return _setup(made) | _timed(lambda: loader, lambda b: len(b["doc"]))
    if name == "tok_pyarrow":
        import pyarrow.parquet as pq

        def docs() -> Any:
            file = pq.ParquetFile(directory / "tokens.parquet")
            for record in file.iter_batches(batch_size=1024, columns=["tokens", "doc"]):
                column = record.column(0)
                offsets = column.offsets.to_numpy()
                values = column.values.to_numpy()
                labels = record.column(1).to_numpy()
                for at in range(0, len(record), TOK_BATCH):
                    end = min(len(record), at + TOK_BATCH)
                    tensors = [
                        torch.from_numpy(values[offsets[i] : offsets[i + 1]].copy())
                        for i in range(at, end)
                    ]
                    yield tensors, torch.from_numpy(labels[at:end])

        return _timed(docs, lambda b: len(b[0]))
    if name.startswith(("var_", "fix_")):
        ds = open_dataset(directory / name[:3])
        workers = int(name[-1])
        loader = ds.to_torch(batch_size=ARR_BATCH, shuffle=True, num_workers=workers)
        result = _setup(made) | _timed(lambda: loader, lambda b: len(b["label"]))
        (batch,) = [next(iter(ds.to_torch(batch_size=4)))]
        result["dense"] = float(tuple(batch["x"].shape) == (4, 32))
        return result
    raise SystemExit(f"unknown case {name}")


def _decode_chunk(blobs: list[bytes]) -> int:
    import simplejpeg

    for raw in blobs:
        simplejpeg.decode_jpeg(raw, colorspace="RGB")
    return len(blobs)


MOSAIC_IMAGES = """
import json, math, sys, time
sys.path.insert(0, sys.argv[2])
import mosaic_shim
mosaic_shim.install()
import numpy as np, torch
from PIL import Image
from streaming import StreamingDataset
from torch.utils.data import DataLoader
def box(rng, w, h):
    area = w * h
    for _ in range(10):
        t = area * rng.uniform(0.08, 1.0)
        a = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = round(math.sqrt(t * a)), round(math.sqrt(t / a))
        if 0 < cw <= w and 0 < ch <= h:
            x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            return x, y, x + cw, y + ch
    return 0, 0, w, h
def collate(samples):
    out = []
    for s in samples:
        rng = np.random.default_rng(int(s["label"]))
        image = s["image"].convert("RGB")
        pixels = np.asarray(image.resize((224, 224), Image.BILINEAR, box=box(rng, *image.size)))
        if rng.random() < 0.5:
            pixels = pixels[:, ::-1]
        out.append(torch.from_numpy(np.ascontiguousarray(pixels)))
    return torch.stack(out)
ds = StreamingDataset(local=sys.argv[1], shuffle=True, shuffle_seed=0, batch_size=64)
start = time.perf_counter(); first = None; n = 0
for b in DataLoader(ds, batch_size=64, num_workers=2, collate_fn=collate):
    first = first or time.perf_counter(); n += len(b)
end = time.perf_counter()
print(json.dumps({"seconds": end - start, "first_batch_s": first - start, "samples": n}))
"""

MOSAIC_TOKENS = """
import json, sys, time
sys.path.insert(0, sys.argv[2])
import mosaic_shim
mosaic_shim.install()
import torch
from streaming import StreamingDataset
from torch.utils.data import DataLoader
ds = StreamingDataset(local=sys.argv[1], shuffle=True, shuffle_seed=0, batch_size=16)
collate = lambda s: ([torch.from_numpy(x["tokens"]) for x in s], [x["doc"] for x in s])
start = time.perf_counter(); first = None; n = 0
for b in DataLoader(ds, batch_size=16, num_workers=0, collate_fn=collate):
    first = first or time.perf_counter(); n += len(b[0])
    if n >= int(sys.argv[3]):
        break
end = time.perf_counter()
print(json.dumps({"seconds": end - start, "first_batch_s": first - start, "samples": n}))
"""


def measure(name: str, directory: Path) -> dict[str, float]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    interop = str(ROOT / "tests" / "interop")
    if name == "img_mosaic":
        cmd = [str(MOSAIC_PYTHON), "-c", MOSAIC_IMAGES, str(directory / "images"), interop]
    elif name == "tok_mosaic":
        cmd = [str(MOSAIC_PYTHON), "-c", MOSAIC_TOKENS, str(directory / "tokens"), interop, "5000"]
    else:
        cmd = [sys.executable, __file__, "--one", name, "--dir", str(directory)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode:
        raise RuntimeError(f"{name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


RATIOS = [
    ("images: ours / file-per-image PIL (>= 1.5x)", "img_ours", "img_files"),
    ("images: ours / Mosaic (>= 2x)", "img_ours", "img_mosaic"),
    ("images: normalize + to_chw / uint8 crops", "img_ours_norm", "img_ours"),
    ("images: decode-only / decode limit (>= 0.9x)", "img_ours_decode", "img_limit"),
    ("images: decode-only / decode sent to the loop", "img_ours_decode", "img_limit_sent"),
    ("tokens: ours / pyarrow loop (>= 3x)", "tok_ours", "tok_pyarrow"),
    ("tokens: ours / Mosaic (>= 10x)", "tok_ours", "tok_mosaic"),
    ("arrays in-process: variable / fixed (>= 0.77x)", "var_w0", "fix_w0"),
    ("arrays 2 workers: variable / fixed (>= 0.77x)", "var_w2", "fix_w2"),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--docs", type=int, default=50_000)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--only", default="images,tokens,arrays")
    parser.add_argument("--one", default=None)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.dir)))
        return
    directory = args.dir or Path(tempfile.gettempdir()) / "spark-dl-shapes-bench"
    directory.mkdir(parents=True, exist_ok=True)
    groups = set(args.only.split(","))
    mosaic = MOSAIC_PYTHON.exists()
    names: list[str] = []
    if "images" in groups:
        make_images(directory, args.images)
        names += ["img_ours", "img_ours_norm", "img_files", "img_ours_decode", "img_limit"]
        names += ["img_limit_sent"]
        names += ["img_mosaic"] if mosaic else []
    if "tokens" in groups:
        make_tokens(directory, args.docs)
        names += ["tok_ours", "tok_pyarrow"] + (["tok_mosaic"] if mosaic else [])
    if "arrays" in groups:
        make_arrays(directory, args.rows)
        names += ["var_w0", "fix_w0", "var_w2", "fix_w2"]
    if not mosaic:
        print("mosaic: skipped (.venv-mosaic not found)")
    results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else reversed(names):
            results[name].append(measure(name, directory))
    rate = {
        n: statistics.median(x["samples"] / x["seconds"] for x in v) for n, v in results.items()
    }
    # Mosaic's cases run one pass in their own interpreter: no warm figure.
    warm = {
        n: statistics.median(x["warm_samples"] / x["warm_seconds"] for x in v)
        for n, v in results.items()
        if all("warm_seconds" in x for x in v)
    }
    print(f"\nsamples/s, medians of {args.rounds} round(s); cold = first pass, warm = second")
    print("first batch s: from the first pass's start; + setup: from open_dataset")
    head = f"{'case':<18}{'cold':>14}{'warm':>14}{'first batch s':>16}{'+ setup':>10}"
    print(f"{head}{'rounds':>8}")
    for name in names:
        first = statistics.median(x["first_batch_s"] for x in results[name])
        setup = statistics.median(x.get("setup_s", 0.0) + x["first_batch_s"] for x in results[name])
        hot = f"{warm[name]:>14,.0f}" if name in warm else f"{'-':>14}"
        line = f"{name:<18}{rate[name]:>14,.0f}{hot}{first:>16.2f}{setup:>10.2f}"
        print(f"{line}{len(results[name]):>8}")
    print(f"\n{'ratio':<52}{'cold':>8}{'warm':>8}")
    for label, a, b in RATIOS:
        if a in rate and b in rate:
            hot = f"{warm[a] / warm[b]:>8.2f}" if a in warm and b in warm else f"{'-':>8}"
            print(f"{label:<52}{rate[a] / rate[b]:>8.2f}{hot}")
    for name in ("var_w0", "var_w2"):
        if name in results:
            print(f"{name}: dense tensor out = {bool(results[name][0].get('dense'))}")


if __name__ == "__main__":
    main()
