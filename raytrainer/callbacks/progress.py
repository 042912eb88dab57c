"""What the driver's terminal shows: a progress bar (steps, loss, ETA) and the log records."""

from __future__ import annotations

from .base import TrainerCallback


def format_logs(logs: dict) -> str:
    parts = []
    for key, value in logs.items():
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return "{" + ", ".join(parts) + "}"


class PrinterCallback(TrainerCallback):
    """Prints each log record (used when the progress bar is disabled)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        print(format_logs(logs or {}), flush=True)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        print(format_logs(metrics or {}), flush=True)

    def on_restart(self, args, state, control, cause=None, **kwargs):
        print(f"[raytrainer] worker group restarted at step {state.global_step}: {cause}", flush=True)


class ProgressCallback(PrinterCallback):
    """A tqdm bar over optimizer steps; log records are written above it."""

    def __init__(self):
        self.bar = None
        self.last_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=state.max_steps, desc="train", unit="step", dynamic_ncols=True)
        self.last_step = state.global_step
        self.bar.update(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None and state.global_step > self.last_step:
            self.bar.update(state.global_step - self.last_step)
            self.last_step = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.on_step_end(args, state, control)
        if self.bar is None:
            return super().on_log(args, state, control, logs=logs)
        if logs and "loss" in logs:
            self.bar.set_postfix(loss=f"{logs['loss']:.4f}", refresh=False)
        self.bar.write(format_logs(logs or {}))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self.bar is None:
            return super().on_evaluate(args, state, control, metrics=metrics)
        self.bar.write(format_logs(metrics or {}))

    def on_restart(self, args, state, control, cause=None, **kwargs):
        message = f"[raytrainer] worker group restarted at step {state.global_step}: {cause}"
        (self.bar.write if self.bar is not None else print)(message)
        if self.bar is not None:
            self.bar.n = self.last_step = state.global_step
            self.bar.refresh()

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.on_step_end(args, state, control)
            self.bar.close()
            self.bar = None
