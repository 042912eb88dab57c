"""DistributedDataParallel: every rank holds the whole model; gradients are averaged by all-reduce."""

from __future__ import annotations

from typing import List

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .base import Strategy


class _DDP(DistributedDataParallel):
    """DDP that answers for its module: hooks written for one process use `model.config`, `model.dtype`,
    ... on the model they are given, which here is the wrapper. (`model.device` DDP sets itself.)"""

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


class DDPStrategy(Strategy):
    name = "ddp"

    def wrap(self, model: nn.Module, blocks: List[nn.Module]) -> nn.Module:
        device_ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
        return _DDP(model, device_ids=device_ids)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    def no_sync(self, model: nn.Module):
        return model.no_sync()
