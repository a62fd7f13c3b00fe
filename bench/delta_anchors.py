"""Ray Data and Daft reading a pinned Delta version into torch batches: the anchors that
bench/delta_inplace_bench.py compares the in-place loader with.

Run by that bench with a side environment's interpreter (they pin other pyarrow versions than
the project's), never imported by it. Imports come before any clock; Ray's clock starts after
``ray.init``. Each case runs two passes over a fresh iterator: the first is cold (reading
starts), the second warm (page cache, workers up). Prints one JSON object per case:
``{"name", "first_s", "cold_rows_s", "warm_rows_s", "rows"}``.

    python bench/delta_anchors.py TABLE VERSION [--batch-size 1024] [--only ray] [--daft-loader]
    python bench/delta_anchors.py db.t SNAPSHOT_ID --iceberg sqlite:///…/catalog.db file:///…
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

# torch.from_numpy of Arrow's read-only buffers: the tensors are only read here
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

SHUFFLE_BUFFER = 100_000
STACKED: set[bool] = set()  # non-empty once some batch's x had to be stacked here


def timed(make: Callable[[], Iterable[Any]]) -> tuple[float, float, int]:
    """(seconds to the first batch, seconds for the whole pass, rows) of one pass; each
    batch must hold ``x`` as one ``(rows, 32)`` tensor (a ragged list is stacked, as its
    user would have to)."""
    start = time.perf_counter()
    first = None
    rows = 0
    for batch in make():
        if first is None:
            first = time.perf_counter() - start
        ids, x = batch["id"], batch["x"]
        if not isinstance(x, torch.Tensor):  # a ragged list column: what a user must stack
            STACKED.add(True)
            x = torch.stack([torch.as_tensor(v) for v in x])
        if x.shape != (len(ids), 32):
            raise SystemExit(f"x arrived as {tuple(x.shape)}, not ({len(ids)}, 32)")
        rows += len(ids)
    return first or 0.0, time.perf_counter() - start, rows


def emit(name: str, cold: tuple[float, float, int], warm: tuple[float, float, int]) -> None:
    print(
        json.dumps(
            {
                "name": name,
                "first_s": cold[0],
                "cold_rows_s": cold[2] / cold[1],
                "warm_rows_s": warm[2] / warm[1],
                "rows": [cold[2], warm[2]],
                "stacked_here": bool(STACKED),
            }
        ),
        flush=True,
    )


def ray_case(
    table: str, version: int, batch_size: int, catalog: dict[str, str] | None = None
) -> None:
    """Ray Data's ``read_delta`` (``table`` a path); with ``catalog``, its ``read_iceberg``
    (``table`` an identifier in that PyIceberg catalog, ``version`` a snapshot id)."""
    import ray
    import ray.data

    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False

    def make() -> Iterable[Any]:
        if catalog is None:
            ds = ray.data.read_delta(table, version=version, shuffle="files")
        else:
            ds = ray.data.read_iceberg(
                table_identifier=table, snapshot_id=version, catalog_kwargs=dict(catalog)
            )
        return ds.iter_torch_batches(
            batch_size=batch_size, local_shuffle_buffer_size=SHUFFLE_BUFFER
        )

    reader = "read_delta" if catalog is None else "read_iceberg"
    name = f"Ray Data {ray.__version__} {reader} + iter_torch_batches (shuffle buffer 100k)"
    emit(name, timed(make), timed(make))
    STACKED.clear()
    ray.shutdown()


def daft_case(table: str, version: int, batch_size: int, loader: bool) -> None:
    import daft
    import pyarrow.compute as pc

    def arrow_batches() -> Iterable[Any]:
        """Daft's record batches cut into torch batches (its fastest way to torch)."""
        df = daft.read_deltalake(table, version=version)
        for rb in df.to_arrow_iter():
            for start in range(0, rb.num_rows, batch_size):
                b = rb.slice(start, batch_size)
                x = pc.list_flatten(b.column("x")).to_numpy().reshape(-1, 32).copy()
                yield {"id": torch.from_numpy(b.column("id").to_numpy()), "x": torch.from_numpy(x)}

    def dataloader() -> Iterable[Any]:
        df = daft.read_deltalake(table, version=version)
        # as an embedding, x arrives as one tensor (a plain list column arrives as lists)
        embedding = daft.DataType.embedding(daft.DataType.float32(), 32)
        df = df.with_column("x", df["x"].cast(embedding))
        return df.to_torch_dataloader(batch_size=batch_size)

    v = daft.__version__
    emit(f"Daft {v} read_deltalake + to_arrow_iter -> torch (no shuffle)", *twice(arrow_batches))
    if loader:
        emit(f"Daft {v} read_deltalake + to_torch_dataloader (no shuffle)", *twice(dataloader))


def twice(make: Callable[[], Iterable[Any]]) -> tuple[Any, Any]:
    return timed(make), timed(make)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("table")
    parser.add_argument("version", type=int)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--only", choices=["ray", "daft"])
    parser.add_argument(
        "--iceberg",
        nargs=2,
        metavar=("URI", "WAREHOUSE"),
        help="TABLE is an identifier in this SQL catalog, VERSION a snapshot id: Ray only",
    )
    parser.add_argument(
        "--daft-loader", action="store_true", help="also Daft's to_torch_dataloader (slow)"
    )
    args = parser.parse_args()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if args.iceberg:
        uri, warehouse = args.iceberg
        catalog = {"name": "bench", "type": "sql", "uri": uri, "warehouse": warehouse}
        return ray_case(args.table, args.version, args.batch_size, catalog)
    if args.only in (None, "ray"):
        ray_case(args.table, args.version, args.batch_size)
    if args.only in (None, "daft"):
        daft_case(args.table, args.version, args.batch_size, args.daft_loader)


if __name__ == "__main__":
    main()
