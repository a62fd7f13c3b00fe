"""How long a Delta snapshot of many small files takes to open and plan in place.

Writes one small Parquet file (a copy per 50,000 names) and hard-links it under ``--files``
names (distinct paths, each opened and its footer read on its own; the page cache is warm,
as it is for a table read a second time), with a hand-written log of one add action per
file (``numRecords`` in its stats), then times ``open_delta(...)``,
``.dataset(cache=False)`` and the first shuffled batch, each in a fresh process: ``cold``
the first open on the machine (no plan cache: every footer read), ``warm`` the second (the
footers' row-group metadata from the per-machine plan cache, tables/parquet/footers). The
caches live under the bench's own temporary directory (``TMPDIR``). ``--table DIR`` reuses
(or builds once into) ``DIR``: an A/B against another checkout runs this script with that
checkout's ``PYTHONPATH``.

    python bench/delta_plan_bench.py --files 100000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_LINKS = 50_000


def linked_files(
    where: Path, files: int, rows: int, field_ids: bool = False
) -> tuple[list[str], int]:
    """``files`` hard links in ``where`` of one ``rows``-row Parquet file (``id`` int64,
    ``x`` double, with Iceberg's field ids 1 and 2 if ``field_ids``; a copy per 50,000
    names): their names and the file's size."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = pa.table({"id": pa.array(range(rows), pa.int64()), "x": [float(i) for i in range(rows)]})
    if field_ids:
        ids = [{b"PARQUET:field_id": str(i + 1)} for i in range(2)]
        data = data.cast(pa.schema([f.with_metadata(m) for f, m in zip(data.schema, ids)]))
    seeds = [where / f"seed-{k}.parquet" for k in range(files // _LINKS + 1)]
    for seed in seeds:  # a file takes ~65,000 links at most (ext4): one copy per 50,000
        pq.write_table(data, seed)
    size = seeds[0].stat().st_size
    names = [f"part-{i:06d}.parquet" for i in range(files)]
    for i, name in enumerate(names):
        os.link(seeds[i // _LINKS], where / name)
    for seed in seeds:
        seed.unlink()
    return names, size


def build(root: Path, files: int, rows: int) -> Path:
    """A table of ``files`` hard links of one ``rows``-row Parquet file."""
    table = root / "t"
    (table / "_delta_log").mkdir(parents=True)
    names, size = linked_files(table, files, rows)
    schema = {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "x", "type": "double", "nullable": True, "metadata": {}},
        ],
    }
    lines = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": "bench",
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(schema),
                "partitionColumns": [],
                "configuration": {},
                "createdTime": 0,
            }
        },
    ]
    stats = json.dumps({"numRecords": rows})
    for name in names:
        add = {"path": name, "partitionValues": {}, "size": size, "modificationTime": 0}
        lines.append({"add": dict(add, dataChange=True, stats=stats)})
    text = "\n".join(json.dumps(line) for line in lines) + "\n"
    (table / "_delta_log" / f"{0:020}.json").write_text(text)
    return table


def open_table(table: str) -> Any:
    """A Delta table's directory, or an Iceberg table's metadata file
    (bench/iceberg_inplace_bench.py), opened pinned."""
    if table.endswith(".metadata.json"):
        from spark_dl_core.tables.iceberg.table import open_iceberg

        return open_iceberg(table)
    from spark_dl_core.tables.delta.table import open_delta

    return open_delta(table)


def measure(table: Path | str) -> dict[str, float]:
    out = {}
    started, cpu = time.perf_counter(), time.process_time()
    snap = open_table(str(table))
    out["open_s"] = time.perf_counter() - started
    out["open_cpu_s"] = time.process_time() - cpu
    started, cpu = time.perf_counter(), time.process_time()
    ds = snap.dataset(cache=False)
    out["rows"] = len(ds)
    out["dataset_s"] = time.perf_counter() - started
    out["dataset_cpu_s"] = time.process_time() - cpu  # all threads: steadier on a busy host
    started = time.perf_counter()
    next(iter(ds.iter_batches(batch_size=256, shuffle=True, seed=1)))
    out["first_batch_s"] = time.perf_counter() - started
    return out


def fresh(table: Path | str, tmp: Path) -> dict[str, float]:
    """:func:`measure` in a new process whose caches live in ``tmp``."""
    env = dict(os.environ, TMPDIR=str(tmp))
    code = f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
    code += "import spark_dl_core, delta_plan_bench as b; "  # imported before the clock
    if str(table).endswith(".metadata.json"):
        code += "import pyiceberg.table, pyiceberg.io.pyarrow, spark_dl_core.tables.iceberg.table; "
    else:
        code += "import deltalake, spark_dl_core.tables.delta.table; "
    code += f"print(json.dumps(b.measure({str(table)!r})))"
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    result: dict[str, float] = json.loads(out.stdout.decode().strip().splitlines()[-1])
    return {k: round(v, 3) for k, v in result.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--table", help="build the table here once (or reuse it)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="delta-plan-") as root:
        started = time.perf_counter()
        where = Path(args.table) if args.table else Path(root)
        table = where / "t"
        if not table.exists():
            where.mkdir(parents=True, exist_ok=True)
            build(where, args.files, args.rows)
        built = time.perf_counter() - started
        tmp = Path(root) / "tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        cold = fresh(table, tmp)
        warm = fresh(table, tmp)
        print(
            json.dumps(
                {"files": args.files, "build_s": round(built, 2), "cold": cold, "warm": warm}
            )
        )


if __name__ == "__main__":
    main()
