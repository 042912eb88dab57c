"""The hosted loop's stop protocol (raytrainer/worker/hosted/stops.py) without Ray: a request another rank sends
is agreed at the end of the next exchange step, HF is asked to save and stop there, and the loop ends once that
step's checkpoint is committed; at the last step nothing changes. The exchange steps follow rank 0's step time,
and every rank takes rank 0's schedule. The fake context of tests/worker/test_step_sync.py stands for the other
rank."""

from __future__ import annotations

import threading
import types

import pytest
from transformers import TrainerControl

from raytrainer.worker.hosted.stops import MAX_EVERY, HostedStop, JobStops, LoopStops
from tests.worker.test_step_sync import FakeCtx, FakeEmitter

# What rank 1 adds to the exchange: its bit in the preempting ranks' word, none in the interrupting ranks', and
# no schedule (rank 0 proposes it).
PREEMPT_RANK_1 = [0b10, 0, 0]


def step(stops, global_step, max_steps=10):
    """One HF step's two events on this rank; the control HF would act on after on_step_end."""
    control = TrainerControl()
    stops.at_step_begin()
    stops.at_step_end(types.SimpleNamespace(global_step=global_step, max_steps=max_steps), control)
    return control


def test_a_preemption_sent_by_another_rank_saves_at_that_step_and_ends_the_loop_after_its_commit():
    ctx = FakeCtx(rank=0, world_size=2)
    job = JobStops(ctx, FakeEmitter(), on_ray=False)
    stops = job.for_loop()
    assert not step(stops, 1).should_save
    ctx.others = [PREEMPT_RANK_1]  # rank 1 got SIGTERM during step 2
    control = step(stops, 2)
    assert control.should_save and control.should_training_stop
    stops.saved(1, "out/checkpoint-1")  # another step's save (none here): not the stop's
    with pytest.raises(HostedStop) as stopped:
        stops.saved(2, "out/checkpoint-2")
    assert (stopped.value.reason, stopped.value.global_step, stopped.value.checkpoint) == (
        "preemption", 2, "out/checkpoint-2")
    assert stops.signals.ranks == [1] and job.stopping  # the SIGTERM watcher leaves the flag to the hand-over


def test_a_stop_agreed_at_the_last_step_changes_nothing_and_one_whose_save_never_came_ends_at_train_end():
    ctx = FakeCtx(rank=0, world_size=2, others=[PREEMPT_RANK_1])
    stops = JobStops(ctx, FakeEmitter(), on_ray=False).for_loop()
    control = step(stops, 10, max_steps=10)
    assert not (control.should_save or control.should_training_stop)
    stops.at_train_end(10, "out/checkpoint-10")  # the run finished

    stops = JobStops(ctx, FakeEmitter(), on_ray=False).for_loop()
    assert step(stops, 3).should_save
    with pytest.raises(HostedStop) as stopped:  # HF saved nothing at step 3 (save_strategy="best", say)
        stops.at_train_end(3, "out/checkpoint-1")
    assert stopped.value.checkpoint == "out/checkpoint-1"


class Clock:
    """Rank 0's clock, moved by the test: `step_s` a step."""

    def __init__(self, step_s: float):
        self.now, self.step_s = 100.0, step_s

    def __call__(self) -> float:
        return self.now


def run_steps(stops, clock, first, last, exchanged):
    """Steps first..last (each taking clock.step_s), the steps whose begin started an exchange appended to
    `exchanged`; the control of the last one."""
    for global_step in range(first, last + 1):
        before = stops.sync.exchanges
        control = step(stops, global_step, max_steps=1000)
        if stops.sync.exchanges > before:
            exchanged.append(global_step)
        clock.now += clock.step_s
        if control.should_save:
            return control
    return control


@pytest.mark.parametrize("step_s, every", [(0.010, 20), (0.001, MAX_EVERY), (0.5, 1), (0.07, 3)])
def test_rank_0_sets_the_exchange_steps_from_its_step_time_and_a_stop_waits_for_the_next_of_them(step_s, every):
    """The first exchange at the first step, the second at the next (rank 0 has no step time before it), then
    every `every` steps: about 0.2 s of rank 0's steps, at least 1, at most MAX_EVERY. A preemption another rank
    raises after step 3 is agreed at the first exchange step after it, and saved there."""
    ctx, clock = FakeCtx(rank=0, world_size=2), Clock(step_s)
    stops = LoopStops(JobStops(ctx, FakeEmitter(), on_ray=False), clock=clock)
    exchanged = []
    assert not run_steps(stops, clock, 1, 3, exchanged).should_save
    ctx.others = [PREEMPT_RANK_1]
    control = run_steps(stops, clock, 4, 200, exchanged)
    expected = [1, 2] + list(range(2 + every, 200 + 1, every))
    assert exchanged == [s for s in expected if s <= exchanged[-1]] and stops.every == every
    saved = exchanged[-1]
    assert saved == min(s for s in expected if s >= 4)
    assert control.should_save and control.should_training_stop and stops.stop_step == saved


def test_every_rank_takes_rank_0s_schedule_whatever_its_own_clock_says():
    """Rank 1 proposes nothing and reads the schedule rank 0 sent (in `others` here): its exchanges are rank 0's."""
    ctx, clock = FakeCtx(rank=1, world_size=2, others=[[0, 0, 7]]), Clock(0.0001)
    stops = LoopStops(JobStops(ctx, FakeEmitter(), on_ray=False), clock=clock)
    exchanged = []
    run_steps(stops, clock, 1, 30, exchanged)
    assert exchanged == [1, 8, 15, 22, 29] and stops.every == 7


def test_hfs_jit_checkpoint_is_left_to_the_hosted_stop_so_a_trainer_builds_off_the_main_thread(tmp_path):
    """enable_jit_checkpoint=True: HF's Trainer sets a SIGTERM handler, which Python refuses outside the main
    thread, where a hosted job runs (Ray Train's training thread). The hosted job saves on SIGTERM itself."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from raytrainer.worker.hosted.host import Host

    host = Host(types.SimpleNamespace(), FakeCtx(), FakeEmitter(), stops=None)
    args = TrainingArguments(str(tmp_path), enable_jit_checkpoint=True, report_to="none", use_cpu=True)
    host.stage(args)
    assert args.enable_jit_checkpoint is False
    built = []
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    thread = threading.Thread(target=lambda: built.append(Trainer(model=model, args=args)))
    thread.start()
    thread.join()
    assert built
