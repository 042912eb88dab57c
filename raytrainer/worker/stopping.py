"""Stopping at a step boundary with a committed checkpoint: a preemption, or the driver's Ctrl-C.

A preemption is a SIGTERM to any worker (what Kubernetes and cloud schedulers send before they reclaim a
node) or Ray Core draining a worker's node (Ray Train then sets the worker's preemption info). The SIGTERM
handler only sets a flag; after each step every rank puts its own flags into the next step's one all-reduce
(`worker/step_sync.py`), which runs beside that step and is read at the start of the step after it (or when the
loop ends). So a request raised during step s is seen by all ranks after step s + 1 (principle 1): each saves
at that step, and:

- preemption: once the checkpoint is committed, every rank reports itself preempted to Ray Train
  (`preemption_context`, the field Ray's own drain watcher sets) and waits. The controller moves to its
  PreemptingState, finds the deadline passed at its next poll (every 2 s), and restarts the worker group
  from the newest committed checkpoint, counting a *preemption* (`FailureConfig.max_preemption_failures`),
  not a failure: `max_failures` is untouched. Returning instead would end the run as finished, and raising
  would count a failure.
- interrupt (Ctrl-C on the driver, relayed by the event sink): the run ends as if a callback stopped it, and
  `train()` raises KeyboardInterrupt; `train(resume_from_checkpoint=True)` continues.

The hosted mode uses the same parts inside HF's loop (worker/hosted/stops.py): its relay stages and exchanges
the flags at exchange steps about 0.2 s apart (HF's loop needs no per-step exchange of raytrainer's), and a job
takes SIGTERM once for all its Trainers (`take_sigterm`).

Ray's worker process installs its own SIGTERM handler (exit at once). Signal handlers can only be set from
a process's main thread, and the training function runs in another thread, so ours is installed by a
task on this worker's own actor (its tasks run on the main thread).
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from typing import List, Optional

from ..protocol import Reason
from .step_sync import BITS, StepSync, rank_bits, ranks_in, set_rank_bit

logger = logging.getLogger("raytrainer")

NOTHING, INTERRUPT, PREEMPT = 0, 1, 2
# A worker group that reported itself preempted and was not torn down by then has met a Ray Train that does
# not act on preemption info: fail (a counted failure) rather than wait for ever.
HAND_OVER_TIMEOUT_S = 120.0
# How often a rank asks Ray Train for its preemption info and rank 0 asks the driver for a Ctrl-C (a Ray call
# each), at most: not every step. Our own SIGTERM flag is read every step (it costs nothing).
POLL_S = 0.2

_sigterm = threading.Event()


def _on_sigterm(signum, frame):
    _sigterm.set()


def sigterm_event() -> threading.Event:
    """Set once this process got SIGTERM, where our handler is installed (a hosted job watches it: its loop is
    HF's, which never reads it)."""
    return _sigterm


def _install_on_main_thread() -> bool:
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def take_sigterm() -> bool:
    """This worker process's SIGTERM becomes a flag (cleared first: the process may have run earlier jobs);
    False if the handler could not be installed. A hosted job takes it once, for all its Trainers."""
    _sigterm.clear()
    return install_sigterm_handler()


def install_sigterm_handler() -> bool:
    """Make SIGTERM a preemption request in this Ray Train worker; False (and a warning) if that fails."""
    import ray

    try:
        actor = ray.get_runtime_context().current_actor
        return bool(ray.get(actor.execute.remote(_install_on_main_thread), timeout=60))
    except Exception as exc:  # a Ray Train without RayTrainWorker.execute: SIGTERM stays Ray's (a failure)
        logger.warning("Could not install the SIGTERM handler (%s: %s): a SIGTERM will count as a worker "
                       "failure, not a preemption.", type(exc).__name__, exc)
        return False


def _ray_preemption_pending() -> bool:
    """Whether Ray Train's drain watcher marked this worker's group as being preempted."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        return get_train_context().preemption_context.preemption_info is not None
    except Exception:
        return False


class StopSignals:
    def __init__(self, ctx, emitter, on_ray: bool, sync: StepSync, sigterm_taken: bool = False):
        """`sigterm_taken`: the caller made SIGTERM a flag already (`take_sigterm`), a hosted job for all its
        training loops; else it is taken here, on Ray."""
        self.ctx = ctx
        self.emitter = emitter
        self.on_ray = on_ray
        self.reason: Optional[str] = None  # "preemption" or "interrupt", once agreed
        self.ranks: List[int] = []  # the ranks that asked
        self._watch = emitter.stop_watch() if ctx.is_main else None
        self._polled = -math.inf  # when Ray's preemption info and the driver's stop were last asked
        self._words = rank_bits(ctx.world_size)
        self._slot = sync.slot(2 * self._words)  # the preempting ranks' bits, then the interrupting ranks'
        if on_ray and not sigterm_taken:
            take_sigterm()

    def stage(self) -> None:
        """Every rank, after every step: this rank's request, for the next exchange (its own bit). The Ray calls
        behind it run at most every POLL_S; a request they find is sticky, so no step loses it."""
        local = NOTHING
        poll = time.monotonic() - self._polled >= POLL_S
        if poll:
            self._polled = time.monotonic()
        if self.on_ray and (_sigterm.is_set() or (poll and _ray_preemption_pending())):
            local = PREEMPT
        elif poll and self._watch is not None and self._watch.requested():
            local = INTERRUPT
        if local == NOTHING:
            return
        words = [0] * (2 * self._words)
        set_rank_bit(words, self.ctx.rank + (0 if local == PREEMPT else self._words * BITS))
        self._slot.put(*words)

    def agreed(self) -> Optional[str]:
        """After the exchange that carried the staged requests: the agreed reason to stop, or None. A
        preemption anywhere outranks an interrupt; every rank also learns which ranks asked."""
        totals = self._slot.totals
        for reason, words in (("preemption", totals[:self._words]), ("interrupt", totals[self._words:])):
            ranks = ranks_in(words)
            if ranks:
                self.reason, self.ranks = reason, ranks
                return reason
        return None

    def describe(self) -> str:
        if self.reason == "interrupt":
            return "interrupted on the driver (Ctrl-C)"
        return f"preemption: SIGTERM or node drain on rank {', '.join(map(str, self.ranks))}"

    def hand_over(self, global_step: int, checkpoint: Optional[str]):
        """After the preemption checkpoint committed: tell the driver why this group ends, report the group
        preempted to Ray Train, and wait to be torn down (the restart resumes from that checkpoint)."""
        if self.ctx.is_main:
            self.emitter.emit("preempted", global_step=global_step, checkpoint=checkpoint, cause=self.describe())
            self.emitter.flush(wait=True)
            self.emitter.record_cause(Reason.PREEMPTION, self.describe())
        report_preempted(self.ctx.rank)
        time.sleep(HAND_OVER_TIMEOUT_S)
        raise RuntimeError(f"Preempted at step {global_step} and checkpointed, but Ray Train did not restart the "
                           f"worker group within {HAND_OVER_TIMEOUT_S:.0f} s.")


def report_preempted(rank: int) -> None:
    """Tell Ray Train that this worker's group is being preempted (the field its drain watcher sets), with a
    deadline already passed: it restarts the group at its next poll, counting a preemption, instead of waiting
    out a drain window. Any thread of the worker process may call it (the train context is the process's)."""
    import ray
    from ray.train.v2._internal.execution.context import get_train_context
    from ray.train.v2.api.preemption import PreemptionInfo

    node = ray.get_runtime_context().get_node_id()
    get_train_context().preemption_context.preemption_info = PreemptionInfo(
        deadline_ms=int(time.time() * 1000), preempted_node_to_ranks={node: [rank]})
