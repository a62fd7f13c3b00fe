"""Remote reads against the link's speed: a cold shuffled epoch from S3 vs plain parallel GETs.

A real S3-compatible server (moto, its own process) sits behind a TCP proxy that shapes the
loopback link like an object store's (``--rtt-ms`` round trip, ``--mbps`` MB/s per
connection; its own process too). One run prints, for the same objects:

- anchor: ``--gets`` plain parallel GETs (one whole object each, s3fs ``cat_file``);
- cold: a shuffled epoch through ``open_dataset("s3://...")`` with an empty shard cache
  (bytes/s of stored shard bytes, and the ratio to the anchor), time to its first batch;
- warm: the next epoch from the cache (samples/s, time to first batch);
- cold with ``download_threads=1`` (one GET at a time, as before parallel downloads).

``--delta``: the same for a Delta table written by deltalake to the server (``id`` int64 +
``x`` float32[``--dim``], ``--files`` files of 4 row groups each) read in place
(``open_delta("s3://...").dataset().iter_batches(shuffle=True)``): open (log, listing,
footers), cold epoch (empty span and converted-row-group caches) against the parallel GETs
of the data files, warm epoch, and the same reads of a local copy of the table (same
relative paths, so the same fingerprint and order). The in-place read GETs one byte range a
row group, so the GETs of those ranges are measured too (a server may serve ranges slower:
moto reads the whole object for each). A cold in-place epoch both downloads and converts
every row group, and on a small machine both take the same cores (this process's GIL, and
the server's and the link's own processes here): that limit is measured in the same run as
the ranges' GETs *while* a cold epoch of the local copy converts in this process (the
slower of the two sets the rate), and the cold epoch is printed against it too.
``--repeat N``: N cold epochs, each between two runs of the GETs; the median is reported
(a busy machine moves every figure).

    python bench/remote_bench.py                       # ~160 MB in 16 MiB shards
    python bench/remote_bench.py --mb 400 --rtt-ms 50 --mbps 25 --threads 16
    python bench/remote_bench.py --delta --mb 160 --repeat 3
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
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


def _parallel_gets(
    options: dict[str, Any],
    paths: list[str],
    gets: int,
    ranges: list[tuple[str, int, int]] | None = None,
) -> float:
    """Seconds for ``gets`` threads to GET every object once (a fresh client), or each of
    ``ranges`` (path, start, end) once."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    fs.cat_file(paths[0], start=0, end=1)  # connect first, as the loader's metadata reads do

    def get(what: Any) -> int:
        if isinstance(what, str):
            return len(fs.cat_file(what, max_concurrency=1))
        return len(fs.cat_file(what[0], start=what[1], end=what[2]))

    started = time.perf_counter()
    with ThreadPoolExecutor(gets) as pool:
        sizes = list(pool.map(get, paths if ranges is None else ranges))
    assert all(sizes)
    return time.perf_counter() - started


def _group_ranges(local: str, paths: list[str], relative: list[str]) -> list[tuple[str, int, int]]:
    """Each row group's byte range (all its column chunks) in each data file, from the
    local copy's footers: the ranges an in-place read GETs, one a row group."""
    import pyarrow.parquet as pq

    out = []
    for path, rel in zip(paths, relative):
        meta = pq.ParquetFile(f"{local}/{rel}").metadata
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            cols = [rg.column(i) for i in range(rg.num_columns)]
            starts = [
                c.dictionary_page_offset
                if c.has_dictionary_page and 0 < c.dictionary_page_offset < c.data_page_offset
                else c.data_page_offset
                for c in cols
            ]
            ends = [a + c.total_compressed_size for a, c in zip(starts, cols)]
            out.append((path, min(starts), max(ends)))
    return out


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


def _delta_options(port: int) -> dict[str, str]:
    """deltalake's (object_store) options for the server at ``port``."""
    return {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
    }


