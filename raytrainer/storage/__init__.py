"""Storage is a URL (principle 6): every checkpoint byte goes through fsspec, and URLs stay `str`.

One concern per module, each importing only modules listed above it:

    urls.py       URLs as `str`: protocol, is_local, join, basename, absolute_if_local, local_path, bucket
    errors.py     storage errors and their classification: StorageFatalError, StorageLostError, describe_error
                  (why a URL cannot be used, naming the fix), fatal_error / is_transient / bucket_lost, redact
    files.py      fsspec I/O: get_fs, read/write bytes and text, exists, remove, is_object_store
    probe.py      the writability probe run on the driver before any worker starts: check_writable
    retry.py      Retry: transient errors waited out for storage_retry_timeout_s, fatal ones raised at once
    integrity.py  checksums (xxh3), taken as bytes are written, checked as they are read
    upload.py     a local directory uploaded file by file, checksummed as it goes, never creating a bucket

This module re-exports what the rest of raytrainer uses as `storage.<name>` (the URL helpers, fsspec I/O, the
probe, the storage errors a caller may catch or word); the rest is imported from its module
(`from ..storage.retry import Retry`, `from ..storage.errors import fatal_error`). Nothing in storage/ imports
checkpoint/ or any layer above it (docs/design.md's layers: storage is foundation).
"""

from __future__ import annotations

from .errors import StorageFatalError, StorageLostError, describe_error, redact
from .files import (
    exists,
    fsspec_options,
    get_fs,
    is_object_store,
    read_bytes,
    read_text,
    remove,
    write_bytes,
    write_text,
)
from .probe import check_writable
from .urls import (
    absolute_if_local,
    basename,
    bucket,
    is_local,
    join,
    local_path,
    protocol,
)

__all__ = [
    # urls
    "protocol", "is_local", "absolute_if_local", "local_path", "join", "basename", "bucket",
    # files
    "fsspec_options", "get_fs", "is_object_store", "read_bytes", "read_text", "write_bytes", "write_text", "exists",
    "remove",
    # probe
    "check_writable",
    # errors
    "StorageFatalError", "StorageLostError", "describe_error", "redact",
]
