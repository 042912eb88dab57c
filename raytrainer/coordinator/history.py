"""The run's memory of its worker groups: why the current one is ending, and every restart and resize so far.

A worker group that never saved a checkpoint leaves no trace in the next group's checkpoint, so the event
sink (`sink.py`) keeps this for the job in flight, across the groups Ray Train starts for it. Why a group
ends comes from three places, before the next group starts: Ray Train's `UserCallback` on a failure and its
controller on a resize (`failures.py`), and rank 0 after a preemption checkpoint (`worker/stopping.py`).
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

from ..protocol import GroupStart, Reason, RestartHistory

RESIZE_FIELDS = ("global_step", "time", "previous_world_size", "world_size", "cause", "checkpoint")


class RunHistory:
    """One job's: a fresh one for each job the driver posts."""

    def __init__(self):
        self._cause: Optional[Dict[str, str]] = None  # why the next worker group starts
        self._world_size: Optional[int] = None  # the current worker group's
        self._restarts: List[Dict[str, Any]] = []
        self._resizes: List[Dict[str, Any]] = []

    @property
    def preempted(self) -> bool:
        return bool(self._cause and self._cause["reason"] == Reason.PREEMPTION.value)

    def record_cause(self, reason: Reason, cause: str, waiting: bool = False):
        """Why the current worker group is about to end. A preemption or a hang is not overwritten by what
        follows from it (ranks torn down after it saved; the failure Ray Train reports for the ended worker),
        except a hang seen by a rank `waiting` in a collective, by the hang of the rank it waited for."""
        current = self._cause
        if current and current["reason"] in (Reason.PREEMPTION.value, Reason.HANG.value):
            if not (current.get("waiting") and Reason(reason) is Reason.HANG and not waiting):
                return
        self._cause = {"reason": Reason(reason).value, "cause": cause, **({"waiting": True} if waiting else {})}

    def group_started(self, start: GroupStart) -> Optional[RestartHistory]:
        """None for the job's first group; else the restart record (the cause recorded since the previous
        group started), the resize record if the world size changed, and the history so far."""
        previous, self._world_size = self._world_size, start.world_size
        cause, self._cause = self._cause, None
        if previous is None:
            return None
        cause = {k: v for k, v in cause.items() if k != "waiting"} if cause else {
            "reason": Reason.RESTART.value, "cause": "worker group restarted by Ray Train"}
        restart = {"global_step": start.global_step, **cause, "time": time.time(), "checkpoint": start.checkpoint,
                   "world_size": start.world_size, "previous_world_size": previous}
        self._restarts.append(restart)
        resize = None
        if previous != start.world_size:
            resize = {k: restart[k] for k in RESIZE_FIELDS}
            resize["gradient_accumulation_steps"] = start.gradient_accumulation_steps
            resize["same_global_batch"] = start.keeps_global_batch
            self._resizes.append(resize)
        return RestartHistory(restart=restart, resize=resize, restarts=tuple(self._restarts),
                              resizes=tuple(self._resizes))
