"""Fuzz harness: randomly corrupted copies of small datasets, read as a user would.

Every file of a dataset is mutated (byte flips, bit flips, truncation, insertions,
deletions, JSON values of other types, removed keys, removed or emptied files) across
datasets of every encoding family, raw and zstd shards, with and without the compact
index. Each case is read in a worker subprocess under a memory limit; the parent gives
each case a timeout, so a crash (signal) or a hang is counted instead of ending the run.
Workers take many cases each; a case whose worker dies or stalls is run again alone to
confirm it. Outcome classes:

- ``same``: read in full, equal to the original (values, columns, length, fingerprint);
- ``typed``: a ``SparkDLError`` naming the mutated file (``typed_unnamed``: not naming it);
- ``no_metadata``: read in full as a dataset without spark-dl metadata, after
  ``spark_dl.json`` was removed from a dataset that has no compact index either (nothing
  records that it had one: it is a valid dataset as another MDS writer would write it);
- ``unchecked``: other values read from a Delta data file whose bytes changed in place
  (same size, magics intact) and still parse: Parquet as deltalake writes it has no page
  checksums, and Delta records no hash of a data file, so no reader can tell;
- ``untyped``: any other exception; ``different``: read in full, not equal to the original;
- ``crash``: the process died (signal or exit); ``hang``: no answer within the timeout.

``python bench/fuzz.py --cases 100000`` (``make fuzz``) prints the counts; ``--targets``
adds the CLI (``cli-inspect``, ``cli-verify``) and ``spark-read`` (a local Spark session per
worker: slow, for a few cases) beside the plain ``read``; ``--json`` prints them as JSON.
The exit status is 1 when any case ended untyped, different, crashed or hung.

The harness lives in ``bench/fuzzing/`` (one module per piece: mutations, the MDS and
Delta target families, the readers, the worker, the driver); this file is its command
line, the worker processes' entry point, and the names the tests load from it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench.fuzzing, tests.*
from bench.fuzzing.datasets import build_datasets
from bench.fuzzing.delta_tables import B85, Z85, build_delta_tables, dv_file, inline_dv
from bench.fuzzing.delta_verdicts import valid_log_change
from bench.fuzzing.driver import run
from bench.fuzzing.iceberg_tables import build_iceberg_tables, mutated_in_place, pin_of
from bench.fuzzing.targets import DELTA_TARGETS, ICEBERG_TARGETS
from bench.fuzzing.worker import BAD, OUTCOMES, worker
from tests.delta_helpers import roaring64

__all__ = [
    "B85",
    "Z85",
    "build_datasets",
    "build_delta_tables",
    "build_iceberg_tables",
    "dv_file",
    "inline_dv",
    "main",
    "mutated_in_place",
    "pin_of",
    "roaring64",
    "run",
    "valid_log_change",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--batch", type=int, default=250, help="cases per worker process")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    parser.add_argument(
        "--targets",
        default="read",
        help="comma-separated: read, cli-inspect, cli-verify, spark-read (with --delta: "
        "delta-export, delta-inplace; with --iceberg: iceberg-export, iceberg-inplace, "
        "iceberg-mds)",
    )
    parser.add_argument(
        "--delta", action="store_true", help="corrupt Delta tables (log, checkpoints, DVs, data)"
    )
    parser.add_argument(
        "--iceberg",
        action="store_true",
        help="corrupt Iceberg tables (metadata, manifests, delete files, data)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    started = time.perf_counter()
    targets = args.targets.split(",")
    if args.delta and targets == ["read"]:
        targets = list(DELTA_TARGETS)
    if args.iceberg and targets == ["read"]:
        targets = list(ICEBERG_TARGETS)
    counts, bad = run(
        args.cases,
        args.seed,
        args.jobs,
        args.batch,
        args.timeout,
        targets,
        delta=args.delta,
        iceberg=args.iceberg,
    )
    took = time.perf_counter() - started
    if args.json:
        print(json.dumps({"counts": counts, "bad": bad, "seconds": took}, indent=1))
    else:
        total = sum(counts.values())
        print(f"{total:,} cases (seed {args.seed}) in {took:.0f} s")
        for outcome in OUTCOMES:
            print(f"  {outcome:<14} {counts.get(outcome, 0):>9,}")
        for r in bad[:50]:
            print(
                f"  {r['outcome']}: case {r['id']} {r['dataset']} {r['file']} {r['kind']} "
                f"{r['target']}: {r['detail']}"
                + (f" (its worker first ended: {r['flaky']}; not alone)" if r.get("flaky") else "")
            )
    sys.exit(1 if any(counts.get(o) for o in BAD) else 0)


if __name__ == "__main__":
    main()
