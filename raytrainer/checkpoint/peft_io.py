"""PEFT adapters (LoRA, IA3, LoHa, ...) read back from a checkpoint.

A PEFT model's `save_pretrained` writes only its adapters, as transformers' Trainer's checkpoints hold them:
`adapter_model.safetensors` and `adapter_config.json` at the top for the adapter named "default", each other
adapter in a folder of its name. The base model's weights are not in the checkpoint: they are the ones the model
was built with, and PEFT keeps them frozen. Loading means what transformers' `_load_from_checkpoint` means
(peft's `load_adapter` on each adapter the model has): `set_peft_model_state_dict`, which puts the adapter name
back into the keys. Unlike `load_adapter`, which only warns, an adapter weight the checkpoint lacks or a key the
model lacks is an error: a resume that left an adapter at its initial values would not be exact (principle 3).

peft is imported only when a model is one of its models, which it cannot be without peft imported.
"""

from __future__ import annotations

import sys
from typing import Callable, Dict

import safetensors.torch
import torch

from .damage import parsing

ADAPTER_FILE = "adapter_model.safetensors"
DEFAULT_ADAPTER = "default"  # peft's name for the adapter saved at the top of the directory


def is_peft_model(model: torch.nn.Module) -> bool:
    """A peft `PeftModel`: what `get_peft_model` returns (transformers' Trainer asks the same question)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def adapter_files(model: torch.nn.Module) -> Dict[str, str]:
    """{adapter name: its weights file, relative to the checkpoint}, as the model's `save_pretrained` lays
    them out."""
    return {name: ADAPTER_FILE if name == DEFAULT_ADAPTER else f"{name}/{ADAPTER_FILE}" for name in model.peft_config}


def load_adapters(model: torch.nn.Module, url: str, read: Callable[[str], bytes]):
    """Load every adapter of `model` (unwrapped) from checkpoint `url`; `read(name)` returns a file's bytes,
    verified against the checkpoint's manifest."""
    from peft import set_peft_model_state_dict

    for adapter, name in adapter_files(model).items():
        data = read(name)
        with parsing(url, name):
            state = safetensors.torch.load(data)
        result = set_peft_model_state_dict(model, state, adapter_name=adapter)
        missing = [key for key in result.missing_keys if _belongs_to(model, key, adapter)]
        if missing or result.unexpected_keys:
            raise RuntimeError(f"Checkpoint {url} does not match adapter {adapter!r} of the model "
                               f"({model.peft_config[adapter].peft_type}): missing {missing[:5]}, unexpected "
                               f"{result.unexpected_keys[:5]}. Build the model with the PEFT config the run that "
                               f"wrote it used ({name.replace(ADAPTER_FILE, 'adapter_config.json')}).")


def _belongs_to(model: torch.nn.Module, key: str, adapter: str) -> bool:
    """Whether `key` of the model's state dict is a weight of `adapter` (the base model's weights are missing
    from every adapter checkpoint, by design). peft's `load_adapter` tells them apart the same way: the tuner's
    parameter prefix (`lora_`, `ia3_`, `hada_`, ...) and the adapter's name."""
    from peft.mapping import PEFT_TYPE_TO_PREFIX_MAPPING

    prefix = PEFT_TYPE_TO_PREFIX_MAPPING.get(model.peft_config[adapter].peft_type, "")
    return prefix in key and f".{adapter}." in f"{key}."
