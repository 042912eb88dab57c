"""GaLore and APOLLO: Adam-style optimizers whose state for the weights of `optim_target_modules` (nn.Linear only)
lives in a low-rank projection of their gradients.

Built as transformers' Trainer builds them (`_setup_low_rank_optimizer`): two groups, every parameter not
targeted (frozen ones too) and the targeted weights with the projection's options; the optimizer gets only the
learning rate, so it keeps its own betas/eps defaults and no weight decay. APOLLO's targeted group also takes
Adam's betas and eps from the arguments.

Each parameter's projector (an object in the optimizer state, refreshed every `update_proj_gap` steps) is
copied when the state is snapshotted for a checkpoint, so a background write cannot see a later projection.
"""

from __future__ import annotations

import copy
import re
import warnings

import torch
from torch import nn

from ..errors import ConfigError
from .layerwise import LayerwiseOptimizer


def _matches(targets, key: str) -> tuple:
    """(found, is_regex): transformers' `check_target_module_exists`."""
    if isinstance(targets, str):
        return bool(re.fullmatch(targets, key)), targets != key
    if key in targets:
        return True, False
    if any(target in key for target in targets):
        return True, False
    if any(re.fullmatch(target, key) for target in targets):
        return True, True
    return False, False


def target_parameter_names(model: nn.Module, targets, optim: str) -> list:
    """Names of the weights to project: those of the nn.Linear modules that `targets` names (all of them for
    'all-linear'). A ConfigError when none matches."""
    all_linear = isinstance(targets, str) and targets.replace("_", "-") == "all-linear"
    names, ignored = [], []
    try:
        for module_name, module in model.named_modules():
            found, is_regex = _matches(targets, module_name)
            if not isinstance(module, nn.Linear):
                if found and not is_regex:
                    ignored.append(module_name)
                continue
            if found or all_linear:
                names.append(module_name + ".weight")
    except re.error as e:
        raise ConfigError(f"optim_target_modules={targets!r} is not a valid regular expression ({e}).") from None
    if ignored:
        warnings.warn(f"optim_target_modules matched modules that are not nn.Linear ({', '.join(ignored[:5])}"
                      f"{', ...' if len(ignored) > 5 else ''}): {optim} projects only linear layers' weights; these "
                      "are trained like the other parameters.", stacklevel=3)
    if not names:
        raise ConfigError(f"optim_target_modules={targets!r} matches no nn.Linear module of the model, so {optim} has "
                          "nothing to project: name linear modules (e.g. ['q_proj', 'v_proj']), give a regex of "
                          "their full names, or 'all-linear'.")
    return names


def _optimizer_and_kwargs(base: str, args, opts: dict) -> tuple:
    """(class, constructor kwargs, options of the targeted group) as transformers' handlers set them."""
    lr = args.learning_rate
    if base.startswith("galore"):
        from galore_torch import GaLoreAdafactor, GaLoreAdamW, GaLoreAdamW8bit

        if base == "galore_adamw":
            return GaLoreAdamW, {"lr": lr, "no_deprecation_warning": True}, opts
        if base == "galore_adamw_8bit":
            return GaLoreAdamW8bit, {"lr": lr}, opts
        # transformers sets these two for galore_adafactor only; its _layerwise form then fails in Adafactor
        # ("Cannot combine manual lr and relative_step=True"): here both forms get them.
        return GaLoreAdafactor, {"lr": lr, "scale_parameter": False, "relative_step": False}, opts
    from apollo_torch import APOLLOAdamW

    return APOLLOAdamW, {"lr": lr}, {**opts, "betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}


def create_low_rank(model: nn.Module, args, opts: dict) -> torch.optim.Optimizer:
    name = args.optim
    layerwise = name.endswith("_layerwise")
    base = name[: -len("_layerwise")] if layerwise else name
    targeted = set(target_parameter_names(model, args.optim_target_modules, name))
    named = list(model.named_parameters())
    target = [p for n, p in named if n in targeted]
    others = [p for n, p in named if n not in targeted]
    cls, kwargs, group_options = _optimizer_and_kwargs(base, args, opts)
    if not layerwise:
        return keep_projectors_exact(cls([{"params": others}, {"params": target, **group_options}], **kwargs))
    per_parameter = {p: keep_projectors_exact(cls([{"params": [p]}], **kwargs)) for p in others}
    per_parameter.update({p: keep_projectors_exact(cls([{"params": [p], **group_options}], **kwargs))
                          for p in target})
    return LayerwiseOptimizer(per_parameter, lr=args.learning_rate)


# ---------------------------------------------------------------------- projectors in checkpoints
def keep_projectors_exact(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    optimizer.register_state_dict_post_hook(_snapshot_projectors)
    optimizer.register_load_state_dict_post_hook(_projectors_to_parameter_devices)
    return optimizer


def _snapshot_projectors(optimizer, state_dict: dict):
    """state_dict() shares each parameter's state dict with the live optimizer; the projector in it is replaced
    at every projection update, which a background checkpoint write must not see."""
    for key, state in state_dict["state"].items():
        if "projector" in state:
            state_dict["state"][key] = {**state, "projector": copy.deepcopy(state["projector"])}
    return state_dict


def _projectors_to_parameter_devices(optimizer):
    """Checkpoints are read onto the CPU; a projector's matrices go back to its parameter's device."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            projector = optimizer.state.get(p, {}).get("projector")
            if projector is None:
                continue
            for attr, value in vars(projector).items():
                if isinstance(value, torch.Tensor):
                    setattr(projector, attr, value.to(p.device))
                elif isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value):
                    setattr(projector, attr, [v.to(p.device) for v in value])
