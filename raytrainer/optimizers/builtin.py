"""The built-in optimizers (torch's AdamW and SGD, transformers' Adafactor, the schedule-free ones), built the way
HF's `Trainer` builds them; and what every optimizer shares: the parameter groups (with and without weight
decay) and `optim_args` parsing.

`NAMES` lists the built-in `optim` names; `registry.py` adds those of the optimizers in their own packages and
decides which module checks and builds a name.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import warnings
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import ConfigError, missing_package

if TYPE_CHECKING:  # for annotations only: TrainingArguments checks its optimizer with this module
    from ..arguments.training_args import TrainingArguments

# The built-in `optim` names. The schedule-free classes are schedulefree's, imported only when one is built.
SCHEDULE_FREE_CLASSES = {"schedule_free_adamw": "AdamWScheduleFree", "schedule_free_sgd": "SGDScheduleFree",
                         "schedule_free_radam": "RAdamScheduleFree"}
SCHEDULE_FREE = tuple(SCHEDULE_FREE_CLASSES)
NAMES = ("adamw_torch", "adamw_torch_fused", "sgd", "adafactor", *SCHEDULE_FREE)

# HF's rule (Trainer.get_decay_parameter_names): no weight decay on biases and normalisation weights.
NO_DECAY_MODULES = (nn.LayerNorm, nn.RMSNorm)
NO_DECAY_PATTERNS = tuple(re.compile(p) for p in (
    r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"))


def get_decay_parameter_names(model: nn.Module) -> list[str]:
    """Names (as in `model.named_parameters()`) of the parameters that get weight decay."""
    excluded = set()
    # remove_duplicate=False: a norm module or parameter shared under two names is excluded under both.
    for prefix, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, NO_DECAY_MODULES):
            excluded.update(n for n, _ in module.named_parameters(prefix=prefix, remove_duplicate=False))
    return [name for name, _ in model.named_parameters()
            if name not in excluded and not any(p.search(name.lower()) for p in NO_DECAY_PATTERNS)]


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """The trainable parameters in HF's two groups: with `weight_decay`, and without (biases, norms)."""
    decay = set(get_decay_parameter_names(model))
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        raise ConfigError("the model has no parameters with requires_grad=True: nothing to train.")
    # Both groups always exist (even empty) so that an optimizer state_dict always has the same layout.
    return [
        {"params": [p for n, p in trainable if n in decay], "weight_decay": weight_decay},
        {"params": [p for n, p in trainable if n not in decay], "weight_decay": 0.0},
    ]


def _fused_adamw_unsupported(params: list[torch.Tensor]) -> str | None:
    """Why fused AdamW cannot run on these params, or None if it can.

    torch checks device and dtype lazily, in the first `step()`; one step on a 1-element probe per
    (device, dtype) finds out now, with public API only.
    """
    for device, dtype in {(p.device, p.dtype) for p in params}:
        try:
            probe = torch.zeros(1, device=device, dtype=dtype, requires_grad=True)
            probe.grad = torch.zeros_like(probe)
            torch.optim.AdamW([probe], lr=0.0, fused=True).step()
        except RuntimeError as e:
            return f"{device.type}/{dtype}: {e}"
    return None


# ---------------------------------------------------------------------- optimizer classes and their options
# Set from TrainingArguments' own fields; optim_args may not override them (one place for each value).
_FROM_ARGS = {"lr": "learning_rate", "betas": "adam_beta1/adam_beta2", "eps": "adam_epsilon",
              "weight_decay": "weight_decay", "warmup_steps": "warmup_steps", "fused": "optim='adamw_torch_fused'"}


def _set_from_args(optim: str) -> set:
    """The optimizer arguments `create` sets from TrainingArguments' fields, for this optimizer."""
    keys = {"lr", "weight_decay"}
    if optim.startswith("adamw") or optim in ("schedule_free_adamw", "schedule_free_radam"):
        keys |= {"betas", "eps"}
    if optim == "adamw_torch_fused":
        keys.add("fused")
    if optim in ("schedule_free_adamw", "schedule_free_sgd"):
        keys.add("warmup_steps")
    return keys


