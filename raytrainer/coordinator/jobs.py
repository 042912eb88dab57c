"""The job board of a long-lived worker group: the driver posts one job at a time, every rank takes it.

A `Trainer` keeps one Ray Train worker group between `train()`, `evaluate()` and `predict()` calls
(`group.py`): one `fit()` whose worker function asks this board for the next job, runs it, and asks again
(`worker/entry.py`). It lives in the event sink's actor (`EventSink` mixes it in), so the driver's one
channel to the workers also carries their work.

What the board decides:
- **Re-serving.** A job stays "running" until rank 0 hands in its result. A worker group that Ray Train
  starts in place of a failed one asks for a job without having seen one, and gets the running job again:
  a train job resumes from its run's newest committed checkpoint, an evaluation or prediction runs again.
- **Failures are counted per job.** Ray Train is told to restart without limit (its count would span every
  call the group ever serves); the board counts the failures of the job in flight against that job's
  `max_failures`, and past it marks the job failed, which the driver raises. A failure is the job's only
  if every rank of the failed group had taken it: a worker lost between calls is often noticed by Ray
  Train only after the next job was posted, and that job then runs again on the replaced group. Ray Train still replaces the
  failed group, and the replacement waits for the next job: a user error leaves the group usable.
- **Idle release.** With no job in flight for `idle_timeout_s`, the board closes: the ranks' waits return
  None, the worker function returns and Ray Train releases the group. So does `close()`.
- **A group that cannot stay up.** Failures while no job is in flight (a worker lost between calls) are
  replaced silently, but past `IDLE_FAILURE_LIMIT` in a row the board gives up and the group is aborted.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Dict, List, Optional

IDLE_FAILURE_LIMIT = 3


class JobBoard:
    def _init_board(self, idle_timeout_s: float):
        self._idle_timeout_s = idle_timeout_s
        self._job: Optional[Dict[str, Any]] = None
        self._closed: Optional[str] = None  # why the board closed ("close", "idle ..."), once it has
        self._idle_since = time.monotonic()
        self._changed = asyncio.Event()
        self._idle_failures: List[str] = []
        self._controller = None  # Ray Train's controller actor: the driver aborts a group through it

    def _notify(self):
        self._changed.set()
        self._changed = asyncio.Event()  # waiters hold the old, set event and re-check

    # ------------------------------------------------------------------ the driver's side
    async def post_job(self, spec: Dict[str, Any], max_failures: int) -> Dict[str, Any]:
        """Post the next job. Not posted when the board has closed (idle timeout): the driver then starts a
        new group. Returns the failures the group went through while idle, for the driver to tell."""
        if self._closed:
            return {"posted": False, "closed": self._closed}
        self._job = {"id": spec["id"], "spec": spec, "state": "running", "failures": 0,
                     "max_failures": max_failures, "error": None, "taken": set(), "world_size": None}
        idle, self._idle_failures = self._idle_failures, []
        self._notify()
        return {"posted": True, "idle_failures": idle}

    async def close_board(self, reason: str = "close") -> bool:
        """Close the board; returns whether a job was still running (the driver then aborts the group)."""
        if not self._closed:
            self._closed = reason
            self._notify()
        return self._job is not None and self._job["state"] == "running"

    # ------------------------------------------------------------------ the workers' side
    async def next_job(self, last_id: Optional[str], rank: int, world_size: int) -> Optional[Dict[str, Any]]:
        """The running job if this rank has not taken it yet (`last_id`: the last one it took), else wait for
        one; None once the board has closed, or when it closes now for having been idle too long."""
        while True:
            if self._closed:
                return None
            job = self._job
            running = job is not None and job["state"] == "running"
            if running and job["id"] != last_id:
                job["taken"].add(rank)
                job["world_size"] = world_size
                return job["spec"]
            timeout = None
            if not running:
                timeout = self._idle_since + self._idle_timeout_s - time.monotonic()
                if timeout <= 0:
                    await self.close_board(f"idle for {self._idle_timeout_s:g} s")
                    return None
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), timeout)
            except asyncio.TimeoutError:
                pass

    def _finish_job(self, job_id: str, state: str, error: Optional[str] = None) -> bool:
        job = self._job
        if job is None or job["id"] != job_id or job["state"] != "running":
            return False
        job["state"], job["error"] = state, error
        self._idle_since = time.monotonic()
        if self._idle_timeout_s == 0:  # released after every job: the next one must not find it open
            self._closed = "released after the job (worker_idle_timeout_s=0)"
        self._notify()
        return True

    # ------------------------------------------------------------------ failures (from Ray Train's controller)
    def _count_failure(self, cause: str, message: str, preempted: bool, fatal: bool = False) -> Dict[str, Any]:
        """A worker group failed. Returns {"job": the id if a job was in flight, "failed": whether that job is
        now failed, "give_up": whether the group should be aborted}. A preemption is Ray Train's to count
        (max_preemptions), not the job's."""
        job = self._job
        if job is None or job["state"] != "running":
            self._idle_failures.append(cause)
            return {"job": None, "failed": False, "give_up": len(self._idle_failures) > IDLE_FAILURE_LIMIT}
        self._idle_failures = []
        taken_by_all = job["world_size"] is not None and len(job["taken"]) >= job["world_size"]
        job["taken"] = set()  # the next group takes it afresh
        if taken_by_all and not preempted:
            job["failures"] += 1
        limit = job["max_failures"]
        failed = fatal or (limit != -1 and job["failures"] > limit)  # fatal: a restart cannot help (storage)
        if failed:
            self._finish_job(job["id"], "failed", message)
        return {"job": job["id"], "failed": failed, "give_up": False}

    async def set_controller(self, controller) -> bool:
        self._controller = controller
        return True

    async def controller(self):
        return self._controller
