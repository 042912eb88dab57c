"""The learning-rate schedules named by `lr_scheduler_type`, built the way HF's `Trainer` builds them
(`transformers.get_scheduler`): each a factor of the initial learning rate, step by step.

Schedules are `LambdaLR`s over module-level functions bound with `functools.partial`, so that a scheduler pickles
(the Trainer that holds one is shipped to Ray actors): a closure or lambda would not.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import TYPE_CHECKING

import torch
from torch.optim.lr_scheduler import LambdaLR

from ..errors import ConfigError
from .builtin import is_schedule_free

if TYPE_CHECKING:  # for annotations only
    from ..arguments.training_args import TrainingArguments

class _Required:
    """The default of a kwarg that has none: lr_scheduler_kwargs must give it."""

    def __repr__(self) -> str:
        return "required"


REQUIRED = _Required()

# Every lr_scheduler_type name, with the lr_scheduler_kwargs each schedule accepts and HF's defaults. Not here:
# HF's "reduce_lr_on_plateau" and "greedy", stepped by evaluation metrics rather than by the step count.
SCHEDULER_KWARGS = {
    "linear": {},
    "cosine": {"num_cycles": 0.5},
    "cosine_with_restarts": {"num_cycles": 1},
    "constant": {},
    "constant_with_warmup": {},
    "polynomial": {"lr_end": 1e-7, "power": 1.0},
    "inverse_sqrt": {"timescale": None},
    "cosine_with_min_lr": {"num_cycles": 0.5, "min_lr": None, "min_lr_rate": None},
    "cosine_warmup_with_min_lr": {"num_cycles": 0.5, "min_lr": None, "min_lr_rate": None, "warmup_lr_rate": None},
    "warmup_stable_decay": {"num_decay_steps": REQUIRED, "num_stable_steps": None, "warmup_type": "linear",
                            "decay_type": "cosine", "min_lr_ratio": 0.0, "num_cycles": 0.5},
}
SCHEDULERS = tuple(SCHEDULER_KWARGS)
WSD_SHAPES = ("linear", "cosine", "1-sqrt")  # warmup_type and decay_type of warmup_stable_decay


def _warmup(step: int, num_warmup_steps: int) -> float:
    return float(step) / float(max(1, num_warmup_steps))


def _constant(step: int) -> float:
    return 1.0


def _constant_with_warmup(step: int, *, num_warmup_steps: int) -> float:
    return _warmup(step, num_warmup_steps) if step < num_warmup_steps else 1.0


def _linear(step: int, *, num_warmup_steps: int, num_training_steps: int) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    return max(0.0, float(num_training_steps - step) / float(max(1, num_training_steps - num_warmup_steps)))


def _cosine(step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float,
            min_lr_rate: float = 0.0) -> float:
    """"cosine", and "cosine_with_min_lr" with its floor (x * 1.0 + 0.0 is x: "cosine"'s factors exactly)."""
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    factor = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    return max(0.0, factor * (1 - min_lr_rate) + min_lr_rate)


def _polynomial(step: int, *, num_warmup_steps: int, num_training_steps: int, lr_end: float, power: float,
                lr_init: float) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    decay_steps = num_training_steps - num_warmup_steps
    if step >= num_training_steps or decay_steps <= 0:  # HF divides by zero when warmup fills the run
        return lr_end / lr_init
    pct_remaining = 1 - (step - num_warmup_steps) / decay_steps
    return ((lr_init - lr_end) * pct_remaining**power + lr_end) / lr_init


def _cosine_with_restarts(step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    if progress >= 1.0:
        return 0.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(num_cycles) * progress) % 1.0))))


def _inverse_sqrt(step: int, *, num_warmup_steps: int, timescale: int) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    return 1.0 / math.sqrt((step + timescale - num_warmup_steps) / timescale)


def _cosine_warmup_with_min_lr(step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float,
                               min_lr_rate: float, warmup_lr_rate) -> float:
    # HF's variant: the warm-up starts above 0 and the decay one step ahead of "cosine_with_min_lr"'s.
    if step < num_warmup_steps:
        if warmup_lr_rate is None:
            return (step + 1.0) / max(1.0, num_warmup_steps)
        rate = float(warmup_lr_rate)
        return rate + (1.0 - rate) * step / max(1, num_warmup_steps - 1)
    progress = (step - num_warmup_steps + 1.0) / max(1.0, num_training_steps - num_warmup_steps)
    factor = 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress))
    return max(0.0, factor * (1 - min_lr_rate) + min_lr_rate)


def _wsd_shape(kind: str, progress: float, num_cycles: float, rising: bool) -> float:
    """warmup_stable_decay's warm-up (rising) or decay factor at `progress` in [0, 1)."""
    if kind == "linear":
        return progress if rising else 1.0 - progress
    if kind == "cosine":
        if rising:
            return 0.5 * (1.0 - math.cos(math.pi * progress))
        return 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    return 1.0 - math.sqrt(1.0 - progress) if rising else 1.0 - math.sqrt(progress)  # "1-sqrt"


def _warmup_stable_decay(step: int, *, num_warmup_steps: int, num_stable_steps: int, num_decay_steps: int,
                         warmup_type: str, decay_type: str, min_lr_ratio: float, num_cycles: float) -> float:
    if step < num_warmup_steps:
        factor = _wsd_shape(warmup_type, float(step) / float(max(1, num_warmup_steps)), num_cycles, rising=True)
        return max(0.0, factor * (1.0 - min_lr_ratio) + min_lr_ratio)
    if step < num_warmup_steps + num_stable_steps:
        return 1.0
    if step < num_warmup_steps + num_stable_steps + num_decay_steps:
        progress = float(step - num_warmup_steps - num_stable_steps) / float(max(1, num_decay_steps))
        factor = _wsd_shape(decay_type, progress, num_cycles, rising=False)
        return max(0.0, factor * (1.0 - min_lr_ratio) + min_lr_ratio)
    return min_lr_ratio


