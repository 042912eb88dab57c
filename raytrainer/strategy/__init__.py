"""Parallelism strategies: how the model is wrapped on each worker."""

from .base import Strategy
from .ddp import DDPStrategy

__all__ = ["Strategy", "DDPStrategy", "make_strategy"]


def make_strategy(name: str, ctx) -> Strategy:
    # One process has nothing to synchronise: skip DDP's wrapper and its bucketing cost.
    if not ctx.distributed:
        return Strategy(ctx)
    return {"ddp": DDPStrategy}[name](ctx)
