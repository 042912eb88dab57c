"""Storage locations as `str`: a local path or a URL (`file://`, `s3://`, ...), never a `pathlib.Path`.

A `Path` would collapse `s3://bucket` to `s3:/bucket`, so nothing here takes or returns one. Pure string
functions: no filesystem is opened (that is files.py).
"""

from __future__ import annotations

import os

from fsspec.core import split_protocol

S3_PROTOCOLS = ("s3", "s3a")
# Stores without real directories: a "directory" is a key prefix, created by writing under it.
OBJECT_STORE_PROTOCOLS = S3_PROTOCOLS + ("gs", "gcs", "abfs", "abfss", "az", "adl", "oss")
_LOCAL_PROTOCOLS = (None, "file", "local")


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


def bucket(url: str) -> str:
    """The bucket (or container) of an object-store URL: `s3://b/run/x` -> `b`."""
    return url.partition("://")[2].split("/", 1)[0]