def is_schedule_free(optim: str) -> bool:
    return optim in SCHEDULE_FREE


def optimizer_class(optim: str) -> type:
    """The optimizer class behind an `optim` name; schedulefree is imported only when asked for."""
    if optim in ("adamw_torch", "adamw_torch_fused"):
        return torch.optim.AdamW
    if optim == "sgd":
        return torch.optim.SGD
    if optim == "adafactor":
        return _adafactor_class()
    if optim in SCHEDULE_FREE:
        try:
            import schedulefree
        except ImportError:
            raise _schedulefree_missing(optim) from None
        return getattr(schedulefree, SCHEDULE_FREE_CLASSES[optim])
    raise ConfigError(f"optim={optim!r} is not supported.")  # TrainingArguments already rejects this


def _adafactor_class() -> type:
    """transformers' `Adafactor` (what `optim="adafactor"` means there; a different algorithm from torch's:
    the numbers differ from the second step on); torch's, with a warning, where transformers is missing."""
    try:
        from transformers.optimization import Adafactor
    except ImportError:
        warnings.warn("optim='adafactor' means transformers' Adafactor, and transformers is not installed: "
                      'using torch.optim.Adafactor, whose steps differ (pip install "raytrainer[hf]").',
                      stacklevel=3)
        return torch.optim.Adafactor
    return Adafactor


def _schedulefree_missing(optim: str) -> ConfigError:
    return missing_package("schedulefree", "schedulefree", f"optim={optim!r}")


def parse_optim_args(text: str | None) -> dict[str, str]:
    """HF's format: 'key=value,key=value' (spaces ignored) -> {key: value}, values still strings."""
    if not text:
        return {}
    out = {}
    for item in text.replace(" ", "").split(","):
        key, sep, value = item.partition("=")
        if not sep or not key or "=" in value:
            raise ConfigError(f"optim_args={text!r}: {item!r} is not 'key=value'; write e.g. "
                              "'momentum=0.9,nesterov=True'.")
        out[key] = value
    return out


def convert_optim_arg(optim: str, key: str, value: str, default):
    """A string from optim_args as the type of the optimizer's default for that argument; a tuple default takes
    ':'-separated items (`eps=None:1e-3`)."""
    if isinstance(default, tuple):
        items = value.split(":")
        if len(items) != len(default):
            raise ConfigError(f"optim_args: {key}={value!r} for optim={optim!r} needs {len(default)} values "
                              f"separated by ':' (default: {':'.join(map(str, default))}).")
        return tuple(None if item == "None" else convert_optim_arg(optim, key, item, d)
                     for item, d in zip(items, default))
    lowered = value.lower()
    if isinstance(default, bool) or (default is None and lowered in ("true", "false")):
        if lowered not in ("true", "false", "1", "0", "yes", "no"):
            raise ConfigError(f"optim_args: {key}={value!r} for optim={optim!r} must be true or false.")
        return lowered in ("true", "1", "yes")
    for kind in ((int, float) if isinstance(default, int) or default is None else (float,)):
        try:
            return kind(value)
        except ValueError:
            pass
    if isinstance(default, (int, float)):
        raise ConfigError(f"optim_args: {key}={value!r} for optim={optim!r} must be a number.")
    return value


