"""Runs one job (train / evaluate / predict / hosted) on a worker group (`group.py`), or in the driver process.

Ray Train V2 does placement, process-group set-up and restarts; we add the event sink: the driver's main
thread drains it and runs the callbacks while the group's `fit()` runs in a helper thread, so progress,
logs and restarts show up live, and callbacks run where the user's code runs. The pump reads the sink's
messages (`protocol.py`) in arrival order and hands each to the job's handlers (`handlers.py`): an `Event` to
the callbacks, a `ControlRequest` gets their decision, a `ClaimRequest` the claim handler's reply; `ResultReady`
has the result taken, `JobFailed` raised, a `Stall` printed as a warning; a `Failure` needs nothing (the job is
re-served to the next group).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional

from ..callbacks.channel import Emitter
from ..protocol import ERROR, HostedClaimReply, JobKind, Kind, WorkOrder
from ..startup import Startup, Timeline
from ..worker.entry import run_job
from ..worker_context import WorkerContext
from .handlers import JobHandlers
from .pending import PendingWatch
from .sink import DirectSink, tell_stall

logger = logging.getLogger("raytrainer")

# How long the driver waits for events before checking whether the group's fit() ended; events wake it at once.
POLL_INTERVAL_S = 0.2


class TrainingError(RuntimeError):
    """A worker raised: the message is one line naming the rank, the user's method that raised and where
    (`worker/user_errors.py`); `worker_traceback` holds that worker's full traceback, when it sent one."""

    worker_traceback: str = ""


def run_job_in_process(trainer, order: WorkOrder, handlers: JobHandlers, use_gpu: bool,
                       startup: Optional[Timeline] = None) -> Any:
    """num_workers=0: the same work order, in this process (on the driver's unpacked copy of the trainer), with
    events dispatched as they are emitted. `startup`: the worker side of the start-up timeline, its `unpack`
    already marked."""
    ctx = WorkerContext.in_process(use_gpu)
    return run_job(trainer, order, ctx, Emitter(DirectSink(handlers), rank=0, flush_interval_s=0.0), startup=startup)


def run_job_on_group(group, packed, handlers: JobHandlers, max_failures: int, receive: Callable[[Any], Any],
                     kind: JobKind, startup: Optional[Startup] = None) -> Any:
    """Run a job on `group` (`group.WorkerGroup`). `packed`: the trainer and work order (`transfer.Packed`); its arrays
    go into the object store once, here, and every worker (and every replaced worker group) maps them from
    there. `receive(result)` runs while the objects in the result (the trained weights, owned by rank 0)
    still exist. Returns NOT_POSTED when the group had just closed (idle timeout): start another.
    `startup`: train()'s start-up timeline, marked here (object store, sink start)."""
    import ray

    from .. import code_paths
    from .cluster import workers_may_be_elsewhere

    data = ray.put(packed.data)  # owned by the driver: lives until this job ends, restarts included
    # The driver's import path goes with every job (it may have grown since the group started); modules
    # only the driver has are shipped when other nodes may run workers (code_paths.py).
    code = code_paths.capture(ship=workers_may_be_elsewhere(), put=ray.put)
    if startup is not None:
        startup.driver.mark("object store")
    job_id = group.post(packed.payload, data, max_failures, code=code, kind=kind)
    if job_id is None:
        return NOT_POSTED
    if startup is not None:
        startup.driver.mark("sink start")
        startup.posted_at = time.time()  # rank 0's taking the job, stamped by the sink, ends "group start"
    try:
        return _pump_job(group, job_id, handlers, receive)
    except _JobFailed as failed:  # a worker raised: Ray Train replaces the group, which serves the next call
        error = TrainingError(str(failed))
        error.worker_traceback = failed.worker_traceback
        raise error from None
    except BaseException:  # the driver gave up on a job still running (a driver callback raised, Ctrl-C twice)
        group.close()
        raise


NOT_POSTED = object()


class _JobFailed(Exception):
    def __init__(self, message: str, worker_traceback: str = ""):
        super().__init__(message)
        self.worker_traceback = worker_traceback


