"""``spark-dl export``: a Delta table (pinned at a version or a time) or a directory of
Parquet files written as an MDS dataset, with its lineage in spark_dl.json. The one
command that writes a dataset from a table, so the table-side checks (a directory that is
not a Delta table, options that only a Delta table takes) live here with it."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from spark_dl.cli.output import EXIT_OK, CommandError, print_json


def _read_spec(path: str | None) -> Any:
    from spark_dl_core import DatasetSpec

    if path is None:
        return DatasetSpec()
    try:
        with open(path, encoding="utf-8") as f:
            return DatasetSpec(**json.load(f))
    except (OSError, json.JSONDecodeError, ValueError) as exc:
        raise CommandError(f"spec {path}: {exc}") from None


def cmd_export(args: argparse.Namespace) -> int:
    """Delta (at a pinned version) or Parquet → MDS, with lineage in spark_dl.json."""
    spec = _read_spec(args.spec)
    if args.nulls is not None:  # the flag wins over the spec file's "nulls"
        spec = type(spec).model_validate({**spec.canonical(), "nulls": args.nulls})
    columns = args.columns.split(",") if args.columns else None
    if args.format == "delta":
        from spark_dl_core.tables.delta.table import open_delta

        _check_delta_log(args.table)
        snapshot = open_delta(
            args.table, version=args.version, timestamp=args.timestamp, columns=columns
        )
        if args.mode == "update":  # the files added since the version --out holds
            given = spec if (args.spec or args.nulls is not None) else None
            return _print_export(args, snapshot.write_mds(args.out, given, mode="update"), {})
        data: Any = snapshot.export_batches()  # the layout a Spark write reproduces
        source = snapshot.lineage()
    else:
        if args.mode == "update":
            raise CommandError("--mode update follows a Delta table, not Parquet files")
        if args.version is not None or args.timestamp is not None:
            raise CommandError("--version/--timestamp apply to Delta tables, not Parquet")
        import pyarrow.dataset as pads

        dataset = pads.dataset(args.table, format="parquet", partitioning="hive")
        files = sorted(dataset.files)  # fixed order: same rows, same order, every run
        dataset = pads.dataset(
            files,
            format="parquet",
            schema=dataset.schema,
            partitioning="hive",  # a file list keeps its key=value directories only so
            partition_base_dir=args.table,
        )
        data = dataset.to_batches(columns=columns)
        source = {"kind": "parquet", "path": args.table, "files": len(files), "columns": columns}
    from spark_dl_core import EncodingError, write_mds

    try:
        result = write_mds(
            data, args.out, spec, mode=args.mode, source=source, progress=not args.no_progress
        )
    except EncodingError as exc:
        if spec.nulls == "error" and "nulls='mask'" in str(exc):  # say it in this CLI's words
            raise CommandError(f"{exc} (here: --nulls mask)") from None
        raise
    return _print_export(args, result, source)


def _print_export(args: argparse.Namespace, result: Any, source: dict[str, Any]) -> int:
    summary = {
        "path": result.path,
        "samples": result.num_samples,
        "shards": result.shards,
        "fingerprint": result.fingerprint,
        "source": source or (result.meta or {}).get("source"),
    }
    if result.skipped:  # --mode ignore found a dataset: report it, not the table not written
        summary["skipped"] = True
        summary["source"] = (result.meta or {}).get("source")
    if args.json:
        print_json(summary)
    elif result.skipped:
        print(
            f"skipped: {result.path} already holds a dataset ({result.num_samples} samples in "
            f"{result.shards} shard(s)); --mode {args.mode} leaves it as it is\n"
            f"fingerprint {result.fingerprint}"
        )
    else:
        print(
            f"wrote {result.num_samples} samples in {result.shards} shard(s) to {result.path}\n"
            f"fingerprint {result.fingerprint}"
        )
    return EXIT_OK


def _check_delta_log(table: str) -> None:
    """A local directory without ``_delta_log`` is not a Delta table: say what to pass."""
    if "://" in table and not table.startswith("file://"):
        return  # remote: delta-rs says what it finds
    local = table.removeprefix("file://")
    if os.path.isdir(local) and not os.path.isdir(os.path.join(local, "_delta_log")):
        raise CommandError(
            f"{table} is not a Delta table (it has no _delta_log directory); "
            "for a directory of Parquet files pass --format parquet"
        )
