"""Remote faults between s3fs and a moto S3 server: a fault-injecting HTTP proxy on loopback.

The proxy forwards every request to moto, except shard GETs that a rule says to fail: an
HTTP 500/503 for the first N, a body cut off midway (headers promise the full length, half
is sent, the socket closes), or every one. It serves a bounded number of requests and shuts
itself down after a deadline, so a broken test cannot leave it running.

s3fs's and botocore's own retries are turned off here (``S3FileSystem.retries = 1``,
``total_max_attempts=1``)
so that the shard cache's retry loop is what is tested; in production the layers stack.
"""

from __future__ import annotations

import http.client
import logging
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from s3_helpers import aws_test_env, endpoint_options, moto_server

from spark_dl_core import DatasetSpec, ShardError, open_dataset, write_mds
from spark_dl_core.errors import HashMismatchError
from spark_dl_core.store.cache import ShardCache
from spark_dl_core.store.cached_store import shard_cache
from spark_dl_core.store.storage import Store, redact

N = 2000
SECRET = "sEcReT-do-not-leak-7f3a9c"
ACCESS = "AKIDFAULTTEST"
_SHARD_GET = re.compile(r"/shard\.\d+\.mds")


@dataclass
class Faults:
    """What the proxy does to shard GETs: ``status`` for the first ``fail`` of them (all of
    them if ``always``), or cut the body of the first ``drop`` of them, or flip a byte in
    the body of the first ``corrupt`` of them; ``norange``: forward them without their
    Range header (a store that ignores byte ranges)."""

    fail: int = 0
    status: int = 503
    drop: int = 0
    corrupt: int = 0
    norange: bool = False
    always: bool = False
    shard_gets: int = 0
    injected: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self, **kw: Any) -> None:
        with self.lock:
            self.fail, self.status, self.drop, self.always = 0, 503, 0, False
            self.corrupt, self.norange = 0, False
            self.shard_gets = self.injected = 0
            for k, v in kw.items():
                setattr(self, k, v)

    def decide(self, method: str, path: str) -> str:
        """``"ok"``, ``"status"`` or ``"drop"`` for one request."""
        if method != "GET" or not _SHARD_GET.search(path.split("?", 1)[0]):
            return "ok"
        with self.lock:
            self.shard_gets += 1
            if self.always or self.fail > 0:
                self.fail -= 1
                self.injected += 1
                return "status"
            if self.drop > 0:
                self.drop -= 1
                self.injected += 1
                return "drop"
            if self.corrupt > 0:
                self.corrupt -= 1
                self.injected += 1
                return "corrupt"
            if self.norange:
                return "norange"
        return "ok"


class _Proxy(ThreadingHTTPServer):
    daemon_threads = True
    upstream: tuple[str, int]
    faults: Faults
    budget: int


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Proxy

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _forward(self) -> None:
        self.server.budget -= 1
        if self.server.budget < 0:  # bounded: a runaway client gets refused
            self.close_connection = True
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        action = self.server.faults.decide(self.command, self.path)
        if action == "status":
            code = self.server.faults.status
            err = b"SlowDown" if code == 503 else b"InternalError"
            payload = b"<Error><Code>" + err + b"</Code><Message>injected</Message></Error>"
            self.send_response(code)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        conn = http.client.HTTPConnection(*self.server.upstream, timeout=10)
        try:
            skip = ("connection", "range") if action == "norange" else ("connection",)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        self.send_response(resp.status)
        for key, value in resp.getheaders():
            if key.lower() in ("transfer-encoding", "connection"):
                continue
            if key.lower() == "content-length" and self.command != "HEAD":
                continue
            self.send_header(key, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if action == "corrupt" and data:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        if action == "drop":
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[Any, dict[str, Any], Faults]]:
    """moto on 127.0.0.1, the fault proxy in front of it, storage options through the proxy."""
    with moto_server() as (host, port), aws_test_env(ACCESS, SECRET):
        faults = Faults()
        proxy = _Proxy(("127.0.0.1", 0), _Handler)
        proxy.upstream, proxy.faults, proxy.budget = (host, port), faults, 20_000
        thread = threading.Thread(target=proxy.serve_forever, daemon=True)
        thread.start()
        deadline = threading.Timer(300, proxy.shutdown)  # stops by itself, whatever happens
        deadline.daemon = True
        deadline.start()
        options: dict[str, Any] = {
            "key": ACCESS,
            "secret": SECRET,
            **endpoint_options("127.0.0.1", proxy.server_address[1]),
            "config_kwargs": {
                "retries": {"total_max_attempts": 1},
                "connect_timeout": 5,
                "read_timeout": 10,
            },
        }
        import s3fs

        saved_retries = s3fs.S3FileSystem.retries
        s3fs.S3FileSystem.retries = 1  # a class setting: s3fs's own retry loop off
        fs = s3fs.S3FileSystem(**options)
        fs.call_s3("create_bucket", Bucket="bucket")
        try:
            yield fs, options, faults
        finally:
            deadline.cancel()
            proxy.shutdown()
            proxy.server_close()
            s3fs.S3FileSystem.retries = saved_retries


