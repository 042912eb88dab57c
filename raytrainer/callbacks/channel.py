"""The worker's end of the channel to the driver: events (progress, logs, evaluations, saves, restarts),
control requests, a hosted Trainer's claim of its output_dir, the result, and Ctrl-C.

The other end is the driver's event sink (`coordinator/sink.py`: an async Ray actor, or `DirectSink` in the
driver process for `num_workers=0`); the messages are `protocol.py`'s. This side holds no reference to the
sink's class: it calls the methods that `protocol.py` lists on whatever handle it is given.

Workers buffer events and send them in batches (at most every `flush_interval_s`, and at once for logs,
evaluations and saves), so observing a step costs no remote call. Only when a driver callback can change
control does rank 0 ask for a decision (`request_control`): its buffered events and the request travel in
one call, which returns when the driver has run the callbacks on them and answered.
"""

from __future__ import annotations

import threading
import time
from typing import Any, List, Optional

from ..protocol import ERROR, Decision, Event, GroupStart, HostedClaim, HostedClaimReply, Reason, RestartHistory, Stall

# Events that the driver should see as soon as they happen. Logs are not among them: with logging_steps=1
# a send per step costs the training processes CPU (benchmarks/events.py measures it); they reach the driver
# within `flush_interval_s`.
URGENT = frozenset({"train_begin", "evaluate", "save", "preempted", "restart", "resize", "train_end",
                    ERROR})


class Emitter:
    """Worker-side: buffers events and delivers them to the sink (a Ray actor handle or a DirectSink).

    Ray does not promise that an async actor starts one caller's calls in order: `request_control` makes the
    earlier pushes land before it asks for a decision."""

    def __init__(self, sink: Any, rank: int, flush_interval_s: float = 0.5, job: Optional[str] = None):
        self._sink = sink
        self.job = job  # stamped on every event: the driver reads only the current job's
        self._remote = hasattr(sink, "push") and hasattr(sink.push, "remote")
        self.rank = rank
        self.flush_interval_s = flush_interval_s
        self._buffer: List[Event] = []
        self._last_flush = time.monotonic()
        self._lock = threading.Lock()
        self._in_flight: List[Any] = []  # refs of pushes not waited for

    def emit(self, name: str, hold: bool = False, **payload: Any):
        """Buffer an event; send at once if urgent. `hold`: keep it for the control request that follows
        (it then travels in that one call)."""
        # Checkpoint commits are reported from the writer thread: guard the buffer.
        with self._lock:
            self._buffer.append(Event(name, self.rank, self.job, payload))
        if not hold and (name in URGENT or time.monotonic() - self._last_flush >= self.flush_interval_s):
            self.flush()

    def _take(self) -> List[Event]:
        with self._lock:
            events, self._buffer = self._buffer, []
            self._last_flush = time.monotonic()
        return events

    def flush(self, wait: bool = False):
        """Send what is buffered. `wait`: return once the sink holds it and every earlier push (an async actor
        may start a later call first: a result set after a waited flush must not overtake the job's events)."""
        if wait:
            self._land_pushes()
        events = self._take()
        if events:
            ref = self._call("push", events, wait=wait)
            if not wait and self._remote:
                with self._lock:
                    self._in_flight = [r for r in self._in_flight if not _done(r)] + [ref]

    def request_control(self, wait: bool = True) -> Any:
        """Send what is buffered and ask for the driver's control decision on it: the Decision, or with
        `wait=False` a handle for `answer` (callback_decisions="next_step"). An async actor may start a later
        call before an earlier one: the pushes still in flight land first, so the driver decides on every
        event up to this one (one request is open at a time: the loop takes an answer before it asks again)."""
        self._land_pushes()
        return self._call("push_and_await", self._take(), wait=wait)

    def claim(self, claim: HostedClaim) -> HostedClaimReply:
        """Rank 0 of a hosted job: send what is buffered and the claim, and wait for the driver's reply (it
        answers once it has handled every event before the claim)."""
        self._land_pushes()
        return self._call("push_and_claim", self._take(), claim, self.job, wait=True)

    def _land_pushes(self):
        """An async actor may start a later call before an earlier one: wait for the pushes still in flight."""
        if self._remote:
            import ray

            with self._lock:
                in_flight, self._in_flight = self._in_flight, []
            ray.get(in_flight)

    def answer(self, request: Any) -> Decision:
        """The Decision of a `request_control(wait=False)`, waiting for it if it has not arrived."""
        if self._remote:
            import ray

            return ray.get(request)
        return request

    def group_started(self, start: GroupStart) -> Optional[RestartHistory]:
        """See `coordinator/history.py`: None for the job's first worker group."""
        return self._call("group_started", start, wait=True)

    def record_cause(self, reason: Reason, cause: str, waiting: bool = False):
        """Tell the driver why this worker group is ending (before it ends: the next group reads it). `waiting`:
        this rank only waited for another one (in a collective), whose own cause is the better one."""
        return self._call("record_cause", Reason(reason), cause, waiting, wait=True)

    def report_stall(self, rank: int, phase: str, seconds: float):
        """`rank` has made no progress for `seconds` in `phase`: the hang watchdog's `report` (worker/watchdog.py
        takes this method as it is). Sent at once, without waiting, from any thread; the driver prints it as a
        warning line."""
        self._call("report_stall", Stall(rank, phase, seconds, self.job), wait=False)

    def stop_watch(self):
        """A non-blocking view of the driver's stop request (Ctrl-C), for rank 0; None in the driver process."""
        return StopWatch(self._sink) if self._remote else None

    def set_result(self, result: Any):
        """Deliver the run's result; blocks until the sink holds it (the worker may exit right after)."""
        self.flush(wait=True)
        self._call("set_result", result, self.job, wait=True)

    def wait_result_taken(self, timeout_s: float = 1800.0) -> bool:
        """Block until the driver has read the result (see `coordinator/sink.py`, `mark_result_taken`)."""
        return self._call("wait_result_taken", self.job, timeout_s, wait=True)

    def _call(self, method: str, *args: Any, wait: bool) -> Optional[Any]:
        fn = getattr(self._sink, method)
        if not self._remote:
            return fn(*args)
        ref = fn.remote(*args)
        if wait:
            import ray

            return ray.get(ref)
        return ref


class StopWatch:
    """Rank 0's view of the driver's stop request (Ctrl-C: `request_stop` on the sink). One `wait_stop` call
    stays in flight; `requested()` checks it without blocking (`ray.wait(timeout=0)`) and renews it when it
    timed out."""

    WAIT_S = 30.0

    def __init__(self, sink):
        self._sink = sink
        self._ref = sink.wait_stop.remote(self.WAIT_S)

    def requested(self) -> Optional[str]:
        import ray

        if not _done(self._ref):
            return None
        reason = ray.get(self._ref)
        if reason is None:
            self._ref = self._sink.wait_stop.remote(self.WAIT_S)
        return reason


def _done(ref) -> bool:
    import ray

    ready, _ = ray.wait([ref], timeout=0)
    return bool(ready)
