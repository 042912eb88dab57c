"""URLs as str (raytrainer/storage/urls.py): the scheme is kept, local paths stay local paths."""

from __future__ import annotations

import os

from raytrainer import storage


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


def test_local_paths_and_buckets():
    assert storage.local_path("file:///tmp/run") == "/tmp/run" and storage.local_path("rel/x") == "rel/x"
    assert storage.absolute_if_local("rel/x") == os.path.abspath("rel/x")
    assert storage.absolute_if_local("s3://b/run") == "s3://b/run"
    assert storage.bucket("s3://b/run/checkpoint-5") == "b" and storage.bucket("gs://c") == "c"
