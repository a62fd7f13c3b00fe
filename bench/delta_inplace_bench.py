"""Reading a pinned Delta version in place vs a plain pyarrow scan vs exporting to MDS.

Not a test. Builds a Delta table (``id`` int64 + ``x`` float32[32], 8 files written by
deltalake), then prints time to first batch and cold/warm-epoch rows/s for: the in-place loader
(``open_delta(...).dataset(...).to_torch(shuffle=True)``, in-process and 2 workers, without
and with its disk cache of converted row groups: the cold pass fills it), a pyarrow scan of the
same version's files delivering torch tensors (no shuffle), and the MDS path
(``snap.write_mds`` + loading the export shuffled). Frameworks are imported before any clock.

    python bench/delta_inplace_bench.py --rows 1000000

``--images N``: the image case instead: a Delta table of N photo-like JPEGs (``image``
binary + ``label``, 4 files) read in place with ``columns={"image": "jpeg"}`` and the train
ops (``image_decode``, ``random_resized_crop`` 224, ``horizontal_flip``) against the MDS
path on an export of the same version with the same ops, shuffled, 2 workers.

    python bench/delta_inplace_bench.py --images 2000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from deltalake import write_deltalake

from spark_dl_core import open_dataset
from spark_dl_core.sources.delta import open_delta

DIM = 32
FILES = 8


def build(path: str, rows: int) -> None:
    per = rows // FILES
    for k in range(FILES):
        ids = np.arange(k * per, (k + 1) * per, dtype=np.int64)
        values = np.random.default_rng(k).random(per * DIM, dtype=np.float32)
        offsets = np.arange(0, per * DIM + 1, DIM, dtype=np.int32)
        x = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        write_deltalake(path, pa.table({"id": ids, "x": x}), mode="append")


def timed(make: Callable[[], Iterable[Any]]) -> tuple[float, float, int]:
    """(seconds to the first batch, seconds for the whole pass, rows) of one pass."""
    start = time.perf_counter()
    first = None
    rows = 0
    for batch in make():
        if first is None:
            first = time.perf_counter() - start
        rows += len(batch["id"])
    return first or 0.0, time.perf_counter() - start, rows


def scan(files: list[str], batch_size: int) -> Iterable[dict[str, torch.Tensor]]:
    """A plain pyarrow scan (file order, no shuffle) delivering torch tensors."""
    for f in files:
        for b in pq.ParquetFile(f).iter_batches(batch_size=batch_size):
            x = b.column("x").values.to_numpy().reshape(-1, DIM).copy()
            yield {"id": torch.from_numpy(b.column("id").to_numpy()), "x": torch.from_numpy(x)}


def report(name: str, cold: tuple[float, float, int], warm: tuple[float, float, int]) -> float:
    rate = warm[2] / warm[1]
    print(
        f"{name:<34} first batch {cold[0]:7.3f} s (cold)  epoch cold {cold[2] / cold[1]:>11,.0f}"
        f" rows/s  warm {rate:>11,.0f} rows/s"
    )
    return rate


TRAIN = [
    {"op": "image_decode", "column": "image"},
    {"op": "random_resized_crop", "column": "image", "size": 224},
    {"op": "horizontal_flip", "column": "image", "p": 0.5},
]
IMAGE_SPEC = {"columns": {"image": "jpeg"}}


def build_images(path: str, count: int, files: int = 4) -> float:
    """Photo-like JPEGs (as bench/shapes_bench.py makes them) in ``files`` appends; the mean
    JPEG size in KB."""
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    blobs = []
    for _ in range(count):
        w, h = int(rng.integers(320, 641)), int(rng.integers(240, 481))
        small = rng.integers(0, 256, size=(h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
        base = np.asarray(Image.fromarray(small).resize((w, h), Image.BILINEAR), np.int16)
        grain = rng.integers(-24, 25, size=(h, w, 1), dtype=np.int16)
        out = io.BytesIO()
        Image.fromarray(np.clip(base + grain, 0, 255).astype(np.uint8)).save(
            out, format="JPEG", quality=85
        )
        blobs.append(out.getvalue())
    per = -(-count // files)
    for k in range(files):
        part = blobs[k * per : (k + 1) * per]
        labels = np.arange(k * per, k * per + len(part), dtype=np.int64)
        table = pa.table({"image": pa.array(part, pa.binary()), "id": labels})
        write_deltalake(path, table, mode="append")
    return sum(map(len, blobs)) / count / 1e3


def images_main(count: int, bs: int) -> None:
    """The image case: in place vs the MDS path, with the same ops."""
    with tempfile.TemporaryDirectory() as tmp:
        table = f"{tmp}/images"
        kb = build_images(table, count)
        print(f"{count:,} JPEGs (mean {kb:.0f} KB) in 4 files; ops: decode + rrc 224 + flip")
        open_delta(table).write_mds(f"{tmp}/mds", IMAGE_SPEC)
        rates: dict[str, float] = {}
        for workers in (2,):

            def inplace(workers: int = workers) -> Iterable[Any]:
                ds = open_delta(table).dataset(IMAGE_SPEC, cache_dir=f"{tmp}/cache-{workers}")
                return ds.to_torch(
                    batch_size=bs, shuffle=True, seed=0, num_workers=workers, transforms=TRAIN
                )

            def mds(workers: int = workers) -> Iterable[Any]:
                return open_dataset(f"{tmp}/mds").to_torch(
                    batch_size=bs, shuffle=True, seed=0, num_workers=workers, transforms=TRAIN
                )

            for name, make in (
                (f"in place, {workers} workers", inplace),
                (f"MDS export, {workers} workers", mds),
            ):
                cold = timed(make)
                warm = [timed(make) for _ in range(3)]
                best = sorted(warm, key=lambda r: r[1])[1]  # the median of three warm passes
                rates[name] = report(name, cold, best)
            ratio = rates[f"in place, {workers} workers"] / rates[f"MDS export, {workers} workers"]
            print(f"images, {workers} workers: in place / MDS {ratio:.2f}x (warm, median of 3)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--images", type=int, default=0, help="the image case, N JPEGs")
    args = parser.parse_args()
    bs = args.batch_size
    if args.images:
        return images_main(args.images, min(bs, 64))
    with tempfile.TemporaryDirectory() as tmp:
        table = f"{tmp}/table"
        build(table, args.rows)
        print(f"{args.rows:,} rows of id int64 + x float32[{DIM}] in {FILES} files")
        rates: dict[str, float] = {}

        def inplace(workers: int, cache: bool) -> Callable[[], Iterable[Any]]:
            def make() -> Iterable[Any]:
                # open counts toward the first batch; one cold disk cache per setting
                snap = open_delta(table)
                ds = snap.dataset(cache=cache, cache_dir=f"{tmp}/cache-{workers}")
                return ds.to_torch(batch_size=bs, shuffle=True, seed=0, num_workers=workers)

            return make

        for cache in (False, True):
            for workers in (0, 2):
                name = f"in place{'' if cache else ' no cache'}, shuffled, {workers} workers"
                make = inplace(workers, cache)
                rates[name] = report(name, timed(make), timed(make))
        files = open_delta(table).files
        rates["pyarrow scan"] = report(
            "pyarrow scan -> torch (no shuffle)",
            timed(lambda: scan(files, bs)),
            timed(lambda: scan(files, bs)),
        )
        start = time.perf_counter()
        open_delta(table).write_mds(f"{tmp}/mds")
        export_s = time.perf_counter() - start
        print(f"snap.write_mds (export)            {export_s:7.3f} s")

        def mds(workers: int) -> Callable[[], Iterable[Any]]:
            def make() -> Iterable[Any]:
                ds = open_dataset(f"{tmp}/mds")
                return ds.to_torch(batch_size=bs, shuffle=True, seed=0, num_workers=workers)

            return make

        for workers in (0, 2):
            name = f"MDS export, shuffled, {workers} workers"
            cold = timed(mds(workers))
            rates[name] = report(name, cold, timed(mds(workers)))
            if workers == 0:
                print(f"{'':<34} first batch after export {export_s + cold[0]:.3f} s")
        scan_rate = rates["pyarrow scan"]
        for workers in (0, 2):
            ours = rates[f"in place, shuffled, {workers} workers"]
            print(
                f"in place / pyarrow scan ({workers} workers): {ours / scan_rate:.2f}x;  "
                f"in place / MDS: {ours / rates[f'MDS export, shuffled, {workers} workers']:.2f}x"
            )


if __name__ == "__main__":
    main()
