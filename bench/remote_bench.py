"""Remote reads against the link's speed: a cold shuffled epoch from S3 vs plain parallel GETs.

A real S3-compatible server (moto, its own process) sits behind a TCP proxy that shapes the
loopback link like an object store's (``--rtt-ms`` round trip, ``--mbps`` MB/s per
connection; its own process too). One run prints, for the same objects:

- anchor: ``--gets`` plain parallel GETs (one whole object each, s3fs ``cat_file``);
- cold: a shuffled epoch through ``open_dataset("s3://...")`` with an empty shard cache
  (bytes/s of stored shard bytes, and the ratio to the anchor), time to its first batch;
- warm: the next epoch from the cache (samples/s, time to first batch);
- cold with ``download_threads=1`` (one GET at a time, as before parallel downloads).

    python bench/remote_bench.py                       # ~160 MB in 16 MiB shards
    python bench/remote_bench.py --mb 400 --rtt-ms 50 --mbps 25 --threads 16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from spark_dl_core import DatasetSpec, open_dataset, write_mds

TESTS = str(Path(__file__).resolve().parent.parent / "tests")
ROW = 4096  # bytes per sample (random, incompressible)

_MOTO = """
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
server.start()
print("port", server.get_host_and_port()[1], flush=True)
sys.stdin.read()
"""

_LINK = """
import sys
sys.path.insert(0, sys.argv[1])
from s3_helpers import ShapedLink
rate = float(sys.argv[4]) or None
link = ShapedLink(("127.0.0.1", int(sys.argv[2])), float(sys.argv[3]), rate).__enter__()
print("port", link.port, flush=True)
sys.stdin.read()
"""


@contextmanager
def _serve(code: str, *args: str) -> Iterator[int]:
    """A helper process printing its port; stopped when its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # moto logs every request
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while not line.startswith("port "):  # moto announces itself first
            line = proc.stdout.readline()
        yield int(line.split()[1])
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _options(port: int) -> dict[str, Any]:
    return {
        "key": "bench",
        "secret": "bench",
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"},
    }


def _write(url: str, options: dict[str, Any], mb: int, shard_mib: int) -> None:
    n = (mb << 20) // ROW
    rng = np.random.default_rng(0)
    ids = np.arange(n, dtype=np.int64)
    spec = DatasetSpec(shard_size=f"{shard_mib}MiB", hashes=["xxh64"])

    def batches() -> Iterator[pa.RecordBatch]:
        for at in range(0, n, 4096):
            k = min(4096, n - at)
            rows = rng.integers(0, 256, size=k * ROW, dtype=np.uint8)
            x = pa.FixedSizeListArray.from_arrays(pa.array(rows), ROW)
            yield pa.record_batch({"id": pa.array(ids[at : at + k]), "x": x})

    schema = pa.schema([("id", pa.int64()), ("x", pa.list_(pa.uint8(), ROW))])
    write_mds(pa.Table.from_batches(list(batches()), schema), url, spec, storage_options=options)


