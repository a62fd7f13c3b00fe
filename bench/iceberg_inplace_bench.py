"""An Iceberg table read in place against the same data read in place from Delta, and Ray
Data's ``read_iceberg``; and how long a snapshot of many small files takes to plan.

Not a test. The epoch case (default) writes the rows of bench/delta_inplace_bench.py
(``id`` int64 + ``x`` float32[32], 8 appends of one data file each) as a Delta table
(deltalake) and as an Iceberg table (PyIceberg, a SQL catalog over sqlite in the bench's
temporary directory; Parquet files snappy-compressed as deltalake's are), then prints:

- the first batch after open on each, fresh processes with empty caches (median, min and
  max of ``--runs``; the imports before the clock), in-process and with 2 workers;
- cold and warm epoch rows/s of each in place (shuffled, the disk cache of converted row
  groups on), in-process and with 2 workers, and the Iceberg / Delta ratio of the warm ones;
- Ray Data's ``read_iceberg(snapshot_id=).iter_torch_batches(local_shuffle_buffer_size=100k)``
  on the same Iceberg table, in the side environment (``--anchors-python``), and the ratio;
- the load average before and after.

    python bench/iceberg_inplace_bench.py --rows 4000000 [--runs 5] [--first-batch-only]

``--plan-files N [N …]``: the planning case instead: a table of N one-row-group data files
(hard links of one small Parquet file, as bench/delta_plan_bench.py makes them) committed by
PyIceberg's fast append in commits of 25,000 files, then ``open_iceberg(...)``, ``len`` of
its dataset and the first shuffled batch, each in a fresh process: ``cold`` with an empty
plan cache (every manifest decoded, every footer read), ``warm`` the second (the
snapshot's plan and the footers from the plan cache).

    python bench/iceberg_inplace_bench.py --plan-files 10000 30000 100000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import delta_inplace_bench as delta_bench  # noqa: E402 - the shared cases and helpers
import delta_plan_bench as plan_bench  # noqa: E402

COMMIT_FILES = 25_000  # data files a fast append commits at once (the planning case)


def catalog(where: str) -> Any:
    """A PyIceberg SQL catalog over sqlite in ``where``, with a ``bench`` namespace."""
    from pyiceberg.catalog.sql import SqlCatalog

    warehouse = os.path.join(where, "warehouse")
    os.makedirs(warehouse, exist_ok=True)
    cat = SqlCatalog(
        "bench", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}"
    )
    cat.create_namespace("bench")
    return cat


def build_iceberg(cat: Any, tables: Iterable[Any]) -> Any:
    """An Iceberg table ``bench.t`` of ``tables``, one append (one data file) each."""
    it = iter(tables)
    first = next(it)
    props = {"write.parquet.compression-codec": "snappy"}  # deltalake's codec
    table = cat.create_table("bench.t", schema=first.schema, properties=props)
    for part in (first, *it):
        table.append(part)
    return cat.load_table("bench.t")


def epoch_main(args: argparse.Namespace) -> None:
    bs = args.batch_size
    with tempfile.TemporaryDirectory() as tmp:
        delta = f"{tmp}/delta"
        delta_bench.build(delta, args.rows, args.files)
        cat = catalog(tmp)
        table = build_iceberg(cat, delta_bench.parts(args.rows, args.files))
        metadata = str(table.metadata_location)
        snap = delta_bench.open_table(metadata)
        ds = snap.dataset(cache=False)
        print(
            f"{len(ds):,} rows of id int64 + x float32[{delta_bench.DIM}] in {len(snap.files)} "
            f"files ({ds.num_shards} row groups), as Delta and as Iceberg (snapshot "
            f"{snap.version}), batch {bs}; {os.cpu_count()} CPUs, {delta_bench.load()}"
        )
        print(f"-- first batch after open, fresh processes, empty caches, {args.runs} runs:")
        for name, where in (("Delta", delta), ("Iceberg", metadata)):
            for case in ("0", "2"):
                first = delta_bench.fresh_first_batch(case, where, tmp, bs, args.runs)
                print(f"{name + ' in place, ' + case + ' workers':<40} {first}")
                for run in range(args.runs):
                    shutil.rmtree(f"{tmp}/first-{case}-{run}", ignore_errors=True)
        if args.first_batch_only:
            print(delta_bench.load())
            return
        print(f"-- passes (cold then warm), {delta_bench.load()}:")
        rates: dict[str, float] = {}
        for workers in (0, 2):
            for name, where in (("Delta", delta), ("Iceberg", metadata)):
                cache = f"{tmp}/cache-{name}-{workers}"

                def make(where: str = where, cache: str = cache, workers: int = workers) -> Any:
                    return delta_bench.inplace(where, cache, bs, workers)

                label = f"{name} in place, {workers} workers"
                cold = delta_bench.timed(make)
                warm = sorted((delta_bench.timed(make) for _ in range(3)), key=lambda r: r[1])
                rates[label] = delta_bench.report(label, cold, warm[1])  # median of 3
        print(f"-- Ray Data, {delta_bench.load()}:")
        uri, warehouse = f"sqlite:///{tmp}/warehouse/catalog.db", f"file://{tmp}/warehouse"
        found = delta_bench.anchors(
            args.anchors_python, "bench.t", snap.version, bs, ("--iceberg", uri, warehouse)
        )
        print(f"-- ratios (warm rows/s), {delta_bench.load()}:")
        for workers in (0, 2):
            ice = rates[f"Iceberg in place, {workers} workers"]
            line = f"Iceberg in place {workers} workers: "
            line += f"{ice / rates[f'Delta in place, {workers} workers']:.2f}x Delta in place"
            for name, case in found.items():
                line += f", {ice / case['warm_rows_s']:.1f}x {name.split(' +')[0]}"
            print(line)


def plan_table(root: Path, files: int, rows: int) -> str:
    """An Iceberg table of ``files`` one-row-group data files (hard links), committed by
    fast appends of :data:`COMMIT_FILES` files each; its metadata file."""
    import pyarrow as pa
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    cat = catalog(str(root))
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64())])
    table = cat.create_table("bench.t", schema=schema)
    data = Path(table.metadata.location.removeprefix("file://")) / "data"
    data.mkdir(parents=True)
    names, size = plan_bench.linked_files(data, files, rows, field_ids=True)
    spec_id = table.metadata.default_spec_id
    for start in range(0, files, COMMIT_FILES):
        with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
            for name in names[start : start + COMMIT_FILES]:
                entry = DataFile.from_args(
                    content=DataFileContent.DATA,
                    file_path=f"file://{data / name}",
                    file_format=FileFormat.PARQUET,
                    partition=Record(),
                    record_count=rows,
                    file_size_in_bytes=size,
                )
                entry.spec_id = spec_id
                append.append_data_file(entry)
        table = cat.load_table("bench.t")
    return str(table.metadata_location)


def plan_main(args: argparse.Namespace) -> None:
    for files in args.plan_files:
        with tempfile.TemporaryDirectory(prefix="iceberg-plan-") as root:
            started = time.perf_counter()
            metadata = plan_table(Path(root), files, args.plan_rows)
            built = time.perf_counter() - started
            tmp = Path(root) / "tmp"
            tmp.mkdir()
            before = delta_bench.load()
            cold = plan_bench.fresh(metadata, tmp)
            warm = plan_bench.fresh(metadata, tmp)
            out = {"files": files, "build_s": round(built, 2), "cold": cold, "warm": warm}
            print(json.dumps(out), f"({before}; after: {delta_bench.load()})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--files", type=int, default=delta_bench.FILES)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per first batch")
    parser.add_argument("--anchors-python", default=delta_bench.ANCHORS_PYTHON)
    parser.add_argument(
        "--first-batch-only", action="store_true", help="stop after the first batches"
    )
    parser.add_argument("--plan-files", type=int, nargs="+", help="the planning case")
    parser.add_argument("--plan-rows", type=int, default=8, help="rows of each data file")
    args = parser.parse_args()
    if args.plan_files:
        return plan_main(args)
    epoch_main(args)


if __name__ == "__main__":
    main()
