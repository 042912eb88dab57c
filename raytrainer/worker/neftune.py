"""NEFTune (Jain et al., 2023): uniform noise on the input embeddings while training, as Hugging Face adds it.

The noise is a forward hook on the embedding layer, active only in training mode, and removed when training
ends, so the embedding layer (and every checkpoint of it) is exactly what training made it.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


def input_embeddings(model: nn.Module) -> nn.Module:
    if hasattr(model, "get_input_embeddings"):
        return model.get_input_embeddings()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            return module
    raise ValueError(f"neftune_noise_alpha needs an embedding layer, and {type(model).__name__} has none "
                     "(no get_input_embeddings() and no nn.Embedding).")


def _add_noise(alpha: float):
    def hook(module, inputs, output):
        if module.training:
            dims = output.size(1) * output.size(2)
            magnitude = alpha / torch.sqrt(torch.tensor(float(dims)))
            output = output + torch.zeros_like(output).uniform_(-magnitude, magnitude)
        return output
    return hook


@contextlib.contextmanager
def neftune(model: nn.Module, alpha):
    if alpha is None:
        yield
        return
    handle = input_embeddings(model).register_forward_hook(_add_noise(float(alpha)))
    try:
        yield
    finally:
        handle.remove()
