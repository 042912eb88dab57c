"""Checkpoints HF's Trainer writes itself (the hosted mode), committed and read back with raytrainer's guarantees
(raytrainer/checkpoint/hf_dirs.py): each node's files (uploaded from its staging directory for a URL, checksummed
in place on local disk), the manifest written last over every node's files, and `fetch` checking every byte."""

from __future__ import annotations

import os

import pytest

from raytrainer.checkpoint import hf_dirs
from raytrainer.checkpoint.damage import CheckpointDamagedError
from raytrainer.checkpoint.listing import list_checkpoints
from raytrainer.checkpoint.manifest import read_manifest
from raytrainer.storage import is_local, local_path
from raytrainer.storage.integrity import of_bytes
from tests.hosting.test_hosted_handler import FILES, damage, write_checkpoint


def write_node(directory: str, files: dict):
    for name, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(directory, name)), exist_ok=True)
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)


def test_two_nodes_files_are_committed_by_one_manifest_written_last(store, tmp_path, monkeypatch):
    """Rank 0's node holds the model and its rng state, the other node its own rng state: on S3 each node's
    files are uploaded from its staging directory; the checkpoint is committed only once the manifest names both."""
    monkeypatch.setenv(hf_dirs.STAGING_ENV, str(tmp_path / "staging"))
    url = store.join("checkpoint-4")
    nodes = [{"model.safetensors": b"m" * 300, "rng_state_0.pth": b"r0"}, {"rng_state_1.pth": b"r1" * 5}]
    held = []
    for index, files in enumerate(nodes):
        # As HF writes: into output_dir itself when it is local, into this node's staging directory for a URL.
        directory = local_path(url) if is_local(url) else os.path.join(str(tmp_path / f"node{index}"), "ckpt")
        write_node(directory, files)
        held.append(hf_dirs.node_files(directory, None if is_local(url) else url, store.options))
    # On S3 a node holds what it wrote; on local disk (one shared directory) the last node sees every file.
    assert held[1][0] == ({"rng_state_1.pth": 10} if not is_local(url) else
                          {"model.safetensors": 300, "rng_state_0.pth": 2, "rng_state_1.pth": 10})
    assert held[1][1]["rng_state_1.pth"] == of_bytes(b"r1" * 5)
    assert [c.committed for c in list_checkpoints(store.url, store.options)] == [False]  # files, no manifest yet
    hf_dirs.commit(url, 4, held, store.options, written_by={"trainer": "t", "index": 0, "run": "r"})
    manifest = read_manifest(url, store.options)
    assert manifest["files"] == {"model.safetensors": 300, "rng_state_0.pth": 2, "rng_state_1.pth": 10}
    assert manifest["checksums"]["model.safetensors"] == of_bytes(b"m" * 300)
    assert [(c.step, c.committed) for c in list_checkpoints(store.url, store.options)] == [(4, True)]


def test_a_local_checkpoint_is_fetched_in_place_after_the_same_check(tmp_path):
    url = write_checkpoint(str(tmp_path / "run"), 3)
    assert hf_dirs.fetch(url) == url and sorted(os.listdir(url)) == sorted(["COMMITTED"] + [n for n, _ in FILES])
    damage(url, "model.safetensors", truncate=True)
    with pytest.raises(CheckpointDamagedError, match="model.safetensors"):
        hf_dirs.fetch(url)
    with pytest.raises(CheckpointDamagedError, match="missing or unreadable"):
        hf_dirs.fetch(write_checkpoint(str(tmp_path / "run"), 5, commit=False))


def test_fetch_checks_every_byte_against_the_manifest(s3_bucket, s3_server, tmp_path, monkeypatch):
    monkeypatch.setenv(hf_dirs.STAGING_ENV, str(tmp_path / "staging"))
    options = dict(s3_server.storage_options)
    url = write_checkpoint(s3_bucket + "/run", 5, options)
    local = hf_dirs.fetch(url, options)
    assert local == hf_dirs.fetched_path(url) and sorted(os.listdir(local)) == sorted(name for name, _ in FILES)
    damage(url, "optimizer.pt", options)
    with pytest.raises(CheckpointDamagedError, match="optimizer.pt: its content changed"):
        hf_dirs.fetch(url, options)
