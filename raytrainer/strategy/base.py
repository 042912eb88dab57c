"""How a model is placed and wrapped for data parallelism. One small class per strategy."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from ..worker.context import WorkerContext


class Strategy:
    """Single device: no wrapping, no gradient synchronisation."""

    name = "single"

    def __init__(self, ctx: WorkerContext):
        self.ctx = ctx

    def setup(self, model: nn.Module) -> nn.Module:
        """Move the model to this worker's device and wrap it; returns the model the loop calls."""
        return model.to(self.ctx.device)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    def no_sync(self, model: nn.Module):
        """Context for micro-steps that only accumulate gradients (no all-reduce)."""
        return contextlib.nullcontext()

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        params = [p for p in model.parameters() if p.grad is not None]
        return torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))

    def model_state_dict(self, model: nn.Module) -> dict:
        """The full (unsharded) state dict, as the checkpoint and the driver see it."""
        return self.unwrap(model).state_dict()
