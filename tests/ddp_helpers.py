"""Two gloo ranks in real processes (torch.multiprocessing), for loader tests under DDP.

A test gives the source of ``work(rank, path)``, run on each rank after the process group
is up; each rank's JSON-able result comes back in rank order. The harness leaves after a
barrier and ``destroy_process_group`` without interpreter teardown, where gloo's threads
can abort a process that has finished its work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ports import free_port

_HARNESS = """
import json, os, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

{work}

def run(rank, path, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    result = work(rank, path)
    gathered = [None, None]
    dist.all_gather_object(gathered, result)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(gathered, f)
    dist.barrier()  # no rank tears gloo down while the other still uses it
    dist.destroy_process_group()
    os._exit(0)

if __name__ == "__main__":
    mp.spawn(run, args=(sys.argv[1], int(sys.argv[2]), sys.argv[3]), nprocs=2)
"""


def run_two_ranks(work: str, path: str, tmp_path: Path, timeout: float = 120) -> list[Any]:
    """Each rank's result of ``work(rank, path)`` (given as source), rank 0 first."""
    port = free_port()
    script = tmp_path / "ddp.py"
    script.write_text(_HARNESS.format(work=work))
    out = tmp_path / "out.json"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    subprocess.run(
        [sys.executable, str(script), path, str(port), str(out)],
        check=True,
        timeout=timeout,
        env=env,
    )
    return list(json.loads(out.read_text()))
