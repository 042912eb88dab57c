"""A hang watchdog: a rank that makes no progress is named, then its worker is ended so Ray Train restarts.

One daemon thread per worker process wakes every `poll_s` and looks at the phase the loop marked last
(`phase("forward/backward")`, `phase("on_step_end (callbacks, control)")`, ...). A mark is one
attribute store of a fresh tuple: no lock, no clock, no syscall on the hot path. The thread keeps a
reference to the mark it saw, so a new mark is a new object (it cannot reuse the old one's address) and "the
same object as a second ago" means "no progress since". Idle (a worker's set-up, the time between jobs) is
never a stall.

After `warn_s` without progress the rank, its phase, the stalled time and the innermost frame of the
marking thread are reported (and again every `warn_s`); after `timeout_s` the worker process exits, so Ray
Train sees a dead worker, restarts the group (one failure against max_failures) and the run resumes from
its newest committed checkpoint, as Ray Train's NCCL hang detection does on GPUs. In the driver process
(num_workers=0) it only reports: there is no group to restart, and exiting would end the user's script.

A rank stuck in a collective waits for a stalled peer, and its stall began when it entered that phase, up to
one phase before the peer's. It gives the peer `PEER_GRACE` of the timeout more, so that the stalled rank
ends first and the restart's cause names its line, not the collective; where every rank waits (mismatched
collectives) the group ends at 1.25 x timeout_s.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Callable, Optional

# How a stall inside a collective is named: that rank waits for a stalled peer.
WAITING_FOR_A_PEER = "a collective: waiting for another rank"
# The exit status of a worker ended for a hang (EX_SOFTWARE), visible in Ray's actor-death message.
EXIT_CODE = 70
Report = Callable[[int, str, float], None]
# Where torch's collectives live: a rank stuck in one of them waits for a stalled peer, not the other way round.
COLLECTIVES = os.path.join("torch", "distributed", "")
# The share of timeout_s a rank waiting in a collective adds before it exits (at least two looks).
PEER_GRACE = 0.25


def report_to_stderr(rank: int, phase: str, seconds: float):
    """One line on this worker's stderr (Ray forwards it to the driver console). The loop reports through the
    event sink instead (`Emitter.report_stall`: the driver prints the line); this is the default for a
    watchdog used on its own."""
    print(f"[raytrainer] rank {rank} has made no progress for {seconds:.0f} s in {phase} "
          "(hang_warning_s; hang_timeout_s ends the worker and restarts the group).", file=sys.stderr, flush=True)


def exit_worker(rank: int, phase: str, seconds: float):
    print(f"[raytrainer] rank {rank} stalled for {seconds:.0f} s in {phase}: past hang_timeout_s, this worker "
          "exits so that Ray Train restarts the group from the newest committed checkpoint (a failure against "
          "max_failures). Raise hang_timeout_s if this phase is legitimately that slow.", file=sys.stderr,
          flush=True)
    sys.stdout.flush()
    os._exit(EXIT_CODE)  # not an exception: the stalled thread is stuck, and nothing else would end it


class Watchdog:
    def __init__(self, rank: int, warn_s: float, timeout_s: float, report: Report = report_to_stderr,
                 on_timeout: Optional[Report] = exit_worker, poll_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        self.rank, self.warn_s, self.timeout_s = rank, warn_s, timeout_s
        self.report, self.on_timeout, self.poll_s, self.clock = report, on_timeout, poll_s, clock
        self.mark: Optional[tuple] = None  # (phase,); None: idle
        self.thread_id = threading.get_ident()  # the thread whose frame is named (the loop's)
        self._seen: Optional[tuple] = None
        self._since = clock()
        self._reports = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # ---- the hot path: one attribute store each ----
    def phase(self, name: str):
        self.mark = (name,)  # a new tuple per call (built from the argument, never a folded constant)

    def idle(self):
        self.mark = None

    # ---- the thread ----
    def start(self):
        if self._thread is None and (self.warn_s > 0 or self.timeout_s > 0):
            self._thread = threading.Thread(target=self._run, name="raytrainer-watchdog", daemon=True)
            self._thread.start()

    def stop(self):
        self._stop.set()

    def _run(self):
        while not self._stop.wait(self.poll_s):
            self.check()

    def check(self, now: Optional[float] = None):
        """One look: reset on progress; report past each multiple of warn_s; act past timeout_s."""
        now = self.clock() if now is None else now
        mark = self.mark
        if mark is not self._seen:
            self._seen, self._since, self._reports = mark, now, 0
            return
        if mark is None:
            return
        stalled = now - self._since
        if self.timeout_s > 0 and stalled >= self.timeout_s and self.on_timeout is not None:
            where = self.describe(mark[0])
            grace = max(PEER_GRACE * self.timeout_s, 2 * self.poll_s) if WAITING_FOR_A_PEER in where else 0.0
            if stalled >= self.timeout_s + grace:
                self.on_timeout(self.rank, where, stalled)
                self._since, self._reports = now, 0  # a test's on_timeout returns: report the next stall afresh
                return
        if self.warn_s > 0 and stalled >= self.warn_s * (self._reports + 1):
            self._reports += 1
            self.report(self.rank, self.describe(mark[0]), stalled)

    def describe(self, phase: str) -> str:
        """The phase and the marking thread's innermost frame (file:line, function): the line it is stuck on."""
        frame = sys._current_frames().get(self.thread_id)
        if frame is None:
            return phase
        code = frame.f_code
        waiting = f" ({WAITING_FOR_A_PEER})" if COLLECTIVES in code.co_filename else ""
        return f"{phase} at {source_file(frame)}:{frame.f_lineno} ({code.co_name}){waiting}"


