"""Copy a local directory to remote storage one file at a time, checksumming the bytes as they go (and one
file back: `download_file`).

Not `fs.put(recursive=True)`: s3fs's recursive put calls `makedirs` for the target, which creates a
missing bucket. A run whose bucket vanished must stop with a clear error (`errors.StorageLostError`), never
write into a fresh, empty bucket and restart from step 0. A per-file write into a missing bucket fails
with NoSuchBucket instead. Reading each staged file once, for the upload and the checksum together, keeps
the checksum free of a second read.
"""

from __future__ import annotations

import os
from typing import Optional

from .files import get_fs
from .integrity import CHUNK, Checksum
from .retry import Retry
from .urls import join


def upload_file(local_file: str, url: str, storage_options: Optional[dict] = None) -> str:
    """Write one local file to `url`; returns its checksum."""
    fs, path = get_fs(url, storage_options)
    with open(local_file, "rb") as src, fs.open(path, "wb") as dst:
        return copy_checksummed(src, dst)


def download_file(url: str, local_file: str, storage_options: Optional[dict] = None) -> str:
    """Copy `url` to a local file; returns the checksum of the bytes read."""
    fs, path = get_fs(url, storage_options)
    with fs.open(path, "rb") as src, open(local_file, "wb") as dst:
        return copy_checksummed(src, dst)


def copy_checksummed(src, dst) -> str:
    """Copy one open binary file to another in chunks, checksumming the bytes as they pass."""
    checksum = Checksum()
    while True:
        chunk = src.read(CHUNK)
        if not chunk:
            break
        checksum.update(chunk)
        dst.write(chunk)
    return checksum.hexdigest()


def local_files(root: str) -> list[str]:
    """Every file under `root`, as sorted relative posix paths."""
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            found.append(os.path.relpath(os.path.join(directory, name), root).replace(os.sep, "/"))
    return sorted(found)


def upload_dir(root: str, url: str, storage_options: Optional[dict] = None,
               retry: Optional[Retry] = None) -> dict[str, str]:
    """Upload every file under the local directory `root` to `url`; returns {relative path: checksum}.
    Each file is retried on its own through `retry` (a transient error re-sends that file only)."""
    retry = retry or Retry(storage_options=storage_options)
    checksums = {}
    for relative in local_files(root):
        target = join(url, relative)
        checksums[relative] = retry.call(
            lambda relative=relative, target=target: upload_file(os.path.join(root, relative), target,
                                                                 storage_options), target, "uploading")
    return checksums
