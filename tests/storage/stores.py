"""A run directory on a local disk or on a real S3 API (moto on loopback), and the `store` fixture that runs a
test once on each. Re-export the fixture from a conftest with `from tests.storage.stores import store`.
`SECRET_OPTIONS`: storage_options full of credentials that no message may show."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from raytrainer import storage

SECRET_OPTIONS = {"key": "AKIAEXAMPLEKEYID0042", "secret": "s3cr3t/Value+With=Chars",
                  "client_kwargs": {"region_name": "us-east-1", "aws_session_token": "tok-123456"}}


@dataclass
class Store:
    url: str  # the run directory (output_dir), not created yet
    options: dict | None

    def join(self, *parts: str) -> str:
        return storage.join(self.url, *parts)

    def write(self, relative: str, data: bytes) -> str:
        url = self.join(relative)
        storage.write_bytes(url, data, self.options)
        return url


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path) -> Store:
    if request.param == "local":
        return Store(str(tmp_path / "run"), None)
    bucket = request.getfixturevalue("s3_bucket")
    return Store(bucket + "/run", request.getfixturevalue("s3_server").storage_options)
