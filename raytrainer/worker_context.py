"""Where this worker sits in the run: rank, world size, device, and the few collectives the loop needs.

Under Ray Train the torch process group is already set up (gloo on CPU, NCCL on GPU). In the driver
process (`num_workers=0`) there is no process group and every collective is the identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List

import torch
import torch.distributed as dist


@dataclass
class WorkerContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    @classmethod
    def from_ray(cls) -> "WorkerContext":
        import ray.train
        import ray.train.torch

        ctx = ray.train.get_context()
        return cls(rank=ctx.get_world_rank(), world_size=ctx.get_world_size(), local_rank=ctx.get_local_rank(),
                   device=ray.train.torch.get_device())

    @classmethod
    def in_process(cls, use_gpu: bool) -> "WorkerContext":
        device = torch.device("cuda", 0) if use_gpu and torch.cuda.is_available() else torch.device("cpu")
        return cls(device=device)

    # ---- collectives (identity without a process group) ----
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def start_all_reduce_sum(self, tensor: torch.Tensor):
        """Start summing `tensor` in place over ranks: a handle whose `wait()` completes it, or None when there is
        nothing to wait for."""
        if self.distributed:
            return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True)
        return None

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor

    def all_gather_object(self, obj: Any) -> List[Any]:
        if not self.distributed:
            return [obj]
        out: List[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def barrier(self):
        if self.distributed:
            dist.barrier()
