"""What the user is told when a worker group fails (raytrainer/coordinator/failures.py `first_worker_error`): the
lowest failed rank's own error, unwrapped from Ray's `RayTaskError`; a rank that failed only inside a collective
(a peer went away first) is named after the ranks that failed on their own. The recorders that run in Ray Train's
controller are tested on real groups (tests/integration/test_recovery.py, tests/integration/cluster/)."""

from __future__ import annotations

from ray.exceptions import RayTaskError

from raytrainer.coordinator.failures import UnhurriedWait, failure_cause, first_worker_error
from raytrainer.worker.user_errors import WorkerError


def wrapped(cause: BaseException) -> RayTaskError:
    """As Ray Train hands a failed worker's exception to its callbacks: the user's exception is its `cause`."""
    return RayTaskError("train_fn", "Traceback ...", cause)


def test_the_lowest_ranks_own_error_is_told_unwrapped():
    failures = {2: wrapped(WorkerError("train() failed on worker rank 2: ValueError: late")),
                1: wrapped(WorkerError("train() failed on worker rank 1: ValueError: boom"))}
    assert first_worker_error(failures) == "train() failed on worker rank 1: ValueError: boom"


def test_a_rank_that_failed_inside_a_collective_comes_after_one_that_failed_on_its_own():
    failures = {0: wrapped(WorkerError("rank 0: connection closed by peer", in_collective=True)),
                3: wrapped(WorkerError("train() failed on worker rank 3: RuntimeError: out of memory"))}
    assert first_worker_error(failures) == "train() failed on worker rank 3: RuntimeError: out of memory"
    only_collective = {1: wrapped(WorkerError("rank 1: connection closed", in_collective=True)),
                       0: wrapped(WorkerError("rank 0: connection closed", in_collective=True))}
    assert first_worker_error(only_collective) == "rank 0: connection closed"


def test_an_error_that_is_no_worker_error_names_the_lowest_rank_and_its_type():
    """A worker lost without a word of its own (its process killed, a health check failed)."""
    failures = {3: RuntimeError("health check failed"), 2: wrapped(ConnectionError("node lost"))}
    assert first_worker_error(failures) == "Training failed on worker rank 2: ConnectionError: node lost"


def test_the_restart_cause_names_the_lost_rank_before_the_survivors_collective_error():
    """A killed worker: Ray Train hands rank 1's health check and rank 0's gloo error (a consequence) to the
    callback; the restart line names rank 1 as lost and rank 0 after it, without gloo's paragraph."""
    gloo = "[pair.cc:537] Read error [127.0.0.1]:2439: Connection reset by peer. This is typically caused by ..."
    died = ("A worker health check failed.\nThe actor died unexpectedly before finishing this task.\n\tclass_name: "
            "RayTrainWorker\n\tpid: 2218\n\tip: 10.0.0.7\nThe actor is dead because its worker process has died. "
            "Worker exit type: SYSTEM_ERROR")
    failures = {0: wrapped(WorkerError(f"train() failed on worker rank 0: RuntimeError: {gloo}", in_collective=True)),
                1: RuntimeError(died)}
    assert failure_cause(failures) == ("rank 1 lost on node 10.0.0.7 (its worker process has died); "
                                       "rank 0 then failed in a collective")
    assert failure_cause({1: ConnectionError("node lost")}) == "rank 1 lost (ConnectionError: node lost)"
    own = {2: wrapped(WorkerError("train() failed on worker rank 2: ValueError: boom")), **failures}
    assert failure_cause(own).startswith("rank 2: train() failed on worker rank 2: ValueError: boom; rank 1 lost")
    only = {0: failures[0]}
    assert failure_cause(only) == f"rank 0 failed in a collective: train() failed on worker rank 0: RuntimeError: " \
                                  f"{gloo}"[:len("rank 0 failed in a collective: ") + 200]


def test_a_controller_turn_that_waits_for_room_pauses_and_no_other_does(monkeypatch):
    """Ray Train's elastic controller, waiting for room for its minimum of workers, stays in the same state
    object turn after turn with no pause of its own (100 % of a core for minutes on the local cluster)."""
    from ray.train.v2._internal.execution.controller.state import InitializingState, RunningState

    slept = []
    monkeypatch.setattr("time.sleep", slept.append)
    waiting, running = InitializingState(), RunningState()
    wait = UnhurriedWait()
    wait.after_controller_state_update(waiting, waiting)  # a turn that decided nothing: paused
    assert slept == [UnhurriedWait.PAUSE_S]
    wait.after_controller_state_update(waiting, running)  # a change of state
    wait.after_controller_state_update(running, running)  # a running group's turns pause in Ray Train itself
    assert slept == [UnhurriedWait.PAUSE_S]
