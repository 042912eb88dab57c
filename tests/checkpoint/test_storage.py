"""raytrainer.storage: URL handling, byte I/O on local and S3, and the driver's writability probe."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time

import pytest
from fsspec.registry import _registry as fsspec_registry

from raytrainer import storage
from raytrainer.errors import StorageError
from tests import s3server
from tests.support import free_port

NOBODY = 65534
SECRET_OPTIONS = {"key": "AKIAEXAMPLEKEYID0042", "secret": "s3cr3t/Value+With=Chars",
                  "client_kwargs": {"region_name": "us-east-1", "aws_session_token": "tok-123456"}}


# ------------------------------------------------------------------------------------------------ URLs
def test_join_keeps_the_scheme():
    assert storage.join("s3://b/run", "checkpoint-5") == "s3://b/run/checkpoint-5"
    assert storage.join("s3://b/run/", "checkpoint-5", "model/x.bin") == "s3://b/run/checkpoint-5/model/x.bin"
    assert storage.join("s3://b", "run") == "s3://b/run"
    assert storage.join("file:///tmp/run", "a") == "file:///tmp/run/a"
    assert storage.join("/tmp/run", "a", "b") == os.path.join("/tmp/run", "a", "b")
    assert storage.join("rel", "/a") == os.path.join("rel", "a")  # a leading slash does not reset the base


def test_is_local_and_basename():
    assert storage.is_local("/tmp/x") and storage.is_local("rel/x") and storage.is_local("file:///tmp/x")
    assert not storage.is_local("s3://b/x") and not storage.is_local("memory://x")
    assert storage.basename("s3://b/run/checkpoint-5/") == "checkpoint-5"
    assert storage.basename("C:\\runs\\checkpoint-7") == "checkpoint-7"


def test_a_collapsed_url_is_refused_with_the_fix():
    with pytest.raises(StorageError, match="s3://b/run"):
        storage.get_fs("s3:/b/run")


def test_missing_s3fs_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "s3fs", None)  # makes `import s3fs` fail
    for proto in ("s3", "s3a"):  # forget the already imported class, so fsspec imports s3fs again
        monkeypatch.delitem(fsspec_registry, proto, raising=False)
    with pytest.raises(StorageError, match=r"pip install 'raytrainer\[s3\]'"):
        storage.get_fs("s3://bucket/run")


# ------------------------------------------------------------------------------------------------ bytes
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


# ---------------------------------------------------------------------------------------------- secrets
def test_redact_hides_option_and_environment_secrets(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envSecretValue99")
    text = f"k={SECRET_OPTIONS['key']} s={SECRET_OPTIONS['secret']} t=tok-123456 e=envSecretValue99 us-east-1"
    out = storage.redact(text, SECRET_OPTIONS)
    assert out == "k=*** s=*** t=*** e=*** us-east-1"


# ------------------------------------------------------------------------------------------ check_writable
def test_check_writable_creates_and_cleans_up(store):
    storage.check_writable(store.url, store.options)
    fs, path = storage.get_fs(store.url, store.options)
    assert fs.find(path) == []  # the probe is gone
    assert fs.isdir(path) == storage.is_local(store.url)  # created where directories exist


def test_unreachable_endpoint_fails_fast_without_secrets():
    port = free_port()  # nothing listens there any more
    options = {**SECRET_OPTIONS, "endpoint_url": f"http://127.0.0.1:{port}"}
    start = time.monotonic()
    with pytest.raises(StorageError) as info:
        storage.check_writable("s3://some-bucket/run", options)
    assert time.monotonic() - start < 15
    message = str(info.value)
    assert "Cannot reach" in message and f"127.0.0.1:{port}" in message and "s3://some-bucket/run" in message
    assert not any(secret in message for secret in ("AKIAEXAMPLEKEYID0042", "s3cr3t", "tok-123456"))


def test_missing_bucket_says_to_create_it(s3_server):
    options = {**s3_server.storage_options, "secret": "s3cr3t/Value+With=Chars"}  # moto accepts any secret
    with pytest.raises(StorageError) as info:
        storage.check_writable("s3://no-such-bucket-7f3a/run", options)
    message = str(info.value)
    assert "'no-such-bucket-7f3a'" in message and "does not exist" in message and "Create it" in message
    assert "s3cr3t" not in message


@pytest.fixture(scope="module")
def s3_server_with_auth():
    server = s3server.start(extra_env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"})  # moto then checks keys
    yield server
    server.stop()


def test_bad_credentials_are_access_denied(s3_server_with_auth):
    options = {**s3_server_with_auth.storage_options, "key": "AKIAEXAMPLEKEYID0042",
               "secret": "s3cr3t/Value+With=Chars"}
    with pytest.raises(StorageError) as info:
        storage.check_writable("s3://bucket/run", options)
    message = str(info.value)
    assert "Access denied" in message and "credentials" in message
    assert "AKIAEXAMPLEKEYID0042" not in message and "s3cr3t" not in message


def test_path_that_is_a_file(tmp_path):
    target = tmp_path / "output"
    target.write_text("not a directory")
    with pytest.raises(StorageError, match="exists and is a file"):
        storage.check_writable(str(target))
    with pytest.raises(StorageError, match="part of the path is an existing file"):
        storage.check_writable(str(target / "run"))


@contextlib.contextmanager
def _as_user(uid: int):
    """Run the block with this effective uid (root can always write, so read-only needs another user)."""
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.fixture
def read_only_dir():
    """A directory its user cannot write (chmod 0o500), and a context that acts as that user.

    As root, permission bits do not stop writes; the directory is then given to `nobody`, and the
    check runs with that effective uid, so the kernel really refuses the write.
    """
    parent = tempfile.mkdtemp(prefix="raytrainer-ro-")
    os.chmod(parent, 0o755)  # let `nobody` reach it
    target = os.path.join(parent, "run")
    os.mkdir(target)
    as_user = contextlib.nullcontext
    if os.geteuid() == 0:
        os.chown(target, NOBODY, NOBODY)
        as_user = lambda: _as_user(NOBODY)  # noqa: E731
    os.chmod(target, 0o500)
    try:
        yield target, as_user
    finally:
        os.chmod(target, 0o700)
        shutil.rmtree(parent)


def test_read_only_local_dir(read_only_dir, tmp_path):
    target, as_user = read_only_dir
    storage.check_writable(str(tmp_path))  # import everything the probe needs before dropping privileges
    with as_user():
        with pytest.raises(StorageError) as info:
            storage.check_writable(target)
        with pytest.raises(StorageError, match="permission denied"):
            storage.check_writable(os.path.join(target, "sub"))  # cannot create the directory either
    assert "permission denied" in str(info.value) and target in str(info.value)


def test_a_hung_filesystem_times_out(tmp_path, monkeypatch):
    monkeypatch.setattr(storage, "_probe", lambda fs, path: time.sleep(2))
    start = time.monotonic()
    with pytest.raises(StorageError, match="did not answer within 0.3 s"):
        storage.check_writable(str(tmp_path), timeout_s=0.3)
    assert time.monotonic() - start < 2
