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


def ddp_options(args) -> dict:
    """transformers' ddp_* arguments that are set, as DistributedDataParallel's keyword arguments. Unset (None)
    ones keep torch's defaults, find_unused_parameters=False included."""
    names = {"ddp_find_unused_parameters": "find_unused_parameters", "ddp_bucket_cap_mb": "bucket_cap_mb",
             "ddp_broadcast_buffers": "broadcast_buffers", "ddp_static_graph": "static_graph"}
    return {kw: getattr(args, name) for name, kw in names.items() if getattr(args, name, None) is not None}


class DDPStrategy(Strategy):
    name = "ddp"

    def wrap(self, model: nn.Module, blocks: List[nn.Module]) -> nn.Module:
        device_ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
        # init_sync=False: no check of shapes and no broadcast of rank 0's weights when every rank already holds
        # the same ones (seconds of a large model's start-up; model_init keeps them: its ranks build their own).
        return _DDP(model, device_ids=device_ids, init_sync=not self.same_weights_everywhere,
                    **ddp_options(self.args))

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    def no_sync(self, model: nn.Module):
        return model.no_sync()