def _parallel_gets(options: dict[str, Any], paths: list[str], gets: int) -> float:
    """Seconds for ``gets`` threads to GET every object once (a fresh client)."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    fs.cat_file(paths[0], start=0, end=1)  # connect first, as the loader's metadata reads do
    started = time.perf_counter()
    with ThreadPoolExecutor(gets) as pool:
        sizes = list(pool.map(lambda p: len(fs.cat_file(p, max_concurrency=1)), paths))
    assert all(sizes)
    return time.perf_counter() - started


def _epoch(url: str, options: dict[str, Any], cache: str, epoch: int, **kw: Any) -> dict[str, Any]:
    ds = open_dataset(url, cache_dir=cache, storage_options=options)
    started = time.perf_counter()
    first, n = None, 0
    for batch in ds.iter_batches(batch_size=256, shuffle=True, seed=1, epoch=epoch, **kw):
        if first is None:
            first = time.perf_counter() - started
        n += len(batch["id"])
    wall = time.perf_counter() - started
    assert n == len(ds), (n, len(ds))
    stored = int(ds.shards.stored_bytes.sum())
    return {"wall_s": wall, "first_batch_s": first, "bytes_per_s": stored / wall, "bytes": stored}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=160, help="dataset size (MB of samples)")
    ap.add_argument("--shard-mib", type=int, default=16)
    ap.add_argument("--rtt-ms", type=float, default=20.0)
    ap.add_argument("--mbps", type=float, default=50.0, help="MB/s per connection (0: no limit)")
    ap.add_argument("--gets", type=int, default=8, help="parallel GETs of the anchor")
    ap.add_argument("--threads", type=int, default=None, help="download_threads (None: default)")
    ap.add_argument("--no-serial", action="store_true", help="skip the one-thread cold epoch")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_EC2_METADATA_DISABLED="true"
    )
    rate = str(args.mbps * 1e6)
    out: dict[str, Any] = {"rtt_ms": args.rtt_ms, "mb_per_s_per_connection": args.mbps}
    with (
        _serve(_MOTO) as moto,
        _serve(_LINK, TESTS, str(moto), str(args.rtt_ms / 1000), rate) as link,
        tempfile.TemporaryDirectory() as tmp,
    ):
        import s3fs

        direct = _options(moto)
        s3fs.S3FileSystem(**direct).call_s3("create_bucket", Bucket="bench")
        url = "s3://bench/ds"
        _write(url, direct, args.mb, args.shard_mib)
        shaped = _options(link)
        ds = open_dataset(url, cache_dir=f"{tmp}/probe", storage_options=shaped)
        paths = [f"bench/ds/{s.stored.basename}" for s in ds.shards]
        stored = int(ds.shards.stored_bytes.sum())
        out.update(shards=ds.num_shards, stored_mb=stored / 1e6)
        before = stored / _parallel_gets(shaped, paths, args.gets)
        kw = {} if args.threads is None else {"download_threads": args.threads}
        cold = _epoch(url, shaped, f"{tmp}/cache", 0, **kw)
        after = stored / _parallel_gets(shaped, paths, args.gets)
        # The anchor runs before and after the cold epoch: a busy machine moves both.
        out.update(anchor_runs=[before, after], anchor_bytes_per_s=(before + after) / 2)
        warm = _epoch(url, shaped, f"{tmp}/cache", 1, **kw)
        out.update(
            cold=cold, warm=warm, cold_vs_gets=cold["bytes_per_s"] / out["anchor_bytes_per_s"]
        )
        if not args.no_serial:
            serial = _epoch(url, shaped, f"{tmp}/serial", 0, download_threads=1)
            out["cold_one_thread"] = serial
            out["one_thread_vs_gets"] = serial["bytes_per_s"] / out["anchor_bytes_per_s"]
    if args.json:
        print(json.dumps(out, indent=2))
        return
    mb = 1e6
    print(
        f"link: {args.rtt_ms:g} ms RTT, {args.mbps:g} MB/s per connection; "
        f"{out['shards']} shards, {out['stored_mb']:.0f} MB"
    )
    runs = " / ".join(f"{r / mb:.1f}" for r in out["anchor_runs"])
    print(
        f"{args.gets} parallel GETs:        {out['anchor_bytes_per_s'] / mb:7.1f} MB/s "
        f"(mean of {runs}: before / after the cold epoch)"
    )
    print(
        f"cold shuffled epoch:     {cold['bytes_per_s'] / mb:7.1f} MB/s  "
        f"({out['cold_vs_gets']:.2f}x the GETs), first batch {cold['first_batch_s']:.2f} s"
    )
    print(
        f"warm epoch:              {warm['bytes_per_s'] / mb:7.1f} MB/s, "
        f"first batch {warm['first_batch_s']:.3f} s"
    )
    if "cold_one_thread" in out:
        s = out["cold_one_thread"]
        print(
            f"cold, download_threads=1:{s['bytes_per_s'] / mb:7.1f} MB/s  "
            f"({out['one_thread_vs_gets']:.2f}x), first batch {s['first_batch_s']:.2f} s"
        )


if __name__ == "__main__":
    main()