def _table() -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table(
        {
            "id": pa.array(np.arange(N, dtype=np.int64)),
            "v": pa.array(list(rng.random((N, 4), dtype=np.float32))),
        }
    )


@pytest.fixture(scope="module")
def dataset_url(s3: tuple[Any, dict[str, Any], Faults]) -> str:
    _fs, options, faults = s3
    faults.reset()
    url = "s3://bucket/faults"
    spec = DatasetSpec(shard_size="8KiB", hashes=["xxh64"])
    write_mds(_table(), url, spec, storage_options=options)
    return url


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_DL_RETRIES", "4")
    monkeypatch.setenv("SPARK_DL_RETRY_BACKOFF_S", "0.01")


def _open(url: str, options: dict[str, Any], cache: Path) -> Any:
    return open_dataset(url, cache_dir=str(cache), storage_options=options)


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name.startswith(".tmp-"))


def _shards(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))


@pytest.mark.parametrize("status", [500, 503])
def test_transient_errors_are_retried(
    s3: Any, dataset_url: str, tmp_path: Path, fast_retries: None, status: int
) -> None:
    _fs, options, faults = s3
    ds = _open(dataset_url, options, tmp_path)
    faults.reset(fail=3, status=status)
    ids = ds.to_arrow(columns=["id"])["id"].to_numpy()
    assert sorted(ids.tolist()) == list(range(N))
    cache = shard_cache(ds)
    assert faults.injected == 3 and cache.failed_attempts == 3
    assert cache.downloads == ds.num_shards
    assert _leftovers(tmp_path) == []


def test_backoff_is_exponential_with_jitter(tmp_path: Path) -> None:
    cache = ShardCache(Store("s3://b/x"), str(tmp_path), retries=6, backoff_s=0.1, max_backoff_s=1)
    for attempt, base in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (6, 1.0)]:
        delays = [cache._delay(attempt) for _ in range(50)]
        assert all(base / 2 <= d <= base for d in delays)
        assert len(set(delays)) > 1  # jittered


