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

# Every lr_scheduler_type name, with the lr_scheduler_kwargs each schedule accepts and HF's defaults.
SCHEDULER_KWARGS = {
    "linear": {},
    "cosine": {"num_cycles": 0.5},
    "constant": {},
    "constant_with_warmup": {},
    "polynomial": {"lr_end": 1e-7, "power": 1.0},
}
SCHEDULERS = tuple(SCHEDULER_KWARGS)


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


def _cosine(step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))


def _polynomial(step: int, *, num_warmup_steps: int, num_training_steps: int, lr_end: float, power: float,
                lr_init: float) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    decay_steps = num_training_steps - num_warmup_steps
    if step >= num_training_steps or decay_steps <= 0:  # HF divides by zero when warmup fills the run
        return lr_end / lr_init
    pct_remaining = 1 - (step - num_warmup_steps) / decay_steps
    return ((lr_init - lr_end) * pct_remaining**power + lr_end) / lr_init


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
    else:  # polynomial
        lr_init = optimizer.defaults["lr"]
        if not lr_init > extra["lr_end"]:
            raise ConfigError(f"lr_scheduler_kwargs lr_end={extra['lr_end']} must be smaller than "
                              f"learning_rate={lr_init}.")
        lr_lambda = functools.partial(_polynomial, num_warmup_steps=warmup, num_training_steps=num_training_steps,
                                      lr_init=lr_init, **extra)
    return LambdaLR(optimizer, lr_lambda)
