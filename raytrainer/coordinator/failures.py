"""Tell the event sink why a worker group ends, so the group that replaces it can record and show it.

Ray Train callbacks run in the Ray Train controller actor; they reach the driver's event sink through the
actor handle they were pickled with. Preemptions are recorded by the workers themselves (they know it
first: `worker/stopping.py`).
"""

from __future__ import annotations

import pickle
import re

from ray.train import UserCallback
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback

from ..protocol import Reason
from ..worker.user_errors import WorkerError


def unwrapped(exc: BaseException) -> BaseException:
    """The exception a worker's code raised: Ray Train wraps it (`RayTaskError.cause`); a lost worker's is Ray's."""
    return getattr(exc, "cause", None) or exc


def first_worker_error(worker_failures: dict) -> str:
    """The message a user gets for a failed worker group: the lowest failed rank's own error (Ray Train
    wraps it; its `cause` is the exception the user's code raised). A worker's error is a `WorkerError`, one
    line that names the user's method (worker/user_errors.py); a rank that failed only because a peer died
    in a collective is named after the ranks that failed first."""
    causes = sorted((rank, unwrapped(exc)) for rank, exc in worker_failures.items())
    own = [(rank, cause) for rank, cause in causes if isinstance(cause, WorkerError)]
    if own:
        return str(min(own, key=lambda rc: (rc[1].in_collective, rc[0]))[1])
    rank, cause = causes[0]
    return f"Training failed on worker rank {rank}: {type(cause).__name__}: {cause}"


def failure_cause(worker_exceptions: dict) -> str:
    """One line for the restart: the ranks whose own code raised, then the ranks lost without a word (the
    process died, a health check failed: no WorkerError), then those that failed only waiting for a lost peer
    in a collective (gloo's "Connection reset by peer" on the survivors: a consequence, named last and short)."""
    own, lost, waiting = [], [], []
    for rank, exc in sorted(worker_exceptions.items()):
        cause = unwrapped(exc)
        if not isinstance(cause, WorkerError):
            lost.append(f"rank {rank} lost{_where_and_why(cause)}")
        elif cause.in_collective:
            waiting.append((rank, cause))
        else:
            own.append(f"rank {rank}: {_first_line(cause)}")
    named = own + lost
    if waiting:
        ranks = f"rank{'s' if len(waiting) > 1 else ''} {', '.join(str(rank) for rank, _ in waiting)}"
        if named:
            named.append(f"{ranks} then failed in a collective")
        else:  # nobody else is named: the collective's error is all there is
            named.append(f"{ranks} failed in a collective: {_first_line(waiting[0][1])}")
    return "; ".join(named)


def _where_and_why(exc: BaseException) -> str:
    """" on node IP (why)" from Ray's words for a dead actor (a health check's ActorDiedError lists the actor's
    `ip:` and says "The actor is dead because its worker process has died" or "its node has died"); else the
    exception's type and first line."""
    text = str(exc)
    ip = re.search(r"^\s*ip: (\S+)", text, re.MULTILINE)
    why = re.search(r"The actor is dead because ([^.]+)", text)
    where = f" on node {ip.group(1)}" if ip else ""
    return f"{where} ({why.group(1) if why else f'{type(exc).__name__}: {_first_line(exc)}'})"


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0][:200] if text else ""


class FailureRecorder(UserCallback):
    """Tells the sink which worker failed and why: the job in flight is then re-served or, past its
    max_failures, failed with the first failed rank's own error. When the sink gives the group up (it keeps
    failing between jobs), the controller is aborted."""

    def __init__(self, sink):
        self.sink = sink

    def after_exception(self, run_context, worker_exceptions):
        import ray

        message = first_worker_error(worker_exceptions) if worker_exceptions else "the worker group failed"
        # An error marked `fatal` (a full disk, lost storage, a damaged checkpoint) fails the job at once.
        causes = [unwrapped(exc) for exc in worker_exceptions.values()]
        fatal = any(getattr(cause, "fatal", False) for cause in causes)
        # The jobs whose own code raised (a user error): theirs, even if a rank had not taken the job yet. Not an
        # error inside a collective: that rank failed because a peer went away (a loss between calls, say).
        raised_by = tuple(sorted({cause.job for cause in causes if isinstance(cause, WorkerError) and cause.job
                                  and not cause.in_collective}))
        try:
            give_up = ray.get(self.sink.record_failure.remote(failure_cause(worker_exceptions)[:500], message, fatal,
                                                             raised_by))
        except ray.exceptions.RayActorError:  # the driver released the group: nobody waits for it
            give_up = True
        if give_up:
            ray.get_runtime_context().current_actor.abort.remote()


