"""HF-compatible callbacks. By default they run on the driver, fed by the workers' event stream.

A callback written for Hugging Face's `Trainer` (`on_log(self, args, state, control, logs=None, **kw)`,
...) works unchanged: the driver keeps a mirror of the `TrainerState` up to date from the events and calls
the same methods with the same arguments. A callback may set flags on `control` or return a
`TrainerControl` (ours or HF's) or a dict of flags; every rank applies them at the same global step.

Two class attributes say where a callback runs and what it costs:
- `observes_only = True`: it never changes control, so the workers never wait for it (the progress bar and
  the reporters). Leave it False for a callback that may stop, save, log or evaluate: the workers then
  consult the driver after each event that callback listens to (a round trip; see `worker/loop_events.py`).
- `on_every_rank = True`: it runs inside the loop on every rank, not on the driver, and receives the model,
  optimizer, scheduler and dataloader as HF passes them (for callbacks that act on tensors). Its control
  flags are combined across ranks (any rank's flag counts).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List

from ..state import TrainerControl, TrainerState
from .event_names import DECISION_POINTS, EVENTS, PER_STEP, method_name
from .stateful import STATES_KEY, export_states

CONTROL_FLAGS = tuple(f.name for f in dataclasses.fields(TrainerControl))
# What trainer_state.json records of a restart and of a resize (the driver's mirror keeps the same).
RESTART_FIELDS = ("global_step", "reason", "cause", "time", "checkpoint", "world_size", "previous_world_size")
RESIZE_FIELDS = ("global_step", "time", "previous_world_size", "world_size", "cause", "checkpoint",
                 "gradient_accumulation_steps", "same_global_batch")


class TrainerCallback:
    """Override the events you need; every method receives `(args, state, control, **kwargs)`."""

    observes_only = False
    on_every_rank = False

    def on_init_end(self, args, state, control, **kwargs): ...
    def on_train_begin(self, args, state, control, **kwargs): ...
    def on_train_end(self, args, state, control, **kwargs): ...
    def on_epoch_begin(self, args, state, control, **kwargs): ...
    def on_epoch_end(self, args, state, control, **kwargs): ...
    def on_step_begin(self, args, state, control, **kwargs): ...
    def on_substep_end(self, args, state, control, **kwargs): ...
    def on_pre_optimizer_step(self, args, state, control, **kwargs): ...
    def on_optimizer_step(self, args, state, control, **kwargs): ...
    def on_step_end(self, args, state, control, **kwargs): ...
    def on_evaluate(self, args, state, control, metrics=None, **kwargs): ...
    def on_predict(self, args, state, control, metrics=None, **kwargs): ...
    def on_prediction_step(self, args, state, control, **kwargs): ...
    def on_save(self, args, state, control, **kwargs): ...
    def on_log(self, args, state, control, logs=None, **kwargs): ...
    def on_push_begin(self, args, state, control, **kwargs): ...
    def on_preempted(self, args, state, control, **kwargs): ...
    def on_restart(self, args, state, control, **kwargs): ...
    def on_resize(self, args, state, control, **kwargs): ...


def listens_to(callback: Any, event: str) -> bool:
    """Whether the callback implements `on_<event>` itself, in its class or as an attribute of its own (not only
    the do-nothing base method)."""
    fn = getattr(callback, method_name(event), None)
    if fn is None:
        return False
    fn = getattr(fn, "__func__", fn)
    # Ours or transformers' base class: both define every method as a no-op.
    return getattr(fn, "__qualname__", "").split(".")[0] != "TrainerCallback"


def reset_control(control: TrainerControl, event: str):
    """HF's resets: each step starts without log/evaluate/save requests, each epoch without an epoch stop."""
    if event == "train_begin":
        control.should_training_stop = False
    elif event == "epoch_begin":
        control.should_epoch_stop = False
    elif event == "step_begin":
        control.should_log = control.should_evaluate = control.should_save = False


def merge_control(control: TrainerControl, returned: Any):
    """Apply what a callback returned: a TrainerControl (ours or HF's), a dict of flags, or None."""
    if returned is None or returned is control:
        return
    items = returned.items() if isinstance(returned, dict) else (
        (name, getattr(returned, name)) for name in CONTROL_FLAGS if hasattr(returned, name))
    for name, value in items:
        if name not in CONTROL_FLAGS:
            raise ValueError(f"A callback returned the control flag {name!r}; known flags: {CONTROL_FLAGS}.")
        if value:
            setattr(control, name, True)


def call(callback: Any, event: str, args, state, control: TrainerControl, **kwargs):
    fn = getattr(callback, method_name(event), None)
    if fn is not None:
        merge_control(control, fn(args, state, control, **kwargs))