def _min_lr_rate(extra: dict, lr: float, name: str) -> float:
    """cosine_with_min_lr's floor as a ratio of the learning rate: `min_lr` or `min_lr_rate`, exactly one."""
    min_lr, rate = extra.pop("min_lr"), extra.pop("min_lr_rate")
    if (min_lr is None) == (rate is None):
        raise ConfigError(f"lr_scheduler_type={name!r} needs exactly one of min_lr and min_lr_rate in "
                          f"lr_scheduler_kwargs (given: {'both' if min_lr is not None else 'neither'}).")
    return min_lr / lr if min_lr is not None else rate


def _wsd(extra: dict, num_training_steps: int, warmup: int) -> dict:
    for key in ("warmup_type", "decay_type"):
        if extra[key] not in WSD_SHAPES:
            raise ConfigError(f"lr_scheduler_kwargs {key}={extra[key]!r} is not one of {', '.join(WSD_SHAPES)}.")
    if extra["num_stable_steps"] is None:  # the run's steps left between the warm-up and the decay
        extra["num_stable_steps"] = num_training_steps - warmup - extra["num_decay_steps"]
    return extra


def create_scheduler(optimizer: torch.optim.Optimizer, args: TrainingArguments,
                     num_training_steps: int) -> LambdaLR:
    name = args.lr_scheduler_type
    if name not in SCHEDULER_KWARGS:
        raise ConfigError(f"lr_scheduler_type={name!r} is not supported.")
    if num_training_steps <= 0:
        raise ConfigError(f"num_training_steps={num_training_steps} must be > 0 to build a schedule.")
    given = dict(args.lr_scheduler_kwargs or {})
    unknown = sorted(set(given) - set(SCHEDULER_KWARGS[name]))
    if unknown:
        accepted = ", ".join(SCHEDULER_KWARGS[name]) or "none"
        raise ConfigError(f"lr_scheduler_kwargs {unknown} are not accepted by lr_scheduler_type={name!r} "
                          f"(accepted: {accepted}).")
    extra = {**SCHEDULER_KWARGS[name], **given}
    missing = sorted(k for k, v in extra.items() if v is REQUIRED)
    if missing:
        raise ConfigError(f"lr_scheduler_type={name!r} needs {', '.join(missing)} in lr_scheduler_kwargs "
                          f"(e.g. lr_scheduler_kwargs={{{missing[0]!r}: ...}}).")
    warmup = args.get_warmup_steps(num_training_steps)
    if is_schedule_free(args.optim) and args.optim != "schedule_free_radam":
        for group in optimizer.param_groups:  # a ratio needed the run's length, known only now
            group["warmup_steps"] = warmup

    if name == "constant":
        # HF ignores warmup here too; say so instead of surprising the user (schedule-free: the optimizer uses it).
        if warmup > 0 and not is_schedule_free(args.optim):
            warnings.warn("lr_scheduler_type='constant' ignores warmup_steps; use 'constant_with_warmup'.",
                          stacklevel=2)
        lr_lambda = _constant
    elif name == "constant_with_warmup":
        lr_lambda = functools.partial(_constant_with_warmup, num_warmup_steps=warmup)
    elif name == "linear":
        lr_lambda = functools.partial(_linear, num_warmup_steps=warmup, num_training_steps=num_training_steps)
    elif name == "cosine":
        lr_lambda = functools.partial(_cosine, num_warmup_steps=warmup, num_training_steps=num_training_steps,
                                      **extra)
    elif name == "cosine_with_restarts":
        lr_lambda = functools.partial(_cosine_with_restarts, num_warmup_steps=warmup,
                                      num_training_steps=num_training_steps, **extra)
    elif name == "inverse_sqrt":  # HF: the timescale is the warm-up, or 10 000 steps without one
        lr_lambda = functools.partial(_inverse_sqrt, num_warmup_steps=warmup,
                                      timescale=extra["timescale"] or warmup or 10_000)
    elif name in ("cosine_with_min_lr", "cosine_warmup_with_min_lr"):
        rate = _min_lr_rate(extra, optimizer.defaults["lr"], name)
        shape = _cosine if name == "cosine_with_min_lr" else _cosine_warmup_with_min_lr
        lr_lambda = functools.partial(shape, num_warmup_steps=warmup, num_training_steps=num_training_steps,
                                      min_lr_rate=rate, **extra)
    elif name == "warmup_stable_decay":
        lr_lambda = functools.partial(_warmup_stable_decay, num_warmup_steps=warmup,
                                      **_wsd(extra, num_training_steps, warmup))
    else:  # polynomial
        lr_init = optimizer.defaults["lr"]
        if not lr_init > extra["lr_end"]:
            raise ConfigError(f"lr_scheduler_kwargs lr_end={extra['lr_end']} must be smaller than "
                              f"learning_rate={lr_init}.")
        lr_lambda = functools.partial(_polynomial, num_warmup_steps=warmup, num_training_steps=num_training_steps,
                                      lr_init=lr_init, **extra)
    return LambdaLR(optimizer, lr_lambda)
