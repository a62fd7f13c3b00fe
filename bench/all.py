"""Every shape's benchmark against its anchors in one run: one table of ratios.

Each bench runs in its own subprocess, one after the other (never two at once, so they do
not share the cores), with the arguments below; every line it prints that holds a ratio
(``1.23x``) is collected with the bench's name, its wall time and the 1-minute load average
at its start and end. The table goes to stdout and, dated, to ``bench-output/all.md`` (the
page docs/performance.md quotes); each bench's whole output sits beside it.

    .venv/bin/python bench/all.py [--quick] [--only loader,shapes,...] [--out DIR]

``--quick`` runs smaller data and fewer rounds (about a quarter of the default time): for a
check that every bench still runs, not for figures to quote. Anchors that live in side
environments (Mosaic Streaming, LitData, Ray Data) are measured where ``make bench-envs``
installed them, and a bench says "not installed" otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RATIO = re.compile(r"\d+\.\d+x\b")


@dataclass(frozen=True)
class Bench:
    """One shape's bench: its script, what it compares, and its arguments (full, quick)."""

    name: str
    script: str
    shape: str
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()


BENCHES = [
    Bench(
        "loader",
        "loader_bench.py",
        "fixed rows (float32[32] + label) vs a pyarrow loop, in memory, Mosaic",
        (),
        ("--rows", "250000", "--rounds", "1"),
    ),
    Bench(
        "streams",
        "loader_bench.py",
        "the default streamed order vs one stream (68 shards of 2 MiB: 4 streams)",
        ("--shard-size", "2MiB", "--skip", "pyarrow,mem_seq,mem_shuf,mosaic"),
        (
            "--shard-size",
            "512KiB",
            "--rows",
            "250000",
            "--rounds",
            "1",
            "--skip",
            "pyarrow,mem_seq,mem_shuf,mosaic",
        ),
    ),
    Bench(
        "shapes",
        "shapes_bench.py",
        "images vs files and Mosaic, token documents, equal-length arrays",
        (),
        ("--rounds", "1", "--images", "800", "--docs", "10000", "--rows", "250000"),
    ),
    Bench("media", "media_bench.py", "audio and video vs a file loader", (), ("--rounds", "1")),
    Bench(
        "mixture",
        "mixture_bench.py",
        "mixtures and schedules vs one dataset",
        (),
        ("--rounds", "1", "--scale", "0.25"),
    ),
    Bench(
        "llm",
        "llm_bench.py",
        "packed tokens vs LitData's TokensLoader",
        ("--only", "pack,bin", "--rounds", "5", "--docs", "30000"),
        ("--only", "pack", "--rounds", "1", "--docs", "5000"),
    ),
    Bench(
        "in_place",
        "delta_inplace_bench.py",
        "Delta read in place vs a pyarrow scan, the MDS path, Ray Data; first batch",
        (),
        ("--rows", "1000000", "--runs", "1"),
    ),
    Bench(
        "spark_read",
        "spark_read_bench.py",
        'spark.read.format("mds") vs Parquet (array columns)',
        (),
        ("--rows", "500000", "--runs", "1"),
    ),
    Bench(
        "egress",
        "cluster_egress_bench.py",
        "bytes pulled from S3 per epoch on simulated nodes vs the dataset",
        (),
        ("--rows", "8192"),
    ),
]


@dataclass
class Ran:
    bench: Bench
    seconds: float
    loads: tuple[float, float]
    code: int
    ratios: list[str] = field(default_factory=list)


def run(bench: Bench, quick: bool, out: Path) -> Ran:
    """``bench`` in a subprocess; its ratio lines, time, loads and exit code."""
    args = bench.quick if quick else bench.full
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    start_load, started = os.getloadavg()[0], time.perf_counter()
    print(f"== {bench.name}: {bench.script} {' '.join(args)}", flush=True)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / bench.script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    log = out / f"{bench.name}.log"
    log.write_text(proc.stdout + ("\n--- stderr\n" + proc.stderr if proc.stderr else ""))
    ratios = [line.strip() for line in proc.stdout.splitlines() if RATIO.search(line)]
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        ratios.append(f"FAILED (exit {proc.returncode}): {tail[0]} (see {log})")
    return Ran(bench, seconds, (start_load, os.getloadavg()[0]), proc.returncode, ratios)


def table(ran: list[Ran], quick: bool) -> str:
    """The markdown page: date, machine, mode, then per bench its ratio lines."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# All shapes, one run ({now})",
        "",
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()};"
        f" {'quick sizes (a smoke run, not figures to quote)' if quick else 'default sizes'}."
        " Benches ran one after another; load is the 1-minute average at each one's start"
        " and end.",
        "",
        "| bench | compares | minutes | load | ratios (as the bench printed them) |",
        "|---|---|---:|---|---|",
    ]
    for r in ran:
        shown = "<br>".join(x.replace("|", "/") for x in r.ratios) or "(no ratio printed)"
        lines.append(
            f"| {r.bench.name} | {r.bench.shape} | {r.seconds / 60:.1f} |"
            f" {r.loads[0]:.1f}-{r.loads[1]:.1f} | {shown} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data, one round")
    parser.add_argument("--only", default=",".join(b.name for b in BENCHES))
    parser.add_argument("--out", type=Path, default=ROOT / "bench-output")
    args = parser.parse_args()
    wanted = args.only.split(",")
    unknown = sorted(set(wanted) - {b.name for b in BENCHES})
    if unknown:
        parser.error(f"unknown bench {unknown}: choose from {[b.name for b in BENCHES]}")
    args.out.mkdir(parents=True, exist_ok=True)
    ran = [run(b, args.quick, args.out) for b in BENCHES if b.name in wanted]
    page = table(ran, args.quick)
    (args.out / "all.md").write_text(page)
    print("\n" + page)
    sys.exit(1 if any(r.code for r in ran) else 0)


if __name__ == "__main__":
    main()
