"""Upload (raytrainer/storage/upload.py): a local directory is copied to an object store file by file,
checksummed as it goes, and never into a bucket that is gone (s3fs's recursive put would create it)."""

from __future__ import annotations

import pytest

from raytrainer import storage
from raytrainer.storage.errors import StorageLostError
from raytrainer.storage.integrity import of_bytes
from raytrainer.storage.upload import upload_dir
from tests.storage.faults import bucket_exists, delete_bucket


def _tree(root):
    (root / "sub").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"a" * 1000)
    (root / "sub" / "b.json").write_bytes(b"{}")
    return {"a.bin": b"a" * 1000, "sub/b.json": b"{}"}


def test_every_file_is_uploaded_with_the_checksum_of_its_bytes(tmp_path, s3_server, s3_bucket):
    opts, url = s3_server.storage_options, s3_bucket + "/run/checkpoint-4"
    files = _tree(tmp_path / "staging")
    checksums = upload_dir(str(tmp_path / "staging"), url, opts)
    assert checksums == {name: of_bytes(data) for name, data in files.items()}
    for name, data in files.items():
        assert storage.read_bytes(storage.join(url, name), opts) == data


def test_a_vanished_bucket_is_never_recreated(tmp_path, s3_server, s3_bucket):
    opts = s3_server.storage_options
    _tree(tmp_path / "staging")
    delete_bucket(opts, s3_bucket)
    with pytest.raises(StorageLostError, match="no longer exists .* never creates buckets"):
        upload_dir(str(tmp_path / "staging"), s3_bucket + "/run/checkpoint-4", opts)
    assert not bucket_exists(opts, s3_bucket)
