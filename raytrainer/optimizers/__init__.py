"""The optimizers and learning-rate schedules that `TrainingArguments` names (`optim`, `lr_scheduler_type`),
built with transformers' arguments and defaults, so a run matches transformers' Trainer in one process.

- `registry`: every `optim` name once, and the checks and builder each goes to: `check_optimizer` (when the
  arguments are built), `check_run` (the Trainer's preflight), `create_optimizer` (on each worker).
- `builtin`: torch's AdamW and SGD, transformers' Adafactor, the schedule-free optimizers; the parameter groups
  and `optim_args` parsing that every optimizer shares.
- `schedules`: the learning-rate schedules (`create_scheduler`).
- `packaged`: the optimizers of their own packages (GaLore, APOLLO, LOMO/AdaLomo, GrokAdamW, StableAdamW): each
  one's package, pip extra, `optim_args` and the rules checked on the driver.
- `low_rank`: GaLore and APOLLO (projected gradients of `optim_target_modules`).
- `layerwise`: the `_layerwise` forms, one optimizer per parameter stepped inside backward (one process only).
- `lomo`, `lomo_classes`: LOMO and AdaLomo, which update each parameter inside backward (`fused_backward`).
- `grok`: GrokAdamW with its state where checkpoints find it.
"""

from .builtin import optimizer_eval_mode, optimizer_train_mode
from .lomo import fused_backward, is_fused_backward
from .registry import OPTIMIZERS, check_optimizer, check_optimizer_cls_and_kwargs, check_run, create_optimizer
from .schedules import SCHEDULERS, create_scheduler

__all__ = ["OPTIMIZERS", "SCHEDULERS", "check_optimizer", "check_optimizer_cls_and_kwargs", "check_run",
           "create_optimizer", "create_scheduler", "fused_backward", "is_fused_backward", "optimizer_eval_mode",
           "optimizer_train_mode"]
