"""What every ``spark-dl`` command shares: its exit codes, the one-line error it reports,
and how it writes data: JSON (``--json``), sample values made JSON-safe, and a reader that
closes the pipe early (``spark-dl inspect … | head``) taken as success. Kept apart from
the commands so each command module needs only this and the core."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from typing import Any

import numpy as np

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A failure the CLI reports as one line and exit code 1."""


def jsonable(value: Any, limit: int = 200) -> Any:
    """Sample values in a form JSON can hold; long values are truncated with a note."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return [jsonable(v, limit) for v in value.tolist()]
        if value.size > limit:
            return {"shape": list(value.shape), "dtype": str(value.dtype), "truncated": True}
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (bytes, bytearray, memoryview)):
        from spark_dl_core.card import describe_value

        return describe_value(value)  # <jpeg 400x300, 73 KB>: what it is, not its bytes
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + "…"
    if isinstance(value, dict):
        return {str(k): jsonable(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, limit) for v in value]
    return value


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=1, sort_keys=True, default=str)
    sys.stdout.write("\n")


def quiet_on_broken_pipe(command: Any) -> Any:
    """A reader that stops early (``spark-dl inspect … | head``) is not an error: stdout
    goes to /dev/null so the interpreter's final flush stays quiet, and the exit is 0."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            code = int(command(args))
            sys.stdout.flush()
            return code
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_OK

    return run
