"""Storage is a URL: every checkpoint byte goes through fsspec, and URLs stay `str`.

A `pathlib.Path` would collapse `s3://bucket` to `s3:/bucket`, so nothing here takes or returns one.
S3 is configured either by `storage_options` (s3fs keys: endpoint_url, key, secret, client_kwargs, ...)
or, when those are absent, by the standard AWS variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...),
which botocore reads itself; explicit `storage_options` win.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import threading
import uuid

import fsspec
from fsspec.core import split_protocol

from ..errors import StorageError

S3_PROTOCOLS = ("s3", "s3a")
# Stores without real directories: a "directory" is a key prefix, created by writing under it.
OBJECT_STORE_PROTOCOLS = S3_PROTOCOLS + ("gs", "gcs", "abfs", "abfss", "az", "adl", "oss")
_LOCAL_PROTOCOLS = (None, "file", "local")
_SECRET_WORDS = ("key", "secret", "token", "password", "credential")
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
_COLLAPSED_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]+:/[^/]")
_PROBE_DATA = b"raytrainer write probe\n"


# ---------------------------------------------------------------------------------------------- URLs
def protocol(url: str) -> str | None:
    """The URL's scheme, or None for a plain local path (Windows drive letters are not schemes)."""
    return split_protocol(str(url))[0]


def is_local(url: str) -> bool:
    return protocol(url) in _LOCAL_PROTOCOLS


def absolute_if_local(url: str) -> str:
    """A local path made absolute (relative to this process's directory); URLs unchanged."""
    return os.path.abspath(local_path(url)) if is_local(url) else url


def local_path(url: str) -> str:
    """The filesystem path of a local URL (`file:///x` -> `/x`)."""
    return url[len("file://"):] if url.startswith("file://") else url


def join(base: str, *parts: str) -> str:
    """Join path parts onto a URL or local path, keeping the scheme (`s3://b/run` + `x` = `s3://b/run/x`)."""
    base = str(base)
    parts = tuple(p.strip("/") for p in map(str, parts) if p.strip("/"))
    if protocol(base) is None:
        return os.path.join(base, *parts)
    scheme, sep, rest = base.partition("://")
    rest = rest.rstrip("/")  # but never strip into the scheme's "//"
    return scheme + sep + "/".join([rest, *parts] if rest else parts)


def basename(url: str) -> str:
    """Last path component of a URL or a local (also Windows) path, ignoring a trailing slash."""
    return str(url).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


# ------------------------------------------------------------------------------------- filesystems
def get_fs(url: str, storage_options: dict | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem and in-filesystem path for `url`.

    Instances are cached by fsspec itself (per class and options, and dropped in a forked child), so
    calling this per operation is cheap and fork-safe.
    """
    url = str(url)
    if _COLLAPSED_URL.match(url):
        raise StorageError(f"{url!r} looks like a URL whose '//' was collapsed (by pathlib.Path?): pass URLs "
                           f"as str, e.g. {url.replace(':/', '://', 1)!r}.")
    scheme = protocol(url)
    options = dict(storage_options or {})
    if scheme in S3_PROTOCOLS:
        # Checkpoints are written by other processes (workers): a cached listing on the driver would hide
        # them, and principle 2 makes the listing the source of truth. The user can still opt back in.
        options.setdefault("use_listings_cache", False)
    try:
        return fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        if scheme in S3_PROTOCOLS:
            raise StorageError(f"{url} is on S3, but s3fs is not installed: pip install 'raytrainer[s3]'.") \
                from None
        raise StorageError(f"No filesystem for {scheme}:// URLs is installed ({redact(str(exc), storage_options)})"
                           f": install the fsspec implementation for {scheme}.") from None
    except ValueError as exc:
        raise StorageError(f"Cannot open {url}: {redact(str(exc), storage_options)}. Check the URL scheme and "
                           "storage_options.") from None


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def is_object_store(fs: fsspec.AbstractFileSystem) -> bool:
    return any(p in OBJECT_STORE_PROTOCOLS for p in _protocols(fs))


def _ensure_parent(fs: fsspec.AbstractFileSystem, path: str) -> None:
    # Local (and other directory) filesystems need the parent to exist; object stores must not try, since
    # s3fs's makedirs creates a missing *bucket*, which a typo in output_dir should never do.
    if not is_object_store(fs):
        fs.makedirs(posixpath.dirname(path.rstrip("/")), exist_ok=True)


# ------------------------------------------------------------------------------------------- bytes
def write_bytes(url: str, data: bytes, storage_options: dict | None = None) -> None:
    fs, path = get_fs(url, storage_options)
    _ensure_parent(fs, path)
    fs.pipe_file(path, data)


def read_bytes(url: str, storage_options: dict | None = None) -> bytes:
    fs, path = get_fs(url, storage_options)
    return fs.cat_file(path)


def write_text(url: str, text: str, storage_options: dict | None = None) -> None:
    write_bytes(url, text.encode("utf-8"), storage_options)


def read_text(url: str, storage_options: dict | None = None) -> str:
    return read_bytes(url, storage_options).decode("utf-8")


def exists(url: str, storage_options: dict | None = None) -> bool:
    fs, path = get_fs(url, storage_options)
    return fs.exists(path)


def remove(url: str, recursive: bool = True, storage_options: dict | None = None) -> None:
    """Delete a file or directory tree; a missing one is not an error (retries and races stay harmless)."""
    fs, path = get_fs(url, storage_options)
    try:
        fs.rm(path, recursive=recursive)
    except FileNotFoundError:
        pass


# ------------------------------------------------------------------------------------------ secrets
def _secret_values(options, secret_key: bool = False):
    if isinstance(options, dict):
        for key, value in options.items():
            yield from _secret_values(value, secret_key or any(w in str(key).lower() for w in _SECRET_WORDS))
    elif secret_key and isinstance(options, str) and options:
        yield options


def redact(text: str, storage_options: dict | None = None) -> str:
    """`text` with every credential from storage_options and the AWS environment replaced by `***`."""
    secrets = set(_secret_values(storage_options or {}))
    secrets.update(os.environ[name] for name in _SECRET_ENV if os.environ.get(name))
    for secret in sorted(secrets, key=len, reverse=True):  # longest first: one secret may contain another
        text = text.replace(secret, "***")
    return text


# --------------------------------------------------------------------------------- writability probe
class _FileInTheWay(Exception):
    pass


class _ProbeTimeout(Exception):
    pass


def _probe_fs(url: str, storage_options: dict | None, timeout_s: float):
    options = dict(storage_options or {})
    if protocol(url) in S3_PROTOCOLS:
        # botocore's and s3fs's retries turn a refused connection into ~10 s of back-off: the probe wants
        # an answer in seconds. A private instance keeps these settings out of the cached, shared one.
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
            raise _FileInTheWay()
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
        raise _ProbeTimeout()
    if outcome[0] is not None:
        raise outcome[0]


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


# ------------------------------------------------------------------------------------ error messages
def exception_chain(exc: BaseException):
    """`exc`, then its causes and contexts, each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _endpoint(storage_options: dict | None) -> str:
    options = storage_options or {}
    return (options.get("endpoint_url") or (options.get("client_kwargs") or {}).get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            or "the default AWS S3 endpoint")


_UNREACHABLE = {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError", "ConnectionError",
                "ConnectionRefusedError", "gaierror", "ProxyConnectionError", "ServerDisconnectedError"}
_NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}


