"""FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters, gradients and optimizer state sharded over all
ranks; each block is one unit (all-gathered for its forward/backward, resharded after), then the root.

Works with gloo on CPU and NCCL on GPU. Without a process group (num_workers=0) the model stays whole, but
checkpoints keep the sharded (DCP) format, so they resume at any world size.
"""

from __future__ import annotations

import contextlib
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from .base import Strategy
from .precision import compute_dtype


class FSDPStrategy(Strategy):
    name = "fsdp"
    shards_state = True

    @property
    def sharded(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def _uses_autocast(self) -> bool:
        return not self.sharded  # FSDP's MixedPrecisionPolicy casts the parameters instead

    def wrap(self, model: nn.Module, blocks: List[nn.Module]) -> nn.Module:
        if not self.sharded:
            return model
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        config = self.args.fsdp_config or {}
        dtype = compute_dtype(self.args)
        # Compute in bf16/fp16, but reduce gradients in fp32: summing many low-precision shards loses bits.
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else MixedPrecisionPolicy()
        # Offloading moves shards to pinned host memory between uses; on a CPU device they already live there
        # (and pinning needs an accelerator), so there it changes nothing and is skipped.
        offload = CPUOffloadPolicy() if config.get("cpu_offload") and self.ctx.device.type != "cpu" \
            else OffloadPolicy()
        options = dict(mp_policy=mp, offload_policy=offload,
                       reshard_after_forward=config.get("reshard_after_forward", True))
        for block in blocks:  # innermost first
            fully_shard(block, **options)
        # The root keeps what no block holds (embeddings, head); it is used right after the last block's
        # backward, so resharding it after forward would only add an all-gather.
        fully_shard(model, **{**options, "reshard_after_forward": False})
        return model

    def no_sync(self, model: nn.Module):
        if not self.sharded:
            return contextlib.nullcontext()
        return _gradient_sync_off(model)

    def clip_grad_norm(self, model: nn.Module, max_norm: float, optimizer=None) -> torch.Tensor:
        # Gradients are DTensor shards: clip_grad_norm_ computes each shard's norm and reduces them over the
        # mesh, so the total is the norm of the whole gradient, as on one device.
        norm = super().clip_grad_norm(model, max_norm, optimizer)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def model_state_dict(self, model: nn.Module) -> dict:
        if not self.sharded:
            return super().model_state_dict(model)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def host_state_dict(self, model: nn.Module) -> Optional[Dict[str, torch.Tensor]]:
        if not self.sharded:
            return super().host_state_dict(model)
        # Gathered one parameter at a time into rank 0's CPU memory: one full copy, on rank 0 only.
        state = self.model_state_dict(model)
        return state if self.ctx.is_main else None


@contextlib.contextmanager
def _gradient_sync_off(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