def test_dropped_body_never_enters_the_cache(
    s3: Any, dataset_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fs, options, faults = s3
    ds = _open(dataset_url, options, tmp_path)
    monkeypatch.setenv("SPARK_DL_RETRIES", "0")
    faults.reset(drop=1)
    name = ds.shards[0].stored.basename
    with pytest.raises(ShardError, match=re.escape(name)):
        ds.load_shard(0)
    assert faults.injected == 1
    assert _shards(tmp_path) == [] and _leftovers(tmp_path) == []
    # The next read re-downloads it and succeeds.
    assert ds.load_shard(0, verify_hashes=True).raw[:4].view("<u4")[0] == ds.shards[0].samples
    assert _shards(tmp_path) == [name]


def test_dropped_bodies_are_retried(
    s3: Any, dataset_url: str, tmp_path: Path, fast_retries: None
) -> None:
    _fs, options, faults = s3
    ds = _open(dataset_url, options, tmp_path)
    faults.reset(drop=3)
    batches = list(ds.iter_batches(batch_size=500, shuffle=True, seed=3, verify_hashes=True))
    assert sorted(np.concatenate([b["id"] for b in batches]).tolist()) == list(range(N))
    assert faults.injected == 3 and shard_cache(ds).failed_attempts == 3
    assert _leftovers(tmp_path) == []


def test_retry_budget_gives_a_clear_error_without_credentials(
    s3: Any, dataset_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fs, options, faults = s3
    monkeypatch.setenv("SPARK_DL_RETRIES", "2")
    monkeypatch.setenv("SPARK_DL_RETRY_BACKOFF_S", "0.01")
    ds = _open(dataset_url, options, tmp_path)
    faults.reset(always=True, status=500)
    name = ds.shards[1].stored.basename
    with pytest.raises(ShardError) as info:
        ds.load_shard(1)
    injected = faults.injected
    faults.reset()
    assert injected == 3  # 1 attempt + 2 retries, then it stops
    text = str(info.value)
    assert name in text and f"{dataset_url}/{name}" in text and "3 attempts" in text
    assert SECRET not in text and SECRET not in repr(info.value)
    assert _shards(tmp_path) == [] and _leftovers(tmp_path) == []


def test_mismatched_shards_are_never_served(
    s3: Any, dataset_url: str, tmp_path: Path, fast_retries: None
) -> None:
    fs, options, faults = s3
    faults.reset()
    url = "s3://bucket/mismatch"
    write_mds(
        _table(), url, DatasetSpec(shard_size="8KiB", hashes=["xxh64"]), storage_options=options
    )
    ds = _open(url, options, tmp_path)
    first, second = (ds.shards[i].stored.basename for i in (0, 1))
    good = fs.cat(f"bucket/mismatch/{first}")
    fs.pipe(f"bucket/mismatch/{first}", good[:-1] + bytes([good[-1] ^ 0xFF]))  # same size
    with pytest.raises(HashMismatchError, match=re.escape(first)):
        ds.load_shard(0)
    assert shard_cache(ds).redownloads == 1  # downloaded once more, then refused
    fs.pipe(f"bucket/mismatch/{second}", b"short")
    with pytest.raises(ShardError, match="the index says"):
        ds.load_shard(1)
    assert _shards(tmp_path) == [] and _leftovers(tmp_path) == []
    # A stale wrong-size file in the cache (say, from an older dataset) is replaced.
    fs.pipe(f"bucket/mismatch/{first}", good)
    (tmp_path / first).write_bytes(b"stale")
    assert ds.load_shard(0, verify_hashes=True).raw[:4].view("<u4")[0] == ds.shards[0].samples
    assert (tmp_path / first).read_bytes() == good


def test_missing_shard_is_a_clear_error(s3: Any, tmp_path: Path) -> None:
    fs, options, faults = s3
    faults.reset()
    url = "s3://bucket/missing"
    write_mds(_table(), url, DatasetSpec(shard_size="8KiB"), storage_options=options)
    ds = _open(url, options, tmp_path)
    name = ds.shards[0].stored.basename
    fs.rm(f"bucket/missing/{name}")
    with pytest.raises(ShardError, match="does not exist"):
        ds.load_shard(0)


def test_no_credentials_in_metadata_errors_or_logs(
    s3: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fs, options, faults = s3
    faults.reset()
    caplog.set_level(logging.DEBUG)
    url = "s3://bucket/creds"
    write_mds(_table(), url, DatasetSpec(shard_size="8KiB"), storage_options=options)
    for name in ("index.json", "spark_dl.json"):
        assert SECRET.encode() not in fs.cat(f"bucket/creds/{name}")
        assert ACCESS.encode() not in fs.cat(f"bucket/creds/{name}")
    ds = _open(url, options, tmp_path)
    assert SECRET not in repr(ds) and SECRET not in repr(ds.store)
    fs.rm(f"bucket/creds/{ds.shards[0].stored.basename}")
    with pytest.raises(ShardError) as info:
        ds.load_shard(0)
    assert SECRET not in str(info.value)
    for record in caplog.records:
        if record.name.startswith("spark_dl"):
            assert SECRET not in record.getMessage()
    # Local writes record no storage options either.
    write_mds(_table(), str(tmp_path / "local"), DatasetSpec(), storage_options={"secret": SECRET})
    for path in (tmp_path / "local").iterdir():
        assert SECRET.encode() not in path.read_bytes()


def test_redact() -> None:
    options = {"key": "AKID1234", "client_kwargs": {"aws_session_token": "tok-5678"}, "anon": False}
    text = "s3://user:pa55word@bucket/x failed for AKID1234 with tok-5678 at http://h:1/y"
    out = redact(text, options)
    assert out == "s3://***@bucket/x failed for *** with *** at http://h:1/y"
    assert "pa55word" not in repr(Store("ftp://user:pa55word@host/ds"))
    assert Store("s3://b/ds", {"secret": "hunter22"}).redact("hunter22 x") == "*** x"


def test_download_progress_bar(
    s3: Any, dataset_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fs, options, faults = s3
    faults.reset()
    ds = _open(dataset_url, options, tmp_path / "off")
    ds.load_shard(0)
    assert "shard.00000" not in capsys.readouterr().err  # off by default
    ds = _open(dataset_url, options, tmp_path / "on")
    cache = ShardCache(ds.store, str(tmp_path / "on"), progress=True)
    info = ds.shards[0].stored
    assert len(cache.fetch(info.basename, info.bytes)) == info.bytes
    assert info.basename in capsys.readouterr().err


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards of ~8 KiB fetched as concurrent 2 KiB byte ranges."""
    monkeypatch.setenv("SPARK_DL_PART_BYTES", "2048")


def test_faults_in_byte_ranges_are_retried(
    s3: Any, dataset_url: str, tmp_path: Path, fast_retries: None, small_parts: None
) -> None:
    _fs, options, faults = s3
    ds = _open(dataset_url, options, tmp_path)
    assert max(s.stored.bytes for s in ds.shards) > 2 * 2048  # several ranges a shard
    faults.reset(fail=3, status=500, drop=3)
    batches = list(ds.iter_batches(batch_size=500, shuffle=True, seed=5, verify_hashes=True))
    assert sorted(np.concatenate([b["id"] for b in batches]).tolist()) == list(range(N))
    cache = shard_cache(ds)
    assert faults.injected == 6 and cache.failed_attempts == 6
    assert cache.downloads == ds.num_shards and cache.redownloads == 0
    assert faults.shard_gets > 2 * ds.num_shards  # ranged GETs, not one per shard
    assert _leftovers(tmp_path) == []


def test_bytes_that_do_not_verify_are_downloaded_once_more(
    s3: Any, dataset_url: str, tmp_path: Path, small_parts: None
) -> None:
    _fs, options, faults = s3
    ds = _open(dataset_url, options, tmp_path)
    faults.reset(corrupt=1)  # one range arrives damaged, the next download is fine
    assert ds.load_shard(0).raw[:4].view("<u4")[0] == ds.shards[0].samples
    cache = shard_cache(ds)
    assert faults.injected == 1 and cache.redownloads == 1 and cache.downloads == 1
    assert _leftovers(tmp_path) == []


def test_a_store_ignoring_byte_ranges_is_named(
    s3: Any, dataset_url: str, tmp_path: Path, small_parts: None
) -> None:
    _fs, options, faults = s3
    ds = _open(dataset_url, options, tmp_path)
    faults.reset(norange=True)
    name = ds.shards[0].stored.basename
    try:
        with pytest.raises(ShardError, match="ignored a byte-range request") as info:
            ds.load_shard(0)
    finally:
        faults.reset()
    assert f"{dataset_url}/{name}" in str(info.value) and SECRET not in str(info.value)
    assert _shards(tmp_path) == [] and _leftovers(tmp_path) == []
