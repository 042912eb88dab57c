"""Every `optim` name, once, and the module that checks and builds it: the built-in optimizers (`builtin.py`),
then those of their own packages (`packaged.py`). The rest of raytrainer calls these:

- `check_optimizer` when `TrainingArguments` is built (what the arguments alone decide);
- `check_run` in the Trainer's preflight, once it is known whether the workers get GPUs and which model they
  train;
- `create_optimizer` on each worker (and `check_optimizer_cls_and_kwargs` for a Trainer given a class).

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
    if args.optim not in packaged.SPECS or getattr(trainer, "optimizer_cls_and_kwargs", None) is not None:
        return
    packaged.check(args, warn=False)
    packaged.check_run(args, use_gpu, trainer.model)


def get_optimizer_cls_and_kwargs(args, model: torch.nn.Module | None = None) -> tuple:
    """transformers' `Trainer.get_optimizer_cls_and_kwargs`: the class and kwargs of the optimizer args.optim
    names, for a `create_optimizer` override that builds its own parameter groups. The built-in names only: those
    of their own packages (GaLore, LOMO, ...) are built from the model's modules, by `create_optimizer`."""
    if args.optim in packaged.SPECS:
        raise ConfigError(f"get_optimizer_cls_and_kwargs(): optim={args.optim!r} is built from the model's modules, "
                          "not from parameter groups: let create_optimizer build it (super().create_optimizer()), or "
                          f"use a built-in optim ({', '.join(builtin.NAMES)}).")
    params = None if model is None else [p for p in model.parameters() if p.requires_grad]
    return builtin.cls_and_kwargs(args, params)


def check_optimizer_cls_and_kwargs(given, optimizer) -> tuple | None:
    """transformers' `Trainer(optimizer_cls_and_kwargs=(cls, kwargs))`, checked on the driver: a class (or any
    callable taking parameter groups) and a dict, and not beside an optimizer instance (`optimizers=`)."""
    if given is None:
        return None
    if optimizer is not None:
        raise ConfigError("Trainer(optimizers=...) and Trainer(optimizer_cls_and_kwargs=...) both name the optimizer: "
                          "pass one of them.")
    if not (isinstance(given, (tuple, list)) and len(given) == 2 and callable(given[0])
            and isinstance(given[1], dict)):
        raise ConfigError(f"optimizer_cls_and_kwargs={given!r} must be (an optimizer class, a dict of its keyword "
                          "arguments), e.g. (torch.optim.SGD, {'lr': 0.1, 'momentum': 0.9}).")
    return given[0], dict(given[1])


def create_optimizer(model: torch.nn.Module, args, cls_and_kwargs: tuple | None = None) -> torch.optim.Optimizer:
    """The optimizer named by args.optim, as transformers' Trainer builds it for `model`; with `cls_and_kwargs`
    (`optimizer_cls_and_kwargs`), that class over the same two parameter groups (weight_decay, and none for biases
    and norms) with its kwargs as given: as in transformers, args.optim, optim_args and learning_rate are not read
    (the schedule scales the `lr` the kwargs give, or the class's default)."""
    if cls_and_kwargs is not None:
        cls, kwargs = cls_and_kwargs
        return cls(builtin.param_groups(model, args.weight_decay), **kwargs)
    if args.optim in packaged.SPECS:
        return packaged.create(model, args)
    return builtin.create(model, args)
