"""fsspec I/O (raytrainer/storage/files.py): byte I/O on local disk and S3, a collapsed URL or a missing s3fs
refused with the fix, S3 configured by the AWS environment alone."""

from __future__ import annotations

import sys

import pytest
from fsspec.registry import _registry as fsspec_registry

from raytrainer import storage
from raytrainer.errors import StorageError


def test_a_collapsed_url_is_refused_with_the_fix():
    with pytest.raises(StorageError, match="s3://b/run"):
        storage.get_fs("s3:/b/run")


def test_missing_s3fs_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "s3fs", None)  # makes `import s3fs` fail
    for proto in ("s3", "s3a"):  # forget the already imported class, so fsspec imports s3fs again
        monkeypatch.delitem(fsspec_registry, proto, raising=False)
    with pytest.raises(StorageError, match=r"pip install 'raytrainer\[s3\]'"):
        storage.get_fs("s3://bucket/run")


def test_write_read_exists_remove(store):
    url = store.join("deep", "dir", "file.txt")
    assert not storage.exists(url, store.options)
    storage.write_text(url, "héllo", store.options)
    assert storage.read_text(url, store.options) == "héllo"
    assert storage.read_bytes(url, store.options) == "héllo".encode()
    assert storage.exists(url, store.options)
    storage.remove(store.url, storage_options=store.options)
    assert not storage.exists(url, store.options)
    storage.remove(store.url, storage_options=store.options)  # idempotent


def test_s3_configured_by_aws_environment_only(s3_server, s3_bucket, monkeypatch):
    """botocore reads AWS_ENDPOINT_URL itself: no storage_options needed."""
    import s3fs

    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()  # instances resolve the endpoint once; start from a clean one
    try:
        url = storage.join(s3_bucket, "env", "x.bin")
        storage.write_bytes(url, b"abc")
        assert storage.read_bytes(url, s3_server.storage_options) == b"abc"  # same bucket via explicit options
        storage.check_writable(storage.join(s3_bucket, "env"))
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


def test_s3_listings_are_not_cached_unless_asked():
    """Other processes (workers) write checkpoints: a cached listing would hide them. DCP's fsspec reader and
    writer are opened with the same options (checkpoint/sharded.py)."""
    options = {"key": "k"}
    assert storage.fsspec_options("s3://b/run", options) == {"key": "k", "use_listings_cache": False}
    assert options == {"key": "k"}  # the caller's dict is left as it was
    assert storage.fsspec_options("s3://b/run", {"use_listings_cache": True})["use_listings_cache"] is True
    assert storage.fsspec_options("/tmp/run", None) == {}
