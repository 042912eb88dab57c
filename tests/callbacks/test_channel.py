"""The worker's side of the event channel (raytrainer/callbacks/channel.py `Emitter`), in one process against the
num_workers=0 sink (`DirectSink`) and the driver's callbacks behind it: events are buffered and sent once the flush
interval passed, urgent ones at once; held events travel with the control request that follows, so the decision
reflects them; a request not waited for is answered through `answer`; the job's id is stamped on every event. The
same over Ray (an actor handle, pushes in flight landed first): tests/callbacks/test_events.py."""

from __future__ import annotations

from raytrainer.callbacks.base import CallbackHandler
from raytrainer.callbacks.channel import Emitter
from raytrainer.coordinator.handlers import JobHandlers
from raytrainer.coordinator.sink import DirectSink
from raytrainer.protocol import Decision
from raytrainer.state import TrainerState
from tests.support import logs_and_evaluations_recorder


class Heard(logs_and_evaluations_recorder()):
    def on_step_end(self, args, state, control, **kwargs):
        self.events.append(("step_end", state.global_step))
        control.should_log = state.global_step % 2 == 0


class Sink(DirectSink):
    """The num_workers=0 sink, counting the calls that reach it."""

    def __init__(self, handlers):
        super().__init__(handlers)
        self.pushes = []

    def push(self, messages):
        self.pushes.append([(m.name, m.job) for m in messages])
        return super().push(messages)


def wire(flush_interval_s: float):
    heard = Heard()
    handler = CallbackHandler([heard], args=None, state=TrainerState())
    sink = Sink(JobHandlers(handler))
    return Emitter(sink, rank=0, flush_interval_s=flush_interval_s, job="job-1"), sink, heard


def test_events_wait_for_the_flush_interval_and_urgent_ones_go_at_once():
    emitter, sink, heard = wire(flush_interval_s=3600)
    emitter.emit("log", global_step=1, logs={"loss": 1.0})
    emitter.emit("log", global_step=2, logs={"loss": 0.9})
    assert sink.pushes == [] and heard.events == []
    emitter.emit("evaluate", global_step=2, metrics={})  # urgent: the buffer goes with it, in order
    assert sink.pushes == [[("log", "job-1"), ("log", "job-1"), ("evaluate", "job-1")]]
    assert heard.events == [("log", 1), ("log", 2), ("evaluate", 2)]
    emitter.emit("log", global_step=3, logs={})
    emitter.flush()
    assert heard.events[-1] == ("log", 3) and len(sink.pushes) == 2


def test_held_events_travel_with_the_request_and_the_decision_reflects_them():
    emitter, sink, heard = wire(flush_interval_s=0)
    emitter.emit("step_end", hold=True, global_step=2)  # held although the interval passed
    assert heard.events == []
    decision = emitter.request_control()
    assert isinstance(decision, Decision) and decision.flags["should_log"] is True
    assert heard.events == [("step_end", 2)] and sink.pushes == [[("step_end", "job-1")]]
    emitter.emit("step_end", hold=True, global_step=3)
    request = emitter.request_control(wait=False)  # callback_decisions="next_step"
    assert emitter.answer(request).flags["should_log"] is False


def test_the_result_is_delivered_after_every_buffered_event():
    emitter, sink, heard = wire(flush_interval_s=3600)
    emitter.emit("log", global_step=4, logs={})
    emitter.set_result({"global_step": 4})
    assert heard.events == [("log", 4)] and sink._result == {"global_step": 4}
    assert emitter.wait_result_taken() is True and emitter.stop_watch() is None  # the driver is this process


class SlowFirstPush:
    """An async actor as the event sink is: its first push yields for a moment, so a later call from the same
    caller can start before it ends (Ray does not order an async actor's calls)."""

    def __init__(self):
        self.events, self.pushes, self.events_at_result = [], 0, None

    async def push(self, messages):
        import asyncio

        self.pushes += 1
        if self.pushes == 1:
            await asyncio.sleep(1.0)
        self.events.extend(m.name for m in messages)
        return len(self.events)

    async def set_result(self, result, job=None):
        self.events_at_result = list(self.events)
        return True

    async def seen(self):
        return self.events, self.events_at_result


def test_a_result_never_overtakes_an_earlier_push_still_in_flight(ray_session):
    """The start-up timeline missed its first step once in the suite: rank 0's pushes not waited for landed
    after its result, so the driver read the result before the job's step events."""
    import ray

    sink = ray.remote(SlowFirstPush).remote()
    emitter = Emitter(sink, rank=0, flush_interval_s=3600, job="job-1")
    emitter.emit("train_begin")  # urgent: pushed at once, and held up in the sink
    emitter.emit("step_end", global_step=1)
    emitter.set_result({"global_step": 1})  # flushes step_end, then the result
    events, at_result = ray.get(sink.seen.remote())
    assert at_result == ["train_begin", "step_end"] == events
    ray.kill(sink)


def test_a_save_reported_from_the_writer_thread_waits_for_the_callbacks_running_and_leaves_their_step():
    """num_workers=0 dispatches in the emitting thread, and a checkpoint commit is reported from the writer's
    thread while the training thread reports its steps: checkpoint-2's save, committed while step 4's log is
    in the driver's callbacks, waits for them, and the log's callbacks see step 4 throughout (a W&B run logged
    step 4's metrics at step 2, and W&B dropped them as older than its current step)."""
    import threading

    from raytrainer.callbacks.base import TrainerCallback

    in_log, release, seen = threading.Event(), threading.Event(), []

    class SlowLog(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            in_log.set()
            release.wait(10)
            seen.append(("log", state.global_step))

        def on_save(self, args, state, control, **kwargs):
            seen.append(("save", state.global_step))

    handler = CallbackHandler([SlowLog()], args=None, state=TrainerState())
    emitter = Emitter(DirectSink(JobHandlers(handler)), rank=0, flush_interval_s=0.0, job="job-1")
    training = threading.Thread(target=emitter.emit, args=("log",), kwargs=dict(global_step=4, logs={"loss": 1.0}))
    training.start()
    assert in_log.wait(10)
    writer = threading.Thread(target=emitter.emit, args=("save",), kwargs=dict(global_step=2, checkpoint="c-2"))
    writer.start()
    writer.join(0.5)
    assert writer.is_alive()  # waiting for the log's callbacks
    release.set()
    training.join(10)
    writer.join(10)
    assert seen == [("log", 4), ("save", 2)]