class CallbackMethods:
    """HF's Trainer methods on its callbacks, for a class holding a `callback_handler` (raytrainer's Trainer, the
    hosted mode's HostedTrainer)."""

    def add_callback(self, callback: Any):
        self.callback_handler.add(callback)

    def pop_callback(self, callback: Any) -> Any:
        return self.callback_handler.pop(callback)

    def remove_callback(self, callback: Any):
        self.callback_handler.pop(callback)


class CallbackHandler:
    """Applies worker events to the driver's state mirror, then dispatches them to the driver's callbacks."""

    def __init__(self, callbacks: List[Any], args, state: TrainerState):
        self.callbacks = list(callbacks)
        self.args = args
        self.state = state
        self.control = TrainerControl()
        self.context: Dict[str, Any] = {}  # model, processing_class: what HF passes every callback

    def add(self, callback: Any):
        self.callbacks.append(callback() if isinstance(callback, type) else callback)

    def pop(self, callback: Any) -> Any:
        """Remove and return `callback` (an instance, or the first instance of a class); None if absent. HF's
        Trainer.pop_callback."""
        for existing in list(self.callbacks):
            if existing is callback or (isinstance(callback, type) and isinstance(existing, callback)):
                self.callbacks.remove(existing)
                return existing
        return None

    @property
    def driver_callbacks(self) -> List[Any]:
        return [c for c in self.callbacks if not getattr(c, "on_every_rank", False)]

    @property
    def rank_callbacks(self) -> List[Any]:
        return [c for c in self.callbacks if getattr(c, "on_every_rank", False)]

    def control_points(self) -> frozenset:
        """The events after which the workers must wait for the driver's control decision: those that a
        callback able to change control listens to (per-step listeners make every step end one)."""
        steering = [c for c in self.driver_callbacks if not getattr(c, "observes_only", False)]
        heard = {event for c in steering for event in EVENTS if listens_to(c, event)}
        points = heard & DECISION_POINTS
        if heard & PER_STEP:
            points.add("step_end")
        return frozenset(points)

    def heard(self) -> frozenset:
        """The events some driver callback implements: rank 0 leaves out the per-step events nobody here
        listens to (`event_names.UNHEARD_UNLESS_LISTENED`)."""
        return frozenset(event for c in self.driver_callbacks for event in EVENTS if listens_to(c, event))

    def handle(self, event: Dict[str, Any]):
        kind = event["kind"]
        self._update_state(kind, event)
        reset_control(self.control, kind)
        kwargs = {k: v for k, v in event.items() if k not in ("kind", "rank", "time", "global_step", "epoch")}
        kwargs = {**self.context, **kwargs}
        for callback in self.driver_callbacks:
            call(callback, kind, self.args, self.state, self.control, **kwargs)

    def take_control(self) -> Dict[str, Any]:
        """The flags set since the last decision, handed to the workers; the one-off requests are cleared
        here (the workers now act on them), a training stop stays set, as in HF. The callbacks' exported
        states travel along, for the next checkpoint's trainer_state.json (callbacks/stateful.py)."""
        flags: Dict[str, Any] = {name: bool(getattr(self.control, name)) for name in CONTROL_FLAGS}
        self.control.should_log = self.control.should_evaluate = self.control.should_save = False
        self.control.should_epoch_stop = False
        states = export_states(self.driver_callbacks)
        if states:
            flags[STATES_KEY] = states
        return flags

    def _update_state(self, kind: str, event: Dict[str, Any]):
        state = self.state
        if "global_step" in event:
            state.global_step = event["global_step"]
        if "epoch" in event:
            state.epoch = event["epoch"]
        if kind == "train_begin":  # after a resume, the best so far is the checkpoint's
            for name in ("max_steps", "num_train_epochs", "best_metric", "best_global_step"):
                setattr(state, name, event.get(name, getattr(state, name)))
        elif kind == "log":  # as in HF, evaluation metrics and the final metrics are logged too
            state.log_history.append(dict(event["logs"]))
        elif kind == "save":
            state.best_model_checkpoint = event.get("best_model_checkpoint", state.best_model_checkpoint)
            state.best_metric = event.get("best_metric", state.best_metric)
        elif kind == "restart":
            # The new worker group replays the steps after its checkpoint: forget what they logged before.
            state.log_history = [h for h in state.log_history if h.get("step", 0) <= state.global_step]
            state.restarts.append({k: event[k] for k in RESTART_FIELDS if k in event})
        elif kind == "resize":
            state.resizes.append({k: event[k] for k in RESIZE_FIELDS if k in event})
