"""LLM data (issue #18): packed token rows, ``bin`` fill, tokenizing inside Spark.

Cases, each in a fresh subprocess (frameworks imported before the clock), in alternating
rounds; the table shows medians and the ratios the issue targets:

packed ``concat`` (documents of 256-4096 uint16 tokens, seq_len 2048, batch 8, in-process,
warm pass: the second pass of one loader, i.e. the next epoch; the ``workers`` group runs
``pack_ours_w2`` / ``pack_litdata_w2``, the same two loaders with 2 DataLoader workers):
- ``pack_ours``: ``ds.to_torch(shuffle=True, pack={"seq_len": 2048})``: input_ids, labels,
  position_ids (int64 [8, 2048]) and cu_seqlens + max_seqlen
- ``pack_litdata``: LitData 0.2.76 ``StreamingDataset(item_loader=TokensLoader(
  block_size=2049), shuffle=True)`` + ``StreamingDataLoader(batch_size=8)`` over the same
  documents (its side environment: ``SPARK_DL_LITDATA_PYTHON``, default
  ``.venv-litdata/bin/python``; without it the case is reported as not run)
- ``pack_limit``: the memory-bandwidth limit for the bytes produced: each batch's 16,384
  uint16 tokens widened into three new int64 [8, 2048] arrays (24 bytes written per token,
  fresh memory per batch as a loader's batches are), nothing else

``bin`` fill: documents of log-normal lengths (median 600 tokens, sigma 1.0), seq_len 2048,
``ds.to_torch(pack={"mode": "bin"})``: ``stats()["fill"]`` and tokens/s of a first pass;
``bin_concat`` packs the same documents with ``mode="concat"``.

tokenize: the same texts (synthetic sentences) through a BPE tokenizer (vocabulary 8,000,
trained here): ``tok_spark`` is ``df.write.format("mds")`` with the ``tokenize`` op on a
``local[2]`` session (2 input files, so 2 tasks; after a warm-up write), ``tok_plain`` the
same ``encode_batch`` loop over batches of 10,000 texts in one process (the tokenizer's own
threads use both cores), ``tok_write`` the core's ``write_mds`` with the same op in one
process (tokenize + encode + write shards, no Spark).

Usage: ``python bench/llm_bench.py [--dir DIR] [--rounds 3] [--docs 20000]
[--texts 100000] [--only pack,bin,tokenize]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LITDATA_PYTHON = Path(
    os.environ.get("SPARK_DL_LITDATA_PYTHON", ROOT / ".venv-litdata" / "bin" / "python")
)
SEQ, BATCH = 2048, 8


# --------------------------------------------------------------------------- data


def make_docs(directory: Path, docs: int) -> None:
    """The packing corpus as MDS (ours) and as LitData chunks (if its environment exists)."""
    import numpy as np
    import pyarrow as pa

    from spark_dl_core import DatasetSpec, write_mds

    rng = np.random.default_rng(0)
    lengths = rng.integers(256, 4097, size=docs)
    flat = rng.integers(0, 50_000, size=int(lengths.sum()), dtype=np.uint16)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    np.save(directory / "flat.npy", flat)
    np.save(directory / "offsets.npy", offsets)
    tokens = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(flat))
    write_mds(pa.table({"tokens": tokens}), str(directory / "mds"), DatasetSpec())
    lognormal = np.clip(rng.lognormal(np.log(600), 1.0, size=docs), 1, 32_768).astype(np.int64)
    loff = np.concatenate([[0], np.cumsum(lognormal)]).astype(np.int32)
    values = pa.array(np.ones(int(loff[-1]), dtype=np.uint16))
    table = pa.table({"tokens": pa.ListArray.from_arrays(pa.array(loff), values)})
    write_mds(table, str(directory / "lognormal"), DatasetSpec())
    if LITDATA_PYTHON.exists():
        subprocess.run(
            [str(LITDATA_PYTHON), __file__, "--case", "litdata_write", "--dir", str(directory)],
            check=True,
        )


_LOADED: dict[str, Any] = {}


def litdata_doc(i: int) -> Any:
    """One document for ``litdata.optimize`` (module level: it pickles the function)."""
    import numpy as np
    import torch

    if not _LOADED:
        directory = Path(os.environ["LLM_BENCH_DIR"])
        _LOADED["flat"] = np.load(directory / "flat.npy", mmap_mode="r")
        _LOADED["offsets"] = np.load(directory / "offsets.npy")
    flat, offsets = _LOADED["flat"], _LOADED["offsets"]
    return torch.from_numpy(np.array(flat[offsets[i] : offsets[i + 1]]).astype(np.int32))


def make_texts(directory: Path, texts: int) -> None:
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    random.seed(0)
    common = ["the", "a", "of", "to", "and", "in", "is", "it", "for", "on"]
    words = [f"w{i}" for i in range(3000)] + common * 50
    rows = [" ".join(random.choices(words, k=random.randint(10, 90))) for _ in range(texts)]
    (directory / "texts").mkdir(exist_ok=True)
    half = len(rows) // 2
    pq.write_table(pa.table({"text": rows[:half]}), directory / "texts" / "part-0.parquet")
    pq.write_table(pa.table({"text": rows[half:]}), directory / "texts" / "part-1.parquet")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=8000,
        special_tokens=["<pad>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(rows[:20_000], trainer)
    tok.save(str(directory / "tokenizer.json"))


# --------------------------------------------------------------------------- cases


def _passes(make: Any, count: Any) -> dict[str, Any]:
    """A loader's cold pass (its construction included) and warm pass (the next epoch):
    tokens/s by the wall clock and by the process's CPU time (all its threads), and the
    minor page faults of the warm pass."""
    import resource

    out: dict[str, Any] = {}
    loader = None
    for name in ("cold", "warm"):
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        started, cpu = time.perf_counter(), time.process_time()
        if loader is None:
            loader = make()
        tokens = count(loader)
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu
        out[f"{name}_tokens_per_s"] = tokens / seconds
        out[f"{name}_cpu_tokens_per_s"] = tokens / cpu
        out[f"{name}_faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        out["tokens"] = tokens
    out["tokens_per_s"] = out["warm_tokens_per_s"]
    return out


def case_pack_ours(
    directory: Path,
    mode: str = "concat",
    corpus: str = "mds",
    workers: int = 0,
    streams: int = 0,
) -> dict[str, Any]:
    import torch  # noqa: F401  (imported before the clock)

    from spark_dl_core import open_dataset

    def make() -> Any:
        ds = open_dataset(str(directory / corpus))
        pack = {"column": "tokens", "seq_len": SEQ, "mode": mode}
        return ds.to_torch(
            batch_size=BATCH,
            shuffle=True,
            seed=0,
            pack=pack,
            num_workers=workers,
            streams=streams,
        )

    stats: dict[str, Any] = {}

    def count(loader: Any) -> int:
        for _batch in loader:
            pass
        stats.update(loader.stats())
        return int(stats["tokens"])

    return _passes(make, count) | {"fill": stats["fill"]}


def case_pack_ours_bin(directory: Path) -> dict[str, Any]:
    return case_pack_ours(directory, "bin")


def case_pack_ours_w2(directory: Path) -> dict[str, Any]:
    return case_pack_ours(directory, workers=2)


def case_pack_ours_streams(directory: Path) -> dict[str, Any]:
    """Rows cut from 2 streams (pack version 2; the corpus has too few rows for automatic
    streams, and 2 shards): what each batch costs there beside one run of rows."""
    return case_pack_ours(directory, streams=2)


def case_pack_limit(directory: Path) -> dict[str, Any]:
    import numpy as np

    flat = np.load(directory / "flat.npy")
    n = BATCH * SEQ
    rows = len(flat) // n
    kept = []
    for k in range(rows):  # warm
        kept = [flat[k * n : (k + 1) * n].astype(np.int64).reshape(BATCH, SEQ) for _ in range(3)]
    started, cpu = time.perf_counter(), time.process_time()
    for k in range(rows):
        kept = [flat[k * n : (k + 1) * n].astype(np.int64).reshape(BATCH, SEQ) for _ in range(3)]
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    del kept
    speed = rows * n / seconds
    return {
        "tokens_per_s": speed,
        "warm_tokens_per_s": speed,
        "warm_cpu_tokens_per_s": rows * n / cpu,
    }


def case_litdata_write(directory: Path) -> dict[str, Any]:
    import numpy as np
    from litdata import optimize
    from litdata.streaming.item_loader import TokensLoader

    os.environ["LLM_BENCH_DIR"] = str(directory)
    docs = len(np.load(directory / "offsets.npy")) - 1
    optimize(
        fn=litdata_doc,
        inputs=list(range(docs)),
        output_dir=str(directory / "litdata"),
        chunk_bytes="64MB",
        item_loader=TokensLoader(),
        num_workers=1,
    )
    return {}


def case_pack_litdata(directory: Path, workers: int = 0) -> dict[str, Any]:
    import torch  # noqa: F401
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.item_loader import TokensLoader

    def make() -> Any:
        ds = StreamingDataset(
            input_dir=str(directory / "litdata"),
            item_loader=TokensLoader(block_size=SEQ + 1),
            shuffle=True,
            seed=0,
        )
        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)

    def count(loader: Any) -> int:
        rows = 0
        for batch in loader:
            rows += len(batch)
        return rows * SEQ

    return _passes(make, count)


def case_pack_litdata_w2(directory: Path) -> dict[str, Any]:
    return case_pack_litdata(directory, workers=2)


def case_bin(directory: Path, mode: str = "bin") -> dict[str, Any]:
    return case_pack_ours(directory, mode, "lognormal")


def case_bin_concat(directory: Path) -> dict[str, Any]:
    return case_bin(directory, "concat")


def case_tok_plain(directory: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    texts = [
        t
        for part in sorted((directory / "texts").glob("*.parquet"))
        for t in pq.read_table(part).column("text").to_pylist()
    ]
    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    started = time.perf_counter()
    for k in range(0, len(texts), 10_000):
        tok.encode_batch_fast(texts[k : k + 10_000], add_special_tokens=False)
    seconds = time.perf_counter() - started
    return {"rows_per_s": len(texts) / seconds, "seconds": seconds}


def case_tok_write(directory: Path) -> dict[str, Any]:
    import pyarrow.dataset as pads

    from spark_dl_core import DatasetSpec, write_mds

    op = {
        "op": "tokenize",
        "column": "text",
        "tokenizer": str(directory / "tokenizer.json"),
        "eos_token": "</s>",
    }
    spec = DatasetSpec(transforms=[op, {"op": "drop", "columns": ["text"]}])
    table = pads.dataset(str(directory / "texts")).to_table()
    started = time.perf_counter()
    write_mds(table.to_batches(10_000), str(directory / "tok-core"), spec, mode="overwrite")
    seconds = time.perf_counter() - started
    return {"rows_per_s": table.num_rows / seconds, "seconds": seconds}


def case_tok_spark(directory: Path) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    import spark_dl

    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    )
    spark_dl.register(spark)
    spec = {
        "transforms": [
            {
                "op": "tokenize",
                "column": "text",
                "tokenizer": str(directory / "tokenizer.json"),
                "eos_token": "</s>",
            },
            {"op": "drop", "columns": ["text"]},
        ]
    }
    df = spark.read.parquet(str(directory / "texts"))
    rows = df.count()
    warm = df.limit(2000).repartition(2)
    warm.write.format("mds").mode("overwrite").option("spec", json.dumps(spec)).save(
        str(directory / "tok-warm")
    )
    started = time.perf_counter()
    df.write.format("mds").mode("overwrite").option("spec", json.dumps(spec)).save(
        str(directory / "tok-mds")
    )
    seconds = time.perf_counter() - started
    spark.stop()
    return {"rows_per_s": rows / seconds, "seconds": seconds}


CASES = {
    "pack_ours": case_pack_ours,
    "pack_ours_bin": case_pack_ours_bin,
    "pack_limit": case_pack_limit,
    "pack_litdata": case_pack_litdata,
    "pack_ours_w2": case_pack_ours_w2,
    "pack_ours_streams": case_pack_ours_streams,
    "pack_litdata_w2": case_pack_litdata_w2,
    "litdata_write": case_litdata_write,
    "bin": case_bin,
    "bin_concat": case_bin_concat,
    "tok_plain": case_tok_plain,
    "tok_spark": case_tok_spark,
    "tok_write": case_tok_write,
}
GROUPS = {
    "pack": ["pack_ours", "pack_litdata", "pack_ours_bin", "pack_limit"],
    "workers": ["pack_ours_w2", "pack_litdata_w2"],
    "streams": ["pack_ours", "pack_ours_streams"],
    "bin": ["bin", "bin_concat"],
    "tokenize": ["tok_plain", "tok_write", "tok_spark"],
}


def run_case(name: str, directory: Path) -> dict[str, Any] | None:
    theirs = name.startswith("pack_litdata")
    python = str(LITDATA_PYTHON) if theirs else sys.executable
    if theirs and not LITDATA_PYTHON.exists():
        return None
    out = subprocess.run(
        [python, __file__, "--case", name, "--dir", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        print(f"{name} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
        return None
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--texts", type=int, default=100_000)
    parser.add_argument("--only", default="pack,bin,tokenize")
    parser.add_argument("--case")
    args = parser.parse_args()
    if args.case:
        print(json.dumps(CASES[args.case](Path(args.dir))))
        return
    directory = Path(args.dir or tempfile.mkdtemp(prefix="llm-bench-"))
    groups = args.only.split(",")
    if not (directory / "mds").exists() and ({"pack", "bin", "workers", "streams"} & set(groups)):
        make_docs(directory, args.docs)
    if "tokenize" in groups and not (directory / "tokenizer.json").exists():
        make_texts(directory, args.texts)
    names = [n for g in groups for n in GROUPS[g]]
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for name in names:  # alternating: each round runs every case once, in a fresh process
            got = run_case(name, directory)
            if got is not None:
                got["load"] = os.getloadavg()[0]  # 1-minute load average as the case ended
                results[name].append(got)
    (directory / "results.json").write_text(json.dumps(results, indent=1))
    report(results, names, args.rounds)


def _spread(values: list[float], scale: float = 1e6) -> str:
    if not values:
        return "not run"
    med, lo, hi = statistics.median(values), min(values), max(values)
    return f"{med / scale:7.1f} [{lo / scale:6.1f}-{hi / scale:6.1f}]"


def report(results: dict[str, list[dict[str, Any]]], names: list[str], rounds: int) -> None:
    """Per case, the median [min-max] over its fresh processes, cold and warm, by the wall
    clock and by CPU time; the load averages the runs ended at; and the ratios."""

    def values(name: str, key: str) -> list[float]:
        return [r[key] for r in results.get(name, []) if r.get(key) is not None]

    def median(name: str, key: str) -> float | None:
        got = values(name, key)
        return statistics.median(got) if got else None

    loads = [r["load"] for rs in results.values() for r in rs if "load" in r]
    if loads:
        print(f"\nload average (1 min) at the cases' ends: {min(loads):.2f}-{max(loads):.2f}")
    timed = [n for n in names if not n.startswith("tok")]
    if timed:
        print(f"\nM tokens/s, median [min-max] over {rounds} fresh processes each")
        head = ("case", "warm", "warm (CPU time)", "cold", "cold (CPU time)")
        print(f"{head[0]:<14} {head[1]:>22} {head[2]:>22} {head[3]:>22} {head[4]:>22}  fill")
        for name in timed:
            cols = [
                _spread(values(name, k))
                for k in (
                    "warm_tokens_per_s",
                    "warm_cpu_tokens_per_s",
                    "cold_tokens_per_s",
                    "cold_cpu_tokens_per_s",
                )
            ]
            fill = median(name, "fill")
            extra = f"  {fill:.3f}" if fill is not None else ""
            print(f"{name:<14} {cols[0]:>22} {cols[1]:>22} {cols[2]:>22} {cols[3]:>22}{extra}")
    for name in names:
        if name.startswith("tok"):
            value = median(name, "rows_per_s")
            shown = "not run" if value is None else f"{value:,.0f} rows/s"
            print(f"{name:<14} {shown:>24}  ({len(results[name])})")
    for a, b, what in (
        ("pack_ours", "pack_litdata", "target >= 1.2x"),
        ("pack_ours_bin", "pack_litdata", "bin mode"),
        ("pack_ours_w2", "pack_litdata_w2", "2 DataLoader workers each"),
    ):
        for key, label in (
            ("warm_tokens_per_s", "warm"),
            ("warm_cpu_tokens_per_s", "warm, CPU time"),
            ("cold_tokens_per_s", "cold"),
        ):
            x, y = median(a, key), median(b, key)
            if x and y:
                # the same round's processes ran back to back: their ratios' spread
                pairs = [
                    ra[key] / rb[key]
                    for ra, rb in zip(results[a], results[b], strict=False)
                    if ra.get(key) and rb.get(key)
                ]
                spread = f" (rounds {min(pairs):.2f}-{max(pairs):.2f})" if pairs else ""
                print(f"{a} / {b}, {label}: {x / y:.2f}x{spread} ({what})")
    ours, limit = median("pack_ours", "tokens_per_s"), median("pack_limit", "tokens_per_s")
    if ours and limit:
        print(f"pack_ours / pack_limit: {ours / limit:.2f}x of the bandwidth limit for 24 B/token")
    packed, concat = median("bin", "tokens_per_s"), median("bin_concat", "tokens_per_s")
    if packed and concat:
        print(f"bin / bin_concat (same log-normal documents, warm): {packed / concat:.2f}x")
    plain, spark = median("tok_plain", "rows_per_s"), median("tok_spark", "rows_per_s")
    if plain and spark:
        print(f"tok_spark / tok_plain: {spark / plain:.2f}x (target >= 0.8x)")


if __name__ == "__main__":
    main()
