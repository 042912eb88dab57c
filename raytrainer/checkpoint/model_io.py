"""Model weights on disk: the model's own `save_pretrained` format when it has one, else model.safetensors.

Both are read back by `load_model_state` (single file or HF's sharded index), from any fsspec URL; from a
checkpoint, each file is checked against the manifest's size and checksum as it is read. A PEFT model's
`save_pretrained` writes its adapters only: `load_checkpoint_weights` loads those into it (peft_io.py).
"""

from __future__ import annotations

import json
import os
from typing import Dict, Optional

import safetensors.torch
import torch

from ..storage import exists, join, read_bytes
from . import peft_io
from .damage import check_bytes, parsing
from .snapshot import MODEL_FILE, MODEL_INDEX_FILE


def save_model_files(model, directory: str, state_dict: Optional[Dict[str, torch.Tensor]] = None):
    """Write `model` (or `state_dict`) into a local directory."""
    os.makedirs(directory, exist_ok=True)
    state_dict = model.state_dict() if state_dict is None else state_dict
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(directory, state_dict=state_dict)
        return
    # safetensors refuses tensors that share memory (tied weights): give each its own contiguous copy.
    seen, tensors = set(), {}
    for name, tensor in state_dict.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        tensors[name] = tensor.contiguous() if key not in seen else tensor.clone().contiguous()
        seen.add(key)
    safetensors.torch.save_file(tensors, os.path.join(directory, MODEL_FILE), metadata={"format": "pt"})


def load_checkpoint_weights(model: torch.nn.Module, url: str, storage_options: Optional[dict] = None,
                            manifest: Optional[dict] = None):
    """Load checkpoint `url`'s weights into `model` (unwrapped): the whole model, or, where the checkpoint holds
    no full weights and the model is a PEFT model, its adapters (as transformers' `_load_from_checkpoint`)."""
    full = exists(join(url, MODEL_FILE), storage_options) or exists(join(url, MODEL_INDEX_FILE), storage_options)
    if not full and peft_io.is_peft_model(model):
        peft_io.load_adapters(model, url, _reader(url, storage_options, manifest))
        return
    if not full and exists(join(url, peft_io.ADAPTER_FILE), storage_options):
        raise RuntimeError(f"Checkpoint {url} holds a PEFT adapter ({peft_io.ADAPTER_FILE}), not a whole model, but "
                           f"the model ({type(model).__name__}) is not a PEFT model: build it as the run that wrote "
                           f"the checkpoint did (peft.get_peft_model(model, config)).")
    load_into(model, load_model_state(url, storage_options, manifest))


def _reader(url: str, storage_options: Optional[dict], manifest: Optional[dict]):
    """read(name): a file of directory `url`, checked against the checkpoint's manifest when there is one."""

    def read(name: str) -> bytes:
        data = read_bytes(join(url, name), storage_options)
        check_bytes(url, name, data, manifest)
        return data

    return read


def load_model_state(url: str, storage_options: Optional[dict] = None,
                     manifest: Optional[dict] = None) -> Dict[str, torch.Tensor]:
    """The model's state dict from a checkpoint or saved-model directory (local path or URL). With the
    checkpoint's `manifest`, every file is verified; a file that cannot be parsed is named either way."""
    read = _reader(url, storage_options, manifest)
    if exists(join(url, MODEL_INDEX_FILE), storage_options):
        with parsing(url, MODEL_INDEX_FILE):
            shards = sorted(set(json.loads(read(MODEL_INDEX_FILE))["weight_map"].values()))
        state = {}
        for shard in shards:
            data = read(shard)
            with parsing(url, shard):
                state.update(safetensors.torch.load(data))
        return state
    data = read(MODEL_FILE)
    with parsing(url, MODEL_FILE):
        return safetensors.torch.load(data)


def load_into(model: torch.nn.Module, state: Dict[str, torch.Tensor]):
    """Load weights, tolerating keys that save_pretrained drops for tied weights."""
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shapes differ: another model, or another configuration of it
        raise RuntimeError(f"Checkpoint does not match the model ({type(model).__name__}): {exc}") from exc
    tied = _tied_names(model)
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise RuntimeError(f"Checkpoint does not match the model: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}.")
    if hasattr(model, "tie_weights"):
        model.tie_weights()


def _tied_names(model: torch.nn.Module) -> set:
    """Parameter names whose storage is shared with an earlier parameter."""
    seen, tied = {}, set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen:
            tied.add(name)
        else:
            seen[ptr] = name
    return tied
