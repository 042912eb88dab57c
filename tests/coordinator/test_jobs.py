"""The job board (raytrainer/coordinator/jobs.py), through the event sink that holds it, without Ray: which
failures count against a job's max_failures, failures between jobs, the idle timeout, a job the driver abandons."""

from __future__ import annotations

import asyncio
import time

from raytrainer.coordinator.jobs import IDLE_FAILURE_LIMIT
from raytrainer.coordinator.sink import EventSink
from raytrainer.protocol import JobFailed, Kind, Reason
from tests.coordinator.sink_calls import job, run, take_all, waits


def test_failures_count_per_job_against_its_max_failures(loop):
    sink = EventSink(idle_timeout_s=60)
    run(loop, sink.post_job(job("a"), max_failures=1))

    def fail():
        for rank in (0, 1):
            run(loop, sink.next_job(None, rank, 2))
        run(loop, sink.record_failure("rank 0: boom", "train() failed on worker rank 0: boom"))
        return take_all(loop, sink)

    (first,) = fail()
    assert first.kind == Kind.FAILURE and first.cause == "rank 0: boom (failure 1, max_failures=1)"  # what is left
    (failed,) = fail()
    assert isinstance(failed, JobFailed) and failed.error == "train() failed on worker rank 0: boom"
    assert waits(loop, sink.next_job(None, 0, 2))  # a failed job is not served again
    # The next job starts with its own count.
    run(loop, sink.post_job(job("b"), max_failures=1))
    assert [m.kind for m in fail()] == [Kind.FAILURE]


def test_a_failure_counts_only_once_every_rank_took_the_job_and_not_after_a_preemption(loop):
    sink = EventSink(idle_timeout_s=60)
    run(loop, sink.post_job(job("a"), max_failures=0))
    run(loop, sink.next_job(None, 0, 2))  # rank 1 never took it: a worker lost before the job reached it
    run(loop, sink.record_failure("rank 1: lost", "lost"))
    assert [m.kind for m in take_all(loop, sink)] == [Kind.FAILURE]
    for rank in (0, 1):
        run(loop, sink.next_job(None, rank, 2))
    run(loop, sink.record_cause(Reason.PREEMPTION, "SIGTERM on rank 1"))
    run(loop, sink.record_failure("rank 1: SIGTERM", "preempted"))
    assert [m.kind for m in take_all(loop, sink)] == [Kind.FAILURE]  # Ray Train's max_preemptions counts it


def test_a_jobs_own_error_counts_even_before_every_rank_took_it(loop):
    """A user error raised at once on rank 0 can reach the board before rank 1 took the job: still the job's
    failure (it ran again, and passed, when only 'taken by every rank' counted). A loss raised by no job's
    code, or an error of another job, is not counted."""
    sink = EventSink(idle_timeout_s=60)
    run(loop, sink.post_job(job("a"), max_failures=0))
    run(loop, sink.next_job(None, 0, 2))
    run(loop, sink.record_failure("rank 1: lost", "lost", raised_by=("other",)))
    assert [m.kind for m in take_all(loop, sink)] == [Kind.FAILURE]
    run(loop, sink.next_job(None, 0, 2))
    run(loop, sink.record_failure("rank 0: ValueError", "evaluate() failed on worker rank 0", raised_by=("a",)))
    [failed] = take_all(loop, sink)
    assert isinstance(failed, JobFailed) and failed.error == "evaluate() failed on worker rank 0"


def test_a_fatal_error_fails_the_job_at_once(loop):
    sink = EventSink(idle_timeout_s=60)
    run(loop, sink.post_job(job("a"), max_failures=-1))
    run(loop, sink.next_job(None, 0, 1))
    run(loop, sink.record_failure("rank 0: StorageError", "storage lost", fatal=True))
    assert [m.kind for m in take_all(loop, sink)] == [Kind.JOB_FAILED]


def test_failures_between_jobs_are_told_with_the_next_post_and_give_up_past_the_limit(loop):
    sink = EventSink(idle_timeout_s=60)
    posted = run(loop, sink.post_job(job("a"), max_failures=0))
    run(loop, sink.next_job(None, 0, 1))
    run(loop, sink.set_result(None, "a"))
    assert run(loop, sink.record_failure("rank 0: lost", "lost")) is False
    assert run(loop, sink.post_job(job("b"), max_failures=0)).idle_failures == ("rank 0: lost",)
    assert posted.idle_failures == ()
    run(loop, sink.next_job("a", 0, 1))
    run(loop, sink.set_result(None, "b"))
    give_up = [run(loop, sink.record_failure(f"lost {i}", "lost")) for i in range(IDLE_FAILURE_LIMIT + 1)]
    assert give_up == [False] * IDLE_FAILURE_LIMIT + [True]


def test_an_idle_board_closes_and_refuses_the_next_post(loop):
    sink = EventSink(idle_timeout_s=0.05)
    start = time.monotonic()
    assert run(loop, sink.next_job(None, 0, 1)) is None  # the worker function returns: Ray Train releases
    assert 0.04 < time.monotonic() - start < 0.5
    posted = run(loop, sink.post_job(job("a"), max_failures=0))
    assert not posted.posted and posted.closed == "idle for 0.05 s"


def test_idle_timeout_zero_releases_the_group_after_each_job(loop):
    sink = EventSink(idle_timeout_s=0)
    run(loop, sink.post_job(job("a"), max_failures=0))
    run(loop, sink.next_job(None, 0, 1))
    run(loop, sink.set_result(None, "a"))
    assert run(loop, sink.next_job("a", 0, 1)) is None
    assert not run(loop, sink.post_job(job("b"), max_failures=0)).posted


def test_a_job_abandoned_by_the_driver(loop):
    """The driver gives up on a running job (a callback raised, Ctrl-C twice): closing the board says a job
    was running (the driver then aborts the group), and the ranks waiting for work return."""
    sink = EventSink(idle_timeout_s=60)
    run(loop, sink.post_job(job("a"), max_failures=0))
    run(loop, sink.next_job(None, 0, 2))
    waiting = loop.create_task(sink.next_job("a", 0, 2))
    request = loop.create_task(sink.push_and_await([]))  # rank 0 waits for a decision nobody will give
    run(loop, asyncio.sleep(0.01))
    assert run(loop, sink.close_board()) is True
    assert run(loop, waiting) is None and run(loop, sink.next_job(None, 1, 2)) is None
    assert not request.done()  # it goes with the group's actors; nothing in the sink waits on it
    request.cancel()
    assert run(loop, sink.close_board()) is True  # closing again is harmless
    assert not run(loop, sink.post_job(job("b"), max_failures=0)).posted
