"""A real S3 API on loopback for tests: moto's server mode in a subprocess.

A subprocess (not moto's in-process mock) so that any process the tests start (Ray workers, the CLI)
reaches the same buckets through a plain endpoint URL. Re-export the fixtures from a conftest with
`from tests.s3server import s3_server, s3_bucket`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field

import pytest

from tests.support import free_port

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


@dataclass
class S3Server:
    endpoint_url: str
    process: subprocess.Popen
    storage_options: dict = field(default_factory=dict)

    def env(self) -> dict:
        """The standard AWS variables that point botocore (and so s3fs) at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1).close()
        return True
    except urllib.error.HTTPError:  # any HTTP answer means the server is up
        return True
    except OSError:
        return False


def start(timeout_s: float = 30.0, attempts: int = 3, extra_env: dict | None = None) -> S3Server:
    """Start moto on a free loopback port; retries on another port if the chosen one was taken meanwhile."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(extra_env or {})
    for _ in range(attempts):
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            if _answers(endpoint):
                options = {"endpoint_url": endpoint, "key": ACCESS_KEY, "secret": SECRET_KEY,
                           "client_kwargs": {"region_name": REGION}}
                return S3Server(endpoint, proc, options)
            time.sleep(0.1)
        server = S3Server(endpoint, proc)
        server.stop()
    raise RuntimeError(f"moto server did not answer within {timeout_s} s after {attempts} attempts")


def create_bucket(server: S3Server, name: str | None = None) -> str:
    import s3fs  # lazily: only S3 tests need it

    name = name or f"test-{uuid.uuid4().hex[:12]}"
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **server.storage_options)
    # Not fs.mkdir: s3fs sends LocationConstraint=us-east-1, which S3 (and moto) reject for that region.
    fs.call_s3("create_bucket", Bucket=name)
    return f"s3://{name}"


@pytest.fixture(scope="session")
def s3_server():
    server = start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh, empty bucket per test, as `s3://<name>`."""
    yield create_bucket(s3_server)
