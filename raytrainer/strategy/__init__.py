"""Parallelism strategies: how the model is wrapped on each worker."""

from .base import Strategy
from .ddp import DDPStrategy
from .fsdp import FSDPStrategy

__all__ = ["Strategy", "DDPStrategy", "FSDPStrategy", "make_strategy"]


def make_strategy(args, ctx) -> Strategy:
    if args.strategy == "fsdp":  # also on one process: its checkpoints stay sharded (resumable anywhere)
        return FSDPStrategy(ctx, args)
    # One process has nothing to synchronise: skip DDP's wrapper and its bucketing cost.
    if not ctx.distributed:
        return Strategy(ctx, args)
    return {"ddp": DDPStrategy}[args.strategy](ctx, args)
