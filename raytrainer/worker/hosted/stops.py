"""Preemption and Ctrl-C in a hosted job: every rank saves at one step of HF's loop, the checkpoint commits,
then the worker group hands over to Ray Train (a preemption: the job resumes from that checkpoint) or the job
ends (Ctrl-C: the driver says which checkpoint holds the run, and the same command continues).

The parts are the own loop's (worker/stopping.py: the SIGTERM flag, Ray Train's preemption info, the driver's
Ctrl-C, the hand-over; worker/step_sync.py: the exchange), placed in HF's loop by the relay:

    on_step_begin(s) at an exchange step: stage this rank's flags (SIGTERM, Ray's preemption info, rank 0: the
                     driver's Ctrl-C) and start the exchange: it runs beside the step's forward and backward
    on_step_end(s)   read it (done by then: no host wait for the step's work); agreed and s < max_steps:
                     should_save and should_training_stop on every rank
    HF saves at s    _save_checkpoint, then the relay's on_save commits it (barrier, manifest) and, for the
                     agreed stop, raises `HostedStop` on every rank: HF's loop and the script unwind (the
                     script's code after train() does not run: the training did not finish)
    run_hosted       a preemption hands over to Ray Train (`StopSignals.hand_over`, counted against
                     max_preemptions); Ctrl-C returns rank 0's runs, the stopped one marked

The exchange runs every `every` steps, not at every step: on gloo one all-reduce costs a step ~1 ms of wall time
on 2 busy cores, whatever its size (its threads' wake-ups take the training threads' cores), which was 15-25 %
of a 5 ms step (benchmarks/README.md). HF's loop needs no collective of raytrainer's for anything else, so the
exchange only has to come often in wall time: rank 0 proposes `every` from its own step time since the last
exchange (about EXCHANGE_S of steps, at least 1, at most MAX_EVERY), the proposal travels in the exchange itself
(the other ranks add 0), and every rank takes the sum when it reads the exchange: the same schedule everywhere,
from the same numbers, whatever each rank's clock says. The first exchange is at each train()'s first step.

So a stop raised during step s - 1 (or at its end: a SIGTERM reaches the flag once Ray's main thread next gets
the GIL) saves at the first exchange step from s on: about EXCHANGE_S of steps later at most, plus the step in
progress, which is not lost.

Outside a training loop (the script's top, an evaluate(), after train()) no step can be agreed on: on a
SIGTERM there the worker reports its group preempted at once, and Ray Train restarts it (a preemption, as
above) from the newest committed checkpoint; a Ctrl-C waits for the next training loop of the job, if any.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Callable, Iterator, Optional

from ...protocol import Reason
from ...verbosity import notice
from ..step_sync import StepSync
from ..stopping import HAND_OVER_TIMEOUT_S, POLL_S, StopSignals, report_preempted, sigterm_event, take_sigterm

logger = logging.getLogger("raytrainer")

# The wall time between two exchanges that rank 0 aims for (Ray's preemption info and the driver's Ctrl-C are
# polled as often: a request is not seen sooner than that anyway), and the most steps between them, which bounds
# a stop's delay in steps where the steps slow down after rank 0 measured them fast.
EXCHANGE_S = POLL_S
MAX_EVERY = 50


class HostedStop(BaseException):
    """Raised on every rank once the stop's checkpoint committed. A BaseException, as KeyboardInterrupt is: a
    script's `except Exception` around train() does not swallow it."""

    def __init__(self, signals: StopSignals, global_step: int, checkpoint: Optional[str]):
        super().__init__(f"{signals.describe()}: stopped at step {global_step}, checkpoint {checkpoint}")
        self.signals, self.global_step, self.checkpoint = signals, global_step, checkpoint

    @property
    def reason(self) -> str:
        return self.signals.reason


