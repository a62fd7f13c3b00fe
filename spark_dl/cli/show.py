"""``spark-dl show``: the dataset card (schema, lineage, column statistics from sampled
rows, pictures) as text, or as one self-contained HTML page. The card itself is the core's
(``spark_dl_core.card``); this is only its command-line face."""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from spark_dl.cli.output import EXIT_OK
from spark_dl.cli.reading import AS_JSON, NULLS_MASKED, read_any


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
