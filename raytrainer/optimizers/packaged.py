"""The optimizers that live in their own packages (GaLore, APOLLO, LOMO/AdaLomo, GrokAdamW, StableAdamW): each
one's package, pip extra, `optim_args` (with transformers' defaults) and the rules the driver checks before any
actor starts; and how each is built (`low_rank`, `lomo`, `grok`, optimi's StableAdamW).

Two places check: `check` when `TrainingArguments` is built (what the arguments alone decide: a missing
package, a layer-wise optimizer on several workers, ...), and `check_run` in the Trainer's preflight, once it is
known whether the workers get GPUs and which model they train (an 8-bit optimizer on CPUs, target modules that
match nothing). `registry.py` calls both.
"""

from __future__ import annotations

import importlib.util
import warnings
from dataclasses import dataclass, field, replace
from typing import Optional

import torch

from ..arguments.scaling import bounds, normalise_workers
from ..errors import ConfigError, missing_package as package_missing
from .builtin import convert_optim_arg, param_groups, parse_optim_args

GALORE_OPTIONS = {"rank": 128, "update_proj_gap": 200, "scale": 0.25, "proj_type": "std"}
APOLLO_OPTIONS = {"rank": 128, "proj": "random", "scale_type": "channel", "update_proj_gap": 200, "scale": 1.0,
                  "proj_type": "std"}
CHOICES = {"proj_type": ("std", "reverse_std", "right", "left", "full"), "proj": ("random", "svd"),
           "scale_type": ("channel", "tensor")}
EIGHT_BIT_NEEDS_CUDA = ("galore_torch's GaLoreAdamW8bit calls torch.cuda.synchronize() in every step, so it runs on "
                        "CUDA GPUs only")


@dataclass(frozen=True)
class Spec:
    modules: tuple  # what must import (the optimizer's package and what it imports)
    extra: str  # the pip extra of raytrainer that installs them
    options: dict = field(default_factory=dict)  # the optim_args accepted, with transformers' defaults
    low_rank: bool = False  # GaLore / APOLLO: needs optim_target_modules
    layerwise: bool = False  # one optimizer per parameter, stepped inside backward
    fused_backward: bool = False  # LOMO: the update happens inside backward
    needs_cuda: Optional[str] = None  # why it cannot run without a CUDA GPU
    # transformers builds GaLore, APOLLO and LOMO without args.weight_decay (GaLore 8-bit then keeps its own 1e-2)
    ignores_weight_decay: bool = False


_GALORE = ("galore_torch", "bitsandbytes")
_APOLLO = ("apollo_torch", "bitsandbytes")
SPECS = {
    "galore_adamw": Spec(_GALORE, "galore", GALORE_OPTIONS, low_rank=True, ignores_weight_decay=True),
    "galore_adamw_8bit": Spec(_GALORE, "galore", GALORE_OPTIONS, low_rank=True, needs_cuda=EIGHT_BIT_NEEDS_CUDA,
                              ignores_weight_decay=True),
    "galore_adafactor": Spec(_GALORE, "galore", GALORE_OPTIONS, low_rank=True, ignores_weight_decay=True),
    "apollo_adamw": Spec(_APOLLO, "apollo", APOLLO_OPTIONS, low_rank=True, ignores_weight_decay=True),
    "lomo": Spec(("lomo_optim",), "lomo", {"clip_grad_value": None}, fused_backward=True,
                 ignores_weight_decay=True),
    "adalomo": Spec(("lomo_optim",), "lomo", {"clip_grad_value": None, "loss_scale": 2**10, "eps": (1e-30, 1e-3),
                                              "clip_threshold": 1.0, "decay_rate": -0.8},
                    fused_backward=True, ignores_weight_decay=True),
    "grokadamw": Spec(("grokadamw",), "grokadamw", {"alpha_init": 0.98, "lamb": 2.0, "gamma": 0.1,
                                                    "grokking_signal_decay_rate": 0.1, "gradient_clipping": 1.0}),
    "stable_adamw": Spec(("optimi",), "stable-adamw", {"decouple_lr": False, "max_lr": None, "kahan_sum": None}),
}
for _name in ("galore_adamw", "galore_adamw_8bit", "galore_adafactor", "apollo_adamw"):
    SPECS[_name + "_layerwise"] = replace(SPECS[_name], layerwise=True)
