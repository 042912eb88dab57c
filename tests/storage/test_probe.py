"""The driver's writability probe (raytrainer/storage/probe.py): each way `output_dir` cannot be used gives one
error naming the fix, fast, and without a secret."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time

import pytest

from raytrainer import storage
from raytrainer.errors import StorageError
from raytrainer.storage import probe
from tests import s3server
from tests.storage.stores import SECRET_OPTIONS
from tests.support import free_port

NOBODY = 65534


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
    monkeypatch.setattr(probe, "_probe", lambda fs, path: time.sleep(2))
    start = time.monotonic()
    with pytest.raises(StorageError, match="did not answer within 0.3 s"):
        storage.check_writable(str(tmp_path), timeout_s=0.3)
    assert time.monotonic() - start < 2
