"""What is applied to the model before a strategy wraps it: activation checkpointing and torch.compile.

Both work on the blocks (blocks.py) so that FSDP then wraps the same units: a recomputed block is also a
sharding unit, and compiling per block keeps FSDP's hooks outside the compiled regions (torchtitan's order:
checkpointing, compile, then fully_shard).
"""

from __future__ import annotations

import functools
from typing import List

from torch import nn

from .blocks import check_wrap_classes, find_blocks


def apply_activation_checkpointing(model: nn.Module, blocks: List[nn.Module], kwargs: dict) -> List[nn.Module]:
    """Recompute each block's activations in backward instead of keeping them. Returns the blocks as they now
    are (plain torch models get each block replaced by a checkpoint wrapper; state-dict names do not change,
    the wrapper strips its prefix)."""
    if hasattr(model, "gradient_checkpointing_enable") and getattr(model, "supports_gradient_checkpointing", True):
        # transformers models checkpoint inside their own layers, with HF's kwargs (use_reentrant, ...).
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(kwargs) or None)
        return blocks
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )
    kwargs = dict(kwargs)
    reentrant = kwargs.pop("use_reentrant", False)
    impl = CheckpointImpl.REENTRANT if reentrant else CheckpointImpl.NO_REENTRANT
    targets = {id(b) for b in blocks}
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=functools.partial(
        checkpoint_wrapper, checkpoint_impl=impl, **kwargs), check_fn=lambda m: id(m) in targets)
    wrapped = {id(m._checkpoint_wrapped_module): m for m in model.modules()
               if hasattr(m, "_checkpoint_wrapped_module")}
    return [wrapped.get(id(b), b) for b in blocks]


def compile_blocks(model: nn.Module, blocks: List[nn.Module], backend: str, mode):
    """torch.compile each block in place (`Module.compile`, so parameter names keep no `_orig_mod.`); a model
    without blocks is compiled whole."""
    for module in blocks or [model]:
        module.compile(backend=backend, mode=mode)


def prepare(model: nn.Module, args) -> List[nn.Module]:
    """Apply what `args` asks for; returns the blocks (the units a sharding strategy wraps)."""
    config = getattr(args, "fsdp_config", None) or {}
    check_wrap_classes(model, config.get("transformer_layer_cls_to_wrap"))  # model_init: not seen on the driver
    blocks = find_blocks(model, config.get("transformer_layer_cls_to_wrap"))
    if args is None:
        return blocks
    if getattr(model, "config", None) is not None and hasattr(args, "use_cache"):
        model.config.use_cache = args.use_cache  # transformers sets it on the model it trains (default False)
    if args.gradient_checkpointing or config.get("activation_checkpointing"):
        blocks = apply_activation_checkpointing(model, blocks, args.gradient_checkpointing_kwargs or {})
    if args.torch_compile:
        compile_blocks(model, blocks, args.torch_compile_backend or "inductor", args.torch_compile_mode)
    return blocks