# The names grouped by package, its layer-wise forms after its others (as TrainingArguments' help lists them).
_EXTRAS = [spec.extra for spec in SPECS.values()]
NAMES = tuple(sorted(SPECS, key=lambda name: _EXTRAS.index(SPECS[name].extra)))

PACKAGES = {"galore_torch": "galore-torch", "apollo_torch": "apollo-torch", "lomo_optim": "lomo-optim",
            "grokadamw": "grokadamw", "optimi": "torch-optimi", "bitsandbytes": "bitsandbytes"}
# optim_args that the optimizer's class takes but a Trainer run cannot honour.
REFUSED_OPTIONS = {
    "clip_grad_norm": "LOMO clips by norm only after a second backward pass (Lomo.grad_norm) that transformers' "
                      "Trainer never makes, and then fails; use clip_grad_value",
}


def missing_package(optim: str) -> Optional[ConfigError]:
    spec = SPECS[optim]
    for module in spec.modules:
        if importlib.util.find_spec(module) is None:
            return package_missing(PACKAGES[module], spec.extra, f"optim={optim!r}")
    return None


def options(args) -> dict:
    """`args.optim_args` merged over transformers' defaults for this optimizer, each converted and checked."""
    spec = SPECS[args.optim]
    out = dict(spec.options)
    for key, value in parse_optim_args(args.optim_args).items():
        if key not in spec.options:
            why = f" ({REFUSED_OPTIONS[key]})" if key in REFUSED_OPTIONS and spec.fused_backward else ""
            accepted = ", ".join(spec.options) or "none"
            raise ConfigError(f"optim_args: {key!r} is not accepted by optim={args.optim!r}{why}; accepted: "
                              f"{accepted}.")
        out[key] = convert_optim_arg(args.optim, key, value, spec.options[key])
        if key in CHOICES and out[key] not in CHOICES[key]:
            raise ConfigError(f"optim_args: {key}={value!r} for optim={args.optim!r} must be one of "
                              f"{', '.join(CHOICES[key])}.")
        if key in ("rank", "update_proj_gap") and not out[key] >= 1:
            raise ConfigError(f"optim_args: {key}={value!r} for optim={args.optim!r} must be a positive int.")
    return out


def _max_workers(args) -> Optional[int]:
    try:
        return bounds(normalise_workers(args.num_workers))[1]
    except ConfigError:  # reported by TrainingArguments' own check of num_workers
        return None


def surely_without_gpu(args) -> bool:
    """What the arguments alone say: no GPU for the workers (use_gpu=False, or an in-process run without CUDA
    and without use_gpu=True, which is how the Trainer places such a run)."""
    if args.use_gpu is False:
        return True
    return _max_workers(args) == 0 and not (args.use_gpu and torch.cuda.is_available())


