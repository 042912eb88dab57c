"""Why each worker group ended (raytrainer/coordinator/history.py): the restart and resize records a new group
start is told, and which recorded cause wins."""

from __future__ import annotations

from raytrainer.coordinator.sink import EventSink
from raytrainer.protocol import GroupStart, Reason
from tests.coordinator.sink_calls import job, run


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


def test_a_hosted_resize_says_the_global_batch_changed():
    """The own loop rescales the accumulation to keep the global batch; a hosted script's Trainer keeps its
    arguments, so the resize record and its console line say the global batch followed the world size."""
    from raytrainer.callbacks.progress import resize_line
    from raytrainer.coordinator.history import RunHistory
    from raytrainer.state import TrainerState

    own, hosted = RunHistory(), RunHistory()
    own.group_started(GroupStart(2, 0, None, 1))
    hosted.group_started(GroupStart(2, 0, None, 1, keeps_global_batch=False))
    own_resize = own.group_started(GroupStart(1, 5, "c-5", 2)).resize
    hosted_resize = hosted.group_started(GroupStart(1, 5, "c-5", 1, keeps_global_batch=False)).resize
    assert own_resize["same_global_batch"] is True and hosted_resize["same_global_batch"] is False
    state = TrainerState(global_step=5)
    assert resize_line(state, **own_resize) == ("[raytrainer] resized 2 -> 1 workers at step 5; "
                                                "gradient_accumulation_steps is now 2 (same global batch)")
    assert resize_line(state, **hosted_resize) == (
        "[raytrainer] resized 2 -> 1 workers at step 5; the script's gradient_accumulation_steps stays 1: the "
        "global batch is 1/2 of what it was")
