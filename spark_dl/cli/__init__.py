"""``spark-dl``: export, inspect, verify, vacuum and query datasets from the command line.

Exit codes: 0 success, 1 failure (bad data, missing table, corrupted shard), 2 usage
error (argparse). ``--json`` prints machine-readable data on stdout; messages go to stderr.
pyspark is imported only by ``sql``: the other commands start fast, with no JVM.

One module per command family (``export``, ``describe`` for inspect, ``show``, ``verify``,
``maintenance`` for vacuum and index, ``sql``), what they read (``reading``), what they
share (``output``), and the argument parser (``parser``); this module runs a parsed command
and turns a deliberate error into one line with exit code 1.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from spark_dl.cli.output import EXIT_FAIL, EXIT_OK, EXIT_USAGE, CommandError
from spark_dl.cli.parser import build_parser

__all__ = ["EXIT_FAIL", "EXIT_OK", "EXIT_USAGE", "CommandError", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``spark-dl``; returns the exit code (also when called from Python)."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on usage errors
    from spark_dl_core import SparkDLError

    try:
        return int(args.func(args))
    except (CommandError, SparkDLError, OSError) as exc:  # deliberate errors: one line
        print(f"spark-dl {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        return 130
