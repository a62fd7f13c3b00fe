"""The ``spark-dl`` command line: every subcommand, its arguments and their types. Bad
values (a negative count, a malformed time, ``--var`` without ``=``) are refused here, at
parse time, with exit code 2 and the argument named, before any command runs."""

from __future__ import annotations

import argparse
from typing import Any

from spark_dl.cli.describe import cmd_inspect
from spark_dl.cli.export import cmd_export
from spark_dl.cli.maintenance import cmd_index, cmd_vacuum
from spark_dl.cli.output import quiet_on_broken_pipe
from spark_dl.cli.show import cmd_show
from spark_dl.cli.sql import cmd_sql
from spark_dl.cli.verify import cmd_verify
from spark_dl_core.spec import NULL_MODES


def _timestamp(text: str) -> str:
    """``--timestamp``: an ISO-8601 time (``2024-05-01``, ``2024-05-01T10:00:00Z``)."""
    import datetime as dt

    try:
        dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO time such as 2024-05-01T10:00:00Z, got {text!r}"
        ) from None
    return text


def _count(least: int) -> Any:
    """An argparse type: a whole number of at least ``least`` (bad ones exit 2, named)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be {least} or more, got {value}")
        return value

    parse.__name__ = "count"  # argparse names the type in its own messages
    return parse


def _seconds(text: str) -> float:
    """``--retention``: seconds, zero or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


def _variable(text: str) -> str:
    """``--var NAME=VALUE``, refused at parse time (exit 2) when the ``=`` is missing."""
    if "=" not in text or not text.split("=", 1)[0].strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spark-dl",
        description="Reproducible deep-learning datasets from Spark and Delta tables (MDS).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("export", help="Delta table (pinned) or Parquet → MDS dataset")
    p.add_argument("table", help="Delta table or Parquet directory (path or URL)")
    when = p.add_mutually_exclusive_group()
    when.add_argument(
        "--version", type=_count(0), help="Delta version to pin (default: latest now)"
    )
    when.add_argument(
        "--timestamp", type=_timestamp, help="last Delta commit at/before this ISO time"
    )
    p.add_argument("--out", required=True, help="output MDS directory or URL")
    p.add_argument("--spec", help="JSON file with a DatasetSpec (encodings, compression…)")
    p.add_argument(
        "--format", choices=["delta", "parquet"], default="delta", help="(default: delta)"
    )
    p.add_argument("--columns", help="comma-separated columns to export (default: all)")
    p.add_argument(
        "--mode",
        choices=["error", "overwrite", "append", "ignore", "update"],
        default="error",
        help="if a dataset exists at --out: refuse (error, the default, as Spark), replace "
        "it (overwrite), append to it, or leave it (ignore); update: make --out follow the "
        "Delta table, converting only the files added since the version it holds",
    )
    p.add_argument(
        "--nulls",
        choices=NULL_MODES,
        help="null values: refuse them naming the column and row (error, the default), or "
        "store each nullable column filled plus a <column>__isnull companion that Arrow and "
        'Spark readers turn back into nulls (mask); overrides the spec file\'s "nulls"',
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=quiet_on_broken_pipe(cmd_export))

    p = sub.add_parser("inspect", help="columns, encodings, shards, sizes, lineage, fingerprint")
    p.add_argument(
        "path",
        help="dataset directory or URL, a saved mixture spec (.json), or a Delta table "
        "(TABLE@VERSION pins a version, TABLE@M..N the rows new since M; read in place, "
        "nothing exported)",
    )
    p.add_argument("--samples", type=_count(0), default=3, help="sample rows to show (default 3)")
    p.add_argument("--epoch", type=_count(0), default=0, help="mixture specs: the epoch to show")
    p.add_argument(
        "--shards", action="store_true", help="list every shard (default: a summary of them)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=quiet_on_broken_pipe(cmd_inspect))

    p = sub.add_parser("show", help="the dataset card: schema, lineage, statistics, pictures")
    p.add_argument(
        "path",
        help="dataset directory or URL, a saved mixture spec (.json), or a Delta table "
        "(TABLE@VERSION pins a version, TABLE@M..N the rows new since M; read in place, "
        "nothing exported)",
    )
    p.add_argument("--html", metavar="OUT", help="write one self-contained HTML page to OUT")
    p.add_argument(
        "--rows", type=_count(0), default=512, help="sampled rows (default 512; 0: schema only)"
    )
    p.set_defaults(func=quiet_on_broken_pipe(cmd_show))

    p = sub.add_parser("verify", help="re-hash and decode every shard; exit 1 naming bad files")
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=quiet_on_broken_pipe(cmd_verify))

    p = sub.add_parser("vacuum", help="delete leftover files no committed index references")
    p.add_argument("path")
    p.add_argument(
        "--retention",
        type=_seconds,
        default=3600.0,
        metavar="SECONDS",
        help="keep unreferenced files younger than this: a write may be in flight (default 3600)",
    )
    p.add_argument("--dry-run", action="store_true", help="report, delete nothing")
    p.add_argument(
        "--keep-versions",
        type=_count(1),
        metavar="N",
        help="a dataset following a Delta table: keep its N newest versions (default: all)",
    )
    p.add_argument(
        "--keep-seconds",
        type=_seconds,
        metavar="SECONDS",
        help="... and the versions committed within this many seconds (either rule keeps)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=quiet_on_broken_pipe(cmd_vacuum))

    p = sub.add_parser("index", help="build the compact binary index (fast open at many shards)")
    p.add_argument("path")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("sql", help="run the statements of a .sql file on a local Spark session")
    p.add_argument("file")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--limit", type=_count(0), default=100, help="rows printed per result")
    p.add_argument(
        "--var",
        action="append",
        default=[],
        type=_variable,
        metavar="NAME=VALUE",
        help="${NAME} substitution (an undefined ${NAME} is an error)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=quiet_on_broken_pipe(cmd_sql))
    return parser
