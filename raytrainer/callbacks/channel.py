"""The one channel from workers to the driver: events (progress, logs, evaluations, saves, restarts) and
the final result.

Ray Train V2 keeps no metrics reported without a checkpoint, so the run's stream is ours: an `EventSink`
owned by the driver (a Ray actor, or a plain object in the driver process for `num_workers=0`). Workers
append; the driver drains it and runs callbacks. The sink outlives worker-group restarts, so the driver
sees one stream for the whole run.

Workers buffer events and send them in batches (at most every `flush_interval_s`, and at once for logs,
evaluations and saves), so a step costs no remote call.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional

# Events that the driver should see as soon as they happen.
URGENT = frozenset({"train_begin", "log", "evaluate", "save", "restart", "train_end", "error"})


class EventSink:
    """Collects events from every worker; holds the result of the run (sent by rank 0)."""

    def __init__(self):
        self._events: List[Dict[str, Any]] = []
        self._result: Any = None
        self._has_result = self._result_taken = False
        self._failures: List[str] = []
        self._lock = threading.Lock()

    def push(self, events: List[Dict[str, Any]]) -> int:
        with self._lock:
            self._events.extend(events)
            return len(events)

    def drain(self) -> List[Dict[str, Any]]:
        with self._lock:
            events, self._events = self._events, []
            return events

    def set_result(self, result: Any) -> bool:
        with self._lock:
            self._result, self._has_result = result, True
            return True

    def get_result(self) -> Any:
        with self._lock:
            return self._result

    def has_result(self) -> bool:
        with self._lock:
            return self._has_result

    # The trained weights in a result are an object that rank 0 put into the store: it owns the object,
    # which is lost when the worker exits. So rank 0 waits until the driver says it has read them.
    def mark_result_taken(self) -> bool:
        with self._lock:
            self._result_taken = True
            return True

    def result_taken(self) -> bool:
        with self._lock:
            return self._result_taken

    def record_failure(self, cause: str) -> bool:
        """Called by the coordinator's Ray Train callback when a worker group fails."""
        with self._lock:
            self._failures.append(cause)
            self._events.append({"kind": "failure", "rank": -1, "time": time.time(), "cause": cause})
            return True

    def last_failure(self) -> Optional[str]:
        with self._lock:
            return self._failures[-1] if self._failures else None


class Emitter:
    """Worker-side: buffers events and delivers them to the sink (a Ray actor handle or an EventSink)."""

    def __init__(self, sink: Any, rank: int, flush_interval_s: float = 0.5):
        self._sink = sink
        self._remote = hasattr(sink, "push") and hasattr(sink.push, "remote")
        self.rank = rank
        self.flush_interval_s = flush_interval_s
        self._buffer: List[Dict[str, Any]] = []
        self._last_flush = time.monotonic()
        self._lock = threading.Lock()

    def emit(self, kind: str, **payload: Any):
        # Checkpoint commits are reported from the writer thread: guard the buffer.
        with self._lock:
            self._buffer.append({"kind": kind, "rank": self.rank, "time": time.time(), **payload})
        if kind in URGENT or time.monotonic() - self._last_flush >= self.flush_interval_s:
            self.flush()

    def flush(self, wait: bool = False):
        with self._lock:
            events, self._buffer = self._buffer, []
            self._last_flush = time.monotonic()
        if events:
            self._call("push", events, wait=wait)

    def last_failure(self) -> Optional[str]:
        """Why the previous worker group died, as the coordinator recorded it (None on a first attempt)."""
        return self._call("last_failure", None, wait=True, no_arg=True)

    def set_result(self, result: Any):
        """Deliver the run's result; blocks until the sink holds it (the worker may exit right after)."""
        self.flush(wait=True)
        self._call("set_result", result, wait=True)

    def wait_result_taken(self, timeout_s: float = 1800.0, poll_s: float = 0.05) -> bool:
        """Block until the driver has read the result (see `EventSink.mark_result_taken`)."""
        deadline = time.monotonic() + timeout_s
        while not self._call("result_taken", None, wait=True, no_arg=True):
            if time.monotonic() > deadline:
                return False
            time.sleep(poll_s)
        return True

    def _call(self, method: str, arg: Any, wait: bool, no_arg: bool = False) -> Optional[Any]:
        fn = getattr(self._sink, method)
        call_args = () if no_arg else (arg,)
        if not self._remote:
            return fn(*call_args)
        ref = fn.remote(*call_args)  # actor calls from one caller run in order, so no event overtakes another
        if wait:
            import ray

            return ray.get(ref)
        return None
