"""Reading a pinned Delta version in place vs a pyarrow scan, the MDS path, Ray Data and Daft.

Not a test. Builds a Delta table (``id`` int64 + ``x`` float32[32], 8 files written by
deltalake; or reads ``--table``), then prints:

- first batch after open (and the CPU seconds of the process and its workers), each in a
  fresh process with numpy, pyarrow (and the pandas module its numpy bridge loads on first
  use), torch (and ``torch.distributed.tensor``, which its first jagged tensor imports),
  deltalake and spark_dl_core imported before the clock, median, min and max of ``--runs``:
  ``open_delta(...).dataset().to_torch(shuffle=True)`` in-process and with 2 workers, and
  the pyarrow scan. Each run has its own empty temporary
  directory (``TMPDIR``), so the plan cache, the converted row-group cache and the verified
  notes all start empty (counted before the clock: a run that finds a file there fails);
- cold / warm epoch rows/s of the in-place loader (in-process and 2 workers, without and with
  its disk cache of converted row groups: the cold pass fills it), a pyarrow scan of the same
  version's files delivering torch tensors (no shuffle), and the MDS path (``snap.write_mds``
  then loading the export shuffled);
- the shuffle quality (:func:`spark_dl_core.order.shuffle_quality`) of the in-place order and
  of the export's order, same seed and window;
- Ray Data's ``read_delta(version=).iter_torch_batches(local_shuffle_buffer_size=100k)`` and
  Daft's ``read_deltalake(version=)`` (bench/delta_anchors.py), run with the interpreter of a
  side environment that has them (``--anchors-python``), or one line saying how to make it;
- ratios, and the load average before and after.

    python bench/delta_inplace_bench.py --rows 4000000 [--table PATH] [--first-only]

``--variable``: ``x`` as ``list<float>`` of 16-48 values a row (mean 32), as Spark's and
delta-rs's variable arrays are (read as jagged batches), rather than 32 values every row.
``--files``: data files of one row group each (default 8; one more small file with
``--tail`` rows). The first-batch figure the docs quote (the new node, or a new version with
new files):

    python bench/delta_inplace_bench.py --rows 4000000 --tail 40000 --variable --first-only \
        --runs 10

``--images N``: the image case instead: a Delta table of N photo-like JPEGs (``image``
binary + ``label``, 4 files) read in place with ``columns={"image": "jpeg"}`` and the train
ops (``image_decode``, ``random_resized_crop`` 224, ``horizontal_flip``) against the MDS
path on an export of the same version with the same ops, shuffled, 2 workers.

    python bench/delta_inplace_bench.py --images 2000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pandas  # noqa: F401 - pyarrow's numpy bridge imports it on first use: not timed
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from deltalake import write_deltalake

from spark_dl_core import open_dataset
from spark_dl_core.order import shuffle_quality
from spark_dl_core.tables.delta.table import open_delta

# torch.from_numpy of Arrow's read-only buffers (the scan's ids): the tensors are only read
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
DIM = 32
FILES = 8
HERE = os.path.dirname(os.path.abspath(__file__))
ANCHORS_PYTHON = os.environ.get(
    "SPARK_DL_ANCHORS_PYTHON", os.path.join(os.path.dirname(HERE), ".venv-ray", "bin", "python")
)
ANCHORS_INSTALL = "make bench-envs"


def parts(
    rows: int, files: int = FILES, tail: int = 0, variable: bool = False
) -> Iterable[pa.Table]:
    """``files`` tables of ``rows // files`` rows (then one of ``tail`` rows): what each
    append writes, the same for a Delta and an Iceberg table; ``x`` holds 32 floats a row,
    or 16-48 with ``variable``."""
    per = rows // files
    sizes = [per] * files + ([tail] if tail else [])
    start = 0
    for k, count in enumerate(sizes):
        rng = np.random.default_rng(k)
        ids = np.arange(start, start + count, dtype=np.int64)
        lengths = rng.integers(16, 49, count) if variable else np.full(count, DIM)
        offsets = np.zeros(count + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        values = rng.random(int(offsets[-1]), dtype=np.float32)
        x = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        yield pa.table({"id": ids, "x": x})
        start += count


def build(path: str, rows: int, files: int = FILES, tail: int = 0, variable: bool = False) -> None:
    """A Delta table of :func:`parts`, each append one data file of one row group."""
    for part in parts(rows, files, tail, variable):
        write_deltalake(path, part, mode="append")


def open_table(table: str) -> Any:
    """A Delta table's directory opened by ``open_delta``; an Iceberg table's metadata file
    (``….metadata.json``, the ``--iceberg`` side) by ``open_iceberg``."""
    if table.endswith(".metadata.json"):
        from spark_dl_core.tables.iceberg.table import open_iceberg

        return open_iceberg(table)
    return open_delta(table)


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
        local = f[len("file://") :] if f.startswith("file://") else f  # Iceberg's paths
        for b in pq.ParquetFile(local).iter_batches(batch_size=batch_size):
            x = b.column("x")
            values = torch.from_numpy(x.values.to_numpy().copy())
            offsets = x.offsets.to_numpy()
            if len(values) == len(b) * DIM and np.all(np.diff(offsets) == DIM):
                out = values.reshape(-1, DIM)
            else:  # variable lists: values and offsets, as a jagged tensor holds them
                out = torch.nested.nested_tensor_from_jagged(
                    values, torch.from_numpy(offsets.astype(np.int64) - offsets[0])
                )
            yield {"id": torch.from_numpy(b.column("id").to_numpy()), "x": out}


def inplace(
    table: str, cache_dir: str | None, bs: int, workers: int, cache: bool = True
) -> Iterable[Any]:
    """The in-place loader from ``open_delta`` (or ``open_iceberg``) on (open counts toward
    the first batch); ``cache_dir`` None: the default place (under ``TMPDIR``)."""
    snap = open_table(table)
    ds = snap.dataset(cache=cache, cache_dir=cache_dir)
    return ds.to_torch(batch_size=bs, shuffle=True, seed=0, num_workers=workers)


def cached_files() -> int:
    """Files under this process's temporary directory, where every cache of a default
    dataset lives (plan, converted row groups, verified notes): 0 for an empty start."""
    return sum(len(names) for _, _, names in os.walk(tempfile.gettempdir()))


def first_batch(case: str, table: str, bs: int) -> None:
    """``--first-batch`` mode (a fresh process; imports above, its own empty ``TMPDIR``):
    seconds to the first batch, this process's CPU seconds (all its threads; not its
    DataLoader workers'), and the files its caches held before the clock."""
    import torch.distributed.tensor  # noqa: F401 - the first jagged tensor's import: not timed

    if table.endswith(".metadata.json"):  # PyIceberg imported before the clock, as deltalake
        import pyiceberg.io.pyarrow
        import pyiceberg.table  # noqa: F401

        import spark_dl_core.tables.iceberg.table  # noqa: F401
    before = cached_files()
    cpu0, start = cpu(), time.perf_counter()
    if case == "scan":
        batches = scan(open_table(table).files, bs)
    else:
        batches = inplace(table, None, bs, int(case))
    next(iter(batches))
    wall = time.perf_counter() - start
    print(json.dumps([wall, cpu() - cpu0 + workers_cpu(), before]), flush=True)
    # No teardown in the figure's process; its workers go too: left orphaned, one blocks
    # writing a batch to a pipe the other holds open, and so holds this one's stdout.
    for pid in children():
        os.kill(pid, signal.SIGKILL)
    os._exit(0)


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children() -> list[int]:
    """This process's live children (its DataLoader workers), from /proc."""
    pids = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids += [int(pid) for pid in f.read().split()]
        except OSError:
            continue
    return pids


