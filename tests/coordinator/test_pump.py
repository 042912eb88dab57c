"""The driver's pump (raytrainer/coordinator/pump.py), without Ray: as Ray Train tests its controller with a
`DummyWorkerGroup`, `pump._pump_job` runs here against a fake group whose sink "handle" runs each call on the
test's asyncio loop, with the ranks as coroutines."""

from __future__ import annotations

import pytest

from raytrainer.callbacks.base import CallbackHandler, TrainerCallback
from raytrainer.coordinator import pump
from raytrainer.coordinator.handlers import JobHandlers
from raytrainer.coordinator.sink import EventSink
from raytrainer.protocol import ERROR, Event, Stall
from raytrainer.state import TrainerState
from tests.coordinator.sink_calls import job, run


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
