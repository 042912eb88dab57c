"""A job's stream of events and control requests (raytrainer/coordinator/stream.py), through the event sink,
without Ray: the order the driver reads them in, a request's answer, a fresh stream for each job."""

from __future__ import annotations

from raytrainer.coordinator.sink import EventSink
from raytrainer.protocol import Decision, Event, Kind
from tests.coordinator.sink_calls import job, run, take_all


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
