"""A few hundred randomly corrupted datasets (``bench/fuzz.py``), each read in a worker
process with a timeout: every one ends in the original data or a spark-dl error naming the
mutated file; none crashes, hangs, raises an untyped exception or serves other data."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fuzz.py"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")  # the pristine datasets, built once


@pytest.fixture(scope="module")
def fuzz() -> Any:
    spec = importlib.util.spec_from_file_location("fuzz_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_bench", module)
    spec.loader.exec_module(module)
    return module


def test_corrupted_datasets_end_in_the_data_or_a_typed_error(fuzz: Any, scratch: Path) -> None:
    counts, bad = fuzz.run(
        300,
        seed=20,
        jobs=2,
        batch=150,
        targets=["read", "cli-inspect", "cli-verify"],
        scratch=scratch,
    )
    assert sum(counts.values()) == 300
    assert not bad, bad[:5]
    assert counts["typed_unnamed"] == 0
    assert counts["same"] > 10 and counts["typed"] > 100  # both kinds of outcome are reached


def test_the_harness_counts_crashes_and_hangs(fuzz: Any, scratch: Path) -> None:
    counts, bad = fuzz.run(
        2,
        seed=1,
        jobs=1,
        batch=2,
        timeout=3,
        targets=["selftest-abort", "selftest-hang"],
        scratch=scratch,
    )
    assert counts["crash"] == counts["hang"] == 1, (counts, bad)
    assert {r["outcome"] for r in bad} == {"crash", "hang"}


def test_corrupted_delta_tables_end_in_the_data_or_a_typed_error(
    fuzz: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Delta logs (commits, checkpoint, ``_last_checkpoint``), deletion vectors (on-disk and
    inline) and Parquet data files corrupted, read pinned by the export and in place."""
    pytest.importorskip("deltalake")
    scratch = tmp_path_factory.mktemp("fuzz-delta")
    counts, bad = fuzz.run(120, seed=7, jobs=2, batch=60, scratch=scratch, delta=True)
    assert sum(counts.values()) == 120
    assert not bad, [(r["outcome"], r["file"], r["kind"], r["detail"]) for r in bad[:5]]
    assert counts["same"] > 10 and counts["typed"] > 50
