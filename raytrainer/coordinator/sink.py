"""The event sink: the one actor between a worker group and the driver (`protocol.py` lists its calls).

Ray Train V2 keeps no metrics reported without a checkpoint, so a run's stream is ours. `group.py` runs an
`EventSink` as an async Ray actor on the driver's node for a worker group's life (on a worker node it would
die with that node); it outlives the group's restarts, so the driver sees one stream per job. It is made of:

- the job board (`jobs.py`): what the workers run; re-serving, per-job failure counts, idle close;
- the event stream (`stream.py`): events, control requests and their decisions, results, failures, stalls,
  in arrival order, for the driver's pump (`pump.py`);
- the run history (`history.py`): why a group ended, every restart and resize of the job;
- the result of the job and the driver's Ctrl-C (a stop request).

The stream, history, result and stop request are per job: posting a job starts them afresh. The class is
plain (no Ray) until `ray.remote` wraps it, so its rules are tested on an asyncio loop
(`tests/coordinator/`). `DirectSink` is the same channel for `num_workers=0`, in the driver process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import sys
import threading
import time
from typing import Any, List, Optional, Sequence

from ..protocol import (
    ClaimRequest,
    ControlRequest,
    Decision,
    Failure,
    GroupStart,
    HostedClaim,
    HostedClaimReply,
    Job,
    JobFailed,
    Posted,
    Reason,
    RestartHistory,
    ResultReady,
    Stall,
)
from .handlers import JobHandlers
from .history import RunHistory
from .jobs import DONE, JobBoard
from .stream import EventStream


class EventSink:
    def __init__(self, idle_timeout_s: float = 0.0):
        self.board = JobBoard(idle_timeout_s)
        self._request_ids = itertools.count()  # across jobs: a late answer never meets another job's request
        self._taken: Optional[str] = None  # the last job whose result the driver has read
        self._controller = None  # Ray Train's controller actor: the driver aborts a group through it
        self._placement_group: Optional[str] = None  # the hex id of its worker group's placement group
        self._stop: Optional[asyncio.Event] = None
        self._new_job()

    def _new_job(self):
        """What belongs to one job (a train, evaluate or predict call): a fresh start for each. Messages still
        queued are a finished job's stragglers, or a replaced group's while idle (`post_job` tells those)."""
        self.stream = EventStream(self._request_ids)
        self.history = RunHistory()
        self._result: Any = None
        stale, self._stop = self._stop, asyncio.Event()
        self._stop_reason: Optional[str] = None
        if stale is not None:  # a finished job's stop watch returns (None) now rather than hold a call 30 s
            stale.set()

    # ------------------------------------------------------------------ the job board
    async def post_job(self, job: Job, max_failures: int) -> Posted:
        """Post the next job and start its stream afresh (no await in between: no worker call runs before
        both are done)."""
        posted = self.board.post(job, max_failures)
        if posted.posted:
            self._new_job()
        return posted

    async def close_board(self, reason: str = "close") -> bool:
        """Close the board; True if a job was still running (the driver then aborts the group)."""
        return self.board.close(reason)

    async def next_job(self, last_id: Optional[str], rank: int, world_size: int) -> Optional[Job]:
        job = await self.board.next_job(last_id, rank, world_size)
        if job is not None and rank == 0:  # stamped on the driver's node: the end of the group's start
            job = dataclasses.replace(job, taken_at=time.time())
        return job

    async def set_controller(self, pickled: bytes) -> bool:
        self._controller = pickled  # Ray Train's controller actor handle, pickled (failures.ControllerRecorder)
        return True

    async def controller(self) -> Optional[bytes]:
        return self._controller

    async def set_placement_group(self, hex_id: str) -> bool:
        self._placement_group = hex_id  # the newest worker group's (failures.ControllerRecorder)
        return True

    async def placement_group(self) -> Optional[str]:
        return self._placement_group

    # ------------------------------------------------------------------ events and control
    async def push(self, messages: Sequence[Any]) -> int:
        return self.stream.put(messages)

    async def push_and_await(self, events: Sequence[Any]) -> Decision:
        """Queue `events` and a control request; return the driver's decision once it has seen them."""
        return await self.stream.ask(events, lambda request: ControlRequest(id=request))

    async def decide(self, request: int, decision: Decision) -> bool:
        return self.stream.answer(request, decision)

    async def push_and_claim(self, events: Sequence[Any], claim: HostedClaim, job: Optional[str] = None
                             ) -> HostedClaimReply:
        """Queue `events` and the hosted claim; return the driver's reply once it has seen them."""
        return await self.stream.ask(events, lambda request: ClaimRequest(id=request, claim=claim, job=job))

    async def answer_claim(self, request: int, reply: HostedClaimReply) -> bool:
        return self.stream.answer(request, reply)

    async def wait_events(self, timeout_s: float) -> List[Any]:
        """Every message so far; waits up to `timeout_s` for one when there is none."""
        return await self.stream.take(timeout_s)

    async def report_stall(self, stall: Stall) -> bool:
        """The hang watchdog's report: the driver prints it as a warning."""
        self.stream.put([stall])
        return True

    # ------------------------------------------------------------------ the result
    async def set_result(self, result: Any, job: Optional[str] = None) -> bool:
        """Hold rank 0's result, end the job, and tell the driver's pump (`ResultReady`) to take it."""
        self._result = result
        if job is not None:
            self.board.finish(job, DONE)
        self.stream.put([ResultReady(job)])
        return True

    async def get_result(self) -> Any:
        return self._result

    # The trained weights in a result are an object that rank 0 put into the store: it owns the object,
    # which is lost when the worker exits. So rank 0 waits until the driver says it has read them.
    async def mark_result_taken(self, job: Optional[str] = None) -> bool:
        self._taken = job
        self.board.notify()
        return True

    async def wait_result_taken(self, job: Optional[str], timeout_s: float) -> bool:
        """True once the driver has read `job`'s result. Not per-job state that post_job resets: rank 0's
        wait can arrive after the driver read the result and posted the next job (then it is read, too)."""
        deadline = time.monotonic() + timeout_s
        while not (self._taken == job or self.board.current_id not in (None, job)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await self.board.wait_changed(remaining)
        return True

    # ------------------------------------------------------------------ failures and restarts
    async def record_failure(self, cause: str, message: str, fatal: bool = False, raised_by: tuple = ()) -> bool:
        """Called by the coordinator's Ray Train callback when a worker group fails: the job in flight is
        re-served to the next group, or failed with `message` once past its max_failures (`JobBoard`).
        Returns True when the group should be given up."""
        counted = self.board.count_failure(cause, message, self.history.preempted, fatal, raised_by)
        if counted.job is not None and not counted.failed and counted.failures:  # the restart line says what is left
            allowed = "no limit" if counted.limit == -1 else f"max_failures={counted.limit}"
            cause = f"{cause} (failure {counted.failures}, {allowed})"
        self.history.record_cause(Reason.FAILURE, cause)
        if counted.job is not None:
            kind = JobFailed if counted.failed else Failure
            self.stream.put([kind(job=counted.job, cause=cause, error=message)])
        return counted.give_up

    async def record_cause(self, reason: Reason, cause: str, waiting: bool = False) -> bool:
        """Why the current worker group is about to end (`RunHistory.record_cause`)."""
        self.history.record_cause(reason, cause, waiting)
        return True

    async def group_started(self, start: GroupStart) -> Optional[RestartHistory]:
        """Rank 0 of each new worker group calls this once (`RunHistory.group_started`)."""
        return self.history.group_started(start)

    # ------------------------------------------------------------------ Ctrl-C
    # The workers save at the end of the step after the one in progress and stop. Rank 0 keeps one wait_stop call
    # in flight and checks it without blocking (at most every 0.2 s), so an uninterrupted run pays no round trip.
    async def request_stop(self, reason: str) -> bool:
        self._stop_reason = reason
        self._stop.set()
        return True

    async def wait_stop(self, timeout_s: float) -> Optional[str]:
        stop = self._stop
        try:
            await asyncio.wait_for(stop.wait(), timeout_s)
        except asyncio.TimeoutError:
            return None
        return self._stop_reason if stop is self._stop else None


def tell_stall(stall: Stall):
    """A hang report, as a warning line on the driver's console (stderr, as raytrainer's other warnings)."""
    print(stall.describe(), file=sys.stderr, flush=True)


class DirectSink:
    """The sink for `num_workers=0`: events are dispatched to the driver's handlers as they are emitted, in the
    emitting thread. Checkpoint commits are reported from the checkpoint writer's thread while the training
    thread reports its steps: one at a time, as the Ray sink's pump takes them. Two at once ran the driver's
    callbacks concurrently on one TrainerState, and a late save's step (checkpoint-2's `global_step` 2) could
    overwrite the step of a log whose callbacks were running: W&B then got step 4's log at step 2 and dropped
    it as older than its current step (tests/callbacks/test_channel.py)."""

    def __init__(self, handlers: JobHandlers):
        self.handlers = handlers
        self._result: Any = None
        self._one_at_a_time = threading.RLock()  # re-entered by push_and_await and push_and_claim

    def push(self, messages):
        with self._one_at_a_time:
            for message in messages:
                if isinstance(message, Stall):
                    tell_stall(message)
                else:
                    self.handlers.handle_event(message.as_callback_event())
        return len(messages)

    def push_and_await(self, events):
        with self._one_at_a_time:  # the decision is on these events, not on another thread's after them
            self.push(events)
            return self.handlers.decide()

    def push_and_claim(self, events, claim: HostedClaim, job=None) -> HostedClaimReply:
        with self._one_at_a_time:
            self.push(events)
            return self.handlers.answer_claim(claim)

    def report_stall(self, stall: Stall):
        return self.push([stall])

    def set_result(self, result, job=None):
        self._result = result
        return True

    def wait_result_taken(self, job, timeout_s):
        return True  # the driver is this process: it has the result once the job returns

    def group_started(self, start):
        return None

    def record_cause(self, reason, cause, waiting=False):
        return True
