"""``spark-dl``: export, inspect, verify, vacuum and query datasets from the command line.

Exit codes: 0 success, 1 failure (bad data, missing table, corrupted shard), 2 usage
error (argparse). ``--json`` prints machine-readable data on stdout; messages go to stderr.
pyspark is imported only by ``sql``: the other commands start fast, with no JVM.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from spark_dl_core.spec import NULL_MODES

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A failure the CLI reports as one line and exit code 1."""


# --------------------------------------------------------------------------- helpers


def _jsonable(value: Any, limit: int = 200) -> Any:
    """Sample values in a form JSON can hold; long values are truncated with a note."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return [_jsonable(v, limit) for v in value.tolist()]
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
        return {str(k): _jsonable(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, limit) for v in value]
    return value


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=1, sort_keys=True, default=str)
    sys.stdout.write("\n")


def _read_spec(path: str | None) -> Any:
    from spark_dl_core import DatasetSpec

    if path is None:
        return DatasetSpec()
    try:
        with open(path, encoding="utf-8") as f:
            return DatasetSpec(**json.load(f))
    except (OSError, json.JSONDecodeError, ValueError) as exc:
        raise CommandError(f"spec {path}: {exc}") from None


# --------------------------------------------------------------------------- export


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
        _print_json(summary)
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
    import os

    if "://" in table and not table.startswith("file://"):
        return  # remote: delta-rs says what it finds
    local = table.removeprefix("file://")
    if os.path.isdir(local) and not os.path.isdir(os.path.join(local, "_delta_log")):
        raise CommandError(
            f"{table} is not a Delta table (it has no _delta_log directory); "
            "for a directory of Parquet files pass --format parquet"
        )


# --------------------------------------------------------------------------- inspect


def _delta_table(path: str) -> tuple[str, int | None, int | None] | None:
    """``(table, version, since)`` when ``path`` names a Delta table, ``TABLE@VERSION``
    pinning one (``version`` None: the latest), ``TABLE@M..N`` the rows new at ``N`` since
    ``M``; None for anything else."""
    table, at, version = path.rpartition("@")
    since, dots, last = version.partition("..")
    if at and dots and None not in (_number(since), _number(last)) and _is_delta(table):
        return table, _number(last), _number(since)
    if at and _number(version) is not None and _is_delta(table):
        return table, _number(version), None
    return (path, None, None) if _is_delta(path) else None


def _number(version: str) -> int | None:  # ``12`` or ``v12`` (as inspect prints it)
    digits = version.removeprefix("v")
    return int(digits) if digits.isdigit() else None


def _is_delta(path: str) -> bool:
    local = path.removeprefix("file://")
    return "://" not in local and os.path.isdir(os.path.join(local, "_delta_log"))


# A Delta table read in place for inspect/show masks its nullable columns: every table Spark
# writes has them, and describing a table must not stop at its first null.
INSPECT_DELTA_SPEC: dict[str, Any] = {"nulls": "mask"}
NULLS_MASKED = (
    "nulls: masked (nulls='mask': a loader gets a null as 0 or empty plus <column>__isnull "
    "= 1; here nulls are counted and shown as null)"
)

AS_JSON = "read as json: {} (arrays holding null elements, which ndarray encodings refuse)"
T = TypeVar("T")


def open_any(path: str, as_json: Sequence[str] = ()) -> Any:
    """What ``inspect`` and ``show`` read: a Delta table (``TABLE@VERSION`` pinned, read in
    place with ``INSPECT_DELTA_SPEC`` and the ``as_json`` columns as json, nothing
    exported), a saved mixture spec, or a dataset directory or URL."""
    from spark_dl_core import open_dataset, open_delta, open_mixture

    delta = _delta_table(path)
    if delta is not None:
        snap = open_delta(delta[0], version=delta[1], since=delta[2])
        return snap.dataset({**INSPECT_DELTA_SPEC, "columns": dict.fromkeys(as_json, "json")})
    base, at, version = path.rpartition("@")
    if at and version.isdigit() and os.path.isdir(os.path.join(base, "_follow")):
        return open_dataset(base, version=int(version))  # PATH@M: a version it holds
    return open_mixture(path) if _is_mixture_spec(path) else open_dataset(path)


def read_any(path: str, work: Callable[[Any], T]) -> tuple[T, list[str]]:
    """``work(open_any(path))`` and the columns read as json: a Delta table's array column
    found holding null elements (its default ndarray encoding has no nulls) is read as json
    and ``work`` runs again, so inspecting a table never stops at a null."""
    from spark_dl_core.errors import ArrayNullsError

    as_json: list[str] = []
    while True:
        try:
            return work(open_any(path, as_json)), as_json
        except ArrayNullsError as exc:
            if exc.column in as_json or _delta_table(path) is None:
                raise
            as_json.append(exc.column)


def describe(path: str, samples: int = 3, shards: bool = False) -> dict[str, Any]:
    """Everything ``inspect`` shows about a dataset, as plain data: its shards summed up
    (``shard_summary``), and listed one by one (``shards``) only when asked."""
    info, as_json = read_any(path, lambda ds: _described(ds, samples, shards))
    return {**info, "arrays_with_nulls_as_json": as_json}


def _shard_summary(ds: Any) -> dict[str, Any]:
    """The shards at a glance (a dataset may have 10^5 of them): the least and most
    samples and stored bytes of one, and every hash recorded."""
    samples = [s.samples for s in ds.shards]
    stored = [s.stored.bytes for s in ds.shards]
    return {
        "samples": [min(samples), max(samples)] if samples else None,
        "bytes": [min(stored), max(stored)] if stored else None,
        "hashes": sorted({h for s in ds.shards for h in s.stored.hashes}),
    }


def _described(ds: Any, samples: int, shards: bool = False) -> dict[str, Any]:
    n = min(samples, len(ds))
    rows = _sample_rows(ds, n) if n else []
    plans = {p.name: p for p in ds.plans or []}
    return {
        "path": ds.path,
        "samples": len(ds),
        "columns": [
            {
                "name": name,
                "encoding": enc,
                "arrow_type": str(plans[name].arrow_type) if name in plans else None,
                "null_mask": plans[name].null_mask if name in plans else None,
            }
            for name, enc in ds.columns.items()
        ],
        "num_shards": ds.num_shards,
        "shard_summary": _shard_summary(ds),
        "bytes": sum(s.stored.bytes for s in ds.shards),
        "raw_bytes": sum(s.raw_data.bytes for s in ds.shards),
        "compression": ds.shards[0].compression if ds.shards else None,
        "spec": ds.spec,
        "lineage": ds.source,
        "fingerprint": ds.fingerprint,
        "sample_rows": rows,
        **(
            {
                "shards": [
                    {
                        "file": s.stored.basename,
                        "samples": s.samples,
                        "bytes": s.stored.bytes,
                        "raw_bytes": s.raw_data.bytes,
                        "hashes": sorted(s.stored.hashes),
                    }
                    for s in ds.shards
                ]
            }
            if shards
            else {}
        ),
    }


def _sample_rows(ds: Any, n: int) -> list[dict[str, Any]]:
    """The first ``n`` rows as the source holds them: a masked column's nulls are None (not
    the stored 0 or empty value), its ``<column>__isnull`` companion is left out; dates,
    times and timestamps (stored as numbers: days, microseconds) as Arrow's values, which
    print as dates."""
    from spark_dl_core.ops.arrow import numpy_to_arrow

    masks = {p.null_mask: p.name for p in ds.plans or [] if p.null_mask}
    temporal = {p.name: p.arrow_type for p in ds.plans or [] if pa.types.is_temporal(p.arrow_type)}
    batch = ds.read(np.arange(n))
    for name, t in temporal.items():
        values = batch.get(name)
        if isinstance(values, np.ndarray) and values.dtype.kind in "iu":  # no read op changed it
            batch[name] = numpy_to_arrow(values, t).to_pylist()
    rows = []
    for i in range(n):
        row = {k: _jsonable(v[i]) for k, v in batch.items() if k not in masks}
        row.update({name: None for mask, name in masks.items() if mask in batch and batch[mask][i]})
        rows.append(row)
    return rows


def describe_mixture(path: str, epoch: int = 0) -> dict[str, Any]:
    """What ``inspect`` shows about a saved mixture: each source's share of ``epoch``."""
    from spark_dl_core import open_mixture

    m = open_mixture(path)
    sources = []
    counts, starts = m.epoch_source_counts(epoch), m.epoch_stream_starts(epoch)
    for item, count, start in zip(m.lineage, counts, starts):
        size = item["samples"]
        stop = start + count
        sources.append(
            {
                **item,
                "per_epoch": count,
                "share": count / len(m),
                "passes": [start / size, stop / size] if size else [0.0, 0.0],
            }
        )
    return {
        "mixture": path,
        "epoch": epoch,
        "epoch_size": len(m),
        "batching": m.mixture.batching,
        "source_column": m.source_column,
        "columns": m.columns,
        "fingerprint": m.fingerprint,
        "sources": sources,
        "schedule": None
        if m.mixture.schedule is None
        else [stage.model_dump() for stage in m.mixture.schedule],
        "stages": m.stage_table(),  # each stage's samples per source (the last: per epoch)
    }


