"""Liger kernels (`use_liger_kernel`): Triton GPU kernels patched into a transformers model (RMSNorm, RoPE,
SwiGLU, fused linear cross-entropy, ...), as transformers' Trainer applies them at the start of `train()`.

They run on CUDA GPUs only: a CPU run is refused on the driver, before any actor starts, as far as the arguments
tell when `TrainingArguments` is built (`optimizers/registry.py`), and by `check_run` in the Trainer's preflight
once it is known whether the workers get GPUs. On a worker with GPUs, `apply_liger_kernel` patches the model in
place before the strategy wraps it; architectures that Liger does not know are left as they are, with a warning
(transformers only logs it).
"""

from __future__ import annotations

import importlib.util
import warnings

from ..errors import ConfigError
from ..optimizers.registry import LIGER_NEEDS_GPU, wants_liger

EXTRA = 'pip install "raytrainer[liger]"'


def check_run(args, use_gpu: bool, model=None):
    """In the Trainer's preflight: refused without GPUs or without the package; an unknown architecture warns."""
    if not wants_liger(args):
        return
    if not use_gpu:
        raise ConfigError(f"use_liger_kernel=True, but this run's workers get no GPU (use_gpu is off, the cluster "
                          f"has no GPUs, or num_workers=0 without CUDA): {LIGER_NEEDS_GPU}. Set "
                          "use_liger_kernel=False, or run on GPUs.")
    if importlib.util.find_spec("liger_kernel") is None:
        raise ConfigError(f"use_liger_kernel=True needs the 'liger-kernel' package, which is not installed: {EXTRA}.")
    if model is not None:
        try:
            from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
        except ImportError:  # another layout of the package: the worker's apply_liger_kernel says what it does
            return
        model_type = getattr(getattr(_base_model(model), "config", None), "model_type", None)
        if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
            warnings.warn(f"use_liger_kernel=True: Liger has no kernels for model_type={model_type!r} (it patches "
                          f"{', '.join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))}); the model trains unpatched.",
                          stacklevel=2)


def _base_model(model):
    """A PEFT wrapper's base model (transformers' `unwrap_peft_model`); the model itself otherwise."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def apply_liger_kernel(model, args):
    """On a worker, before the strategy wraps the model: patch it in place, as transformers' Trainer does."""
    if not wants_liger(args):
        return model
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
    except ImportError:
        raise ConfigError(f"use_liger_kernel=True needs the 'liger-kernel' package on every worker: {EXTRA}.") \
            from None
    from transformers import PreTrainedModel

    base = _base_model(model)
    if isinstance(base, PreTrainedModel):
        _apply_liger_kernel_to_instance(model=base, **(getattr(args, "liger_kernel_config", None) or {}))
    else:
        warnings.warn("use_liger_kernel=True: the model is not a transformers PreTrainedModel, so no Liger kernel "
                      "is applied.", stacklevel=2)
    return model
