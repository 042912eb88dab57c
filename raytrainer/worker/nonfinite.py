"""A NaN or Inf training loss: never trained on and committed silently (`on_nonfinite_loss`).

- "warn" (default; transformers trains on too): no sync and no device operation per step. The steps' losses are
  kept as they are and checked together every FOLD_MICRO_STEPS micro-batches and before a report; the first
  non-finite step is reported, naming it, when a checkpoint is saved after it and at the end of each epoch
  (where the loop syncs anyway).
- "skip": that optimizer step is skipped (gradients dropped, the schedule moves on, as a skipped AMP step),
  with a warning naming the step. The decision costs one tiny all-reduce per step, so every rank skips the
  same step (principle 1).
- "stop": the run fails at that step, before its update, with `NonFiniteLossError` (not retried: a restart
  would reach the same step again); nothing after it is saved.
"""

from __future__ import annotations

import math

import torch

from ..checkpoint.listing import checkpoint_name
from ..verbosity import notice
from .meter import host_values

POLICIES = ("warn", "skip", "stop")


class NonFiniteLossError(RuntimeError):
    fatal = True  # a worker-group restart replays the same data to the same step: fail once


# How many micro-batch losses "warn" keeps before checking them (one host read per that many).
FOLD_MICRO_STEPS = 256


class NonFiniteGuard:
    def __init__(self, policy: str, ctx):
        if policy not in POLICIES:
            raise ValueError(f"on_nonfinite_loss={policy!r}: choose one of {', '.join(POLICIES)}.")
        self.policy, self.ctx = policy, ctx
        self._step_losses: list = []  # this step's micro-batch loss shares (tensors on the device)
        self._kept: list = []  # "warn": (step, its losses) not checked yet
        self._kept_micro = 0
        self._first = -math.inf  # -(first non-finite step) since the last report: the max over ranks is the earliest

    def add(self, loss: torch.Tensor) -> None:
        """A micro-batch's loss share (kept as it is: no device operation)."""
        self._step_losses.append(loss.detach())

    def end_step(self, step: int) -> bool:
        """After the step's backward passes, before its optimizer step: True to skip that update."""
        losses, self._step_losses = self._step_losses, []
        if self.policy == "warn":
            self._kept.append((step, losses))
            self._kept_micro += len(losses)
            if self._kept_micro >= FOLD_MICRO_STEPS:
                self._check_kept()
            return False
        step_loss = torch.cat([loss.reshape(1).to(torch.float64) for loss in losses]).sum()
        bad = (~torch.isfinite(step_loss)).to(torch.float32).reshape(1)
        if not self.ctx.all_reduce_max(bad).item():
            return False
        if self.policy == "stop":
            raise NonFiniteLossError(
                f"The training loss is NaN/Inf at step {step} (on_nonfinite_loss='stop'): the run stopped before "
                "that step's update, and nothing after it was saved. Resume from the newest checkpoint with a lower "
                "learning_rate, max_grad_norm, bf16 instead of fp16, or check the data of that step.")
        if self.ctx.is_main:  # every rank skips; the console says it once
            notice(f"WARNING: step {step}: the training loss is NaN/Inf; its optimizer step is skipped "
                   "(on_nonfinite_loss='skip').")
        return True

    def _check_kept(self) -> None:
        """"warn": the first step among the kept ones whose loss is NaN/Inf (one host read for all of them)."""
        kept, self._kept, self._kept_micro = self._kept, [], 0
        losses = [loss for _, step_losses in kept for loss in step_losses]
        if not losses or self._first != -math.inf:  # none kept, or an earlier step already found
            return
        finite = [math.isfinite(value) for value in host_values(losses)]
        i = 0
        for step, step_losses in kept:
            if not all(finite[i:i + len(step_losses)]):
                self._first = -step
                return
            i += len(step_losses)

    def skip(self, trainer) -> tuple:
        """The skipped step's stand-in for the optimizer step: (grad_norm, learning rate), as the loop logs."""
        trainer.optimizer.zero_grad(set_to_none=True)
        learning_rate = trainer.lr_scheduler.get_last_lr()[0]
        trainer.lr_scheduler.step()
        return None, learning_rate

    def report(self, saving_step: int | None = None) -> None:
        """Collective (all ranks, same step): warn, naming the first non-finite step since the last report."""
        self._check_kept()
        mine = torch.tensor([self._first], dtype=torch.float64, device=self.ctx.device)
        first = self.ctx.all_reduce_max(mine).item()
        self._first = -math.inf
        if math.isinf(first) or not self.ctx.is_main:
            return
        if saving_step is not None:
            notice(f"WARNING: {checkpoint_name(saving_step)} is saved after a NaN/Inf training loss at step "
                   f"{int(-first)}: its weights may be NaN/Inf. on_nonfinite_loss='skip' or 'stop' keeps such steps "
                   "out of checkpoints.")
        else:
            notice(f"WARNING: the training loss was NaN/Inf at step {int(-first)} (on_nonfinite_loss='warn' "
                   "trains on).")