class ControllerRecorder(ControllerCallback, WorkerGroupCallback):
    """Hands Ray Train's controller actor to the sink, so that the driver can abort a group that is running a
    job it no longer waits for (a second Ctrl-C, a driver callback that raised), and each worker group's
    placement group, so that the driver can remove it when the controller dies without removing it itself
    (group.py `_remove_orphaned_placement_group`). Internal API of Ray 2.60: a Ray Train without it only makes
    such a group finish its job before it is released."""

    def __init__(self, sink):
        self.sink = sink

    def after_controller_start(self, train_run_context):
        import ray

        # Not waited for: the controller would hold the worker group's start until the sink actor is up (its
        # process and imports: "sink start" in startup.py). The handle is there long before a job could be
        # abandoned. Pickled here: the sink only keeps it for the driver, and an actor handle Ray deserializes
        # loads its class, Ray Train's controller module (2-3 CPU seconds in every sink's start).
        self.sink.set_controller.remote(pickle.dumps(ray.get_runtime_context().current_actor))

    def after_worker_group_start(self, worker_group):
        # Each start's (a restart places a new group): Ray Train removes the old one as it shuts it down.
        placement_group = worker_group.get_worker_group_state().placement_group_handle.placement_group
        self.sink.set_placement_group.remote(placement_group.id.hex())


class ResizeRecorder(ControllerCallback):
    """An elastic run's healthy worker group is stopped when Ray Train's elastic monitor finds room for a
    different number of workers (every `elastic_resize_monitor_interval_s`). No public Ray Train callback sees
    that, so this one is a `ControllerCallback` (Ray Train passes callbacks that are not `UserCallback`s to
    its controller as they are; internal API of Ray 2.60)."""

    def __init__(self, sink):
        self.sink = sink

    def after_controller_state_update(self, previous_state, current_state):
        import ray

        if type(current_state).__name__ != "ResizingState":  # a failure restarts through RestartingState
            return
        wanted = current_state.scaling_decision.num_workers
        ray.get(self.sink.record_cause.remote(
            Reason.RESIZE, f"Ray Train's elastic monitor found room for {wanted} workers"))


class FreshClusterView(ControllerCallback):
    """Elastic runs: keep the cluster view Ray Train's elastic policy decides from fresh.

    The policy sizes a group from the reservations of Ray's AutoscalingCoordinator, which re-reads the
    cluster's nodes every 20 s. Right after a node loss it still counts the lost node: the restart asks for
    the old size, cannot be placed, and waits out the 60 s group start timeout before trying the smaller
    size; a node that joins is seen up to 20 s late. While a group restarts (every controller iteration,
    at most once a second) and while it runs (once per resize-monitor interval) this asks the coordinator
    to recompute now. Internal API of Ray 2.60 (the coordinator lives in ray.data); any error is ignored:
    the run then only resizes later."""

    def __init__(self, monitor_interval_s: float):
        self.monitor_interval_s = monitor_interval_s
        self._last = 0.0

    def after_controller_state_update(self, previous_state, current_state):
        import time

        name = type(current_state).__name__
        every = 1.0 if name in ("RestartingState", "ReschedulingState") else (
            self.monitor_interval_s if name == "RunningState" else None)
        if every is None or time.monotonic() - self._last < every:
            return
        self._last = time.monotonic()
        try:
            from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
                get_or_create_autoscaling_coordinator,
            )

            get_or_create_autoscaling_coordinator().get_reserved_resources.remote("raytrainer", recompute=True)
        except Exception:  # noqa: BLE001 (a missing internal API only delays the resize)
            pass


class UnhurriedWait(ControllerCallback):
    """Elastic runs: while Ray Train's elastic policy waits for room for `min_workers` (its decision: do
    nothing yet), its controller's loop turns again at once, with no pause of its own, and keeps a CPU busy
    (100 % of a core for minutes, measured on the local cluster while another run's reservation held the
    nodes). Each such turn of a group that is not running pauses here for a moment. Internal API of Ray 2.60."""

    PAUSE_S = 0.05

    def after_controller_state_update(self, previous_state, current_state):
        import time

        if previous_state is current_state and type(current_state).__name__ in (
                "InitializingState", "RestartingState", "ReschedulingState"):
            time.sleep(self.PAUSE_S)
