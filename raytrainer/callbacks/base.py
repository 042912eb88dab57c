"""HF-compatible callbacks, run on the driver from the workers' event stream.

A callback written for Hugging Face's `Trainer` (`on_log(self, args, state, control, logs=None, **kw)`,
...) works unchanged: the driver keeps a mirror of the `TrainerState` up to date from the events and calls
the same methods with the same arguments.
"""

from __future__ import annotations

from typing import Any, Dict, List

from ..state import TrainerControl, TrainerState

EVENT_METHODS = {
    "train_begin": "on_train_begin",
    "epoch_begin": "on_epoch_begin",
    "step": "on_step_end",
    "epoch_end": "on_epoch_end",
    "log": "on_log",
    "evaluate": "on_evaluate",
    "predict": "on_predict",
    "save": "on_save",
    "train_end": "on_train_end",
}


class TrainerCallback:
    """Override the events you need; every method receives `(args, state, control, **kwargs)`."""

    def on_init_end(self, args, state, control, **kwargs): ...
    def on_train_begin(self, args, state, control, **kwargs): ...
    def on_train_end(self, args, state, control, **kwargs): ...
    def on_epoch_begin(self, args, state, control, **kwargs): ...
    def on_epoch_end(self, args, state, control, **kwargs): ...
    def on_step_begin(self, args, state, control, **kwargs): ...
    def on_step_end(self, args, state, control, **kwargs): ...
    def on_evaluate(self, args, state, control, metrics=None, **kwargs): ...
    def on_predict(self, args, state, control, metrics=None, **kwargs): ...
    def on_save(self, args, state, control, **kwargs): ...
    def on_log(self, args, state, control, logs=None, **kwargs): ...
    def on_restart(self, args, state, control, **kwargs): ...


class CallbackHandler:
    """Applies worker events to the driver's state mirror, then dispatches them to the callbacks."""

    def __init__(self, callbacks: List[Any], args, state: TrainerState):
        self.callbacks = list(callbacks)
        self.args = args
        self.state = state
        self.control = TrainerControl()

    def add(self, callback: Any):
        self.callbacks.append(callback() if isinstance(callback, type) else callback)

    def handle(self, event: Dict[str, Any]):
        kind = event["kind"]
        self._update_state(kind, event)
        method = EVENT_METHODS.get(kind, "on_" + kind)
        kwargs = {k: v for k, v in event.items() if k not in ("kind", "rank", "time", "global_step", "epoch")}
        for callback in self.callbacks:
            fn = getattr(callback, method, None)
            if fn is not None:
                fn(self.args, self.state, self.control, **kwargs)

    def _update_state(self, kind: str, event: Dict[str, Any]):
        state = self.state
        if "global_step" in event:
            state.global_step = event["global_step"]
        if "epoch" in event:
            state.epoch = event["epoch"]
        if kind == "train_begin":
            state.max_steps = event.get("max_steps", state.max_steps)
            state.num_train_epochs = event.get("num_train_epochs", state.num_train_epochs)
        elif kind == "log":
            state.log_history.append(dict(event["logs"]))
        elif kind == "evaluate":
            state.log_history.append(dict(event["metrics"]))
        elif kind == "save":
            state.best_model_checkpoint = event.get("best_model_checkpoint", state.best_model_checkpoint)
            state.best_metric = event.get("best_metric", state.best_metric)
        elif kind == "restart":
            # The new worker group replays the steps after its checkpoint: forget what they logged before.
            state.log_history = [h for h in state.log_history if h.get("step", 0) <= state.global_step]
            state.restarts.append({k: event[k] for k in ("global_step", "cause", "time") if k in event})