def _pump_job(group, job_id: str, handlers: JobHandlers, receive: Callable[[Any], Any],
              get: Optional[Callable[[Any], Any]] = None) -> Any:
    """Run callbacks on the job's events as they come, and read the result as soon as rank 0 has set it
    (it waits for that: it owns the trained weights' object). Messages of an earlier job are dropped.
    `get`: `ray.get`; the tests pass their own, with a plain sink behind a fake group (tests/coordinator)."""
    if get is None:
        import ray

        get = ray.get
    sink = group.sink
    outcome: Dict[str, Any] = {}

    def take():
        try:
            outcome["result"] = receive(get(sink.get_result.remote()))
        except BaseException as exc:
            outcome["receive_error"] = exc
        finally:
            get(sink.mark_result_taken.remote(job_id))

    def pump(timeout_s: float):
        """Answer rank 0's control requests once the messages before them are handled, so a decision reflects
        everything up to that point; take the result when rank 0 says it is there."""
        for message in get(sink.wait_events.remote(timeout_s)):
            kind = message.kind
            if kind is not Kind.STALL:
                waiting.progress()
            if kind is Kind.CONTROL_REQUEST:
                sink.decide.remote(message.id, handlers.decide())
            elif kind is Kind.HOSTED_CLAIM:  # answered whatever its job: its rank 0 waits for the reply
                reply = handlers.answer_claim(message.claim) if message.job == job_id else HostedClaimReply(
                    error=f"a claim of job {message.job}, which is no longer running")
                sink.answer_claim.remote(message.id, reply)
            elif kind is Kind.STALL:  # told whatever its job: a hang is worth a line at any time
                tell_stall(message)
                waiting.on_stall()  # and what Ray cannot place, if anything: the stall's likely cause
            elif message.job != job_id:
                continue
            elif kind is Kind.RESULT_READY:
                take()
            elif kind is Kind.JOB_FAILED:
                outcome["failed"] = message.error
            elif kind is Kind.EVENT:
                if message.name == ERROR:  # the first failed rank's traceback, for TrainingError.worker_traceback
                    outcome.setdefault("traceback", message.payload.get("traceback", ""))
                handlers.handle_event(message.as_callback_event())
            # Kind.FAILURE: the job is re-served to the group Ray Train starts next (which logs the failure)

    def ended() -> bool:
        return any(k in outcome for k in ("result", "receive_error", "failed"))

    # No progress for a while and Ray holds demands it cannot place (a Ray Data task, this worker group): say so.
    waiting = PendingWatch()
    with _first_ctrl_c_stops(sink) as stopping:
        while not ended() and group.thread_alive():
            pump(POLL_INTERVAL_S)
            stopping.relay()
            waiting.look()
    if not ended():  # the group's fit() ended: read what its last workers sent
        pump(0)
    if "failed" in outcome:
        raise _JobFailed(outcome["failed"], outcome.get("traceback", ""))
    if "receive_error" in outcome:
        raise outcome["receive_error"]
    if "result" in outcome:
        return outcome["result"]
    error = group.error
    if error is None:
        raise TrainingError("The worker group ended before the job did (released while it ran).")
    raise _unwrap(error) from error


class _first_ctrl_c_stops:
    """While fit() runs: the first Ctrl-C asks every rank to save at its next step boundary and end the run
    (train() then raises KeyboardInterrupt); a second one raises at once and abandons the run. The handler
    only sets a flag: a KeyboardInterrupt in the middle of the pump could drop a control request that rank 0
    waits on. Only the main thread can set handlers; elsewhere Ctrl-C keeps Python's behaviour."""

    def __init__(self, sink):
        self.sink = sink
        self.pressed = self.relayed = False
        self.previous = None

    def __enter__(self):
        import signal

        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, signum, frame):
        if self.pressed:
            print("[raytrainer] interrupted: the run is abandoned; its last committed checkpoint stays, and the "
                  "same command (or call) again resumes from it", flush=True)
            raise KeyboardInterrupt
        self.pressed = True

    def relay(self):
        if self.pressed and not self.relayed:
            import ray
            from tqdm.auto import tqdm

            self.relayed = True
            # Above the driver's progress bar, if one is shown (a plain print landed on the bar's line). Not in
            # the signal handler: tqdm takes its lock to write.
            tqdm.write("[raytrainer] interrupted: saving a checkpoint at the next step, then stopping "
                       "(Ctrl-C again to abandon the run)")
            sys.stdout.flush()
            ray.get(self.sink.request_stop.remote("interrupt"))

    def __exit__(self, *exc):
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False


def describe(error: BaseException) -> str:
    return str(_unwrap(error))


def _unwrap(error: BaseException) -> BaseException:
    """Ray Train wraps worker errors; give the user the first worker's own error message."""
    failures = getattr(error, "worker_failures", None)
    if failures:
        from .failures import first_worker_error

        unwrapped = TrainingError(first_worker_error(failures))
        unwrapped.worker_traceback = next((getattr(getattr(e, "cause", None), "worker_traceback", "")
                                           for _, e in sorted(failures.items())), "")
        return unwrapped
    return TrainingError(str(error))
