"""The main job end to end on the embedded default (``make demo``).

A local Spark session, a small Delta table generated in place, a pinned version of it
written as MDS through ``df.write.format("mds")``, one epoch of PyTorch training from
``df.dl.to_torch`` with a mid-epoch checkpoint and exact resume, one epoch of Keras from
``df.dl.to_tf``, and proof that a new Delta commit changes nothing for the pinned data.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

FEATURES = 16


def make_rows(rows: int, seed: int) -> pa.Table:
    """Points in 16 dimensions labelled by the side of a fixed hyperplane they fall on."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    y = (x @ np.linspace(-1.0, 1.0, FEATURES, dtype=np.float32) > 0).astype(np.int64)
    return pa.table(
        {
            "features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), FEATURES),
            "label": pa.array(y),
        }
    )


def step(message: str) -> None:
    print(f"\n== {message}", flush=True)


def train_torch(loader: Any, stop_after: int | None = None) -> tuple[float, int, float, Any]:
    """Logistic regression over the loader; optionally stop after some batches."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = torch.tensor(0.0)
    seen, start = 0, time.perf_counter()
    for i, batch in enumerate(loader):
        logits = model(batch["features"])
        loss = torch.nn.functional.cross_entropy(logits, batch["label"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen += len(batch["label"])
        if stop_after is not None and i + 1 == stop_after:
            break
    return float(loss.detach()), seen, seen / (time.perf_counter() - start), model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_dl.demo", description=__doc__)
    parser.add_argument("--out", default="demo-output", help="working directory (%(default)s)")
    parser.add_argument("--rows", type=int, default=20_000, help="rows per Delta commit")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from deltalake import write_deltalake
    from pyspark.sql import SparkSession

    import spark_dl
    from spark_dl_core import open_dataset

    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    table_path, mds_path = str(out / "events-delta"), str(out / "train-mds")

    step("1. a Delta table with two commits (generated in place, no JVM needed)")
    write_deltalake(table_path, make_rows(args.rows, args.seed))
    write_deltalake(table_path, make_rows(args.rows, args.seed + 1), mode="append")
    print(f"   {table_path}: versions 0 and 1, {2 * args.rows:,} rows at version 1")

    step("2. local Spark with Delta Lake reads the table pinned at version 1")
    spark = (
        spark_dl.with_delta(SparkSession.builder.master("local[2]"))
        .appName("spark-dl demo")
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.spark_dl.cache.dir", str(out / "cache"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark_dl.register(spark)
    df = spark_dl.read_delta(spark, table_path, version=1)
    reader = spark_dl.delta.lineage_for(df)["reader"]  # type: ignore[index]
    print(f"   {df.count():,} rows ({reader}), schema {df.schema.simpleString()}")

    step('3. df.write.format("mds") writes Mosaic-compatible shards from the executors')
    start = time.perf_counter()
    df.write.format("mds").mode("overwrite").option("compression", "zstd").save(mds_path)
    ds = open_dataset(mds_path)
    print(
        f"   {len(ds):,} samples in {ds.num_shards} shards, {time.perf_counter() - start:.1f}s; "
        f"columns {ds.columns}\n   fingerprint {ds.fingerprint[:16]}…"
    )

    step("4. one epoch of PyTorch from df.dl.to_torch (cached materialization)")
    dl: Any = df.dl  # typed Any: type checkers read df.<name> as a Column
    loader = dl.to_torch(batch_size=256, shuffle=True, seed=args.seed)
    loss, seen, rate, model = train_torch(loader)
    with_weights = model.weight.detach().numpy()
    accuracy = _accuracy(open_dataset(mds_path), with_weights, model.bias.detach().numpy())
    print(f"   loss {loss:.3f}, accuracy {accuracy:.1%}, {seen:,} samples, {rate:,.0f} samples/s")

    step("5. checkpoint mid-epoch, resume in a new loader: every sample exactly once")
    first = dl.to_torch(batch_size=256, shuffle=True, seed=args.seed)
    seen_ids: list[int] = []
    for i, batch in enumerate(first):
        seen_ids.extend(batch["label"].tolist())
        if i == 39:
            state = first.state_dict()
            break
    resumed = dl.to_torch(batch_size=256, shuffle=True, seed=args.seed)
    resumed.load_state_dict(state)
    rest = sum(len(b["label"]) for b in resumed)
    print(
        f"   checkpoint after {len(seen_ids):,} samples; resumed loader yields the other "
        f"{rest:,} ({len(seen_ids) + rest:,} of {seen:,})"
    )
    if len(seen_ids) + rest != seen:
        print("   resume lost or repeated samples", file=sys.stderr)
        return 1

    step("6. one epoch of Keras from df.dl.to_tf")
    import tensorflow as tf

    tf_ds = dl.to_tf(batch_size=256, shuffle=True, seed=args.seed).map(
        lambda b: (b["features"], b["label"])
    )
    keras_model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(2)])
    keras_model.compile(
        optimizer=tf.keras.optimizers.SGD(0.5),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    start = time.perf_counter()
    history = keras_model.fit(tf_ds, epochs=1, verbose=0, shuffle=False)
    print(
        f"   loss {history.history['loss'][-1]:.3f}, accuracy "
        f"{history.history['accuracy'][-1]:.1%}, {seen / (time.perf_counter() - start):,.0f} "
        "samples/s"
    )

    step("7. a new Delta commit does not change the pinned training data")
    write_deltalake(table_path, make_rows(args.rows, args.seed + 2), mode="append")
    again = spark_dl.read_delta(spark, table_path, version=1)
    again.write.format("mds").mode("overwrite").option("compression", "zstd").save(
        str(out / "train-mds-again")
    )
    same = open_dataset(str(out / "train-mds-again")).fingerprint == ds.fingerprint
    print(f"   version 2 committed; version 1 re-exported: fingerprint unchanged = {same}")
    spark.stop()
    print(f"\nDone. Everything is under {out}")
    return 0 if same else 1


def _accuracy(ds: Any, weight: np.ndarray, bias: np.ndarray) -> float:
    correct = total = 0
    for batch in ds.iter_batches(batch_size=4096):
        predicted = (batch["features"] @ weight.T + bias).argmax(axis=1)
        correct += int((predicted == batch["label"]).sum())
        total += len(predicted)
    return correct / max(total, 1)


if __name__ == "__main__":
    sys.exit(main())
