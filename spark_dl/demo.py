"""The main job end to end on the embedded default (``make demo``).

Generates a small tabular classification set in place, writes it as an MDS dataset,
opens it again and trains a tiny PyTorch model for an epoch from shuffled batches,
printing what it did at each step. No arguments needed; ``--out`` and ``--rows`` exist.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from spark_dl_core import DatasetSpec, open_dataset, write_mds


def make_table(rows: int, seed: int = 0) -> pa.Table:
    """Points in 16 dimensions labelled by which side of a fixed hyperplane they fall."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(rows, 16)).astype(np.float32)
    weights = np.linspace(-1.0, 1.0, 16, dtype=np.float32)
    labels = (features @ weights > 0).astype(np.int64)
    return pa.table(
        {
            "features": pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), 16),
            "label": pa.array(labels),
            "id": pa.array(np.arange(rows, dtype=np.int64)),
        }
    )


def train_one_epoch(path: str, batch_size: int, seed: int) -> tuple[float, float, float]:
    """Train logistic regression for one shuffled epoch; returns loss, accuracy, samples/s."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Linear(16, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    dataset = open_dataset(path)
    seen = correct = 0
    loss = torch.tensor(0.0)
    start = time.perf_counter()
    for batch in dataset.iter_batches(batch_size=batch_size, shuffle=True, seed=seed):
        x = torch.from_numpy(batch["features"])
        y = torch.from_numpy(batch["label"])
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen += len(y)
        correct += int((logits.argmax(dim=1) == y).sum())
    elapsed = time.perf_counter() - start
    return float(loss.detach()), correct / max(seen, 1), seen / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_dl.demo", description=__doc__)
    parser.add_argument(
        "--out", default="demo-output", help="working directory (default: %(default)s)"
    )
    parser.add_argument("--rows", type=int, default=50_000, help="rows to generate")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    dataset_path = str(out / "train-mds")

    table = make_table(args.rows, args.seed)
    print(f"[1/3] generated {table.num_rows:,} rows: {', '.join(table.column_names)}")

    spec = DatasetSpec(compression="zstd", shard_size="1MiB", hashes=["xxh64"])
    start = time.perf_counter()
    result = write_mds(table, dataset_path, spec)
    print(
        f"[2/3] wrote {result.num_samples:,} samples in {result.shards} zstd shards to "
        f"{dataset_path} in {time.perf_counter() - start:.2f}s\n"
        f"      fingerprint {result.fingerprint[:16]}…"
    )

    ds = open_dataset(dataset_path)
    loss, accuracy, rate = train_one_epoch(dataset_path, batch_size=256, seed=args.seed)
    print(
        f"[3/3] trained torch logistic regression for 1 epoch on {len(ds):,} samples: "
        f"loss {loss:.3f}, accuracy {accuracy:.1%}, {rate:,.0f} samples/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
