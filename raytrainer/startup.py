"""Where a train() call's start-up time goes: one timeline from `train()` to the first optimizer step.

The phases follow one another (no two overlap), each measured as a duration on one machine:

    driver  preflight    train() entered -> the trainer is pickled: argument and dataset checks, Ray
                         connected, storage probe, lease, and the 2-sample loss check (`loss_check_s` apart)
            pack         `transfer.pack`: the trainer pickled, its weights and large data as numpy arrays
            group        taking an idle worker group, or creating a new one (its start goes on in the
                         background: Ray Train places the actors while the driver does what follows)
            object store `ray.put` of the arrays (and the driver's import path)
            sink start   posting the job on the group's event sink (for a new group: waits for its actor)
            group start  posted -> rank 0 took the job: the rest of a new group's start (placement, worker
                         processes, imports, process group); about 0 on a reused group. Stamped by the sink
                         actor, which runs on the driver's node: both ends read the driver's clock
    rank 0  unpack       the job received -> the trainer unpickled, its weights fetched from the object store
            build        the model built (model_init) or taken from the unpacked trainer; seed, liger kernels
            wrap         the strategy's set-up: device placement, DDP or FSDP wrapping
            data         the train dataloader
            optimizer    optimizer and scheduler
            resume       finding and loading a checkpoint; the group's start recorded with the sink
            first step   set-up done -> rank 0's first `on_step_end` (on_train_begin, eval_on_start and the
                         first step's batches, forward, backward and optimizer step), both stamps rank 0's
    driver  total        train() entered -> the driver received that first `on_step_end`; what the phases
                         leave over (`other`) is mostly the event's way to the driver (flushed every 0.5 s)

With num_workers=0 there is no object store, sink or group: `group` is "in process" and `unpack` is the
driver's copy of the trainer. rank 0 sends its phases in one event ("startup") with the events it already
buffers, so the timeline costs no round trip. The driver logs it at INFO as one line when the first step is
done and keeps it in `trainer.state.startup` (saved in trainer_state.json by `save_state()`, under
`stateful_callbacks["raytrainer"]`, where transformers' `TrainerState.load_from_json` reads it too).

`train()` makes the `Startup` and hands it on: its own marks (preflight, pack: `Trainer._dispatch`), then the
coordinator's (`dispatch.dispatch_job`, `pump.run_job_on_group`). Foundation level: the driver (trainer,
coordinator) and the workers import it.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, Optional

# The event rank 0 sends once its set-up is done: {"phases": {name: seconds}}; its time is rank 0's clock.
EVENT = "startup"

DRIVER_PHASES = ("preflight", "pack", "group", "object store", "sink start", "group start")
WORKER_PHASES = ("unpack", "build", "wrap", "data", "optimizer", "resume")


class Timeline:
    """Consecutive phases on one machine: `mark(name)` ends the phase that started at the previous mark."""

    def __init__(self):
        self.started = self._last = time.perf_counter()
        self.phases: Dict[str, float] = {}

    def mark(self, name: str) -> float:
        now = time.perf_counter()
        took = now - self._last
        self.phases[name] = self.phases.get(name, 0.0) + took
        self._last = now
        return took

    def skip(self):
        """Start the next phase now: the time since the last mark belongs to no phase of this timeline."""
        self._last = time.perf_counter()

    def add(self, name: str, seconds: float):
        self.phases[name] = self.phases.get(name, 0.0) + max(seconds, 0.0)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


# What the driver is waiting for once each of its phases is marked done: the start-up line's words
# (startup_line.py), so a user who waits 20-50 s for a new group knows for what.
DOING_AFTER = {"preflight": "packing the trainer", "pack": "taking a worker group",
               "group": "putting the weights in Ray's object store", "object store": "posting the job",
               "sink start": "starting the workers (placement, processes, imports, process group)"}
DOING_AFTER_REUSED = {"sink start": "the workers are setting up (model, data, optimizer, checkpoint)"}


class _DriverTimeline(Timeline):
    def __init__(self, startup: "Startup"):
        super().__init__()
        self._startup = startup

    def mark(self, name: str) -> float:
        reused = self._startup.group == "reused"
        self._startup.doing = (reused and DOING_AFTER_REUSED.get(name)) or DOING_AFTER.get(name, self._startup.doing)
        return super().mark(name)


class Startup:
    """A train() call's timeline on the driver, completed by rank 0's phases and its first step. `doing`: what
    the driver waits for now, in words; `on_started`: called once, by the driver's event pump, when the run's
    first event reaches the callbacks (the progress bar's turn: the start-up line goes). `words_only`: the line's
    words and nothing more, for the hosted mode (its ranks run the user's script and send no set-up phases, so
    the timeline is neither logged nor kept in the state)."""

    def __init__(self, words_only: bool = False):
        self.words_only = words_only
        self.doing = "checking the arguments and data"
        self.on_started: Optional[Callable[[], None]] = None
        self.driver = _DriverTimeline(self)
        self.loss_check_s: Optional[float] = None
        self.group = "in process"
        self.worker: Optional[Dict[str, float]] = None
        self.worker_done_at: Optional[float] = None  # rank 0's time.time() when its set-up was done
        self.first_step_s: Optional[float] = None
        self.total_s: Optional[float] = None
        self.posted_at: Optional[float] = None  # time.time() on the driver's node

    def on_event(self, event: dict) -> bool:
        """Read a callback event (`protocol.Event.as_callback_event()`); True when it was rank 0's startup
        event (not for the callbacks). The first step_end completes the timeline."""
        kind = event.get("kind")
        if kind != EVENT and self.on_started is not None:
            self.on_started()
            self.on_started = None
        if kind == EVENT:
            if self.worker is None:  # a restarted group sends its own: the first one is the call's start-up
                self.worker = dict(event.get("phases", {}))
                self.worker_done_at = event.get("time")
                taken_at = event.get("taken_at")
                if taken_at is not None and self.posted_at is not None:
                    self.driver.add("group start", taken_at - self.posted_at)
            return True
        if kind == "step_end" and self.total_s is None and self.worker_done_at is not None:
            self.first_step_s = max(event.get("time", self.worker_done_at) - self.worker_done_at, 0.0)
            self.total_s = self.driver.elapsed()
        return False

    @property
    def complete(self) -> bool:
        return self.total_s is not None

    def phases(self) -> Dict[str, float]:
        out = {name: self.driver.phases[name] for name in DRIVER_PHASES if name in self.driver.phases}
        out.update(self.worker or {})
        if self.first_step_s is not None:
            out["first step"] = self.first_step_s
        return out

    def record(self) -> dict:
        """What trainer.state.startup keeps: seconds per phase, in order, the total and the group's kind."""
        total = self.total_s if self.total_s is not None else self.driver.elapsed()
        record = {"total_s": round(total, 3), "group": self.group,
                  "phases_s": {name: round(s, 3) for name, s in self.phases().items()}}
        if self.loss_check_s is not None:
            record["loss_check_s"] = round(self.loss_check_s, 3)
        return record

    def line(self) -> str:
        record = self.record()
        parts = []
        for name, seconds in record["phases_s"].items():
            text = f"{name} {seconds:.1f}"
            if name == "preflight" and self.loss_check_s is not None:
                text += f" (loss check {self.loss_check_s:.1f})"
            if name == "group start":
                text += f" ({self.group})"
            parts.append(text)
        other = record["total_s"] - sum(record["phases_s"].values())
        if other >= 0.05:
            parts.append(f"other {other:.1f}")
        return f"start-up {record['total_s']:.1f} s: " + ", ".join(parts)


def add_to_state_json(text: str, record: dict) -> str:
    """A trainer_state.json text (`TrainerState.to_json_string`) with `record` as its startup."""
    from .state import TrainerState

    state = TrainerState.from_json_string(text)
    state.startup = record
    return state.to_json_string()
