"""Checksums (issue 20, 1-2): every committed file carries one, taken as it is written; what is loaded is
verified; a damaged checkpoint is refused naming the file and the checkpoint, falls back only for
resume_from_checkpoint=True, and is never deleted. Each test on local disk and on S3 (moto). Checksums as written:
test_writer.py and test_snapshot.py; an old manifest without them: test_model_io.py."""

from __future__ import annotations

import json
import pickle

import pytest

from raytrainer import storage
from raytrainer.checkpoint import listing, manifest, resume
from raytrainer.checkpoint.damage import CheckpointDamagedError
from raytrainer.checkpoint.model_io import load_model_state, save_model_files
from raytrainer.checkpoint.snapshot import Snapshot, get_rng_state
from raytrainer.checkpoint.writer import write_snapshot
from raytrainer.errors import ConfigError
from tests.models import make_model


def _save(store, step: int) -> str:
    model = make_model(step)
    url = store.join(f"checkpoint-{step}")
    snapshot = Snapshot(step=step, model_state=model.state_dict(), model=model,
                        optimizer_state={"state": {}, "param_groups": []}, scheduler_state={"last_epoch": step},
                        rng_states=[get_rng_state()], trainer_state_json=json.dumps({"global_step": step}),
                        args_json="{}")
    write_snapshot(snapshot, url, lambda d, sd: save_model_files(model, d, sd), store.options)
    return url


def _overwrite(store, url: str, name: str, at: int, data: bytes):
    """Same-size damage: `data` written over the file's bytes at offset `at` (negative: from the end)."""
    full = storage.join(url, name)
    content = bytearray(storage.read_bytes(full, store.options))
    at = at % len(content)
    content[at:at + len(data)] = data
    storage.write_bytes(full, bytes(content), store.options)


def test_same_size_corruption_is_refused_naming_file_and_checkpoint(store):
    url = _save(store, 4)
    _overwrite(store, url, "model.safetensors", -4096, b"\xff" * 64)  # inside the weights; size unchanged
    assert listing.newest_committed(store.url, store.options) == url  # sizes alone cannot tell
    with pytest.raises(CheckpointDamagedError, match=r"checkpoint-4 is damaged: model\.safetensors: its content"):
        resume.resolve(store.url, url, store.options)
    with pytest.raises(CheckpointDamagedError, match="model.safetensors"):  # the load verifies too
        load_model_state(url, store.options, manifest.read_manifest(url, store.options))
    assert storage.exists(storage.join(url, "model.safetensors"), store.options)  # left as evidence


@pytest.mark.parametrize("name,damage", [
    ("model.safetensors", b"\xff\xff\xff\xff\xff\xff\xff\x7f"),  # header length: "header too large"
    ("optimizer.pt", b"garbage!"),  # a torch.save zip's magic
    ("trainer_state.json", b"{{{{"),
])
def test_header_damage_names_the_file(store, name, damage):
    url = _save(store, 4)
    _overwrite(store, url, name, 0, damage)
    with pytest.raises(CheckpointDamagedError, match=f"checkpoint-4 is damaged: {name}"):
        resume.resolve(store.url, url, store.options)


def test_true_falls_back_to_the_newest_intact_one_and_says_so(store, capfd):
    _save(store, 4)
    newest = _save(store, 8)
    _overwrite(store, newest, "optimizer.pt", -100, b"\x00" * 10)
    assert resume.resolve(store.url, True, store.options) == store.join("checkpoint-4")
    err = capfd.readouterr().err
    assert "resuming from checkpoint-4 (step 4)" in err and "passed over checkpoint-8 (optimizer.pt" in err
    with pytest.raises(CheckpointDamagedError):  # a path is never replaced by another checkpoint
        resume.resolve(store.url, newest, store.options)


def test_truncated_committed_checkpoint_is_damaged_not_partial_and_never_removed(store):
    _save(store, 4)
    newest = _save(store, 8)
    content = storage.read_bytes(storage.join(newest, "model.safetensors"), store.options)
    storage.write_bytes(storage.join(newest, "model.safetensors"), content[:-10], store.options)
    info = {i.step: i for i in listing.list_checkpoints(store.url, store.options)}
    assert not info[8].committed and "model.safetensors" in info[8].damaged and "truncated" in info[8].damaged
    assert listing.remove_partial(store.url, store.options) == []  # committed once: not ours to delete
    assert storage.exists(storage.join(newest, "model.safetensors"), store.options)
    with pytest.raises(CheckpointDamagedError, match="checkpoint-8 is damaged: model.safetensors"):
        resume.resolve(store.url, newest, store.options)


def test_no_committed_checkpoint_at_all(store):
    with pytest.raises(ConfigError, match="holds no committed checkpoint"):
        resume.resolve(store.url, True, store.options)


def test_damaged_error_crosses_processes():
    error = pickle.loads(pickle.dumps(CheckpointDamagedError("s3://b/run/checkpoint-3", "optimizer.pt", "x")))
    assert error.fatal and "checkpoint-3 is damaged: optimizer.pt: x" in str(error)
