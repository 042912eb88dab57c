"""The event sink (raytrainer/coordinator/sink.py), the rules of the driver-worker protocol without Ray: the sink is
a plain class until `ray.remote` wraps it, so each test runs its async methods on an asyncio loop, with the ranks
as coroutines (tests/coordinator/sink_calls.py). Its parts have their own files: the job board test_jobs.py, the
stream test_stream.py, the restart history test_history.py; the driver's pump against it test_pump.py."""

from __future__ import annotations

import subprocess
import sys

from raytrainer.coordinator.sink import EventSink
from raytrainer.protocol import (
    ControlRequest,
    Decision,
    Event,
    Failure,
    JobFailed,
    JobKind,
    Kind,
    Reason,
    ResultReady,
    Stall,
)
from tests.coordinator.sink_calls import job, run, take_all, waits
from tests.support import ROOT


def test_a_replacing_group_gets_the_job_in_flight_again(loop):
    sink = EventSink(idle_timeout_s=60)
    assert run(loop, sink.post_job(job("a"), max_failures=3)).posted
    assert [run(loop, sink.next_job(None, rank, 2)).id for rank in (0, 1)] == ["a", "a"]
    assert waits(loop, sink.next_job("a", 0, 2))  # a rank that took it waits for the next job
    assert run(loop, sink.record_failure("rank 1: died", "rank 1 died")) is False
    (failure,) = take_all(loop, sink)
    assert isinstance(failure, Failure) and failure.kind is Kind.FAILURE and failure.job == "a"
    # Ray Train's new group (fresh processes: no last job) is served the same job; the run resumes.
    assert [run(loop, sink.next_job(None, rank, 2)).id for rank in (0, 1)] == ["a", "a"]
    run(loop, sink.set_result({"done": True}, "a"))
    assert isinstance(take_all(loop, sink)[-1], ResultReady)
    assert run(loop, sink.get_result()) == {"done": True}
    assert waits(loop, sink.next_job(None, 0, 2))  # done: nothing to serve until the next post


def test_rank_0_waits_until_the_driver_read_the_result_or_moved_on(loop):
    sink = EventSink(idle_timeout_s=60)
    run(loop, sink.post_job(job("a"), max_failures=0))
    assert run(loop, sink.wait_result_taken("a", 0.02)) is False
    waiting = loop.create_task(sink.wait_result_taken("a", 5))
    run(loop, sink.mark_result_taken("a"))
    assert run(loop, waiting) is True
    # A wait that arrives after the driver read the result and posted the next job returns at once.
    run(loop, sink.post_job(job("b"), max_failures=0))
    assert run(loop, sink.wait_result_taken("a", 5)) is True


def test_messages_survive_pickling_as_ray_sends_them():
    import pickle

    for message in (job("a"), Event("log", 0, "a", {"logs": {"loss": 1.0}}), ControlRequest(3),
                    Decision({"should_stop": True}), ResultReady("a"), Failure("a", "c", "e"),
                    JobFailed("a", "c", "e"), Stall(1, "all_reduce", 3.0)):
        assert pickle.loads(pickle.dumps(message)) == message
    assert f"{JobKind.EVALUATE}()" == "evaluate()" and str(Reason.RESIZE) == "resize"


def test_the_sink_actors_process_imports_neither_torch_nor_transformers():
    """The sink starts beside every new worker group (on 2 cores it competes with the group's start): its
    module must not pull torch in through the package (raytrainer/__init__.py imports on first use)."""
    code = ("import sys, raytrainer.coordinator.sink; "
            "print(sorted(m for m in ('torch', 'transformers', 'ray.data') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