def check(args, warn: bool = True):
    """What TrainingArguments alone decide; raises ConfigError naming the fix."""
    name, spec = args.optim, SPECS[args.optim]
    error = missing_package(name)
    if error is not None:
        raise error
    options(args)
    workers = _max_workers(args)
    if spec.low_rank:
        targets = getattr(args, "optim_target_modules", None)
        if targets is None:
            raise ConfigError(f"optim={name!r} needs optim_target_modules: the nn.Linear modules whose gradients "
                              "it projects, as a list of names (e.g. ['q_proj', 'v_proj']), a regex, or 'all-linear'.")
        if not isinstance(targets, str) and not (isinstance(targets, (list, tuple))
                                                 and all(isinstance(t, str) for t in targets)):
            raise ConfigError(f"optim_target_modules={targets!r} must be a list of module names, a regex string, "
                              "or 'all-linear'.")
    if (spec.low_rank or spec.fused_backward) and args.strategy == "fsdp":
        what = "projects each weight's whole gradient matrix" if spec.low_rank else \
            "updates each parameter from its whole gradient inside backward"
        raise ConfigError(f"optim={name!r} {what}, and FSDP gives each worker a shard of it: use strategy='ddp'.")
    if spec.layerwise:
        if workers is not None and workers > 1:
            raise ConfigError(
                f"optim={name!r} runs in one process only (transformers' Trainer refuses it under DDP too): each "
                "parameter's optimizer steps inside backward as soon as that gradient exists, before the workers "
                f"could average it. Use num_workers=1 (or 0), or optim={name[:-len('_layerwise')]!r} on "
                f"{workers} workers.")
        if args.gradient_accumulation_steps != 1:
            raise ConfigError(f"optim={name!r} steps each parameter inside every backward, so it cannot accumulate "
                              "gradients (transformers refuses it too): set gradient_accumulation_steps=1.")
    if (spec.layerwise or spec.fused_backward) and args.fp16:
        raise ConfigError(f"optim={name!r} updates the weights inside backward, from gradients that fp16's loss "
                          "scaling has not yet unscaled or checked for overflow: use bf16=True or full precision.")
    if spec.needs_cuda and surely_without_gpu(args):
        raise ConfigError(f"optim={name!r} needs a CUDA GPU ({spec.needs_cuda}), and this run's workers have none "
                          f"(use_gpu={args.use_gpu}, num_workers={args.num_workers}). On CPUs use "
                          f"optim={name.replace('_8bit', '')!r}.")
    if warn and spec.ignores_weight_decay and args.weight_decay > 0:
        kept = " (GaLoreAdamW8bit keeps its own weight_decay=0.01)" if "8bit" in name else ""
        warnings.warn(f"optim={name!r} does not apply weight_decay={args.weight_decay}: transformers' Trainer builds "
                      f"it without weight decay{kept}, and so does raytrainer, for the same numbers.", stacklevel=6)


def check_run(args, use_gpu: bool, model=None):
    """In the Trainer's preflight, with the workers' devices and the model known."""
    spec = SPECS[args.optim]
    if spec.needs_cuda and not use_gpu:
        raise ConfigError(f"optim={args.optim!r} needs a CUDA GPU ({spec.needs_cuda}), and this run's workers have "
                          f"none. On CPUs use optim={args.optim.replace('_8bit', '')!r}.")
    if spec.low_rank and model is not None:
        from .low_rank import target_parameter_names

        target_parameter_names(model, args.optim_target_modules, args.optim)


def create(model: torch.nn.Module, args) -> torch.optim.Optimizer:
    """The optimizer named by args.optim (one of NAMES), as transformers' Trainer builds it for `model`."""
    error = missing_package(args.optim)
    if error is not None:
        raise error
    name, spec, opts = args.optim, SPECS[args.optim], options(args)
    lr = args.learning_rate
    if spec.low_rank:
        from .low_rank import create_low_rank

        return create_low_rank(model, args, opts)
    if spec.fused_backward:
        from .lomo import create_lomo

        param_groups(model, 0.0)  # the same error as the other optimizers when nothing is trainable
        return create_lomo(model, name, lr, opts)
    groups = param_groups(model, args.weight_decay)
    if name == "grokadamw":  # transformers passes no betas/eps: GrokAdamW's own defaults
        from .grok import GrokAdamW

        return GrokAdamW(groups, lr=lr, **opts)
    from optimi import StableAdamW

    return StableAdamW(groups, lr=lr, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon,
                       weight_decay=args.weight_decay, **opts)
