"""The parent of a fuzz run: builds the pristine datasets (or Delta tables), plans the
cases, and runs them in batches, one worker process per batch, a few at a time. A case
that kills or stalls its worker (crash, hang) is run again alone to confirm it, so one
bad case costs neither the run nor the other cases of its batch."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.fuzzing.datasets import build_datasets, plan_cases
from bench.fuzzing.delta_tables import build_delta_tables, plan_delta_cases
from bench.fuzzing.iceberg_tables import build_iceberg_tables, plan_iceberg_cases
from bench.fuzzing.targets import DELTA_TARGETS, ICEBERG_TARGETS
from bench.fuzzing.worker import BAD

FUZZ = Path(__file__).resolve().parents[1] / "fuzz.py"  # its --worker runs one worker


def _run_batch(
    cases: list[dict[str, Any]], pristine_file: str, scratch: Path, timeout: float
) -> list[dict[str, Any]]:
    """Run ``cases`` in as few workers as survive them; returns one result per case, with
    any case that killed or stalled its worker confirmed by running it alone."""
    results: dict[int, dict[str, Any]] = {}
    pending = list(cases)
    while pending:
        died, status = _run_worker(pending, pristine_file, scratch, timeout, results)
        pending = [c for c in pending if c["id"] not in results]
        if died is None:
            continue
        alone: dict[int, dict[str, Any]] = {}
        again, why = _run_worker([died], pristine_file, scratch, timeout, alone)
        if again is None:  # it passes alone: record what it did then, noting the first death
            results[died["id"]] = {**alone[died["id"]], "flaky": status}
        else:
            results[died["id"]] = {"id": died["id"], "outcome": why[0], "detail": why[1]}
        pending = [c for c in pending if c["id"] not in results]
    return [{**c, **results[c["id"]]} for c in cases]


def _run_worker(
    cases: list[dict[str, Any]],
    pristine_file: str,
    scratch: Path,
    timeout: float,
    results: dict[int, dict[str, Any]],
) -> tuple[dict[str, Any] | None, tuple[str, str]]:
    """One worker over ``cases``; fills ``results``. Returns the case it died or stalled
    in (None if it finished) and ("crash" | "hang", detail)."""
    fd, cases_file = tempfile.mkstemp(dir=scratch, suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(cases, f)
    by_id = {c["id"]: c for c in cases}
    proc = subprocess.Popen(
        [sys.executable, str(FUZZ), "--worker", cases_file, pristine_file],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    current: int | None = None
    deadline = time.monotonic() + max(120.0, timeout)  # start-up: imports, on a busy machine
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                proc.kill()
                proc.wait()
                stalled = by_id[current] if current is not None else cases[0]
                return stalled, ("hang", f"no answer within {timeout:.0f} s")
            line = proc.stdout.readline()
            if not line:
                code = proc.wait()
                if current is None and len(results) >= len(cases):
                    return None, ("", "")
                err = (proc.stderr.read() if proc.stderr else "")[-300:]
                died = by_id[current] if current is not None else cases[0]
                return died, ("crash", f"exit {code}: {err.strip()}")
            if line.startswith("S "):
                current = int(line[2:])
                deadline = time.monotonic() + timeout
            elif line.startswith("R "):
                result = json.loads(line[2:])
                results[result["id"]] = result
                current = None
                deadline = time.monotonic() + timeout
                if len(results) >= len(cases) and all(c["id"] in results for c in cases):
                    proc.wait()
                    return None, ("", "")
    finally:
        sel.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.unlink(cases_file)


def run(
    count: int,
    seed: int = 0,
    jobs: int | None = None,
    batch: int = 250,
    timeout: float = 30.0,
    targets: list[str] | None = None,
    scratch: Path | None = None,
    delta: bool = False,
    iceberg: bool = False,
) -> tuple[Counter[str], list[dict[str, Any]]]:
    """Build the datasets (``delta``: the Delta tables; ``iceberg``: the Iceberg tables),
    run ``count`` cases; the outcome counts and every bad case."""
    own = scratch is None
    root = Path(tempfile.mkdtemp(prefix="spark-dl-fuzz-")) if scratch is None else scratch
    try:
        family = "pristine-iceberg" if iceberg else "pristine-delta" if delta else "pristine"
        pristine_file = root / f"{family}.json"
        if pristine_file.exists():  # built by an earlier run in this scratch directory
            datasets = {k: Path(v) for k, v in json.loads(pristine_file.read_text()).items()}
        else:
            build = (
                build_iceberg_tables if iceberg else build_delta_tables if delta else build_datasets
            )
            datasets = build(root / family)
            pristine_file.write_text(json.dumps({k: str(v) for k, v in datasets.items()}))
        if iceberg:
            cases = plan_iceberg_cases(datasets, count, seed, targets or list(ICEBERG_TARGETS))
        elif delta:
            cases = plan_delta_cases(datasets, count, seed, targets or list(DELTA_TARGETS))
        else:
            cases = plan_cases(datasets, count, seed, targets or ["read"])
        batches = [cases[i : i + batch] for i in range(0, len(cases), batch)]
        counts: Counter[str] = Counter()
        bad: list[dict[str, Any]] = []
        with ThreadPoolExecutor(jobs or os.cpu_count() or 2) as pool:
            for results in pool.map(
                lambda b: _run_batch(b, str(pristine_file), root, timeout), batches
            ):
                for r in results:
                    counts[r["outcome"]] += 1
                    unnamed = iceberg and r["outcome"] == "typed_unnamed"  # a finding there
                    if r["outcome"] in BAD or r.get("flaky") or unnamed:
                        bad.append(r)
        return counts, bad
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
