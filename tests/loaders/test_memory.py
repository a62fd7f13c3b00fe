"""Peak RSS of full shuffled epochs is bounded by the window, not by the dataset size.

Runs ``bench/memory_bench.py``'s measuring side in fresh interpreters (clean figures from
``/proc/self/status``) over datasets of N and 4N shards, both far larger than the shuffle
window, with a read-ahead budget of a few shards.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

if not Path("/proc/self/status").exists():  # pragma: no cover - Linux only
    pytest.skip("needs /proc/self/status", allow_module_level=True)

BENCH = Path(__file__).resolve().parents[2] / "bench" / "memory_bench.py"
SHARD = 256 << 10
MIB = 1 << 20


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("memory_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("memory_bench", module)
    spec.loader.exec_module(module)
    return module


def test_peak_rss_is_flat_in_dataset_size_and_epochs(tmp_path: Path) -> None:
    bench = _bench()
    results = []
    for shards in (24, 96):
        path = str(tmp_path / f"ds{shards}")
        bench.write(path, shards, f"{SHARD}B")
        results.append(bench.measure(path, epochs=3, batch_size=512, prefetch=4 * SHARD))
    small, large = results
    for r in results:
        assert r["rows_read"] == 3 * r["rows"]
        assert r["shards"] >= 10 * bench.WINDOW  # dataset >= 10x the window
    growth = [r["epochs"][-1]["VmHWM"] - r["start"]["VmRSS"] for r in results]
    data_growth = large["stored_bytes"] - small["stored_bytes"]
    # 4x the data adds a small fraction of it (per-sample order arrays), not the data itself.
    assert growth[1] - growth[0] < 0.25 * data_growth, (growth, data_growth)
    assert growth[1] < 0.5 * large["stored_bytes"], growth
    # No growth across epochs: epoch 3 ends where epoch 2 did (epoch 1 warms allocators).
    for r in results:
        rss = [e["VmRSS"] for e in r["epochs"]]
        assert rss[2] - rss[1] < 2 * MIB, rss
        peaks = [e["VmHWM"] for e in r["epochs"]]
        assert peaks[2] - peaks[1] < 2 * MIB, peaks
