"""The one channel between workers and the driver: events (progress, logs, evaluations, saves, restarts),
control decisions, and the final result.

Ray Train V2 keeps no metrics reported without a checkpoint, so the run's stream is ours: an `EventSink`
owned by the driver (an async Ray actor, or `DirectSink` in the driver process for `num_workers=0`).
Workers append; the driver waits on it and runs callbacks. The sink outlives worker-group restarts, so the
driver sees one stream for the whole run.

Workers buffer events and send them in batches (at most every `flush_interval_s`, and at once for logs,
evaluations and saves), so observing a step costs no remote call. Only when a driver callback can change
control does rank 0 ask for a decision (`request_control`): its buffered events and the request travel in
one call, which returns when the driver has run the callbacks on them and answered.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Dict, List, Optional

from ..coordinator.jobs import JobBoard

# Events that the driver should see as soon as they happen. Logs are not among them: with logging_steps=1
# a send per step costs the 2 training processes CPU (measured 1.21x with, see benchmarks/events.py); they
# reach the driver within `flush_interval_s`.
URGENT = frozenset({"train_begin", "evaluate", "save", "preempted", "restart", "resize", "train_end",
                    "error"})


class EventSink(JobBoard):
    """Collects events from every worker, hands control decisions back, holds the result (from rank 0).

    Run as an async Ray actor, so `push_and_await` and `wait_events` wait without blocking. Ray does not
    promise that an async actor starts one caller's calls in order: the emitter makes its earlier pushes
    land before it asks for a decision (`Emitter.request_control`). It is also the worker group's job board
    (`coordinator/jobs.py`): the state above is per job, reset when the driver posts one."""

    def __init__(self, idle_timeout_s: float = 0.0):
        self._events: List[Dict[str, Any]] = []
        self._arrived = asyncio.Event()
        self._decisions: Dict[int, asyncio.Future] = {}
        self._next_request = 0
        self._taken: Optional[str] = None  # the last job whose result the driver has read
        self._init_board(idle_timeout_s)
        self._new_job()

    async def post_job(self, spec: Dict[str, Any], max_failures: int) -> Dict[str, Any]:
        """`JobBoard.post_job`, and a fresh start of the per-job state (no await in between: no worker call
        runs before both are done)."""
        posted = await super().post_job(spec, max_failures)
        if posted["posted"]:
            self._new_job()
        return posted

    def _new_job(self):
        """What belongs to one job (a train, evaluate or predict call): a fresh start for each. Events still
        queued are a finished job's stragglers, or a replaced group's while idle (`post_job` tells those)."""
        self._events = []
        self._result: Any = None
        self._cause: Optional[Dict[str, str]] = None  # why the next worker group starts: see group_started
        self._world_size: Optional[int] = None  # the current worker group's
        self._history: Dict[str, List[dict]] = {"restarts": [], "resizes": []}
        stale = getattr(self, "_stop", None)
        self._stop = asyncio.Event()
        self._stop_reason: Optional[str] = None
        if stale is not None:  # a finished job's stop watch returns (None) now rather than hold a call 30 s
            stale.set()

    async def push(self, events: List[Dict[str, Any]]) -> int:
        self._events.extend(events)
        self._arrived.set()
        return len(events)

    async def push_and_await(self, events: List[Dict[str, Any]]) -> Dict[str, bool]:
        """Append `events` and a control request; return the driver's decision once it has seen them."""
        request = self._next_request
        self._next_request += 1
        future = asyncio.get_running_loop().create_future()
        self._decisions[request] = future
        await self.push(events + [{"kind": "control_request", "rank": 0, "time": time.time(), "id": request}])
        try:
            return await future
        finally:
            self._decisions.pop(request, None)

    async def decide(self, request: int, flags: Dict[str, bool]) -> bool:
        future = self._decisions.get(request)
        if future is not None and not future.done():
            future.set_result(flags)
        return True

    async def wait_events(self, timeout_s: float) -> List[Dict[str, Any]]:
        """Every event so far; waits up to `timeout_s` for one when there is none."""
        if not self._events:
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        events, self._events = self._events, []
        self._arrived.clear()
        return events

    async def set_result(self, result: Any, job: Optional[str] = None) -> bool:
        """Hold rank 0's result, end the job, and tell the driver's pump (a `result_ready` event) to take it."""
        self._result = result
        if job is not None:
            self._finish_job(job, "done")
        await self.push([{"kind": "result_ready", "rank": 0, "time": time.time(), "job": job}])
        return True

    async def get_result(self) -> Any:
        return self._result

    # The trained weights in a result are an object that rank 0 put into the store: it owns the object,
    # which is lost when the worker exits. So rank 0 waits until the driver says it has read them.
    async def mark_result_taken(self, job: Optional[str] = None) -> bool:
        self._taken = job
        self._notify()
        return True

    async def wait_result_taken(self, job: Optional[str], timeout_s: float) -> bool:
        """True once the driver has read `job`'s result. Not a per-job event that post_job resets: rank 0's
        wait can arrive after the driver read the result and posted the next job (then it is read, too)."""
        deadline = time.monotonic() + timeout_s
        while not (self._taken == job or (self._job is not None and self._job["id"] != job)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except asyncio.TimeoutError:
                pass
        return True

    async def record_failure(self, cause: str, message: str, fatal: bool = False) -> bool:
        """Called by the coordinator's Ray Train callback when a worker group fails: the job in flight is
        re-served to the next group, or failed with `message` once past its max_failures (`JobBoard`).
        Returns True when the group should be given up."""
        preempted = bool(self._cause and self._cause["reason"] == "preemption")
        counted = self._count_failure(cause, message, preempted, fatal)
        await self.record_cause("failure", cause)
        if counted["job"] is not None:
            kind = "job_failed" if counted["failed"] else "failure"
            await self.push([{"kind": kind, "rank": -1, "time": time.time(), "cause": cause, "error": message,
                              "job": counted["job"]}])
        return counted["give_up"]

    async def record_cause(self, kind: str, cause: str) -> bool:
        """Why the current worker group is about to end: "failure" (a worker died or raised), "preemption" (rank 0,
        after the preemption checkpoint committed) or "resize" (Ray Train's elastic monitor). A preemption is
        not overwritten by what follows from it (ranks torn down after it saved)."""
        if not (self._cause and self._cause["reason"] == "preemption"):
            self._cause = {"reason": kind, "cause": cause}
        return True

    async def group_started(self, start: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """Rank 0 of each new worker group calls this once with its world_size, global_step, checkpoint and
        gradient_accumulation_steps. None for the run's first group. Else the restart record (why the previous
        group ended: the cause recorded since it started), the resize record if the world size changed, and
        every restart and resize of this run so far: a group that never saved a checkpoint leaves no trace in
        the next group's checkpoint, so the sink is the run's memory of them."""
        previous, self._world_size = self._world_size, start["world_size"]
        cause, self._cause = self._cause, None
        if previous is None:
            return None
        cause = cause or {"reason": "restart", "cause": "worker group restarted by Ray Train"}
        restart = {"global_step": start["global_step"], **cause, "time": time.time(),
                   "checkpoint": start["checkpoint"], "world_size": start["world_size"],
                   "previous_world_size": previous}
        self._history["restarts"].append(restart)
        resize = None
        if previous != start["world_size"]:
            resize = {k: restart[k] for k in ("global_step", "time", "previous_world_size", "world_size", "cause",
                                              "checkpoint")}
            resize["gradient_accumulation_steps"] = start["gradient_accumulation_steps"]
            self._history["resizes"].append(resize)
        return {"restart": restart, "resize": resize, **{k: list(v) for k, v in self._history.items()}}

    # Ctrl-C on the driver: the workers save at the next step boundary and stop. Rank 0 keeps one wait_stop
    # call in flight and checks it without blocking at each step, so an uninterrupted run pays no round trip.
    async def request_stop(self, reason: str) -> bool:
        self._stop_reason = reason
        self._stop.set()
        return True

    async def wait_stop(self, timeout_s: float) -> Optional[str]:
        try:
            await asyncio.wait_for(self._stop.wait(), timeout_s)
        except asyncio.TimeoutError:
            return None
        return self._stop_reason


class DirectSink:
    """The sink for `num_workers=0`: events are dispatched to the driver's callbacks as they are emitted."""

    def __init__(self, handler):
        self.handler = handler
        self._result: Any = None

    def push(self, events):
        self.handler.handle_all(events)
        return len(events)

    def push_and_await(self, events):
        self.push(events)
        return self.handler.take_control()

    def set_result(self, result, job=None):
        self._result = result
        return True

    def wait_result_taken(self, job, timeout_s):
        return True  # the driver is this process: it has the result once the job returns

    def group_started(self, start):
        return None

    def record_cause(self, kind, cause):
        return True


class Emitter:
    """Worker-side: buffers events and delivers them to the sink (a Ray actor handle or a DirectSink)."""

    def __init__(self, sink: Any, rank: int, flush_interval_s: float = 0.5, job: Optional[str] = None):
        self._sink = sink
        self.job = job  # stamped on every event: the driver reads only the current job's
        self._remote = hasattr(sink, "push") and hasattr(sink.push, "remote")
        self.rank = rank
        self.flush_interval_s = flush_interval_s
        self._buffer: List[Dict[str, Any]] = []
        self._last_flush = time.monotonic()
        self._lock = threading.Lock()
        self._in_flight: List[Any] = []  # refs of pushes not waited for

    def emit(self, kind: str, hold: bool = False, **payload: Any):
        """Buffer an event; send at once if urgent. `hold`: keep it for the control request that follows
        (it then travels in that one call)."""
        # Checkpoint commits are reported from the writer thread: guard the buffer.
        with self._lock:
            self._buffer.append({"kind": kind, "rank": self.rank, "time": time.time(), "job": self.job, **payload})
        if not hold and (kind in URGENT or time.monotonic() - self._last_flush >= self.flush_interval_s):
            self.flush()

    def _take(self) -> List[Dict[str, Any]]:
        with self._lock:
            events, self._buffer = self._buffer, []
            self._last_flush = time.monotonic()
        return events

    def flush(self, wait: bool = False):
        events = self._take()
        if events:
            ref = self._call("push", events, wait=wait)
            if not wait and self._remote:
                with self._lock:
                    self._in_flight = [r for r in self._in_flight if not _done(r)] + [ref]

    def request_control(self) -> Dict[str, bool]:
        """Send what is buffered and wait for the driver's control decision on it. An async actor may start
        a later call before an earlier one: the pushes still in flight land first, so the driver decides on
        every event up to this one."""
        if self._remote:
            import ray

            with self._lock:
                in_flight, self._in_flight = self._in_flight, []
            ray.get(in_flight)
        return self._call("push_and_await", self._take(), wait=True)

    def group_started(self, start: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """See `EventSink.group_started`."""
        return self._call("group_started", start, wait=True)

    def record_cause(self, kind: str, cause: str):
        """Tell the driver why this worker group is ending (before it ends: the next group reads it)."""
        return self._call("record_cause", kind, cause, wait=True)

    def stop_watch(self):
        """A non-blocking view of the driver's stop request (Ctrl-C), for rank 0; None in the driver process."""
        return StopWatch(self._sink) if self._remote else None

    def set_result(self, result: Any):
        """Deliver the run's result; blocks until the sink holds it (the worker may exit right after)."""
        self.flush(wait=True)
        self._call("set_result", result, self.job, wait=True)

    def wait_result_taken(self, timeout_s: float = 1800.0) -> bool:
        """Block until the driver has read the result (see `EventSink.mark_result_taken`)."""
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
    """Rank 0's view of `EventSink.request_stop`: one `wait_stop` call stays in flight; `requested()` checks it
    without blocking (`ray.wait(timeout=0)`) and renews it when it timed out."""

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
