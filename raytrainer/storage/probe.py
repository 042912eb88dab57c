"""The writability probe (principle 4, fail before spending): before any worker starts, the driver creates
`output_dir` where directories exist, writes a probe object, reads it back and deletes it, within a time limit.

Any failure becomes one `StorageError` naming the URL, the cause and the fix (errors.describe_error), with no
secret in it. A missing bucket is reported, never created.
"""

from __future__ import annotations

import errno
import threading
import uuid

import fsspec

from ..errors import StorageError
from .errors import FileInTheWay, ProbeTimeout, describe_error
from .files import get_fs, is_object_store
from .urls import S3_PROTOCOLS, protocol

_PROBE_DATA = b"raytrainer write probe\n"


def check_writable(url: str, storage_options: dict | None = None, timeout_s: float = 20) -> None:
    """Fail before spending: create `url` if needed, write, read back and delete a probe file.

    Raises `StorageError` naming the URL, the cause and the fix; no secret appears in it.
    """
    url = str(url)
    try:
        fs, path = _probe_fs(url, storage_options, timeout_s)
        _run_with_timeout(lambda: _probe(fs, path), timeout_s)
    except StorageError:
        raise
    except Exception as exc:  # e.g. options the filesystem rejects, as well as I/O errors
        raise describe_error(url, exc, storage_options, timeout_s=timeout_s) from None


def _probe_fs(url: str, storage_options: dict | None, timeout_s: float):
    options = dict(storage_options or {})
    if protocol(url) in S3_PROTOCOLS:
        # botocore's and s3fs's retries turn a refused connection into a long back-off: the probe wants an
        # answer within its time limit. A private instance keeps these settings out of the cached, shared one.
        options["config_kwargs"] = {**options.get("config_kwargs", {}), "connect_timeout": min(3.0, timeout_s),
                                    "read_timeout": timeout_s, "retries": {"max_attempts": 2, "mode": "standard"}}
        options["skip_instance_cache"] = True
    fs, path = get_fs(url, options)
    if protocol(url) in S3_PROTOCOLS:
        fs.retries = 1  # s3fs's own retry loop, on top of botocore's; only on this private instance
    return fs, path


def _probe(fs: fsspec.AbstractFileSystem, path: str) -> None:
    if not is_object_store(fs):
        if fs.isfile(path):
            raise FileInTheWay()
        fs.makedirs(path, exist_ok=True)
    probe = path.rstrip("/") + f"/.raytrainer-probe-{uuid.uuid4().hex}"
    fs.pipe_file(probe, _PROBE_DATA)
    try:
        echoed = fs.cat_file(probe)
    finally:
        fs.rm_file(probe)
    if echoed != _PROBE_DATA:
        raise OSError(errno.EIO, f"read back {len(echoed)} bytes that differ from the {len(_PROBE_DATA)} written")


def _run_with_timeout(func, timeout_s: float) -> None:
    # A daemon thread, not a pool: a filesystem that hangs (a dead NFS mount, a black-holed endpoint) must
    # not keep the driver from failing, nor from exiting afterwards.
    outcome: list = []

    def target():
        try:
            func()
            outcome.append(None)
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)

    thread = threading.Thread(target=target, name="raytrainer-storage-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        raise ProbeTimeout()
    if outcome[0] is not None:
        raise outcome[0]
