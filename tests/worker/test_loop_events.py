"""Where the loop fires its events and learns what to do (raytrainer/worker/loop_events.py), in one process: the
worker side (`LoopEvents`, its `Emitter`) talks to the driver's callbacks through the num_workers=0 sink
(`DirectSink`), as a run with num_workers=0 does. A driver callback's decision lands at the step it was made
(callback_decisions="same_step") or at the next step's on_step_end ("next_step"), or at the epoch's end; per-step
events no callback implements never leave the worker. Every rank at one step on 2 workers:
tests/callbacks/test_events.py."""

from __future__ import annotations

import types

from raytrainer.callbacks.base import CallbackHandler, TrainerCallback
from raytrainer.callbacks.channel import Emitter
from raytrainer.coordinator.handlers import JobHandlers
from raytrainer.coordinator.sink import DirectSink
from raytrainer.state import TrainerState
from raytrainer.worker.loop_events import LoopEvents
from raytrainer.worker_context import WorkerContext
from tests.support import logs_and_evaluations_recorder


class SaveAtStep2(TrainerCallback):
    def __init__(self):
        self.heard = []

    def on_step_end(self, args, state, control, **kwargs):
        self.heard.append(("step_end", state.global_step))
        control.should_save = state.global_step == 2 or control.should_save


class Seen(logs_and_evaluations_recorder()):
    """Observes only what reaches the driver."""
    observes_only = True


def wire(callbacks, next_step: bool = False):
    """The driver's handler and a rank 0 LoopEvents wired to it through the num_workers=0 sink."""
    handler = CallbackHandler(callbacks, args=None, state=TrainerState())
    emitter = Emitter(DirectSink(JobHandlers(handler)), rank=0, flush_interval_s=0)
    trainer = types.SimpleNamespace(state=TrainerState(), args=None)
    events = LoopEvents(trainer, WorkerContext(), emitter, control_points=handler.control_points(),
                        next_step=next_step, heard=handler.heard())
    return events, trainer.state, handler


def step(events: LoopEvents, state: TrainerState, number: int):
    state.global_step = number
    events.fire("step_begin")
    control = events.fire("step_end")
    saved = control.should_save
    events.end_step()
    return saved


def test_a_decision_lands_at_the_step_it_was_made():
    callback = SaveAtStep2()
    events, state, _ = wire([callback])
    assert [step(events, state, n) for n in (1, 2, 3)] == [False, True, False]
    assert callback.heard == [("step_end", 1), ("step_end", 2), ("step_end", 3)]


def test_next_step_decisions_land_one_step_later_or_at_the_epochs_end():
    events, state, _ = wire([SaveAtStep2()], next_step=True)
    assert [step(events, state, n) for n in (1, 2, 3, 4)] == [False, False, True, False]
    # An epoch that ends right after step 2: its answer is settled there, not lost.
    events, state, _ = wire([SaveAtStep2()], next_step=True)
    assert [step(events, state, n) for n in (1, 2)] == [False, False]
    settled = events.settle()
    assert settled.should_save and events.settle() is None


def test_per_step_events_nobody_implements_stay_on_the_worker_and_observers_are_not_waited_for():
    seen = Seen()
    events, state, handler = wire([seen])
    assert handler.control_points() == frozenset()  # an observer steers nothing: no request at all
    for name in ("step_begin", "substep_end", "optimizer_step"):
        assert name in events.idle
    state.global_step = 5
    events.fire("step_begin")
    events.fire("log", logs={"loss": 1.0})
    events.fire("evaluate", metrics={"eval_loss": 2.0})  # urgent: sent at once
    assert seen.events == [("log", 5), ("evaluate", 5)]
    assert handler.state.global_step == 5  # the driver's mirror followed the events it got
