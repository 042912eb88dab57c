"""Damaged checkpoints in real runs (issue 20, 1-2), in the driver process (num_workers=0): the damage is found
before anything loads, named with its file and checkpoint; resume_from_checkpoint=True falls back to the newest
intact checkpoint, says so, and ends with the uninterrupted run's weights; nothing damaged is ever deleted."""

from __future__ import annotations

import json
import os

import pytest

from raytrainer.checkpoint import listing, manifest
from raytrainer.checkpoint.damage import CheckpointDamagedError, verify
from tests.models import assert_same_weights, weights
from tests.resume_script import SlowTrainer, TokenData, make_model, training_args


def _train(out, resume_from=None, **extra):
    trainer = SlowTrainer(model=make_model(), args=training_args(out, **extra), train_dataset=TokenData(44))
    trainer.train(resume_from_checkpoint=resume_from)
    return trainer


def _flip(path: str, offset: int, data: bytes):
    with open(path, "r+b") as f:
        f.seek(offset, os.SEEK_END if offset < 0 else os.SEEK_SET)
        f.write(data)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A run of 12 steps with checkpoints at 4, 8 and 12, and its final weights."""
    out = str(tmp_path_factory.mktemp("ref") / "run")
    return out, weights(_train(out).model)


def test_damaged_newest_checkpoints_fall_back_exactly_and_are_kept(finished, tmp_path, capfd):
    import shutil

    out = str(tmp_path / "run")
    shutil.copytree(finished[0], out)
    _flip(f"{out}/checkpoint-12/model.safetensors", -4096, b"\x7f" * 32)  # same size: only the checksum tells
    with open(f"{out}/checkpoint-8/optimizer.pt", "r+b") as f:  # truncated
        f.truncate(os.path.getsize(f"{out}/checkpoint-8/optimizer.pt") - 100)
    capfd.readouterr()

    with pytest.raises(CheckpointDamagedError, match=r"checkpoint-12 is damaged: model\.safetensors"):
        _train(out, resume_from=f"{out}/checkpoint-12")  # an explicit path is never swapped for another
    resumed = _train(out, resume_from=True)

    err = capfd.readouterr().err
    assert "resuming from checkpoint-4 (step 4)" in err and "passed over checkpoint-12 (model.safetensors" in err
    assert "checkpoint-8 (optimizer.pt" in err and "damaged, left in place" in err
    assert_same_weights(weights(resumed.model), finished[1])
    # The damaged ones were set aside when their steps were saved again, every file kept.
    for step in (8, 12):
        assert manifest.read_manifest(f"{out}/checkpoint-{step}.damaged") is not None
        assert verify(f"{out}/checkpoint-{step}") is None  # the new ones are intact
    assert [i.step for i in listing.list_checkpoints(out) if i.committed] == [4, 8, 12]


@pytest.mark.parametrize("name,damage", [
    ("model.safetensors", b"\xff\xff\xff\xff\xff\xff\xff\x7f"),
    ("optimizer.pt", b"garbage!"),
    ("trainer_state.json", b"{{{{"),
])
def test_header_damage_in_an_old_checkpoint_is_named_when_loaded(finished, tmp_path, name, damage):
    """A checkpoint committed before checksums existed (size check only): the parse error names the file."""
    import shutil

    out = str(tmp_path / "run")
    shutil.copytree(finished[0], out)
    ckpt = f"{out}/checkpoint-8"
    old = manifest.read_manifest(ckpt)
    old.pop("checksums")
    old["format"] = 1
    with open(f"{ckpt}/{manifest.MANIFEST_NAME}", "w") as f:
        json.dump(old, f)
    _flip(f"{ckpt}/{name}", 0, damage)
    with pytest.raises(CheckpointDamagedError, match=f"checkpoint-8 is damaged: {name}: cannot be read"):
        _train(out, resume_from=ckpt)
    assert os.path.exists(f"{ckpt}/{name}")


def test_sharded_checkpoint_shards_are_checksummed_and_verified(tmp_path):
    """FSDP (sharded DCP files, written by DCP itself and read back once by the rank that wrote them)."""
    import glob

    from raytrainer import Trainer
    from tests.blocks_model import TinyBlocks, blocks_args

    out = str(tmp_path / "run")
    args = blocks_args(out, num_workers=0, strategy="fsdp", save_strategy="steps", save_steps=3)
    Trainer(model=TinyBlocks(), args=args, train_dataset=TokenData(24)).train()
    ckpt = f"{out}/checkpoint-6"
    committed = manifest.read_manifest(ckpt)
    shards = [n for n in committed["files"] if n.endswith(".distcp") or n.endswith(".metadata")]
    assert shards and set(committed["checksums"]) == set(committed["files"])
    _flip(glob.glob(f"{ckpt}/pytorch_model_fsdp_0/*.distcp")[0], -64, b"\x00\x01" * 8)
    with pytest.raises(CheckpointDamagedError, match=r"checkpoint-6 is damaged: pytorch_model_fsdp_0/__0_0\.distcp"):
        Trainer(model=TinyBlocks(), args=args, train_dataset=TokenData(24)).train(resume_from_checkpoint=ckpt)
