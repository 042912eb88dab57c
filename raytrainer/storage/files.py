"""fsspec I/O: the filesystem of a URL, and whole-object reads, writes, existence and deletes.

S3 is configured either by `storage_options` (s3fs keys: endpoint_url, key, secret, client_kwargs, ...)
or, when those are absent, by the standard AWS variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...),
which botocore reads itself; explicit `storage_options` win. Nothing here creates a bucket.
"""

from __future__ import annotations

import posixpath
import re

import fsspec

from ..errors import StorageError
from .errors import redact
from .urls import OBJECT_STORE_PROTOCOLS, S3_PROTOCOLS, protocol

_COLLAPSED_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]+:/[^/]")


def fsspec_options(url: str, storage_options: dict | None = None) -> dict:
    """The options an fsspec filesystem for `url` is opened with: the user's storage_options, and on S3 no
    listings cache unless the user asks for one. Checkpoints are written by other processes (workers): a cached
    listing on the driver would hide them, and principle 2 makes the listing the source of truth."""
    options = dict(storage_options or {})
    if protocol(url) in S3_PROTOCOLS:
        options.setdefault("use_listings_cache", False)
    return options


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
    try:
        return fsspec.core.url_to_fs(url, **fsspec_options(url, storage_options))
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
