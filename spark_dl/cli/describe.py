"""``spark-dl inspect``: a dataset, a Delta table read in place or a saved mixture
described as plain data (``describe``, ``describe_mixture``: also what ``--json`` prints)
and as text: columns and encodings, shards at a glance, sizes, lineage, fingerprint and a
few sample rows; for a mixture, each source's share of an epoch and its stages."""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
import pyarrow as pa

from spark_dl.cli.output import EXIT_OK, jsonable, print_json
from spark_dl.cli.reading import AS_JSON, NULLS_MASKED, is_mixture_spec, read_any


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
        row = {k: jsonable(v[i]) for k, v in batch.items() if k not in masks}
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
        print_json(info)
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


def cmd_inspect(args: argparse.Namespace) -> int:
    if is_mixture_spec(args.path):
        return _inspect_mixture(args)
    info = describe(args.path, args.samples, args.shards)
    if args.json:
        print_json(info)
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
