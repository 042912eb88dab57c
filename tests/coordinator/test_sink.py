"""The rules of the driver-worker protocol, without Ray: the event sink is a plain class until `ray.remote` wraps
it, so each test runs its async methods on an asyncio loop, with the ranks as coroutines. As Ray Train tests
its controller with a `DummyWorkerGroup`, the driver's pump (`pump._pump_job`) runs here against a fake
group whose sink "handle" runs each call on that loop."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from raytrainer.callbacks.base import CallbackHandler, TrainerCallback
from raytrainer.coordinator import pump
from raytrainer.coordinator.handlers import JobHandlers
from raytrainer.coordinator.jobs import IDLE_FAILURE_LIMIT
from raytrainer.coordinator.sink import EventSink
from raytrainer.protocol import (
    ERROR,
    ControlRequest,
    Decision,
    Event,
    Failure,
    GroupStart,
    Job,
    JobFailed,
    JobKind,
    Kind,
    Reason,
    ResultReady,
    Stall,
)
from raytrainer.state import TrainerState
from tests.support import ROOT


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def job(name: str = "a") -> Job:
    return Job(id=name, job_kind=JobKind.TRAIN, payload=b"", data=None)


def run(loop, coro, timeout_s: float = 1.0):
    return loop.run_until_complete(asyncio.wait_for(coro, timeout_s))


def waits(loop, coro, timeout_s: float = 0.05) -> bool:
    """True if `coro` is still waiting after `timeout_s`."""
    try:
        run(loop, coro, timeout_s)
    except asyncio.TimeoutError:
        return True
    return False


def take_all(loop, sink: EventSink) -> list:
    return run(loop, sink.wait_events(0))


# ---------------------------------------------------------------------------------------- the job board
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


def test_failures_count_per_job_against_its_max_failures(loop):
    sink = EventSink(idle_timeout_s=60)
    run(loop, sink.post_job(job("a"), max_failures=1))

    def fail():
        for rank in (0, 1):
            run(loop, sink.next_job(None, rank, 2))
        run(loop, sink.record_failure("rank 0: boom", "train() failed on worker rank 0: boom"))
        return take_all(loop, sink)

    assert [m.kind for m in fail()] == [Kind.FAILURE]
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


def test_a_new_job_starts_a_fresh_stream_and_releases_the_last_stop_watch(loop):
    sink = EventSink(idle_timeout_s=60)
    run(loop, sink.post_job(job("a"), max_failures=0))
    watch = loop.create_task(sink.wait_stop(5))
    run(loop, sink.push([Event("log", 0, "a", {"logs": {}})]))
    run(loop, sink.post_job(job("b"), max_failures=0))
    assert run(loop, watch) is None  # a's stop watch returns now, not after 5 s
    assert take_all(loop, sink) == []  # a's straggler is gone
    run(loop, sink.request_stop("interrupt"))
    assert run(loop, sink.wait_stop(5)) == "interrupt"


# ---------------------------------------------------------------------------------------- control and history
def test_events_sent_before_a_control_request_come_before_it(loop):
    sink = EventSink(idle_timeout_s=60)
    run(loop, sink.post_job(job("a"), max_failures=0))
    run(loop, sink.push([Event("train_begin", 0, "a")]))
    asking = loop.create_task(sink.push_and_await([Event("step_end", 0, "a", {"global_step": 1})]))
    messages = run(loop, sink.wait_events(1))
    assert [m.name if m.kind is Kind.EVENT else m.kind for m in messages] == [
        "train_begin", "step_end", Kind.CONTROL_REQUEST]
    assert not asking.done()
    run(loop, sink.decide(messages[-1].id, Decision(flags={"should_save": True})))
    assert run(loop, asking) == Decision(flags={"should_save": True})
    run(loop, sink.decide(messages[-1].id, Decision()))  # a late answer to a finished request is dropped


def test_the_restart_history_names_why_each_group_ended(loop):
    sink = EventSink(idle_timeout_s=60)
    run(loop, sink.post_job(job("a"), max_failures=-1))
    assert run(loop, sink.group_started(GroupStart(2, 0, None, 1))) is None  # the job's first group
    run(loop, sink.record_cause(Reason.PREEMPTION, "SIGTERM on rank 1"))
    run(loop, sink.record_failure("rank 1: SIGTERM", "lost"))  # what follows a preemption does not replace it
    first = run(loop, sink.group_started(GroupStart(2, 10, "ckpt-10", 1)))
    assert first.restart["reason"] == "preemption" and first.restart["cause"] == "SIGTERM on rank 1"
    assert first.resize is None
    run(loop, sink.record_cause(Reason.RESIZE, "room for 1 worker"))
    second = run(loop, sink.group_started(GroupStart(1, 20, "ckpt-20", 2)))
    assert second.resize["previous_world_size"] == 2 and second.resize["gradient_accumulation_steps"] == 2
    assert [r["reason"] for r in second.restarts] == ["preemption", "resize"] and len(second.resizes) == 1
    third = run(loop, sink.group_started(GroupStart(1, 20, "ckpt-20", 2)))
    assert third.restart["reason"] == "restart"  # nothing recorded: Ray Train restarted it


# ---------------------------------------------------------------------------------------- the driver's pump
class FakeHandle:
    """An actor handle: `sink.method.remote(*args)` runs the call on the test's loop and returns its value
    (the pump's `get` is then the identity). While the driver waits, the ranks' coroutines run."""

    def __init__(self, sink: EventSink, loop):
        self._sink, self._loop = sink, loop

    def __getattr__(self, name):
        method = getattr(self._sink, name)
        loop = self._loop

        class Remote:
            @staticmethod
            def remote(*args):
                return loop.run_until_complete(method(*args))

        return Remote


class FakeGroup:
    """What the pump needs of a `WorkerGroup`: its sink, whether its fit() thread runs, its error."""

    def __init__(self, sink: EventSink, loop):
        self.sink = FakeHandle(sink, loop)
        self.error = None

    def thread_alive(self) -> bool:
        return True


class SaveAtStep2(TrainerCallback):
    def __init__(self):
        self.seen = []

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append(state.global_step)
        if state.global_step == 2:
            control.should_save = True


def pump_job(loop, sink: EventSink, callbacks, job_id: str = "a", receive=lambda result: result, claims_of=None):
    """The pump on `sink`'s messages, with `callbacks` (and the claim handler `claims_of(callback handler)`)."""
    handler = CallbackHandler(callbacks, args=None, state=TrainerState())
    handlers = JobHandlers(handler, claims_of(handler) if claims_of is not None else None)
    return pump._pump_job(FakeGroup(sink, loop), job_id, handlers, receive, get=lambda value: value)


def test_the_driver_decides_on_every_event_before_the_request_and_takes_the_result(loop):
    sink = EventSink(idle_timeout_s=60)
    run(loop, sink.post_job(job("a"), max_failures=0))
    decisions = []

    async def rank0():
        await sink.push([Event("step_end", 0, "a", {"global_step": 1})])
        await sink.push([Event("log", 0, "old-job", {"logs": {"loss": 9.0}})])  # a straggler: dropped
        decisions.append(await sink.push_and_await([Event("step_end", 0, "a", {"global_step": 2})]))
        await sink.report_stall(Stall(1, "callback on_step_end", 62.4, "a"))
        await sink.set_result({"steps": 2}, "a")
        assert await sink.wait_result_taken("a", 1)

    worker = loop.create_task(rank0())
    callback = SaveAtStep2()
    assert pump_job(loop, sink, [callback]) == {"steps": 2}
    run(loop, worker)
    assert callback.seen == [1, 2]
    assert decisions[0].flags["should_save"] is True  # decided after step 2 was handled


def test_a_stall_is_printed_as_a_warning(loop, capsys):
    sink = EventSink(idle_timeout_s=60)
    run(loop, sink.post_job(job("a"), max_failures=0))
    run(loop, sink.report_stall(Stall(1, "callback on_step_end", 62.4, "a")))
    run(loop, sink.set_result(None, "a"))
    pump_job(loop, sink, [])
    assert "[raytrainer] rank 1 has made no progress for 62 s in callback on_step_end" in capsys.readouterr().err


def test_a_failed_job_raises_with_the_first_ranks_traceback(loop):
    sink = EventSink(idle_timeout_s=60)
    run(loop, sink.post_job(job("a"), max_failures=0))
    run(loop, sink.next_job(None, 0, 1))
    run(loop, sink.push([Event(ERROR, 0, "a", {"traceback": "Traceback ...\nValueError: boom"})]))
    run(loop, sink.record_failure("rank 0: ValueError: boom", "train() failed on worker rank 0: boom"))
    with pytest.raises(pump._JobFailed, match="rank 0: boom") as failed:
        pump_job(loop, sink, [])
    assert failed.value.worker_traceback.endswith("ValueError: boom")


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


def test_a_hang_cause_from_the_stalled_rank_wins_over_its_waiting_peer():
    """Both ranks' watchdogs end their workers: the rank waiting in a collective for the stalled one records first;
    the stalled rank's own cause replaces it, and Ray Train's failure report afterwards replaces neither."""
    from raytrainer.coordinator.history import RunHistory
    from raytrainer.protocol import GroupStart

    history = RunHistory()
    history.group_started(GroupStart(world_size=2, global_step=0, checkpoint=None, gradient_accumulation_steps=1))
    history.record_cause(Reason.HANG, "rank 0 ... in all_reduce (a collective: waiting for another rank)", True)
    history.record_cause(Reason.HANG, "rank 1 made no progress for 15 s in on_step_end at train.py:12")
    history.record_cause(Reason.HANG, "rank 0 again, waiting", True)
    history.record_cause(Reason.FAILURE, "WorkerHealthCheckFailedError")
    restart = history.group_started(GroupStart(world_size=2, global_step=2, checkpoint="c-2",
                                               gradient_accumulation_steps=1)).restart
    assert restart["reason"] == "hang" and restart["cause"].startswith("rank 1") and "waiting" not in restart
