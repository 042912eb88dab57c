"""Where the loop fires its events (see `callbacks/events.py` for the list and order) and learns what to do.

`fire(event)` on every rank:
  1. resets the control flags as HF does (each step starts without log/evaluate/save requests);
  2. runs the callbacks declared `on_every_rank` (with model, optimizer, ... as HF passes them);
  3. rank 0 reports the event to the driver (buffered: observing costs no round trip);
  4. if the event is a control point (a driver callback that can change control listens to it), rank 0
     sends the buffered events and waits for the driver's decision on them;
  5. the flags are combined over ranks (one small all-reduce, only when 2 or 4 happened), so every rank
     holds the same control and acts on it at the same global step (principle 1).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from ..callbacks.base import CONTROL_FLAGS, call, listens_to, reset_control
from ..state import TrainerControl


class LoopEvents:
    def __init__(self, trainer, ctx, emitter, control_points: Iterable[str] = (), rank_callbacks=()):
        self.trainer = trainer
        self.ctx = ctx
        self.emitter = emitter
        self.control_points = frozenset(control_points)
        self.rank_callbacks = list(rank_callbacks)
        self.control = TrainerControl()

    def fire(self, event: str, **payload: Any) -> TrainerControl:
        trainer, control = self.trainer, self.control
        state = trainer.state
        reset_control(control, event)
        local = [c for c in self.rank_callbacks if listens_to(c, event)]
        for callback in local:
            call(callback, event, trainer.args, state, control, **self._hf_kwargs(), **payload)
        ask = event in self.control_points
        if self.ctx.is_main:  # an event the driver decides on travels with the request, in one call
            self.emitter.emit(event, hold=ask, global_step=state.global_step, epoch=state.epoch, **payload)
        # A rank callback marked observes_only (the profiler) never changes control: no all-reduce for it.
        if not ask and all(getattr(c, "observes_only", False) for c in local):
            return control
        flags = [int(getattr(control, name)) for name in CONTROL_FLAGS]
        if ask and self.ctx.is_main:
            decided = self.emitter.request_control()  # a protocol.Decision
            state.stateful_callbacks.update(decided.states)  # saved with the next checkpoint
            flags = [f | int(decided.flags.get(name, False)) for f, name in zip(flags, CONTROL_FLAGS)]
        if self.ctx.distributed:
            flags = self.ctx.all_reduce_max(torch.tensor(flags, dtype=torch.int32, device=self.ctx.device)).tolist()
        for name, value in zip(CONTROL_FLAGS, flags):
            setattr(control, name, bool(value))
        return control

    def emit(self, event: str, **payload: Any):
        """Report an event that steers nothing (prediction steps, restarts), from rank 0 only."""
        if self.ctx.is_main:
            state = self.trainer.state
            self.emitter.emit(event, global_step=state.global_step, epoch=state.epoch, **payload)

    def _hf_kwargs(self) -> dict:
        t = self.trainer
        return {"model": t.model, "processing_class": t.processing_class, "optimizer": t.optimizer,
                "lr_scheduler": t.lr_scheduler, "train_dataloader": getattr(t, "_train_dataloader", None)}
