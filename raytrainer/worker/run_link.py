"""The explicit interface between a training run (`worker/loop.py`) and the Trainer's hooks (`worker/hooks.py`).

The loop owns both objects below and sets them on the Trainer while it runs (`trainer.training_run`,
`trainer.micro_step`); it clears them when the run ends. Outside a run (on the driver, in evaluate() and
predict() jobs) both are None. A subclass's hook may read them; nothing else of the loop is reached from the
Trainer, and the loop reaches the Trainer only through its public HF attributes and hooks.

- `MicroStep`: the micro-batch `training_step` is called on, as the loop sees it (its loss weight, the step's
  number of micro-batches), and what `training_step` tells the loop back (whether its loss is a share of the
  global batch's, to be summed over ranks, or a per-rank value, to be averaged).
- `TrainingRun`: what `Trainer.log` and `Trainer.evaluate` do when called inside the run (by the loop, or by a
  subclass's override through `super()`): the record joins the run's log_history and fires on_log on every
  rank; an evaluation runs on this worker group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Sequence


@dataclass
class MicroStep:
    loss_weight: float = 1.0  # 0.0 for a rank's zero-weight filler batch (data/sampler.py); set by the loop
    accumulation_steps: int = 1  # micro-batches in this optimizer step (the last one may have fewer); the loop's
    loss_is_global: bool = False  # set by training_step: its loss is this rank's share of the global batch's


class TrainingRun(Protocol):
    def record_log(self, logs: dict) -> None:
        """HF's `log` inside the run."""

    def evaluate_here(self, dataset, ignore_keys: Optional[Sequence[str]] = None,
                      metric_key_prefix: str = "eval") -> dict:
        """HF's `evaluate` inside the run: this group's evaluation of `dataset`, its metrics returned."""
