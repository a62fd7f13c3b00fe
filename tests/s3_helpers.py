"""A real S3-compatible server for tests: moto on 127.0.0.1, with credentials that never
send an SDK looking elsewhere (no instance-metadata lookups, no real endpoints)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

REGION = "us-east-1"


@contextmanager
def aws_test_env(access: str = "testing", secret: str = "testing") -> Iterator[None]:
    """AWS credentials in the usual environment variables, restored afterwards."""
    env = {
        "AWS_ACCESS_KEY_ID": access,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def moto_server() -> Iterator[tuple[str, int]]:
    """A moto S3 server on a free loopback port: yields (host, port); stopped afterwards."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        yield server.get_host_and_port()
    finally:
        server.stop()


def endpoint_options(host: str, port: int) -> dict[str, object]:
    """fsspec/s3fs storage options pointing at ``host:port``."""
    return {"client_kwargs": {"endpoint_url": f"http://{host}:{port}", "region_name": REGION}}


@contextmanager
def s3_bucket(bucket: str = "bucket") -> Iterator[tuple[object, dict[str, object]]]:
    """A moto server with ``bucket`` made, in the test credentials: yields an s3fs
    filesystem on it and the storage options that reach it."""
    with moto_server() as (host, port), aws_test_env():
        import s3fs

        options = endpoint_options(host, port)
        fs = s3fs.S3FileSystem(**options)
        fs.call_s3("create_bucket", Bucket=bucket)
        yield fs, options


class ShapedLink:
    """A TCP proxy on loopback that behaves like a network link: every byte is delivered
    ``rtt_s / 2`` late in each direction, and each connection carries at most
    ``bytes_per_s`` in each direction (None: unlimited). Runs an asyncio loop on its own
    thread. Counts connections (``max_open``: most open at once), request bytes that ask
    for a byte range (``ranged``) and bytes sent back (``down_bytes``)."""

    CHUNK = 64 << 10

    def __init__(
        self, upstream: tuple[str, int], rtt_s: float = 0.0, bytes_per_s: float | None = None
    ) -> None:
        self.upstream, self.delay, self.rate = upstream, rtt_s / 2, bytes_per_s
        self.open = self.max_open = self.ranged = self.down_bytes = 0
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._run, name="shaped-link", daemon=True)

    def __enter__(self) -> ShapedLink:
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        loop = self._loop
        if loop is not None:

            async def close() -> None:  # every connection, before the loop goes
                for writer in list(self._writers):
                    writer.close()
                await asyncio.sleep(0.05)

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(close(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)  # transports closed late look it up in this thread
        server = loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            server.close()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer, up=True), self._pipe(up_reader, writer, up=False)
            )
        finally:
            self.open -= 1
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.close()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
        """Copy ``src`` to ``dst`` late by the one-way delay and paced to the rate."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=64)

        async def read() -> None:
            try:
                while data := await src.read(self.CHUNK):
                    if up and b"\r\nrange: bytes=" in data.lower():
                        self.ranged += 1
                    await queue.put((loop.time() + self.delay, data))
            except (ConnectionError, OSError):
                pass
            await queue.put((loop.time() + self.delay, b""))

        async def write() -> None:
            free = loop.time()
            while True:
                due, data = await queue.get()
                now = loop.time()
                if due > now:
                    await asyncio.sleep(due - now)
                if not data:
                    break
                if self.rate:
                    free = max(free, loop.time())
                    if free > loop.time():
                        await asyncio.sleep(free - loop.time())
                    free += len(data) / self.rate
                if not up:
                    self.down_bytes += len(data)
                try:
                    dst.write(data)
                    await dst.drain()
                except (ConnectionError, OSError):
                    break
            with contextlib.suppress(OSError, RuntimeError):
                if dst.can_write_eof():
                    dst.write_eof()

        await asyncio.gather(read(), write())


@contextmanager
def moto_process() -> Iterator[tuple[str, int]]:
    """A moto S3 server in its own process on a free loopback port: yields (host, port).

    ``deltalake`` holds the GIL while it waits on some requests (``DeltaTable.history``),
    so a server thread in the test's own process would never answer them."""
    import subprocess
    import sys
    import time
    import urllib.request

    from ports import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the moto server did not start") from None
                time.sleep(0.1)
        yield "127.0.0.1", port
    finally:
        proc.terminate()
        proc.wait(10)


def delta_options(host: str, port: int) -> dict[str, str]:
    """deltalake (object_store) storage options pointing at ``host:port``."""
    return {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": REGION,
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
    }