class JobStops:
    """One per hosted job on each rank: on Ray, SIGTERM becomes a flag for the job's training loops, and a
    watcher hands the group over to Ray Train on one that comes while no loop runs (no step to save at)."""

    def __init__(self, ctx, emitter, on_ray: bool):
        self.ctx, self.emitter, self.on_ray = ctx, emitter, on_ray
        self.loops = 0  # training loops running (a Trainer's train()): they read the flag
        self.stopping = False  # a stop was agreed and is being carried out: the flag is handled
        self._done = threading.Event()

    def __enter__(self) -> "JobStops":
        self.taken = self.on_ray and take_sigterm()
        if self.taken:
            threading.Thread(target=self._watch, name="raytrainer-hosted-sigterm", daemon=True).start()
        return self

    def __exit__(self, *exc) -> bool:
        self._done.set()
        return False

    @contextlib.contextmanager
    def training(self) -> Iterator[None]:
        """While a Trainer's train() runs: its relay reads the SIGTERM flag at each step."""
        self.loops += 1
        try:
            yield
        finally:
            self.loops -= 1

    def for_loop(self) -> "LoopStops":
        """What one training loop's relay uses (a fresh exchange and stop watch for each train())."""
        return LoopStops(self)

    def _watch(self):
        flag = sigterm_event()
        while not self._done.wait(0.5):  # a poll, not flag.wait(): a set flag a loop owns must not spin here
            if flag.is_set() and not self.loops and not self.stopping:
                self.stopping = True
                self._hand_over_outside_a_loop()

    def _hand_over_outside_a_loop(self):
        """This rank's preemption, with nothing to save: recorded as the group's cause (a preemption, not a
        failure), reported to Ray Train, which tears the group down at its next poll while the job's code goes
        on meanwhile (a commit it may start is atomic); the worker exits if that does not come."""
        rank = self.ctx.rank
        cause = f"preemption: SIGTERM on rank {rank} outside a training loop"
        notice(f"{cause} (no step to save at): Ray Train restarts the worker group from the run's newest "
               "committed checkpoint")
        try:
            report_preempted(rank)
            # Recorded again each second until the group ends: rank 0's group_started (at the group's first
            # train()) takes the cause recorded before it, and without one the restart would count a failure.
            deadline = time.monotonic() + HAND_OVER_TIMEOUT_S
            while time.monotonic() < deadline:
                self.emitter.record_cause(Reason.PREEMPTION, cause)
                if self._done.wait(1.0):  # the job ended first: the idle group restarts
                    return
        except Exception:  # noqa: BLE001 (no Ray Train context: a lost worker instead)
            logger.exception("Could not report the preemption to Ray Train: this worker exits")
        os._exit(143)


class LoopStops:
    """The stop requests of one HF training loop, agreed at the exchange steps (see the module's doc). `clock`:
    rank 0's, for the exchange schedule (a test's)."""

    def __init__(self, job: JobStops, clock: Callable[[], float] = time.monotonic):
        self.job, self.clock = job, clock
        self.sync = StepSync(job.ctx)  # its slots: the stop flags, then rank 0's proposed schedule
        self.signals = StopSignals(job.ctx, job.emitter, job.on_ray, self.sync, sigterm_taken=True)
        self._proposal = self.sync.slot()
        self.every = 1  # steps from one exchange to the next, as last agreed
        self.countdown = 1  # steps until the next exchange: the first at the loop's first step
        self._last: Optional[float] = None  # rank 0: when the last exchange started
        self.in_flight = False  # an exchange started at this step's begin, not read yet
        self.stop_step: Optional[int] = None  # the step every rank saves at and stops after

    def at_step_begin(self) -> None:
        """Every rank, at each on_step_begin: at an exchange step, this rank's requests sent (and on rank 0 the
        next schedule proposed)."""
        if self.stop_step is not None:
            return
        self.countdown -= 1
        if self.countdown > 0 or self.in_flight:
            return
        self.signals.stage()
        if self.job.ctx.is_main:
            self._proposal.put(self._propose())
        self.sync.start()
        self.in_flight = True

    def _propose(self) -> int:
        """Rank 0: the steps until the exchange after this one, from its step time since the last exchange."""
        now, last = self.clock(), self._last
        self._last = now
        if last is None or now <= last:
            return 1
        step_s = (now - last) / self.every
        return max(1, min(MAX_EVERY, round(EXCHANGE_S / step_s)))

    def at_step_end(self, state, control) -> None:
        """Every rank, at each on_step_end: at an exchange step, its sums read; the agreed schedule taken, and a
        stop agreed asks HF to save now and stop (at the last step the run ends anyway: nothing to do)."""
        if not self.in_flight:
            return
        self.in_flight = False
        self.every = self.countdown = max(1, self._proposal.total)
        if self.signals.agreed() is not None and state.global_step < state.max_steps:
            self.stop_step = state.global_step
            control.should_save = True
            control.should_training_stop = True

    def saved(self, global_step: int, checkpoint: str) -> None:
        """After a checkpoint committed (on_save): the stop's checkpoint ends the loop on every rank."""
        if self.stop_step == global_step:
            self._stop(global_step, checkpoint)

    def at_train_end(self, global_step: int, last_checkpoint: Optional[str]) -> None:
        """The loop ended: the exchange in flight waited for (the process group outlives the Trainer). A stop
        agreed whose save HF did not make (save_strategy="best" without a new best) stops here, from the last
        committed checkpoint."""
        self.sync.complete()
        if self.stop_step is not None:
            self._stop(global_step, last_checkpoint)

    def _stop(self, global_step: int, checkpoint: Optional[str]):
        self.job.stopping = True
        raise HostedStop(self.signals, global_step, checkpoint)