def workers_cpu() -> float:
    """CPU seconds of this process's live children (its DataLoader workers, all started
    after the clock), from /proc; 0 where there is none."""
    total = 0
    for pid in children():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def fresh_first_batch(case: str, table: str, tmp: str, bs: int, runs: int) -> str:
    """Median, min and max seconds (and median CPU seconds) to the first batch over ``runs``
    fresh processes, each with its own empty ``TMPDIR`` (so empty plan and row-group
    caches): on a loaded machine the CPU figure is the steadier one."""
    walls, cpus = [], []
    for run in range(runs):
        own = f"{tmp}/first-{case}-{run}"
        os.makedirs(own)
        argv = [sys.executable, __file__, "--first-batch", case, table, str(bs)]
        env = {**os.environ, "TMPDIR": own}
        out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env)
        wall, used, before = json.loads(out.stdout.strip().splitlines()[-1])
        if before:
            raise SystemExit(f"run {run} of {case!r} found {before} cached files before its clock")
        walls.append(wall)
        cpus.append(used)
    return (
        f"{statistics.median(walls):7.3f} s (min {min(walls):.3f}, max {max(walls):.3f}; "
        f"CPU {statistics.median(cpus):.3f} s)"
    )


def report(name: str, cold: tuple[float, float, int], warm: tuple[float, float, int]) -> float:
    rate = warm[2] / warm[1]
    print(
        f"{name:<40} first batch {cold[0]:7.3f} s (cold)  epoch cold {cold[2] / cold[1]:>11,.0f}"
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


def quality(order: np.ndarray, shard_sizes: np.ndarray) -> str:
    q = shuffle_quality(order, shard_sizes)
    return (
        f"adjacent source neighbours {q['adjacent_neighbours']:.2e}, same shard adjacent "
        f"{q['same_shard_adjacent']:.3f}, position correlation {q['position_correlation']:+.4f}"
        f", mean step {q['mean_step']:.3f}"
    )


def epoch_order(ds: Any, bs: int) -> np.ndarray:
    """The epoch's global order as loaders read it (seed 0, epoch 0, the default window)."""
    return np.concatenate(list(ds.sample_order(bs, shuffle=True, seed=0)))


def anchors(
    python: str, table: str, version: int, bs: int, extra: tuple[str, ...] = ()
) -> dict[str, dict[str, Any]]:
    """Ray Data and Daft in the side environment (bench/delta_anchors.py), or nothing;
    ``extra``: more of its arguments (``--iceberg`` and a catalog: Ray's ``read_iceberg``)."""
    probe = [python, "-c", "import ray.data, daft"]
    if not os.path.exists(python) or subprocess.run(probe, capture_output=True).returncode:
        print(f"Ray Data / Daft anchors skipped: no {python} with them; make it: {ANCHORS_INSTALL}")
        return {}
    argv = [python, os.path.join(HERE, "delta_anchors.py"), table, str(version), *extra]
    out = subprocess.run([*argv, "--batch-size", str(bs)], capture_output=True, text=True)
    found = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            case = json.loads(line)
            found[case["name"]] = case
            print(
                f"{case['name']}\n{'':<40} first batch {case['first_s']:7.3f} s (cold)  epoch "
                f"cold {case['cold_rows_s']:>11,.0f} rows/s  warm {case['warm_rows_s']:>11,.0f}"
                f" rows/s  rows {case['rows']}"
            )
    if out.returncode:
        print(f"anchors failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
    return found


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--images", type=int, default=0, help="the image case, N JPEGs")
    parser.add_argument("--table", help="an existing table of this shape (else one is built)")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per first batch")
    parser.add_argument("--anchors-python", default=ANCHORS_PYTHON)
    parser.add_argument("--files", type=int, default=FILES, help="data files of one row group")
    parser.add_argument("--tail", type=int, default=0, help="rows of one more, small file")
    parser.add_argument("--variable", action="store_true", help="x: 16-48 floats a row")
    parser.add_argument("--first-batch", nargs=3, metavar=("CASE", "TABLE", "BS"))
    parser.add_argument("--first-only", action="store_true", help="only the first batches")
    args = parser.parse_args()
    if args.images:
        return images_main(args.images, min(args.batch_size, 64))
    if args.first_batch:
        case, table, bs = args.first_batch
        first_batch(case, table, int(bs))
    with tempfile.TemporaryDirectory() as tmp:
        table = args.table or f"{tmp}/table"
        if not args.table:
            build(table, args.rows, args.files, args.tail, args.variable)
        run(table, tmp, args)


def run(table: str, tmp: str, args: argparse.Namespace) -> None:
    bs = args.batch_size
    snap = open_delta(table)
    ours = snap.dataset(cache=False)
    x = "list<float> of 16-48" if args.variable else f"float32[{DIM}]"
    print(
        f"{len(ours):,} rows of id int64 + x {x} in {len(snap.files)} files "
        f"({ours.num_shards} row groups), version {snap.version}, batch {bs}; "
        f"{os.cpu_count()} CPUs, {load()}"
    )
    print(f"-- first batch after open, fresh processes, empty caches, {args.runs} runs:")
    for case, name in (
        ("0", "in place, shuffled, 0 workers"),
        ("2", "in place, shuffled, 2 workers"),
        ("scan", "pyarrow scan -> torch"),
    ):
        print(f"{name:<40} {fresh_first_batch(case, table, tmp, bs, args.runs)}")
    print(f"-- {load()}")
    if args.first_only:
        return
    print(f"-- passes (cold then warm), {load()}:")
    rates: dict[str, float] = {}
    for cache in (False, True):
        for workers in (0, 2):
            name = f"in place{'' if cache else ' no cache'}, shuffled, {workers} workers"
            where = f"{tmp}/cache-{workers}" if cache else None

            def make(
                where: str | None = where, workers: int = workers, cache: bool = cache
            ) -> Iterable[Any]:
                return inplace(table, where, bs, workers, cache)

            rates[name] = report(name, timed(make), timed(make))
    files = snap.files
    rates["scan"] = report(
        "pyarrow scan -> torch (no shuffle)",
        timed(lambda: scan(files, bs)),
        timed(lambda: scan(files, bs)),
    )
    start = time.perf_counter()
    snap.write_mds(f"{tmp}/mds")
    export_s = time.perf_counter() - start
    print(f"{'snap.write_mds (export)':<40} {export_s:7.3f} s")
    for workers in (0, 2):
        name = f"MDS export, shuffled, {workers} workers"

        def mds(workers: int = workers) -> Iterable[Any]:
            ds = open_dataset(f"{tmp}/mds")
            return ds.to_torch(batch_size=bs, shuffle=True, seed=0, num_workers=workers)

        cold = timed(mds)
        rates[name] = report(name, cold, timed(mds))
        if workers == 0:
            print(f"{'':<40} first batch after export {export_s + cold[0]:.3f} s")
    print("-- shuffle quality (seed 0, epoch 0, default window of 4 shards):")
    export = open_dataset(f"{tmp}/mds")
    for name, ds in (("in place", ours), ("MDS export", export)):
        print(f"{name} ({ds.num_shards} shards): {quality(epoch_order(ds, bs), ds.shards.samples)}")
    print(f"-- anchors, {load()}:")
    found = anchors(args.anchors_python, table, snap.version, bs)
    print(f"-- ratios (warm rows/s), {load()}:")
    for workers in (0, 2):
        mine = rates[f"in place, shuffled, {workers} workers"]
        line = (
            f"in place {workers} workers: {mine / rates['scan']:.2f}x pyarrow scan, "
            f"{mine / rates[f'MDS export, shuffled, {workers} workers']:.2f}x MDS path"
        )
        for name, case in found.items():
            line += f", {mine / case['warm_rows_s']:.1f}x {name.split(' read')[0]}"
        print(line)


if __name__ == "__main__":
    main()