def describe_error(url: str, exc: BaseException, storage_options: dict | None = None,
                   timeout_s: float | None = None) -> StorageError:
    """A `StorageError` saying why `url` could not be used and how to fix it, secrets redacted."""
    url = str(url)
    chain = list(exception_chain(exc))
    names = {cls.__name__ for e in chain for cls in type(e).__mro__}
    reason = redact(f"{type(exc).__name__}: {exc}", storage_options)
    remote = not is_local(url)
    scheme = protocol(url)
    endpoint = _endpoint(storage_options) if scheme in S3_PROTOCOLS else None
    where = f" at {endpoint}" if endpoint else ""

    if isinstance(exc, _ProbeTimeout):
        text = (f"Storage for {url}{where} did not answer within {timeout_s:g} s. Check that the endpoint is "
                "right and reachable from this machine (network, proxy, firewall), or that the mounted "
                "filesystem is not hung.")
    elif remote and names & _UNREACHABLE:
        text = (f"Cannot reach the storage endpoint{where} for {url} ({reason}). Check the endpoint URL "
                "(storage_options['endpoint_url'] or AWS_ENDPOINT_URL), that the service is running, and "
                "that this machine can connect to it.")
    elif names & _NO_CREDENTIALS:
        text = (f"No usable credentials for {url}{where} ({reason}). Pass storage_options={{'key': ..., "
                "'secret': ...}} or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE).")
    elif isinstance(exc, _FileInTheWay):
        text = (f"{url} exists and is a file, not a directory: choose another output_dir or remove the file.")
    elif isinstance(exc, (NotADirectoryError, FileExistsError)):
        text = (f"Cannot create the directory {url}: part of the path is an existing file ({reason}). Choose "
                "another output_dir or remove that file.")
    elif isinstance(exc, PermissionError) or getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM,
                                                                              errno.EROFS):
        if remote:
            text = (f"Access denied to {url}{where} ({reason}). Check the credentials (storage_options 'key'/"
                    "'secret', or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE) and that they allow "
                    "listing the bucket and putting, getting and deleting objects under this prefix.")
        else:
            text = (f"Cannot write to {url}: permission denied or read-only filesystem ({reason}). Choose a "
                    "directory this user can write to, or fix its permissions (e.g. chmod u+w).")
    elif isinstance(exc, FileNotFoundError) and scheme in OBJECT_STORE_PROTOCOLS:
        bucket = url.partition("://")[2].split("/", 1)[0]
        text = (f"The bucket {bucket!r} of {url} does not exist{where} ({reason}). Create it first (e.g. "
                f"`aws s3 mb {scheme}://{bucket}`), or point output_dir at an existing bucket.")
    else:
        text = (f"Cannot use {url}{where} ({reason}). Check the URL and storage_options.")
    return StorageError(redact(text, storage_options))
