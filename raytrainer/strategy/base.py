"""How a model is placed and wrapped for data parallelism. One small class per strategy.

The loop calls the same methods whatever the strategy (autocast, backward, no_sync, clip_grad_norm,
optimizer_step, host_state_dict); a strategy changes what they do, never the loop's shape.
"""

from __future__ import annotations

import contextlib
from typing import Dict, List, Optional

import torch
from torch import nn

from ..worker_context import WorkerContext
from .precision import Precision
from .prepare import prepare


class Strategy:
    """Single device: no wrapping, no gradient synchronisation."""

    name = "single"
    # Whether checkpoints hold per-rank shards (torch.distributed.checkpoint) instead of one full copy.
    shards_state = False
    # Every rank's model was unpickled from one copy (Trainer(model=...), not model_init): the weights are the
    # same everywhere before any collective, so DDP need not broadcast them at start-up (set by the loop).
    same_weights_everywhere = False

    def __init__(self, ctx: WorkerContext, args=None):
        self.ctx = ctx
        self.args = args
        self.precision = Precision(args, ctx.device, autocast=self._uses_autocast())

    def _uses_autocast(self) -> bool:
        return True

    def setup(self, model: nn.Module) -> nn.Module:
        """Move the model to this worker's device, checkpoint/compile its blocks, wrap it; returns the model
        the loop calls."""
        model = model.to(self.ctx.device)
        return self.wrap(model, prepare(model, self.args))

    def wrap(self, model: nn.Module, blocks: List[nn.Module]) -> nn.Module:
        return model

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    # ------------------------------------------------------------------ one optimizer step
    def autocast(self):
        """Context for the forward pass and the loss (mixed precision)."""
        return self.precision.autocast()

    def backward(self, loss: torch.Tensor):
        self.precision.backward(loss)

    def no_sync(self, model: nn.Module):
        """Context for micro-steps that only accumulate gradients (no all-reduce)."""
        return contextlib.nullcontext()

    def clip_grad_norm(self, model: nn.Module, max_norm: float, optimizer=None) -> torch.Tensor:
        self.precision.unscale(optimizer)
        params = [p for p in model.parameters() if p.grad is not None]
        return torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))

    def optimizer_step(self, optimizer):
        self.precision.step(optimizer)

    # ------------------------------------------------------------------ state
    def model_state_dict(self, model: nn.Module) -> dict:
        """The full (unsharded) state dict, as the checkpoint and the driver see it."""
        return self.unwrap(model).state_dict()

    def host_state_dict(self, model: nn.Module) -> Optional[Dict[str, torch.Tensor]]:
        """The full state dict copied to host memory, on rank 0 (other ranks may get None). Every rank must
        call it: a sharded strategy gathers here."""
        if not self.ctx.is_main:  # every rank holds the same weights: only rank 0's travel
            return None
        # No copy when already on the CPU: the caller copies once (into the driver's model or the object store).
        return {k: v.detach().to("cpu") for k, v in self.model_state_dict(model).items()}
