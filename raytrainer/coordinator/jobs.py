"""The job board of a long-lived worker group: the driver posts one job at a time, every rank takes it.

A `Trainer` keeps one Ray Train worker group between `train()`, `evaluate()` and `predict()` calls
(`group.py`): one `fit()` whose worker function asks this board for the next job, runs it, and asks again
(`worker/entry.py`). The board is a part of the event sink's actor (`sink.py`), so the driver's one channel
to the workers also carries their work. It is a plain object run on the actor's event loop: no method awaits
between reading and changing its state, so calls that interleave see it whole.

What the board decides:
- **Re-serving.** A job stays "running" until rank 0 hands in its result. A worker group that Ray Train
  starts in place of a failed one asks for a job without having seen one, and gets the running job again:
  a train job resumes from its run's newest committed checkpoint, an evaluation or prediction runs again.
- **Failures are counted per job.** Ray Train is told to restart without limit (its count would span every
  call the group ever serves); the board counts the failures of the job in flight against that job's
  `max_failures`, and past it marks the job failed, which the driver raises. A failure is the job's if
  the job's own code raised on a rank, or if every rank of the failed group had taken it: a worker lost
  between calls is often noticed by Ray Train only after the next job was posted, and that job then runs
  again on the replaced group. (Without the first rule, a user error raised at once could be seen before a
  slower rank took the job, and the job ran again instead of failing.) Ray Train
  still replaces the failed group, and the replacement waits for the next job: a user error leaves the
  group usable.
- **Idle release.** With no job in flight for `idle_timeout_s`, the board closes: the ranks' waits return
  None, the worker function returns and Ray Train releases the group. So does `close()`.
- **A group that cannot stay up.** Failures while no job is in flight (a worker lost between calls) are
  replaced silently, but past `IDLE_FAILURE_LIMIT` in a row the board gives up and the group is aborted.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import List, Optional, Set

from ..protocol import Job, Posted

IDLE_FAILURE_LIMIT = 3

RUNNING, DONE, FAILED = "running", "done", "failed"


@dataclass
class _Entry:
    """The board's record of the job in flight (mutable: it is the board's own, never sent)."""
    job: Job
    max_failures: int
    state: str = RUNNING
    failures: int = 0
    error: Optional[str] = None
    taken: Set[int] = field(default_factory=set)  # the ranks of the current group that took it
    world_size: Optional[int] = None  # the current group's


@dataclass(frozen=True)
class Counted:
    """What a group failure did: `job` the id in flight (None if idle), `failed` whether that job is now
    failed, `give_up` whether the group should be aborted, `failures` the job's failures counted so far and
    `limit` its max_failures (-1: none)."""
    job: Optional[str]
    failed: bool
    give_up: bool
    failures: int = 0
    limit: int = -1


class JobBoard:
    def __init__(self, idle_timeout_s: float = 0.0):
        self.idle_timeout_s = idle_timeout_s
        self._entry: Optional[_Entry] = None
        self.closed: Optional[str] = None  # why the board closed ("close", "idle ..."), once it has
        self._idle_since = time.monotonic()
        self._changed = asyncio.Event()
        self._idle_failures: List[str] = []

    @property
    def current_id(self) -> Optional[str]:
        """The id of the last job posted (running or finished)."""
        return self._entry.job.id if self._entry is not None else None

    @property
    def running(self) -> bool:
        return self._entry is not None and self._entry.state == RUNNING

    def notify(self):
        """Wake every waiter (they re-check what they wait for)."""
        self._changed.set()
        self._changed = asyncio.Event()  # waiters hold the old, set event

    async def wait_changed(self, timeout_s: Optional[float]):
        """Until the next `notify`, at most `timeout_s` (None: no limit)."""
        changed = self._changed
        try:
            await asyncio.wait_for(changed.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass

    # ------------------------------------------------------------------ the driver's side
    def post(self, job: Job, max_failures: int) -> Posted:
        """Post the next job. Not posted when the board has closed (idle timeout): the driver then starts a
        new group. Tells the failures the group went through while idle."""
        if self.closed:
            return Posted(closed=self.closed)
        self._entry = _Entry(job, max_failures)
        idle, self._idle_failures = self._idle_failures, []
        self.notify()
        return Posted(idle_failures=tuple(idle))

    def close(self, reason: str = "close") -> bool:
        """Close the board; returns whether a job was still running (the driver then aborts the group)."""
        if not self.closed:
            self.closed = reason
            self.notify()
        return self.running

    # ------------------------------------------------------------------ the workers' side
    async def next_job(self, last_id: Optional[str], rank: int, world_size: int) -> Optional[Job]:
        """The running job if this rank has not taken it yet (`last_id`: the last one it took), else wait for
        one; None once the board has closed, or when it closes now for having been idle too long."""
        while True:
            if self.closed:
                return None
            entry = self._entry
            if self.running and entry.job.id != last_id:
                entry.taken.add(rank)
                entry.world_size = world_size
                return entry.job
            timeout = None
            if not self.running:
                timeout = self._idle_since + self.idle_timeout_s - time.monotonic()
                if timeout <= 0:
                    self.close(f"idle for {self.idle_timeout_s:g} s")
                    return None
            await self.wait_changed(timeout)

    def finish(self, job_id: str, state: str, error: Optional[str] = None) -> bool:
        """End `job_id` as DONE or FAILED; False if it is not the running job."""
        entry = self._entry
        if entry is None or entry.job.id != job_id or entry.state != RUNNING:
            return False
        entry.state, entry.error = state, error
        self._idle_since = time.monotonic()
        if self.idle_timeout_s == 0:  # released after every job: the next one must not find it open
            self.closed = "released after the job (worker_idle_timeout_s=0)"
        self.notify()
        return True

    # ------------------------------------------------------------------ failures (from Ray Train's controller)
    def count_failure(self, cause: str, message: str, preempted: bool, fatal: bool = False,
                      raised_by: tuple = ()) -> Counted:
        """A worker group failed. A preemption is Ray Train's to count (max_preemptions), not the job's;
        `fatal`: a restart cannot help (storage), the job fails now; `raised_by`: the ids of the jobs whose own
        code raised on a rank (a user error is its job's failure even if another rank had not taken it yet)."""
        entry = self._entry
        if not self.running:
            self._idle_failures.append(cause)
            return Counted(None, False, len(self._idle_failures) > IDLE_FAILURE_LIMIT)
        self._idle_failures = []
        taken_by_all = entry.world_size is not None and len(entry.taken) >= entry.world_size
        entry.taken = set()  # the next group takes it afresh
        if (taken_by_all or entry.job.id in raised_by) and not preempted:
            entry.failures += 1
        limit = entry.max_failures
        failed = fatal or (limit != -1 and entry.failures > limit)
        if failed:
            self.finish(entry.job.id, FAILED, message)
        return Counted(entry.job.id, failed, False, entry.failures, limit)