def optim_kwargs(args: TrainingArguments, cls: type | None = None) -> dict:
    """`args.optim_args` as keyword arguments of the optimizer, each checked against its signature."""
    given = parse_optim_args(args.optim_args)
    if not given:
        return {}
    cls = cls or optimizer_class(args.optim)
    params = inspect.signature(cls.__init__).parameters
    from_args = _set_from_args(args.optim)
    accepted = [n for n, p in params.items() if n not in ("self", "params") and n not in from_args
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    out = {}
    for key, value in given.items():
        if key in from_args:
            raise ConfigError(f"optim_args sets {key!r}, which comes from TrainingArguments: set "
                              f"{_FROM_ARGS[key]} instead.")
        if key not in accepted:
            raise ConfigError(f"optim_args: {key!r} is not an argument of {cls.__name__} (optim={args.optim!r}); "
                              f"accepted: {', '.join(accepted)}.")
        out[key] = convert_optim_arg(args.optim, key, value, params[key].default)
    return out


def check(args: TrainingArguments) -> None:
    """At TrainingArguments construction (`registry.check_optimizer`): the optimizer's package is installed and
    optim_args fit it."""
    if is_schedule_free(args.optim):
        if importlib.util.find_spec("schedulefree") is None:
            raise _schedulefree_missing(args.optim)
        if args.lr_scheduler_type != "constant":
            # HF builds both without a word; the decay then runs on top of schedule-free averaging, and a
            # scheduler warm-up multiplies the optimizer's own.
            warnings.warn(f"optim={args.optim!r} needs no learning-rate schedule and does its own warm-up "
                          f"(warmup_steps); lr_scheduler_type={args.lr_scheduler_type!r} is applied on top. "
                          "Set lr_scheduler_type='constant' as the schedulefree authors recommend.", stacklevel=5)
    optim_kwargs(args)


def create(model: nn.Module, args: TrainingArguments) -> torch.optim.Optimizer:
    """The built-in optimizer named by args.optim (`registry.create_optimizer` builds every name)."""
    groups = param_groups(model, args.weight_decay)
    cls, kwargs = cls_and_kwargs(args, [p for g in groups for p in g["params"]])
    optimizer = cls(groups, **kwargs)
    if is_schedule_free(args.optim):
        optimizer.train()  # it refuses to step in eval mode, which is where it starts
    return optimizer


def cls_and_kwargs(args: TrainingArguments, params: list | None = None) -> tuple:
    """The class and keyword arguments of the built-in optimizer args.optim names (transformers'
    `get_optimizer_cls_and_kwargs`); `params`, the parameters it will get when known, decide whether fused AdamW
    can run on them."""
    lr = args.learning_rate
    cls = optimizer_class(args.optim)
    extra = optim_kwargs(args, cls)
    adam = {"betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}
    if args.optim in ("adamw_torch", "adamw_torch_fused"):
        kwargs = {"lr": lr, **adam, **extra}
        if args.optim == "adamw_torch_fused":
            reason = _fused_adamw_unsupported(params) if params is not None else None
            if reason is None:
                kwargs["fused"] = True
            else:
                warnings.warn(f"optim='adamw_torch_fused' is not supported for these parameters ({reason}); "
                              "using the non-fused torch.optim.AdamW instead.", stacklevel=4)
        return cls, kwargs
    if args.optim == "adafactor" and cls is not torch.optim.Adafactor:
        # transformers' Adafactor with its Trainer's settings: the learning rate is the schedule's.
        return cls, {"lr": lr, **{"scale_parameter": False, "relative_step": False, **extra}}
    if args.optim in ("sgd", "adafactor"):
        return cls, {"lr": lr, **extra}
    # Schedule-free, with HF's arguments: Adam's betas/eps (not for SGD), warm-up inside the optimizer (not
    # for RAdam, which needs none). A warm-up ratio is resolved in schedules.create_scheduler, once the length is known.
    kwargs = {"lr": lr, **({} if args.optim == "schedule_free_sgd" else adam), **extra}
    if args.optim != "schedule_free_radam":
        kwargs["warmup_steps"] = 0 if 0 < args.warmup_steps < 1 else int(args.warmup_steps)
    return cls, kwargs


def optimizer_train_mode(optimizer) -> None:
    """Before training steps: a schedule-free optimizer moves the weights to its training point (y).
    A no-op for other optimizers (and when already in train mode)."""
    if callable(getattr(optimizer, "train", None)):
        optimizer.train()


def optimizer_eval_mode(optimizer) -> None:
    """Before evaluation, saving and returning the final model: a schedule-free optimizer moves the weights to
    their averaged point (x), the one to evaluate and keep. A no-op for other optimizers."""
    if callable(getattr(optimizer, "eval", None)):
        optimizer.eval()
