"""Every `optim` name, once, and the module that checks and builds it: the built-in optimizers (`builtin.py`),
then those of their own packages (`packaged.py`). The rest of raytrainer calls these:

- `check_optimizer` when `TrainingArguments` is built (what the arguments alone decide);
- `check_run` in the Trainer's preflight, once it is known whether the workers get GPUs and which model they
  train;
- `create_optimizer` on each worker.

`check_optimizer` also checks `use_liger_kernel` as far as the arguments decide (a CPU run is refused): Liger's
kernels are patched into the model by the strategy layer (`strategy/liger.py`, which also checks the run), but
the arguments are checked here, in the layer that `TrainingArguments` may import.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from . import builtin, packaged

OPTIMIZERS = builtin.NAMES + packaged.NAMES

LIGER_NEEDS_GPU = ("Liger's kernels are Triton kernels for CUDA GPUs; on CPUs they cannot run, and transformers' "
                   "own modules are what a CPU run uses")


def wants_liger(args) -> bool:
    return bool(getattr(args, "use_liger_kernel", False))


def check_liger_args(args):
    """What the arguments alone decide about Liger's kernels: the config's type, and workers surely without GPU."""
    if not wants_liger(args):
        return
    config = getattr(args, "liger_kernel_config", None)
    if config is not None and not isinstance(config, dict):
        raise ConfigError(f"liger_kernel_config={config!r} must be a dict of kernel names to booleans, e.g. "
                          "{'rope': True, 'cross_entropy': False} (or None for Liger's defaults).")
    if packaged.surely_without_gpu(args):
        raise ConfigError(f"use_liger_kernel=True, but this run's workers have no GPU (use_gpu={args.use_gpu}, "
                          f"num_workers={args.num_workers}): {LIGER_NEEDS_GPU}. Set use_liger_kernel=False, or "
                          "run on GPUs.")


def check_optimizer(args) -> None:
    """At TrainingArguments construction: the optimizer's package is installed, optim_args fit it, and the rules
    of its kind hold (with Liger's kernels, checked here too). Raises ConfigError naming the fix."""
    check_liger_args(args)
    if args.optim in packaged.SPECS:
        packaged.check(args)
    else:
        builtin.check(args)


def check_run(trainer, use_gpu: bool):
    """In the Trainer's preflight, with the workers' devices and the model known (Liger's kernels: see
    `strategy/liger.py`)."""
    args = trainer.args
    check_liger_args(args)  # the arguments may have been changed since they were built
    if args.optim not in packaged.SPECS:
        return
    packaged.check(args, warn=False)
    packaged.check_run(args, use_gpu, trainer.model)


def create_optimizer(model: torch.nn.Module, args) -> torch.optim.Optimizer:
    """The optimizer named by args.optim, as transformers' Trainer builds it for `model`."""
    if args.optim in packaged.SPECS:
        return packaged.create(model, args)
    return builtin.create(model, args)
