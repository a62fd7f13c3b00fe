"""The commands that change a written dataset's files without changing its data:
``vacuum`` (delete leftovers no committed index references, and old versions of a dataset
following a Delta table) and ``index`` (write the compact binary index beside index.json)."""

from __future__ import annotations

import argparse

from spark_dl.cli.output import EXIT_OK, print_json


def cmd_vacuum(args: argparse.Namespace) -> int:
    """Delete files the committed index does not reference, older than the retention."""
    from spark_dl_core.maintenance import vacuum

    report = vacuum(
        args.path,
        retention_seconds=args.retention,
        dry_run=args.dry_run,
        keep_versions=args.keep_versions,
        keep_seconds=args.keep_seconds,
    )
    if args.json:
        print_json(report.to_dict())
        return EXIT_OK
    verb = "would remove" if args.dry_run else "removed"
    for name in report.removed:
        print(f"{verb} {name}")
    if report.dropped_versions:
        print(
            f"{'would let' if args.dry_run else 'let'} go table versions {report.dropped_versions}"
        )
    if not report.committed:
        print(
            f"{report.path}: no index.json: every shard here is left over by a write that never "
            "committed"
        )
    print(
        f"{report.path}: {verb} {len(report.removed)} file(s), {report.bytes_removed} bytes; "
        f"kept {len(report.kept)}, {len(report.too_new)} unreferenced but newer than "
        f"{args.retention:g}s"
    )
    return EXIT_OK


def cmd_index(args: argparse.Namespace) -> int:
    """Write spark_dl.index.arrow beside index.json (datasets written by Mosaic included)."""
    from spark_dl_core import open_dataset, write_compact_index

    written = write_compact_index(args.path)
    ds = open_dataset(args.path)
    print(f"{written}: {ds.num_shards} shard(s), {len(ds)} samples")
    return EXIT_OK