def _write_delta(uri: str, options: dict[str, str], mb: int, dim: int, files: int) -> None:
    from deltalake import WriterProperties, write_deltalake

    per = (mb << 20) // (dim * 4 + 8) // files
    props = WriterProperties(max_row_group_size=max(1, per // 4))
    for k in range(files):
        values = np.random.default_rng(k).random(per * dim, dtype=np.float32)
        x = pa.FixedSizeListArray.from_arrays(pa.array(values), dim)
        ids = pa.array(np.arange(k * per, (k + 1) * per, dtype=np.int64))
        table = pa.table({"id": ids, "x": x.cast(pa.list_(pa.float32()))})
        write_deltalake(uri, table, mode="append", storage_options=options, writer_properties=props)


def _delta_epoch(
    uri: str, options: dict[str, str] | None, caches: str, epoch: int
) -> dict[str, Any]:
    """Open the table in place and read one shuffled epoch (caches under ``caches``)."""
    from spark_dl_core.tables.delta.table import open_delta

    started = time.perf_counter()
    snap = open_delta(uri, storage_options=options)
    ds = snap.dataset(
        cache_dir=f"{caches}/rows", span_dir=f"{caches}/spans", plan_cache=f"{caches}/plan"
    )
    opened = time.perf_counter() - started
    first, n = None, 0
    for batch in ds.iter_batches(batch_size=256, shuffle=True, seed=1, epoch=epoch):
        if first is None:
            first = time.perf_counter() - started
        n += len(batch["id"])
    wall = time.perf_counter() - started
    assert n == len(ds), (n, len(ds))
    stored = sum(snap.file_size(f) or 0 for f in snap.files)
    epoch_s = wall - opened  # the link's anchor opens nothing either
    return {
        "open_s": opened,
        "first_batch_s": first,
        "wall_s": wall,
        "rows_per_s": n / epoch_s,
        "bytes_per_s": stored / epoch_s,
        "bytes": stored,
        **(ds.download_stats() or {}),
    }


def _gets_while_reading(
    options: dict[str, Any],
    paths: list[str],
    gets: int,
    read: Callable[[], dict[str, Any]],
    ranges: list[tuple[str, int, int]] | None = None,
) -> dict[str, float]:
    """The parallel GETs (of ``paths``, or of ``ranges``) while ``read()`` (a cold epoch of
    a local copy) runs on another thread of this process: what downloading and reading at
    once can reach on this machine (seconds of each, and of both)."""
    import threading

    done: dict[str, Any] = {}

    def work() -> None:
        try:
            done["read"] = read()
        except BaseException as exc:  # re-raised below, on the bench's thread
            done["error"] = exc

    started = time.perf_counter()
    worker = threading.Thread(target=work, name="local-cold")
    worker.start()
    gets_s = _parallel_gets(options, paths, gets, ranges)
    worker.join()
    both_s = time.perf_counter() - started
    if "error" in done:
        raise done["error"]
    return {"gets_s": gets_s, "read_s": done["read"]["wall_s"], "both_s": both_s}


def delta_main(args: argparse.Namespace) -> None:
    """The ``--delta`` bench (see the module's docstring)."""
    import s3fs

    rate = str(args.mbps * 1e6)
    out: dict[str, Any] = {"rtt_ms": args.rtt_ms, "mb_per_s_per_connection": args.mbps}
    with (
        _serve(_MOTO) as moto,
        _serve(_LINK, TESTS, str(moto), str(args.rtt_ms / 1000), rate) as link,
        tempfile.TemporaryDirectory() as tmp,
    ):
        s3fs.S3FileSystem(**_options(moto)).call_s3("create_bucket", Bucket="bench")
        uri = "s3://bench/delta"
        _write_delta(uri, _delta_options(moto), args.mb, args.dim, args.files)
        s3fs.S3FileSystem(**_options(moto)).get("bench/delta", f"{tmp}/local", recursive=True)
        shaped = _delta_options(link)
        from spark_dl_core.tables.delta.table import open_delta

        snap = open_delta(uri, storage_options=shaped)
        paths = [f.split("://", 1)[1] for f in snap.files]
        stored = sum(snap.file_size(f) or 0 for f in snap.files)
        out.update(files=len(paths), stored_mb=stored / 1e6)
        # A busy machine moves every figure: each cold epoch runs between two runs of the
        # GETs and is compared with their mean, and with the local cold epoch and the GETs
        # while converting measured right after it; the median run is reported.
        # The GETs of the row groups' byte ranges (what the in-place read asks for): a
        # server may serve ranges slower than whole objects (moto reads the whole object
        # for each range), so the read is compared with both.
        ranges = _group_ranges(
            f"{tmp}/local", paths, [p.removeprefix("bench/delta/") for p in paths]
        )
        ranged = sum(end - start for _, start, end in ranges)
        out["ranges"] = len(ranges)
        link_options = _options(link)
        anchors = [stored / _parallel_gets(link_options, paths, args.gets)]
        runs: list[dict[str, Any]] = []
        for r in range(args.repeat):
            cold = _delta_epoch(uri, shaped, f"{tmp}/remote{r}", 0)
            anchors.append(stored / _parallel_gets(link_options, paths, args.gets))
            ranges_rate = ranged / _parallel_gets(link_options, paths, args.gets, ranges)
            local = functools.partial(_delta_epoch, f"{tmp}/local", None, f"{tmp}/both{r}", 0)
            both = _gets_while_reading(link_options, paths, args.gets, local, ranges)
            local_cold = _delta_epoch(f"{tmp}/local", None, f"{tmp}/local{r}", 0)
            gets = (anchors[r] + anchors[r + 1]) / 2
            runs.append(
                {
                    "cold": cold,
                    "local_cold": local_cold,
                    "both": {**both, "bytes_per_s": ranged / both["both_s"]},
                    "anchor_bytes_per_s": gets,
                    "anchor_runs": anchors[r : r + 2],
                    "ranges_bytes_per_s": ranges_rate,
                    "cold_vs_gets": cold["bytes_per_s"] / gets,
                    "cold_vs_ranges": cold["bytes_per_s"] / ranges_rate,
                    "cold_vs_local_cold": cold["rows_per_s"] / local_cold["rows_per_s"],
                    "cold_vs_both": cold["bytes_per_s"] * both["both_s"] / ranged,
                }
            )
            for name in (f"both{r}", *((f"remote{r}", f"local{r}") if r else ())):
                shutil.rmtree(f"{tmp}/{name}", ignore_errors=True)  # keep the disk small
        median = sorted(runs, key=lambda run: run["cold_vs_gets"])[len(runs) // 2]
        out.update(median)
        out["repeats"] = [
            {
                k: run[k]
                for k in ("cold_vs_gets", "cold_vs_ranges", "cold_vs_local_cold", "cold_vs_both")
            }
            for run in runs
        ]
        out["warm"] = warm = _delta_epoch(uri, shaped, f"{tmp}/remote0", 1)
        out["local_warm"] = local_warm = _delta_epoch(f"{tmp}/local", None, f"{tmp}/local0", 1)
        cold, local_cold = out["cold"], out["local_cold"]
    if args.json:
        print(json.dumps(out, indent=2))
        return
    mb = 1e6
    print(
        f"link: {args.rtt_ms:g} ms RTT, {args.mbps:g} MB/s per connection; Delta table of "
        f"{out['files']} files, {out['stored_mb']:.0f} MB, x float32[{args.dim}]"
    )
    runs = " / ".join(f"{r / mb:.1f}" for r in out["anchor_runs"])
    print(
        f"{args.gets} parallel GETs of the files: {out['anchor_bytes_per_s'] / mb:.1f} MB/s "
        f"({runs}: before / after the cold epoch; the median of {args.repeat} runs below)"
    )
    print(
        f"{args.gets} parallel GETs of the {out['ranges']} row groups' ranges: "
        f"{out['ranges_bytes_per_s'] / mb:.1f} MB/s"
    )
    for name, r in (
        ("s3 cold", cold),
        ("s3 warm", warm),
        ("local cold", local_cold),
        ("local warm", local_warm),
    ):
        print(
            f"{name:<11} open {r['open_s']:.2f} s, first batch {r['first_batch_s']:.2f} s, "
            f"epoch {r['rows_per_s']:,.0f} rows/s, {r['bytes_per_s'] / mb:.1f} MB/s"
            + (f" (waited {r['network_wait_s']:.2f} s)" if "network_wait_s" in r else "")
        )
    fetched = cold.get("download_bytes", 0.0) / max(cold.get("download_s", 0.0), 1e-9)
    print(
        f"s3 cold fetched {cold.get('download_bytes', 0) / mb:.0f} MB at {fetched / mb:.1f} MB/s "
        f"while a range was in flight ({fetched / out['anchor_bytes_per_s']:.2f}x the GETs)"
    )
    b = out["both"]
    print(
        f"the ranges' GETs while a local cold epoch converts (this process): "
        f"{b['bytes_per_s'] / mb:.1f} MB/s (GETs {b['gets_s']:.2f} s, convert "
        f"{b['read_s']:.2f} s, both {b['both_s']:.2f} s; local cold alone "
        f"{out['stored_mb'] * mb / local_cold['bytes_per_s']:.2f} s)"
    )
    print(
        f"s3 cold: {out['cold_vs_gets']:.2f}x the GETs of the files, {out['cold_vs_ranges']:.2f}x "
        f"those of the ranges, {out['cold_vs_local_cold']:.2f}x local cold, "
        f"{out['cold_vs_both']:.2f}x the ranges' GETs while converting; s3 warm "
        f"{warm['rows_per_s'] / local_warm['rows_per_s']:.2f}x local warm"
    )
    if args.repeat > 1:
        each = ", ".join("/".join(f"{v:.2f}" for v in r.values()) for r in out["repeats"])
        print(f"every run (vs files' GETs / ranges' GETs / local cold / while converting): {each}")


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
    ap.add_argument("--delta", action="store_true", help="a Delta table read in place")
    ap.add_argument("--dim", type=int, default=1024, help="--delta: floats per row")
    ap.add_argument("--files", type=int, default=8, help="--delta: data files")
    ap.add_argument("--repeat", type=int, default=1, help="cold epochs (the median reported)")
    args = ap.parse_args()
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_EC2_METADATA_DISABLED="true"
    )
    if args.delta:
        return delta_main(args)
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
        kw = {} if args.threads is None else {"download_threads": args.threads}
        # The anchor runs before and after each cold epoch: a busy machine moves both; the
        # median of ``--repeat`` cold epochs (each against its two anchors) is reported.
        # The limit on a small machine: the GETs while a cold epoch of a local copy reads
        # (verifies, decodes) the same shards in this process.
        s3fs.S3FileSystem(**direct).get("bench/ds", f"{tmp}/local", recursive=True)
        anchors = [stored / _parallel_gets(shaped, paths, args.gets)]
        runs = []
        for r in range(args.repeat):
            cold = _epoch(url, shaped, f"{tmp}/cache{r}", 0, **kw)
            anchors.append(stored / _parallel_gets(shaped, paths, args.gets))
            local = functools.partial(_epoch, f"{tmp}/local", {}, f"{tmp}/both{r}", 0)
            both = stored / _gets_while_reading(shaped, paths, args.gets, local)["both_s"]
            gets = (anchors[r] + anchors[r + 1]) / 2
            ratios = (cold["bytes_per_s"] / gets, cold["bytes_per_s"] / both)
            runs.append((ratios, r, cold, anchors[r : r + 2], gets, both))
            for name in (f"both{r}", *((f"cache{r}",) if r else ())):
                shutil.rmtree(f"{tmp}/{name}", ignore_errors=True)
        ratios, _, cold, anchor_runs, gets, both = sorted(runs, key=lambda run: run[:2])[
            len(runs) // 2
        ]
        out.update(anchor_runs=anchor_runs, anchor_bytes_per_s=gets, repeats=[x[0] for x in runs])
        out.update(both_bytes_per_s=both, cold_vs_both=ratios[1])
        ratio = ratios[0]
        warm = _epoch(url, shaped, f"{tmp}/cache0", 1, **kw)
        out.update(cold=cold, warm=warm, cold_vs_gets=ratio)
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
        f"GETs while a local copy's cold epoch reads: {out['both_bytes_per_s'] / mb:7.1f} MB/s "
        f"(this process); the cold epoch {out['cold_vs_both']:.2f}x that"
    )
    if args.repeat > 1:
        each = ", ".join(f"{a:.2f}x/{b:.2f}x" for a, b in out["repeats"])
        print(f"every run (vs the GETs / vs the GETs while reading): {each}")
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