def _inspect_mixture(args: argparse.Namespace) -> int:
    info = describe_mixture(args.path, args.epoch)
    if args.json:
        _print_json(info)
        return EXIT_OK
    print(
        f"mixture {info['mixture']}: {info['epoch_size']} samples per epoch, "
        f"batching {info['batching']}, fingerprint {info['fingerprint']}"
    )
    for k, stage in enumerate(info["stages"]):
        weights = ", ".join(f"{n} {w:g}" for n, w in stage["weights"].items())
        counts = ", ".join(f"{n} {c}" for n, c in stage["counts"].items())
        span = "per epoch" if stage["end"] is None else f"until sample {stage['end']}"
        print(f"stage {k} from sample {stage['start']}: {weights}; samples {counts} {span}")
    print(f"epoch {info['epoch']}:")
    for s in info["sources"]:
        a, b = s["passes"]
        print(
            f"  {s['name']}: {s['per_epoch']} samples ({s['share']:.1%}) of {s['samples']}, "
            f"passes {a:.2f}-{b:.2f} through it, fingerprint {s['fingerprint'][:16]}"
        )
    return EXIT_OK


def _is_mixture_spec(path: str) -> bool:
    """A saved mixture spec: a .json file that is not one of a dataset's own files (those
    open as a dataset, which says to open the directory instead)."""
    own = ("index.json", "spark_dl.json", "spark_dl.prev.json")
    return path.endswith(".json") and os.path.isfile(path) and os.path.basename(path) not in own


