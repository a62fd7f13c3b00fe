"""One worker process: runs its cases in order under a memory limit, each on a mutated
copy of a pristine dataset, and judges the outcome against what the pristine copy reads
as. It announces each case before it starts, so the driver can name the one it died in."""

from __future__ import annotations

import json
import random
import resource
import shutil
import tempfile
import traceback
from pathlib import Path
from typing import Any

from bench.fuzzing.datasets import META_FILE, METADATA
from bench.fuzzing.delta_tables import mutate_delta
from bench.fuzzing.delta_verdicts import pages_only, valid_log_change
from bench.fuzzing.iceberg_tables import locked, mutate_iceberg, mutated_in_place, pin_of
from bench.fuzzing.iceberg_verdicts import unchecked_iceberg_change
from bench.fuzzing.mutations import mutate
from bench.fuzzing.targets import CliFailed, iceberg_snapshot, run_target, spark_session

BAD = ("untyped", "different", "crash", "hang")
OUTCOMES = ("same", "typed", "typed_unnamed", "no_metadata", "unchecked", *BAD)
MEMORY_LIMIT = 3 << 30  # a case allocating beyond this fails (MemoryError: untyped)


def run_case(case: dict[str, Any], pristine: dict[str, str], work: Path) -> dict[str, Any]:
    """Mutate a copy of the case's dataset and read it; the outcome and a detail."""
    from spark_dl_core import SparkDLError

    if case["dataset"].startswith("ice-"):
        return run_iceberg_case(case, pristine, work)
    target = work / f"case-{case['id']}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(pristine[case["dataset"]], target)
    has_compact = (target / METADATA[2]).exists()
    victim = target / case["file"]
    rng = random.Random(case["seed"])
    original = victim.read_bytes()
    if case["dataset"].startswith("delta-"):
        mutated = mutate_delta(original, case["kind"], rng, case["file"])
    else:
        mutated = mutate(original, case["kind"], rng)
    if mutated is None:
        victim.unlink()
    else:
        victim.write_bytes(mutated)
    expected_key = f"{case['dataset']}|{case['target']}"
    if expected_key not in _EXPECTED:  # the original must read (else the worker dies: seen)
        _EXPECTED[expected_key] = run_target(case["target"], pristine[case["dataset"]])
    try:
        got = run_target(case["target"], str(target), _pinned(pristine[case["dataset"]]))
    except (SparkDLError, CliFailed) as exc:
        text = str(exc)
        named = Path(case["file"]).name in text
        return {"outcome": "typed" if named else "typed_unnamed", "detail": text[:300]}
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        tb = traceback.format_exc(limit=-3)
        return {"outcome": "untyped", "detail": f"{type(exc).__name__}: {exc}"[:300], "tb": tb}
    finally:
        shutil.rmtree(target, ignore_errors=True)
    if got == _EXPECTED[expected_key]:
        return {"outcome": "same", "detail": ""}
    if pages_only(case["file"], original, mutated):
        return {"outcome": "unchecked", "detail": "data pages changed in place"}
    why = valid_log_change(case["file"], original, mutated)
    if why:
        return {"outcome": "unchecked", "detail": why}
    if case["kind"] == "remove" and case["file"] == META_FILE and not has_compact:
        # nothing records that the dataset had spark-dl metadata: it is now a valid dataset
        # as another MDS writer would write it, read without our column types
        return {"outcome": "no_metadata", "detail": ""}
    return {"outcome": "different", "detail": ""}


_EXPECTED: dict[str, str] = {}


def run_iceberg_case(case: dict[str, Any], pristine: dict[str, str], work: Path) -> dict[str, Any]:
    """An Iceberg case: the pristine table mutated in place under its lock (its files name
    each other by absolute path, so a copy would read the original) and put back after."""
    from spark_dl_core import SparkDLError

    table = Path(pristine[case["dataset"]])
    key = f"{case['dataset']}|{case['target']}"
    original = Path(f"{table}.orig", case["file"]).read_bytes()
    mutated = mutate_iceberg(original, case["kind"], random.Random(case["seed"]), case["file"])
    out = work / f"case-{case['id']}"
    with locked(table):
        if key not in _EXPECTED:
            _EXPECTED[key] = iceberg_snapshot(str(table), case["target"], str(out))
            shutil.rmtree(out, ignore_errors=True)
    try:
        with mutated_in_place(table, case["file"], mutated):
            got = iceberg_snapshot(str(table), case["target"], str(out))
    except SparkDLError as exc:
        text = str(exc)
        pin = pin_of(str(table))
        where = (Path(case["file"]).name, pin["metadata"], f"snapshot {pin['snapshot_id']}")
        named = all(w in text for w in where)  # the file, the table and the snapshot
        return {"outcome": "typed" if named else "typed_unnamed", "detail": text[:300]}
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        tb = traceback.format_exc(limit=-3)
        return {"outcome": "untyped", "detail": f"{type(exc).__name__}: {exc}"[:300], "tb": tb}
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if got == _EXPECTED[key]:
        return {"outcome": "same", "detail": ""}
    why = unchecked_iceberg_change(case["file"], original, mutated)
    if why:
        return {"outcome": "unchecked", "detail": why}
    return {"outcome": "different", "detail": ""}


def _pinned(path: str) -> int | None:
    """A pristine Delta table's latest version (its last commit file); None for MDS."""
    commits = sorted(Path(path).glob("_delta_log/*[0-9].json"))
    return int(commits[-1].name.split(".")[0]) if commits else None


def worker(cases_file: str, pristine_file: str) -> None:
    """Run cases in order, announcing each before it starts (so a death names it)."""
    import warnings

    warnings.simplefilter("ignore")
    cases = json.loads(Path(cases_file).read_text())
    pristine = json.loads(Path(pristine_file).read_text())
    if not any(c["target"] == "spark-read" for c in cases):  # a JVM reserves far more
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash ends at once, with no core file
    import spark_dl_core  # noqa: F401  (imported before the first case's clock starts)

    if any(c["target"].startswith("cli-") for c in cases):
        import spark_dl.cli  # noqa: F401
    if any(c["target"] == "spark-read" for c in cases):
        spark_session()
    for key in sorted({(c["dataset"], c["target"]) for c in cases}):  # off the cases' clocks
        if not key[1].startswith(("selftest-", "iceberg-")):  # Iceberg: under its lock
            _EXPECTED["|".join(key)] = run_target(key[1], pristine[key[0]])
    # under the run's scratch directory (beside the cases file): removed with it even when
    # this process is killed
    with tempfile.TemporaryDirectory(prefix="work-", dir=Path(cases_file).parent) as work:
        for case in cases:
            print(f"S {case['id']}", flush=True)
            result = run_case(case, pristine, Path(work))
            print("R " + json.dumps({"id": case["id"], **result}), flush=True)
