"""A resume that keeps the run's own optimizer hyperparameters, not the checkpoint's.

Population Based Training starts a trial from another trial's checkpoint with new hyperparameters (tune/trial.py):
the weights, the optimizer's moments, the step, the schedule's position and the RNG streams are the checkpoint's,
but the learning rate, weight decay, betas and eps must be the trial's own. A plain resume would take them from the
checkpoint too (`optimizer.load_state_dict` restores each group's values, the scheduler its `base_lrs`), and the
trial would go on with the donor's learning rate: the exploit's new values would be logged and never used.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List

# The per-group values an optimizer takes from the arguments (TrainingArguments: learning_rate, weight_decay,
# adam_beta1/2, adam_epsilon); `initial_lr` is the schedule's base, set when the scheduler was built.
KEYS = ("lr", "initial_lr", "weight_decay", "betas", "eps")


def own_hyperparameters(optimizer, scheduler) -> Dict[str, Any]:
    """This run's values, read before a checkpoint's state is loaded over them."""
    groups: List[Dict[str, Any]] = [{k: copy.copy(g[k]) for k in KEYS if k in g} for g in optimizer.param_groups]
    return {"groups": groups, "base_lrs": list(getattr(scheduler, "base_lrs", None) or [])}


def put_back(optimizer, scheduler, own: Dict[str, Any]):
    """After the checkpoint's optimizer and scheduler states: this run's values again, and each group's learning
    rate where this run's schedule puts it at the restored step (HF's schedules are LambdaLR: base x factor(step));
    another scheduler keeps the run's starting learning rate."""
    if len(own["groups"]) != len(optimizer.param_groups):
        raise ValueError(f"the checkpoint's optimizer has {len(optimizer.param_groups)} parameter groups and this "
                         f"run's {len(own['groups'])}: a trial cannot continue another trial's optimizer of another "
                         "shape.")
    for group, values in zip(optimizer.param_groups, own["groups"]):
        group.update(copy.deepcopy(values))
    if own["base_lrs"]:
        scheduler.base_lrs = list(own["base_lrs"])
    factors = getattr(scheduler, "lr_lambdas", None)
    if factors is not None:
        for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, factors):
            group["lr"] = base * factor(scheduler.last_epoch)
    if hasattr(scheduler, "_last_lr"):  # what get_last_lr() (the logged learning_rate) reads
        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
