"""PEFT models read back from a checkpoint (issue 31): the checkpoint holds the adapters only, as the model's
save_pretrained writes them; loading puts them into a freshly built PEFT model, verified against the manifest,
for LoRA, IA3 and LoHa, and for a model with two adapters. No Ray: the loading logic on local files."""

from __future__ import annotations

import pytest
import torch

from raytrainer import storage
from raytrainer.checkpoint import manifest
from raytrainer.checkpoint.damage import CheckpointDamagedError
from raytrainer.checkpoint.model_io import load_checkpoint_weights, save_model_files
from tests.hf_models import tiny_model
from tests.models import assert_same_weights, weights

peft = pytest.importorskip("peft")

CONFIGS = {
    "lora": lambda: peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "ia3": lambda: peft.IA3Config(target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"]),
    "loha": lambda: peft.LoHaConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
}


def peft_model(kind: str, trained_seed=None, **config):
    """A tiny Llama (the same base weights every time) with adapter `kind`; `trained_seed`: its adapter weights
    moved off their initial values (LoRA's B starts at zero, IA3's vectors at one), as training would."""
    config = CONFIGS[kind]() if not config else type(CONFIGS[kind]())(**config)
    model = peft.get_peft_model(tiny_model("llama"), config)
    if trained_seed is not None:
        train(model, trained_seed)
    return model


def train(model, seed: int):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=generator))


def checkpoint(model, tmp_path) -> tuple:
    """`model` saved as the checkpoint writer saves it, then committed: (url, manifest)."""
    url = str(tmp_path / "checkpoint-3")
    save_model_files(model, url)
    return url, manifest.commit(url, 3)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_an_adapter_only_checkpoint_loads_into_a_fresh_peft_model(kind, tmp_path):
    saved = peft_model(kind, trained_seed=1)
    url, committed = checkpoint(saved, tmp_path)
    # As transformers writes it: the adapter and its config, no base weights.
    assert {"adapter_model.safetensors", "adapter_config.json"} <= set(committed["files"])
    assert not any(name.startswith("model") for name in committed["files"])
    fresh = peft_model(kind)
    assert weights(fresh).keys() == weights(saved).keys()
    load_checkpoint_weights(fresh, url, None, committed)
    assert_same_weights(weights(fresh), weights(saved), atol=0)
    assert [n for n, p in fresh.named_parameters() if p.requires_grad] == \
        [n for n, p in saved.named_parameters() if p.requires_grad]  # still trainable: the optimizer's tensors


def test_every_adapter_of_a_model_with_two_loads_from_its_folder(tmp_path):
    saved = peft_model("lora")
    saved.add_adapter("second", CONFIGS["lora"]())
    for adapter, seed in (("default", 1), ("second", 2)):
        saved.set_adapter(adapter)
        train(saved, seed)
    url, committed = checkpoint(saved, tmp_path)
    assert "second/adapter_model.safetensors" in committed["files"]  # peft's layout: one folder per other adapter
    fresh = peft_model("lora")
    fresh.add_adapter("second", CONFIGS["lora"]())
    load_checkpoint_weights(fresh, url, None, committed)
    assert_same_weights(weights(fresh), weights(saved), atol=0)


def test_a_changed_adapter_file_is_refused_naming_it(tmp_path):
    url, committed = checkpoint(peft_model("lora", trained_seed=1), tmp_path)
    path = storage.join(url, "adapter_model.safetensors")
    data = bytearray(storage.read_bytes(path))
    data[-16:] = b"\xff" * 16  # same size: only the checksum tells
    storage.write_bytes(path, bytes(data))
    with pytest.raises(CheckpointDamagedError, match=r"checkpoint-3 is damaged: adapter_model\.safetensors"):
        load_checkpoint_weights(peft_model("lora"), url, None, committed)


def test_a_model_built_with_other_adapter_targets_is_refused(tmp_path):
    url, committed = checkpoint(peft_model("lora", trained_seed=1), tmp_path)
    other = peft_model("lora", r=4, lora_alpha=8, target_modules=["q_proj", "k_proj"])
    expected = r"does not match adapter 'default'.*missing \[.*k_proj.*unexpected \[.*v_proj"
    with pytest.raises(RuntimeError, match=expected):
        load_checkpoint_weights(other, url, None, committed)


def test_a_model_that_is_not_a_peft_model_is_told_to_build_one(tmp_path):
    url, committed = checkpoint(peft_model("lora", trained_seed=1), tmp_path)
    with pytest.raises(RuntimeError, match=r"holds a PEFT adapter.*not a PEFT model.*get_peft_model"):
        load_checkpoint_weights(tiny_model("llama"), url, None, committed)
