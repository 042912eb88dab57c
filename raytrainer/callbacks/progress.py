"""What the driver's terminal shows: a progress bar (steps, loss, ETA) and the log records."""

from __future__ import annotations

from typing import List, Optional

from .base import TrainerCallback


def format_logs(logs: dict) -> str:
    parts = []
    for key, value in logs.items():
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return "{" + ", ".join(parts) + "}"


def straggler(rank_stats: List[dict]) -> Optional[dict]:
    """The rank whose steps are slowest without counting collective waits (its own compute plus data wait is
    what makes the others wait): the one with the largest data wait, if clearly above the others'."""
    if len(rank_stats) < 2:
        return None
    ordered = sorted(rank_stats, key=lambda r: r["data_wait_s"], reverse=True)
    slowest, rest = ordered[0], ordered[1:]
    typical = sorted(r["data_wait_s"] for r in rest)[len(rest) // 2]
    if slowest["data_wait_s"] - typical < 0.01 or slowest["data_wait_s"] < 2 * typical:
        return None
    return {"rank": slowest["rank"], "data_wait_s": slowest["data_wait_s"], "others_data_wait_s": typical}


def restart_line(state, reason=None, cause=None, world_size=None, checkpoint=None, **kwargs) -> str:
    size = f" with {world_size} worker{'s' if world_size != 1 else ''}" if world_size else ""
    source = f" from {checkpoint.rstrip('/').rsplit('/', 1)[-1]}" if checkpoint else " from step 0"
    return (f"[raytrainer] worker group restarted{size} at step {state.global_step}{source} "
            f"({reason or 'restart'}): {cause}")


def resize_line(state, previous_world_size=None, world_size=None, gradient_accumulation_steps=None,
                same_global_batch=True, **kwargs) -> str:
    head = f"[raytrainer] resized {previous_world_size} -> {world_size} workers at step {state.global_step}; "
    if same_global_batch:
        return head + f"gradient_accumulation_steps is now {gradient_accumulation_steps} (same global batch)"
    # A hosted script's Trainer keeps its arguments: its global batch scales with the world size.
    return head + (f"the script's gradient_accumulation_steps stays {gradient_accumulation_steps}: the global "
                   f"batch is {world_size}/{previous_world_size} of what it was")


class PrinterCallback(TrainerCallback):
    """Prints each log record (used when the progress bar is disabled)."""

    observes_only = True  # never changes control: the workers never wait for it

    def __init__(self):
        self.straggler_rank = None

    def on_log(self, args, state, control, logs=None, rank_stats=None, **kwargs):
        self._write(format_logs(logs or {}))
        self._report_straggler(rank_stats)

    def _report_straggler(self, rank_stats):
        """One line when a rank starts making the others wait (or stops), not one per log."""
        slow = straggler(rank_stats or [])
        rank = slow["rank"] if slow else None
        if rank != self.straggler_rank and rank_stats:
            self.straggler_rank = rank
            self._write(f"[raytrainer] straggler: rank {rank} waits {slow['data_wait_s']:.3f} s per step for data "
                        f"(the others {slow['others_data_wait_s']:.3f} s)" if slow else
                        "[raytrainer] no straggler any more")

    def _write(self, line: str):
        print(line, flush=True)

    def on_restart(self, args, state, control, **kwargs):
        self._write(restart_line(state, **kwargs))

    def on_preempted(self, args, state, control, cause=None, checkpoint=None, **kwargs):
        self._write(f"[raytrainer] {cause}: checkpoint of step {state.global_step} committed ({checkpoint}); "
                    "Ray Train restarts the worker group from it")

    def on_resize(self, args, state, control, **kwargs):
        self._write(resize_line(state, **kwargs))


class ProgressCallback(PrinterCallback):
    """A tqdm bar over optimizer steps; log records are written above it."""

    def __init__(self):
        super().__init__()
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
        if self.bar is not None and logs and "loss" in logs:
            postfix = {"loss": f"{logs['loss']:.4f}"}
            if "train_tokens_per_second" in logs:  # throughput at a glance; every key is in the log line
                postfix["tok/s"] = f"{logs['train_tokens_per_second']:.4g}"
            self.bar.set_postfix(postfix, refresh=False)
        super().on_log(args, state, control, logs=logs, **kwargs)

    def _write(self, line: str):
        (self.bar.write if self.bar is not None else print)(line)

    def on_restart(self, args, state, control, **kwargs):
        super().on_restart(args, state, control, **kwargs)
        if self.bar is not None:
            self.bar.n = self.last_step = state.global_step
            self.bar.refresh()

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.on_step_end(args, state, control)
        self.end()

    def end(self):
        """Close the bar: at the train's end, or where a run ends without one (a hosted job stopped by Ctrl-C:
        a bar left open failed in tqdm's __del__ at the interpreter's exit, with a traceback)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