def cmd_inspect(args: argparse.Namespace) -> int:
    if _is_mixture_spec(args.path):
        return _inspect_mixture(args)
    info = describe(args.path, args.samples, args.shards)
    if args.json:
        _print_json(info)
        return EXIT_OK
    print(f"{info['path']}: {info['samples']} samples, {info['num_shards']} shard(s), ", end="")
    print(
        f"{info['bytes']} bytes stored ({info['raw_bytes']} raw), compression {info['compression']}"
    )
    print(f"fingerprint {info['fingerprint']}")
    masks = {c["null_mask"] for c in info["columns"] if c["null_mask"]}
    if masks:
        print(NULLS_MASKED)
    if info["arrays_with_nulls_as_json"]:
        print(AS_JSON.format(", ".join(info["arrays_with_nulls_as_json"])))
    print("columns:")
    for c in info["columns"]:
        if c["name"] in masks:
            continue  # said on its column's line
        print(
            f"  {c['name']}: {c['encoding']}"
            + (f" ({c['arrow_type']})" if c["arrow_type"] else "")
            + (f", nulls masked by {c['null_mask']}" if c["null_mask"] else "")
        )
    if info["lineage"]:
        print("lineage:")
        for k, v in info["lineage"].items():
            print(f"  {k}: {v}")
    summary = info["shard_summary"]
    if summary["samples"] is not None:
        (least, most), (small, big) = summary["samples"], summary["bytes"]
        listed = "" if "shards" in info else " (--shards lists them)"
        print(
            f"shards: {info['num_shards']}, {least}-{most} samples and {small}-{big} bytes "
            f"each, hashes {summary['hashes']}{listed}"
        )
    for s in info.get("shards", []):
        print(f"  {s['file']}: {s['samples']} samples, {s['bytes']} bytes, hashes {s['hashes']}")
    for i, row in enumerate(info["sample_rows"]):
        print(f"sample {i}: {json.dumps(row, default=str)[:500]}")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    """The dataset card: as text, or as one self-contained HTML page with ``--html``."""
    from spark_dl_core.card import card_html, column_stats, sample_indices, stats_lines

    if args.html:
        page, _ = read_any(args.path, lambda ds: card_html(ds, rows=args.rows))
        with open(args.html, "w", encoding="utf-8") as out:
            out.write(page)
        print(f"wrote {args.html}")
        return EXIT_OK

    def sampled(ds: Any) -> tuple[Any, np.ndarray, dict[str, Any]]:
        indices = sample_indices(ds, args.rows)
        return ds, indices, column_stats(ds, indices)

    (ds, indices, stats), as_json = read_any(args.path, sampled)
    print(f"{ds.shown}: {len(ds)} samples, {ds.num_shards} shard(s), fingerprint {ds.fingerprint}")
    if any(p.null_mask for p in ds.plans or []):
        print(NULLS_MASKED)
    if as_json:
        print(AS_JSON.format(", ".join(as_json)))
    print(f"columns (statistics from {len(indices)} sampled rows):")
    for name, st in stats.items():
        head = f"{ds.columns.get(name, '')}, {st['kind']}, nulls {st['nulls']}"
        lines = [text for text, _ in stats_lines(st)]  # as the HTML card words them
        print(f"  {name}: " + "; ".join([head, *lines]))
    lineage = getattr(ds, "lineage", None) or ds.source
    if lineage:
        print(f"lineage: {json.dumps(lineage, default=str)}")
    return EXIT_OK