def source_file(frame) -> str:
    """The file of a frame's code. A function shipped by value from the driver (defined in its script) has
    cloudpickle's "<dynamic-code>" as its code's file name, but keeps its module's `__file__` in its globals."""
    name = frame.f_code.co_filename
    if name == "<dynamic-code>":
        return frame.f_globals.get("__file__") or name
    return name


class _Unwatched:
    """Marks that go nowhere: no watched job is running in this process."""

    def phase(self, name: str):
        pass

    def idle(self):
        pass


UNWATCHED = _Unwatched()
_current = UNWATCHED  # this process's watchdog while a watched job runs


def current():
    return _current


@contextlib.contextmanager
def watching(args, rank: int, exit_on_timeout: bool, report: Report = report_to_stderr,
             before_exit: Optional[Report] = None):
    """Watch the job run inside (the training loop). Nested use (an evaluation inside training) keeps the
    outer watchdog. `report(rank, phase, seconds)` is where a stall goes (the driver console); `before_exit`
    is told the stall before the worker ends for it (the restart record's cause)."""
    global _current
    warn_s, timeout_s = getattr(args, "hang_warning_s", 0.0), getattr(args, "hang_timeout_s", 0.0)
    if _current is not UNWATCHED or not (warn_s > 0 or timeout_s > 0):
        yield _current
        return
    def ending(rank: int, phase: str, seconds: float):
        if before_exit is not None:
            try:
                before_exit(rank, phase, seconds)
            except Exception:  # noqa: BLE001 (the driver gone: the worker still ends)
                pass
        exit_worker(rank, phase, seconds)

    dog = Watchdog(rank, warn_s, timeout_s, report=report, on_timeout=ending if exit_on_timeout else None)
    _current = dog
    # Set-up (imports, building and wrapping the model, loading a checkpoint) starts idle: its length depends on
    # the model and the storage, not on a hang, and Ray Train's process-group timeout bounds its collectives.
    # The loop's first mark (on_train_begin) starts the watch.
    dog.start()
    try:
        yield dog
    finally:
        dog.idle()
        dog.stop()
        _current = UNWATCHED


def watching_job(settings, rank: int, exit_on_timeout: bool, emitter):
    """`watching` for a job on a worker (the own loop, a hosted job), its stalls told to the driver through
    `emitter`: the events buffered before the stall are sent first (the log lines of the steps before it reach
    the console, not only the stall line), and the cause of an exit is recorded as a hang for the restart."""
    from ..protocol import Reason

    def report(rank: int, phase: str, seconds: float):
        emitter.flush()
        emitter.report_stall(rank, phase, seconds)

    def record_hang(rank: int, phase: str, seconds: float):
        emitter.record_cause(Reason.HANG, f"rank {rank} made no progress for {seconds:.0f} s in {phase} "
                                          "(hang_timeout_s)", waiting=WAITING_FOR_A_PEER in phase)

    return watching(settings, rank, exit_on_timeout=exit_on_timeout, report=report, before_exit=record_hang)


def watch_events(events, dog):
    """Mark each event before the loop's events object fires it (rank callbacks, the driver's decision, the
    control all-reduce): a rank stalled in `on_step_end` is named so. worker/loop_events.py stays unaware of it."""
    if dog is UNWATCHED:
        return
    fire, names = events.fire, {}

    def watched_fire(event: str, **payload):
        dog.phase(names.get(event) or names.setdefault(event, f"on_{event} (callbacks, control)"))
        return fire(event, **payload)
    events.fire = watched_fire
