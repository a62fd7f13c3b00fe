"""Ranks of a real ``torchrun`` run (2 processes, gloo) compare what their loader's order
depends on before the first batch (issue 42, bad input): ranks that agree read every row
once; a rank with another seed, or a restored position another rank does not have, fails
on every rank naming the setting and each rank's value (it would have repeated and skipped
rows without a word); a rank that starts late is not waited for: the other rank warns
naming it, and both still read their shares of the one order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, write_mds

pytest.importorskip("torch")

ROWS = 600

WORKER = """
import json, os, sys, time, warnings
import torch.distributed as dist
from spark_dl_core import open_dataset
from spark_dl_core.errors import RanksDisagreeError, RanksNotComparedWarning

path, modes, out = sys.argv[1:4]
dist.init_process_group("gloo")
rank = dist.get_rank()
ds = open_dataset(path)
reports = {}
for mode in modes.split(","):  # one loader after another, as a training script makes them
    seed = 4 if mode == "seed" and rank == 1 else 3
    if mode == "packed":
        loader = ds.to_torch(4, shuffle=True, seed=seed, pack={"column": "tokens", "seq_len": 16})
    else:
        loader = ds.to_torch(20, shuffle=True, seed=seed, columns=["id"])
    if mode == "position" and rank == 1:  # a checkpoint only this rank restored
        loader.load_state_dict({**loader.state_dict(), "consumed": 40})
    if mode == "late" and rank == 1:
        time.sleep(4)
    report = {"ids": [], "error": None, "warnings": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for batch in loader:
                report["ids"] += batch["id"].tolist() if "id" in batch else []
        except RanksDisagreeError as exc:
            report["error"] = str(exc)
    report["warnings"] = [str(w.message) for w in caught if w.category is RanksNotComparedWarning]
    reports[mode] = report
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(reports, f)
dist.barrier()  # no rank tears gloo down while the other still uses it
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # no interpreter teardown, where gloo's threads can abort a finished process
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("agree") / "ds")
    tokens = [list(range(i % 23 + 1)) for i in range(ROWS)]
    table = pa.table({"id": np.arange(ROWS, dtype=np.int64), "tokens": tokens})
    write_mds(table, path, DatasetSpec(shard_size="2KiB"))
    return path


def _run(work: Path, dataset: str, modes: str, timeout_s: str = "60") -> dict[str, Any]:
    """A ``torchrun --standalone --nproc-per-node 2`` of the worker, one loader per mode:
    per mode, each rank's report."""
    out = work / "out"
    out.mkdir()
    script = work / "worker.py"
    script.write_text(WORKER)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "--max-restarts", "0", str(script), dataset, modes, str(out),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", SPARK_DL_RANKS_TIMEOUT_S=timeout_s)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return {mode: [r[mode] for r in ranks] for mode in modes.split(",")}


def test_ranks_compare_their_orders(tmp_path: Path, dataset: str) -> None:
    """One run, four loaders in turn: ranks that agree read every row once (plain and
    packed); another seed, or a position restored on one rank only, fails on every rank
    before its first batch, naming the setting and the ranks' values."""
    got = _run(tmp_path, dataset, "agree,seed,packed,position")
    for mode in ("agree", "packed"):
        assert all(r["error"] is None and not r["warnings"] for r in got[mode]), got[mode]
    first, second = got["agree"][0]["ids"], got["agree"][1]["ids"]
    assert sorted(first + second) == list(range(ROWS)) and set(first).isdisjoint(second)
    for mode, named in (
        ("seed", "seed (rank 0: 3, rank 1: 4)"),
        ("position", "position (rank 0: 0, rank 1: 40)"),
    ):
        for r in got[mode]:
            assert r["error"] is not None and named in r["error"], r["error"]
            assert "would read different orders" in r["error"] and r["ids"] == []


def test_a_late_rank_is_not_waited_for(tmp_path: Path, dataset: str) -> None:
    """Rank 1 starts 4 s late with a 1 s timeout: rank 0 warns naming it and reads its
    share; rank 1 compares with rank 0's posted order (no warning); every row once."""
    first, late = _run(tmp_path, dataset, "late", timeout_s="1")["late"]
    assert first["error"] is None and late["error"] is None
    assert len(first["warnings"]) == 1 and "rank(s) [1] did not start" in first["warnings"][0]
    assert late["warnings"] == []
    assert sorted(first["ids"] + late["ids"]) == list(range(ROWS))
