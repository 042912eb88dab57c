"""Who takes a job's messages on the driver (raytrainer/coordinator/handlers.py): events to the callbacks (after
train()'s start-up watch), control requests their decision, a hosted claim its typed reply; and the pump and the
num_workers=0 sink handing each message to them by its kind, without Ray (the pump's fake group of test_pump.py)."""

from __future__ import annotations

import pytest

from raytrainer.callbacks.base import CallbackHandler, TrainerCallback
from raytrainer.coordinator.handlers import JobHandlers
from raytrainer.coordinator.sink import DirectSink, EventSink
from raytrainer.protocol import Event, HostedClaim, HostedClaimReply, Kind
from raytrainer.state import TrainerState
from tests.coordinator.sink_calls import job, run
from tests.coordinator.test_pump import pump_job


class StopAtStep(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            control.should_training_stop = True


class Claims:
    """A claim handler: answers with the claimed output_dir's checkpoint, and what the callbacks had seen then."""

    def __init__(self, callbacks: CallbackHandler):
        self.callbacks = callbacks
        self.claims = []

    def answer_claim(self, claim: HostedClaim) -> HostedClaimReply:
        self.claims.append((claim, self.callbacks.state.global_step))
        return HostedClaimReply(resume_from=f"{claim.output_dir}/checkpoint-{self.callbacks.state.global_step}")


def callbacks(*given) -> CallbackHandler:
    return CallbackHandler(list(given), args=None, state=TrainerState())


def test_a_decision_is_the_callbacks_flags_since_the_last_one():
    handlers = JobHandlers(callbacks(StopAtStep()))
    handlers.handle_event({"kind": "step_end", "global_step": 1})
    assert handlers.decide().flags["should_training_stop"] is False
    handlers.handle_event({"kind": "step_end", "global_step": 2})
    decision = handlers.decide()
    assert decision.flags["should_training_stop"] is True and decision.states == {}


def test_a_claim_without_a_claim_handler_gets_an_error_not_silence():
    reply = JobHandlers(callbacks()).answer_claim(HostedClaim(output_dir="/out", trainer="T", index=0))
    assert isinstance(reply, HostedClaimReply) and "raytrainer.hosted" in reply.error


def test_the_claim_is_its_own_message_answered_after_the_events_before_it(loop):
    """Rank 0's claim travels after the events it sent with it, as a ClaimRequest; the pump hands it to the claim
    handler once the events before it were handled, and rank 0 gets the typed reply."""
    sink = EventSink(idle_timeout_s=60)
    run(loop, sink.post_job(job("a"), max_failures=0))
    replies, kinds = [], []
    claim = HostedClaim(output_dir="/out", trainer="trl.SFTTrainer", index=0)

    async def rank0():
        replies.append(await sink.push_and_claim([Event("step_end", 0, "a", {"global_step": 3})], claim, "a"))
        await sink.set_result("done", "a")
        assert await sink.wait_result_taken("a", 1)

    original = sink.wait_events

    async def recording(timeout_s):
        messages = await original(timeout_s)
        kinds.extend(m.kind for m in messages)
        return messages

    sink.wait_events = recording
    worker = loop.create_task(rank0())
    holder = {}

    def make_claims(handler):
        holder["claims"] = Claims(handler)
        return holder["claims"]

    assert pump_job(loop, sink, [], claims_of=make_claims) == "done"
    run(loop, worker)
    assert Kind.HOSTED_CLAIM in kinds and Kind.CONTROL_REQUEST not in kinds
    assert replies == [HostedClaimReply(resume_from="/out/checkpoint-3")]  # after step 3 was handled
    assert holder["claims"].claims == [(claim, 3)]


def test_a_claim_of_another_job_is_refused_so_its_rank_does_not_wait(loop):
    sink = EventSink(idle_timeout_s=60)
    run(loop, sink.post_job(job("a"), max_failures=0))
    replies = []

    async def stale_rank0():
        replies.append(await sink.push_and_claim([], HostedClaim("/out", "T", 0), "old-job"))
        await sink.set_result(None, "a")

    worker = loop.create_task(stale_rank0())
    pump_job(loop, sink, [], claims_of=Claims)
    run(loop, worker)
    assert "old-job" in replies[0].error and replies[0].resume_from is None


def test_in_process_the_direct_sink_answers_the_claim_after_its_events():
    handler = callbacks()
    claims = Claims(handler)
    sink = DirectSink(JobHandlers(handler, claims))
    reply = sink.push_and_claim([Event("step_end", 0, None, {"global_step": 5})], HostedClaim("/o", "T", 0))
    assert reply == HostedClaimReply(resume_from="/o/checkpoint-5")


@pytest.fixture
def loop():
    import asyncio

    loop = asyncio.new_event_loop()
    yield loop
    loop.close()
