"""A NaN or Inf training loss: never trained on and committed silently (`on_nonfinite_loss`).

- "warn" (default; transformers trains on too): no sync per step. The first non-finite step is kept on the
  device and reported, naming the step, when a checkpoint is saved after it and at the end of each epoch
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

POLICIES = ("warn", "skip", "stop")


class NonFiniteLossError(RuntimeError):
    fatal = True  # a worker-group restart replays the same data to the same step: fail once


class NonFiniteGuard:
    def __init__(self, policy: str, ctx):
        if policy not in POLICIES:
            raise ValueError(f"on_nonfinite_loss={policy!r}: choose one of {', '.join(POLICIES)}.")
        self.policy, self.ctx = policy, ctx
        self._step_loss = torch.zeros((), dtype=torch.float64, device=ctx.device)
        # -(first non-finite step) since the last report, or -inf: the max over ranks is the earliest step.
        self._first = torch.full((), -math.inf, dtype=torch.float64, device=ctx.device)

    def add(self, loss: torch.Tensor) -> None:
        """A micro-batch's loss share (on the device: no sync)."""
        self._step_loss.add_(loss.detach().to(torch.float64))

    def end_step(self, step: int) -> bool:
        """After the step's backward passes, before its optimizer step: True to skip that update."""
        bad = ~torch.isfinite(self._step_loss)
        self._step_loss.zero_()
        self._first = torch.where(bad & torch.isinf(self._first), torch.full_like(self._first, -step), self._first)
        if self.policy == "warn":
            return False
        if not self.ctx.all_reduce_max(bad.to(torch.float32).reshape(1)).item():
            return False
        if self.policy == "stop":
            raise NonFiniteLossError(
                f"The training loss is NaN/Inf at step {step} (on_nonfinite_loss='stop'): the run stopped before "
                "that step's update, and nothing after it was saved. Resume from the newest checkpoint with a lower "
                "learning_rate, max_grad_norm, bf16 instead of fp16, or check the data of that step.")
        self._first.fill_(-math.inf)  # reported here; a later save commits weights the skip kept finite
        if self.ctx.is_main:  # every rank skips; the console says it once
            notice(f"WARNING: step {step}: the training loss is NaN/Inf; its optimizer step is skipped "
                   "(on_nonfinite_loss='skip').")
        return True

    def skip(self, trainer) -> tuple:
        """The skipped step's stand-in for the optimizer step: (grad_norm, learning rate), as the loop logs."""
        trainer.optimizer.zero_grad(set_to_none=True)
        learning_rate = trainer.lr_scheduler.get_last_lr()[0]
        trainer.lr_scheduler.step()
        return None, learning_rate

    def report(self, saving_step: int | None = None) -> None:
        """Collective (all ranks, same step): warn, naming the first non-finite step since the last report."""
        first = self.ctx.all_reduce_max(self._first.clone().reshape(1)).item()
        self._first.fill_(-math.inf)
        if math.isinf(first) or not self.ctx.is_main:
            return
        if saving_step is not None:
            notice(f"WARNING: {checkpoint_name(saving_step)} is saved after a NaN/Inf training loss at step "
                   f"{int(-first)}: its weights may be NaN/Inf. on_nonfinite_loss='skip' or 'stop' keeps such steps "
                   "out of checkpoints.")
        else:
            notice(f"WARNING: the training loss was NaN/Inf at step {int(-first)} (on_nonfinite_loss='warn' "
                   "trains on).")


