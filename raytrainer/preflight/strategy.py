"""Once the driver knows the workers' devices (the cluster's GPUs, or CUDA here for num_workers=0): what the
strategy, the precision, torch.compile and the optimizer need, and whether a resume's checkpoint fits this run."""

from __future__ import annotations

from typing import Optional

import torch

from .. import optimizers
from ..checkpoint.sharded import is_sharded, strategy_mismatch
from ..data.global_batch import accumulation_to_keep
from ..errors import ConfigError
from ..state import OWN_STATE_KEY
from ..strategy import liger
from ..strategy.blocks import check_wrap_classes


def check_strategy_and_precision(trainer, use_gpu: bool, resume_url: Optional[str],
                                 resume_state: Optional[dict] = None):
    """Precision, compilation, FSDP wrapping and a resume at another world size: checked here, where we know
    whether the workers get GPUs (`use_gpu`: the cluster's GPUs, or CUDA in this process for num_workers=0)."""
    args = trainer.args
    optimizers.check_run(trainer, use_gpu)  # 8-bit GaLore needs GPUs; GaLore's targets exist
    liger.check_run(trainer.args, use_gpu, trainer.model)  # Liger's kernels need GPUs and their package
    if args.fp16 and not use_gpu:
        raise ConfigError("fp16=True needs GPUs, but the workers run on CPU (use_gpu is off, the cluster has no "
                          "GPUs, or num_workers=0 without CUDA). Use bf16=True on CPU, or run on GPUs.")
    if args.bf16 and use_gpu and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"bf16=True, but this machine's GPU ({torch.cuda.get_device_name()}) has no bf16 support: "
                          "use fp16=True instead.")
    if args.torch_compile:
        from torch import _dynamo  # not `import torch._dynamo`: that makes `torch` local to this function

        backends = _dynamo.list_backends(exclude_tags=())
        if args.torch_compile_backend not in backends:
            raise ConfigError(f"torch_compile_backend={args.torch_compile_backend!r} is not a torch.compile backend "
                              f"here; choose one of {', '.join(sorted(backends))}.")
    if args.strategy == "fsdp" and trainer.model is not None:
        check_wrap_classes(trainer.model, (args.fsdp_config or {}).get("transformer_layer_cls_to_wrap"))
    if resume_url is not None:
        _check_resume(trainer, resume_url, resume_state or {})


def _check_resume(trainer, resume_url: str, state: dict):
    args = trainer.args
    if is_sharded(resume_url, args.storage_options) != (args.strategy == "fsdp"):
        raise ConfigError(strategy_mismatch(f"resume_from_checkpoint={resume_url!r}", args.strategy == "fsdp"))
    own = (state.get("stateful_callbacks") or {}).get(OWN_STATE_KEY)
    for world_size in range(max(args.min_workers, 1), max(args.max_workers, 1) + 1):  # every size it may take
        accumulation_to_keep(own, args, world_size)  # raises when the global batch cannot be kept
