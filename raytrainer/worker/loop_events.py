"""Where the loop fires its events (see `callbacks/event_names.py` for the list and order) and learns what to do.

`fire(event)` on every rank:
  1. resets the control flags as HF does (each step starts without log/evaluate/save requests);
  2. runs the callbacks declared `on_every_rank` (with model, optimizer, ... as HF passes them);
  3. rank 0 reports the event to the driver (buffered: observing costs no round trip), unless it is a per-step
     event that no driver callback implements (`event_names.UNHEARD_UNLESS_LISTENED`);
  4. if the event is a control point (a driver callback that can change control listens to it), rank 0
     sends the buffered events and waits for the driver's decision on them;
  5. the flags are combined over ranks (one small all-reduce, only when 2 or 4 happened), so every rank
     holds the same control and acts on it at the same global step (principle 1).

With `callback_decisions="next_step"`, step 4 does not wait at the per-step control points (`on_step_end`,
`on_log`): rank 0 sends the step's events and one request at the step's end (`end_step`) and training goes
on; the answer is folded into the control of the next step's `on_step_end` (every rank applies it there,
before that step's log / evaluate / save), or at the epoch's last step into `settle()`. A control point of
another event (`on_evaluate`, `on_epoch_end`, ...) still waits, and takes every answer still open with it.
Which step applies an answer depends only on the loop's structure, never on when the answer arrived: every
rank applies it at the same step, and a rerun at the same step again.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional

import torch

from ..callbacks.base import CONTROL_FLAGS, call, listens_to, reset_control
from ..callbacks.event_names import UNHEARD_UNLESS_LISTENED
from ..state import TrainerControl

# The control points that callback_decisions="next_step" answers one step later.
DEFERRED = frozenset({"step_end", "log"})


class LoopEvents:
    def __init__(self, trainer, ctx, emitter, control_points: Iterable[str] = (), rank_callbacks=(),
                 next_step: bool = False, heard: Iterable[str] = ()):
        self.trainer = trainer
        self.ctx = ctx
        self.emitter = emitter
        self.control_points = frozenset(control_points)
        # Per-step events no driver callback implements stay here: observing costs nothing unless asked for.
        self.unsent = UNHEARD_UNLESS_LISTENED - frozenset(heard) - self.control_points
        self.rank_callbacks = list(rank_callbacks)
        # ...and those no rank callback implements either do nothing but HF's control reset.
        self.idle = frozenset(e for e in self.unsent if not any(listens_to(c, e) for c in self.rank_callbacks))
        self.control = TrainerControl()
        self.train_dataloader = None  # set by the training loop: the callbacks' `train_dataloader` argument
        self.next_step = next_step
        self._wanted = False  # a deferred control point fired this step: end_step() asks the driver
        # The request of an earlier step not answered into control yet: on rank 0 the sink's reply (a Ray
        # ref, or the Decision itself in the driver process); True on the other ranks, which fold with it.
        self._pending: Optional[Any] = None

    def fire(self, event: str, **payload: Any) -> TrainerControl:
        trainer, control = self.trainer, self.control
        reset_control(control, event)
        if event in self.idle:
            return control
        state = trainer.state
        local = [c for c in self.rank_callbacks if listens_to(c, event)]
        for callback in local:
            call(callback, event, trainer.args, state, control, **self._hf_kwargs(), **payload)
        ask = event in self.control_points
        deferred = ask and self.next_step and event in DEFERRED
        if self.ctx.is_main and event not in self.unsent:  # one the driver decides on travels with the request
            self.emitter.emit(event, hold=ask, global_step=state.global_step, epoch=state.epoch, **payload)
        # The previous step's answer is applied at this step's on_step_end; a waiting request takes it too.
        fold = self._pending is not None and (event == "step_end" or (ask and not deferred))
        # A rank callback marked observes_only (the profiler) never changes control: no all-reduce for it.
        if not (ask and not deferred) and not fold and all(getattr(c, "observes_only", False) for c in local):
            self._wanted = self._wanted or deferred
            return control
        flags = [int(getattr(control, name)) for name in CONTROL_FLAGS]
        decisions = self._take_pending() if fold else []
        if deferred:
            self._wanted = True
        elif ask:
            self._wanted = False  # the held events of this step travel with this request
            if self.ctx.is_main:
                decisions.append(self.emitter.request_control())
        for name, value in zip(CONTROL_FLAGS, self._combine(flags, decisions)):
            setattr(control, name, bool(value))
        return control

    def end_step(self):
        """After every step's log / evaluate / save: with callback_decisions="next_step", rank 0 sends the
        step's events and asks for the driver's decision on them, without waiting. The open answer of the step
        before was folded at this step's on_step_end, so one request is open at a time."""
        if not self._wanted:
            return
        self._wanted = False
        self._pending = self.emitter.request_control(wait=False) if self.ctx.is_main else True

    def settle(self) -> Optional[TrainerControl]:
        """At the end of an epoch's steps: the flags the open answer raised (agreed over ranks), for the loop
        to act on at this step; None if no answer is open."""
        if self._pending is None:
            return None
        flags = self._combine([0] * len(CONTROL_FLAGS), self._take_pending())
        return TrainerControl(**{name: bool(value) for name, value in zip(CONTROL_FLAGS, flags)})

    def _take_pending(self) -> List[Any]:
        pending, self._pending = self._pending, None
        return [self.emitter.answer(pending)] if self.ctx.is_main else []

    def _combine(self, flags: List[int], decisions: List[Any]) -> List[int]:
        """This rank's flags OR rank 0's decisions, then the maximum over ranks: the same flags everywhere."""
        for decided in decisions:  # protocol.Decision
            self.trainer.state.stateful_callbacks.update(decided.states)  # saved with the next checkpoint
            flags = [f | int(decided.flags.get(name, False)) for f, name in zip(flags, CONTROL_FLAGS)]
        if self.ctx.distributed:
            flags = self.ctx.all_reduce_max(torch.tensor(flags, dtype=torch.int32, device=self.ctx.device)).tolist()
        return flags

    def emit(self, event: str, **payload: Any):
        """Report an event that steers nothing (prediction steps, restarts), from rank 0 only."""
        if self.ctx.is_main:
            state = self.trainer.state
            self.emitter.emit(event, global_step=state.global_step, epoch=state.epoch, **payload)

    def _hf_kwargs(self) -> dict:
        t = self.trainer
        return {"model": t.model, "processing_class": t.processing_class, "optimizer": t.optimizer,
                "lr_scheduler": t.lr_scheduler, "train_dataloader": self.train_dataloader}