# --------------------------------------------------------------------------- verify


def verify(path: str) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Check every shard: size, recorded hashes, decompression, full decode, content hash.

    Returns (per-shard results, problems). Shards with no recorded hashes are still
    decompressed, decoded in full and checked against spark_dl.json's content hash.
    """
    from spark_dl_core import SparkDLError, open_dataset
    from spark_dl_core.format.hashing import content_hash

    ds = open_dataset(path)
    content = {m["basename"]: m.get("content_hash") for m in (ds.meta or {}).get("shards", [])}
    results: list[dict[str, Any]] = []
    problems: list[dict[str, str]] = []
    for i, shard in enumerate(ds.shards):
        name = shard.stored.basename
        hashed = bool(shard.stored.hashes)
        try:
            data = ds.load_shard(i, verify_hashes=hashed)
            ds.decode(data, np.arange(shard.samples))
            expected = content.get(name)
            if expected and content_hash(data.raw) != expected:
                raise SparkDLError(
                    f"shard {ds.store.path(name)!r}: content hash differs from spark_dl.json"
                )
        except (SparkDLError, ValueError, IndexError, OSError) as exc:
            problems.append({"file": ds.store.path(name), "error": str(exc)})
            results.append(_checked(name, False, hashed, bool(content.get(name))))
            continue
        results.append(_checked(name, True, hashed, bool(content.get(name))))
    return results, problems


def _checked(name: str, ok: bool, hashed: bool, content: bool) -> dict[str, Any]:
    """One shard's verify result, with what was checked (every shard is decoded in full)."""
    return {"file": name, "ok": ok, "hashes_checked": hashed, "content_hash_checked": content}


