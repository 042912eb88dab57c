"""Each storage test that takes `store` runs twice: on a local directory and on a real S3 API (moto on
loopback)."""

from tests.storage.stores import store  # noqa: F401  (fixture)
