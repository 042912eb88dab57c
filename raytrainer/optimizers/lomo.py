"""LOMO and AdaLomo (`lomo_optim`): each parameter is updated inside backward, from its gradient, which is then
freed, so no step follows backward. transformers' Trainer calls `optimizer.fused_backward(loss, lr)` in place
of `loss.backward()`, with the learning rate of the current step, and keeps its other rules:

- gradient accumulation: every micro-batch's backward updates the weights (with the loss scaled as usual:
  divided by the accumulation steps, or normalised by the batch's item count), not once per optimizer step;
- clipping: `max_grad_norm` finds no gradients left after backward, so nothing is clipped and the logged
  `grad_norm` is 0.0 (LOMO's own `clip_grad_value` option does clip, inside backward);
- weight decay: not applied (transformers passes none).

On several workers each gradient is averaged across the ranks as soon as it is complete, before LOMO reads it
(a hook per parameter, in the same order on every rank), so N workers update as one process with the N-fold
batch. DDP's own reducer must stay out of it: run the forward and this backward inside the strategy's
`no_sync()` on every micro-step (DDP would otherwise write the averaged gradients back after backward and LOMO
would apply them a second time).

The loop integration (worker/hooks.py `training_step`)::

    fused = is_fused_backward(self.optimizer)
    with self.strategy.no_sync(model) if fused else contextlib.nullcontext():
        loss = ...compute_loss...
        if fused:
            fused_backward(self.optimizer, loss * scale)      # lr: this step's, from the schedule
        else:
            self.strategy.backward(loss * scale)

`optimizer.step()` is a no-op for these classes, so the loop's step needs no change.
"""

from __future__ import annotations

from typing import Optional

import torch


def is_fused_backward(optimizer) -> bool:
    """Whether `optimizer` updates the weights inside backward (LOMO's `fused_backward(loss, lr)` interface)."""
    return callable(getattr(optimizer, "fused_backward", None))


def fused_backward(optimizer, loss: torch.Tensor, learning_rate: Optional[float] = None):
    """Backward of `loss` that also updates the weights, at `learning_rate` (default: the optimizer's current
    one, which the schedule set for this step: what transformers passes, `lr_scheduler.get_last_lr()[0]`)."""
    lr = optimizer.param_groups[0]["lr"] if learning_rate is None else learning_rate
    optimizer.fused_backward(loss, lr)


def create_lomo(model: torch.nn.Module, name: str, lr: float, opts: dict) -> torch.optim.Optimizer:
    from .lomo_classes import AdaLomo, Lomo

    if name == "adalomo":
        return AdaLomo(model, lr=lr, **opts)
    return Lomo(model, lr=lr, **opts)
