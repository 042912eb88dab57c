"""Reading a checkpoint's model back (raytrainer/checkpoint/model_io.py): a manifest of the format before checksums
loads by size, and damage the size cannot show is named by the parse. Local disk and S3 (moto); the rest of
what a load verifies: tests/checkpoint/test_integrity.py."""

from __future__ import annotations

import json

import pytest
import torch

from raytrainer import storage
from raytrainer.checkpoint import manifest, resume
from raytrainer.checkpoint.damage import CheckpointDamagedError
from raytrainer.checkpoint.model_io import load_model_state
from tests.checkpoint.test_integrity import _overwrite, _save
from tests.models import make_model


def test_old_manifest_without_checksums_loads_by_size(store):
    url = _save(store, 4)
    old = manifest.read_manifest(url, store.options)
    old.pop("checksums")
    old["format"] = 1
    storage.write_text(storage.join(url, manifest.MANIFEST_NAME), json.dumps(old), store.options)
    assert resume.resolve(store.url, True, store.options) == url
    state = load_model_state(url, store.options, manifest.read_manifest(url, store.options))
    assert torch.equal(state["head.weight"], make_model(4).state_dict()["head.weight"])
    _overwrite(store, url, "model.safetensors", 0, b"\xff" * 8)  # undetectable by size: the parse names it
    with pytest.raises(CheckpointDamagedError, match=r"checkpoint-4 is damaged: model\.safetensors: cannot be read"):
        load_model_state(url, store.options, manifest.read_manifest(url, store.options))
