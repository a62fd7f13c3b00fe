"""A real S3-compatible server for tests: moto on 127.0.0.1, with credentials that never
send an SDK looking elsewhere (no instance-metadata lookups, no real endpoints)."""

from __future__ import annotations

import os
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