def _checked_summary(results: list[dict[str, Any]]) -> str:
    """What verify actually compared, shard counts included: a reader of the summary should
    not have to guess whether "ok" meant hashes, the content hash or only decoding."""
    n = len(results)
    hashed = sum(r["hashes_checked"] for r in results)
    content = sum(r["content_hash_checked"] for r in results)
    parts = [f"decoded in full {n}/{n}"]
    parts.append(f"recorded file hashes {hashed}/{n}")
    parts.append(f"content hash from spark_dl.json {content}/{n}")
    return "checked: " + ", ".join(parts)


def cmd_verify(args: argparse.Namespace) -> int:
    results, problems = verify(args.path)
    if args.json:
        _print_json(
            {"path": args.path, "ok": not problems, "shards": results, "problems": problems}
        )
    else:
        for p in problems:
            print(f"BAD {p['file']}: {p['error']}", file=sys.stderr)
        status = "FAILED" if problems else "ok"
        print(
            f"{args.path}: {len(results) - len(problems)}/{len(results)} shard(s) ok "
            f"({_checked_summary(results)}): {status}"
        )
    return EXIT_FAIL if problems else EXIT_OK


# --------------------------------------------------------------------------- vacuum


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
        _print_json(report.to_dict())
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


# --------------------------------------------------------------------------- sql


def cmd_sql(args: argparse.Namespace) -> int:
    """Run a .sql file's statements on a local Spark session (spark_dl registered)."""
    from pyspark.sql import SparkSession

    import spark_dl
    from spark_dl.sql import run_sql_file

    if not os.environ.get("PYSPARK_PYTHON"):  # our own session: its workers run this Python
        os.environ["PYSPARK_PYTHON"] = sys.executable  # (the JVM it starts inherits it)
    spark = (
        SparkSession.builder.master(args.master)
        .appName("spark-dl sql")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    try:
        if hasattr(spark_dl, "register"):
            spark_dl.register(spark)
        variables = dict(v.split("=", 1) for v in args.var)  # "NAME=VALUE": checked by argparse
        results = run_sql_file(spark, args.file, variables or None)
        out = [_result_data(r, args.limit) for r in (results or [])]
    finally:
        spark.stop()
    if args.json:
        _print_json(out)
    else:
        for i, r in enumerate(out):
            print(f"-- statement {i + 1}")
            if r.get("columns"):
                print("\t".join(r["columns"]))
            for row in r.get("rows", []):
                print("\t".join(str(v) for v in row))
    return EXIT_OK


def _result_data(result: Any, limit: int) -> dict[str, Any]:
    """A statement result (DataFrame, list of Rows, or anything) as columns + rows."""
    statement = None
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], str):
        statement, result = result
    if hasattr(result, "limit") and hasattr(result, "columns"):
        rows = [list(r) for r in result.limit(limit).collect()]
        data: dict[str, Any] = {"columns": list(result.columns), "rows": _jsonable(rows)}
    elif isinstance(result, list):
        data = {"columns": [], "rows": _jsonable([list(r) for r in result[:limit]])}
    else:
        data = {"columns": [], "rows": [] if result is None else [[_jsonable(result)]]}
    if statement is not None:
        data["statement"] = statement
    return data


# --------------------------------------------------------------------------- main


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


def _quiet_on_broken_pipe(command: Any) -> Any:
    """A reader that stops early (``spark-dl inspect … | head``) is not an error: stdout
    goes to /dev/null so the interpreter's final flush stays quiet, and the exit is 0."""
    import functools
    import os

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
    p.set_defaults(func=_quiet_on_broken_pipe(cmd_export))

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
    p.set_defaults(func=_quiet_on_broken_pipe(cmd_inspect))

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
    p.set_defaults(func=_quiet_on_broken_pipe(cmd_show))

    p = sub.add_parser("verify", help="re-hash and decode every shard; exit 1 naming bad files")
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_quiet_on_broken_pipe(cmd_verify))

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
    p.set_defaults(func=_quiet_on_broken_pipe(cmd_vacuum))

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
    p.set_defaults(func=_quiet_on_broken_pipe(cmd_sql))
    return parser


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


if __name__ == "__main__":
    sys.exit(main())
