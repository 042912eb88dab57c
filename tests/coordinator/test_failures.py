"""What the user is told when a worker group fails (raytrainer/coordinator/failures.py `first_worker_error`): the
lowest failed rank's own error, unwrapped from Ray's `RayTaskError`; a rank that failed only inside a collective
(a peer went away first) is named after the ranks that failed on their own. The recorders that run in Ray Train's
controller are tested on real groups (tests/integration/test_recovery.py, tests/integration/cluster/)."""

from __future__ import annotations

from ray.exceptions import RayTaskError

from raytrainer.coordinator.failures import first_worker_error
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
