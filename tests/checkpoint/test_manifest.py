"""manifest.py: the commit marker is written last, and a committed checkpoint is verified by its sizes."""

from __future__ import annotations

import json

from raytrainer import storage
from raytrainer.checkpoint import manifest
from raytrainer.checkpoint.manifest import MANIFEST_NAME
from raytrainer.storage.integrity import of_bytes


def _write_files(store, ckpt: str) -> str:
    store.write(f"{ckpt}/model.safetensors", b"w" * 1000)
    store.write(f"{ckpt}/optimizer/rank-0.pt", b"o" * 10)
    return store.join(ckpt)


def test_commit_lists_every_file_and_writes_the_marker(store):
    url = _write_files(store, "checkpoint-5")
    assert manifest.read_manifest(url, store.options) is None
    assert not manifest.is_committed(url, store.options)  # no manifest: partial

    written = manifest.commit(url, 5, store.options)

    assert written["format"] == manifest.FORMAT and written["step"] == 5 and written["created"]
    assert written["files"] == {"model.safetensors": 1000, "optimizer/rank-0.pt": 10}
    assert written["checksums"] == {"model.safetensors": of_bytes(b"w" * 1000),
                                    "optimizer/rank-0.pt": of_bytes(b"o" * 10)}
    assert manifest.read_manifest(url, store.options) == written
    assert manifest.is_committed(url, store.options)
    assert manifest.list_files(url, store.options).keys() == written["files"].keys()  # marker excluded


def test_explicit_file_list_is_trusted_and_verified(store):
    url = _write_files(store, "checkpoint-7")
    written = manifest.commit(url, 7, store.options, files={"model.safetensors": 1000})
    assert written["files"] == {"model.safetensors": 1000}
    assert manifest.is_committed(url, store.options)
    manifest.commit(url, 7, store.options, files={"model.safetensors": 1000, "missing.bin": 3}, checksums={})
    assert not manifest.is_committed(url, store.options)


def test_truncated_or_missing_file_after_commit_is_not_committed(store):
    url = _write_files(store, "checkpoint-5")
    manifest.commit(url, 5, store.options)
    store.write("checkpoint-5/model.safetensors", b"w" * 999)  # truncated
    assert not manifest.is_committed(url, store.options)
    assert manifest.is_committed(url, store.options, verify=False)  # the marker alone is still there

    store.write("checkpoint-5/model.safetensors", b"w" * 1000)
    assert manifest.is_committed(url, store.options)
    storage.remove(store.join("checkpoint-5/optimizer"), storage_options=store.options)
    assert not manifest.is_committed(url, store.options)


def test_torn_or_foreign_manifest_is_not_a_commit(store):
    url = _write_files(store, "checkpoint-5")
    store.write(f"checkpoint-5/{MANIFEST_NAME}", b'{"format": 1, "step": 5, "fil')  # crash mid-write
    assert manifest.read_manifest(url, store.options) is None
    assert not manifest.is_committed(url, store.options, verify=False)
    store.write(f"checkpoint-5/{MANIFEST_NAME}", json.dumps({"step": "5"}).encode())
    assert manifest.read_manifest(url, store.options) is None


def test_delete_uncommits_then_removes(store):
    url = _write_files(store, "checkpoint-5")
    manifest.commit(url, 5, store.options)
    manifest.delete(url, store.options)
    assert not storage.exists(url, store.options)
    manifest.delete(url, store.options)  # idempotent
