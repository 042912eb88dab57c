"""TuneReport without Ray: what one evaluation reports, and Tune's stop turned into a stop at that step."""

import json
import math

import pytest

from raytrainer.callbacks.base import listens_to
from raytrainer.state import TrainerControl, TrainerState
from raytrainer.tune.report import (
    OBJECTIVE,
    POINTER,
    TuneReport,
    TuneReportAtCommit,
    default_compute_objective,
    pointed_checkpoint,
    tune_metrics,
)

METRICS = {"eval_loss": 2.5, "eval_runtime": 0.01, "eval_samples_per_second": 800.0,
           "eval_steps_per_second": 100.0, "epoch": 0.5}


def state_at(step: int, epoch: float = 0.5) -> TrainerState:
    state = TrainerState()
    state.global_step, state.epoch = step, epoch
    return state


def test_an_evaluation_reports_its_metrics_the_objective_and_the_step():
    sent = []
    report = TuneReport(default_compute_objective, report=sent.append)
    control = TrainerControl()
    report.on_evaluate(None, state_at(4), control, metrics=dict(METRICS))
    assert sent == [{**METRICS, OBJECTIVE: 2.5, "step": 4}]
    assert report.reported == 1 and not report.stopped and not control.should_training_stop
    assert report.last == sent[0]


def test_an_evaluation_of_several_datasets_is_reported_once_with_all_their_metrics():
    """A dict of eval datasets is one on_evaluate each (as transformers' evaluate): Tune gets their merged
    metrics once, after the last, as transformers' Ray backend reports them."""
    sent = []
    report = TuneReport(lambda m: m["eval_a_loss"] + m["eval_b_loss"], report=sent.append)
    report.on_evaluate(None, state_at(6, 1.0), TrainerControl(), metrics={"eval_a_loss": 2.0, "epoch": 1.0},
                       eval_datasets_left=1)
    assert sent == []
    report.on_evaluate(None, state_at(6, 1.0), TrainerControl(), metrics={"eval_b_loss": 0.5, "epoch": 1.0},
                       eval_datasets_left=0)
    assert sent == [{"eval_a_loss": 2.0, "eval_b_loss": 0.5, "epoch": 1.0, OBJECTIVE: 2.5, "step": 6}]
    for name, loss, left in (("eval_a_loss", 1.0, 1), ("eval_b_loss", 0.25, 0)):  # the next evaluation afresh
        report.on_evaluate(None, state_at(8, 1.5), TrainerControl(), metrics={name: loss, "epoch": 1.5},
                           eval_datasets_left=left)
    assert sent[1] == {"eval_a_loss": 1.0, "eval_b_loss": 0.25, "epoch": 1.5, OBJECTIVE: 1.25, "step": 8}


def test_a_user_objective_is_given_the_metrics():
    sent = []
    report = TuneReport(lambda m: m["eval_accuracy"], report=sent.append)
    report.on_evaluate(None, state_at(2), TrainerControl(), metrics={**METRICS, "eval_accuracy": 0.75})
    assert sent[0][OBJECTIVE] == 0.75 and sent[0]["eval_accuracy"] == 0.75


def test_tunes_stop_becomes_a_training_stop_at_this_step():
    """Tune's function trainables report synchronously: a stopped trial's tune.report raises SystemExit."""
    def stopped(result):
        raise SystemExit(0)

    report = TuneReport(default_compute_objective, report=stopped)
    control = TrainerControl()
    report.on_evaluate(None, state_at(2), control, metrics=dict(METRICS))
    assert report.stopped and control.should_training_stop and report.reported == 0
    calls = []
    report._report = calls.append  # a stopped trial reports nothing more: Tune closed its session
    report.on_evaluate(None, state_at(4), TrainerControl(), metrics=dict(METRICS))
    assert calls == []


def test_an_objective_that_is_no_number_names_the_fix():
    report = TuneReport(lambda m: float("nan"), report=lambda r: None)
    with pytest.raises(ValueError, match="compute_objective"):
        report.on_evaluate(None, state_at(2), TrainerControl(), metrics=dict(METRICS))
    report = TuneReport(lambda m: None, report=lambda r: None)
    with pytest.raises(ValueError, match="compute_objective"):
        report.on_evaluate(None, state_at(2), TrainerControl(), metrics=dict(METRICS))


def test_tune_metrics_keeps_numbers_only():
    out = tune_metrics({"eval_loss": 1.0, "eval_name": "x", "eval_flag": True, "eval_n": 3}, 1.0, 8, None)
    assert out == {"eval_loss": 1.0, "eval_n": 3, OBJECTIVE: 1.0, "step": 8}
    assert not math.isnan(out[OBJECTIVE])


def test_the_callback_decides_control():
    """Not observes_only: every rank waits for its answer at the evaluation's step (principle 1)."""
    assert TuneReport.observes_only is False and TuneReport.on_every_rank is False


@pytest.mark.parametrize("metrics", [dict(METRICS), {**METRICS, "eval_accuracy": 0.5, "eval_f1": 0.25},
                                     {"eval_accuracy": 0.5, "epoch": 1.0}, {"eval_loss": 1.5}])
def test_the_default_objective_is_transformers(metrics):
    """Defined here (no transformers import in each trial's actor), the same as transformers' own."""
    trainer_utils = pytest.importorskip("transformers.trainer_utils")
    assert default_compute_objective(dict(metrics)) == trainer_utils.default_compute_objective(dict(metrics))


def test_under_pbt_an_evaluation_is_reported_once_its_checkpoint_is_committed(tmp_path):
    from ray.tune import Checkpoint

    from raytrainer import TrainingArguments

    sent = []
    args = TrainingArguments(output_dir=str(tmp_path / "run-a"), num_workers=1, use_gpu=False)
    report = TuneReportAtCommit(default_compute_objective, report=lambda *a: sent.append(a))
    assert listens_to(report, "step_end")  # every step's end waits for the driver: a stop given at on_save
    report.on_evaluate(args, state_at(6), TrainerControl(), metrics=dict(METRICS))
    assert sent == [] and report.pending[6]["step"] == 6  # the workers save checkpoint-6 next
    report.on_save(args, state_at(6), TrainerControl(), checkpoint=str(tmp_path / "run-a" / "checkpoint-4"))
    assert sent == []  # an earlier checkpoint (of a step without evaluation) committed late
    url = str(tmp_path / "run-a" / "checkpoint-6")
    report.on_save(args, state_at(6), TrainerControl(), checkpoint=url)
    [(result, pointer)] = sent
    assert result["step"] == 6 and report.reported == 1 and report.pending == {}
    assert pointer == {"url": url, "step": 6}
    # num_workers=0: the commit of checkpoint-9 is heard after step 10's evaluation (the writer thread reports it
    # while the loop trains on). Each result still goes with its own step's checkpoint, in order.
    report.on_evaluate(args, state_at(9), TrainerControl(), metrics=dict(METRICS))
    report.on_evaluate(args, state_at(10), TrainerControl(), metrics={**METRICS, "eval_loss": 0.5})
    for step in (9, 10):
        report.on_save(args, state_at(10), TrainerControl(), checkpoint=str(tmp_path / "run-a" / f"checkpoint-{step}"))
    assert [(r["step"], p["step"]) for r, p in sent[1:]] == [(9, 9), (10, 10)] and report.pending == {}
    assert sent[2][0]["objective"] == 0.5
    folder = tmp_path / "tune-checkpoint"  # as Tune hands it back to the trial that continues it
    folder.mkdir()
    (folder / POINTER).write_text(json.dumps(pointer))
    assert pointed_checkpoint(Checkpoint.from_directory(str(folder))) == pointer
    (folder / POINTER).unlink()
    assert pointed_checkpoint(Checkpoint.from_directory(str(folder))) is None  # not ours: the trial starts as usual
    assert pointed_checkpoint(None) is None

    def stopped(*a):
        raise SystemExit(0)

    report = TuneReportAtCommit(default_compute_objective, report=stopped)
    control = TrainerControl()
    report.on_evaluate(args, state_at(2), control, metrics=dict(METRICS))
    report.on_save(args, state_at(2), control, checkpoint=str(tmp_path / "run-a" / "checkpoint-2"))
    assert report.stopped and control.should_training_stop  # taken by the workers at their next step's end
    # The run's last step is evaluated and saved: its result goes to Tune with its checkpoint too.
    last, before = state_at(8), state_at(7)
    last.max_steps = before.max_steps = 8
    control = TrainerControl()
    report.on_step_end(args, before, control)
    assert not control.should_evaluate and not control.should_save
    report.on_step_end(args, last, control)
    assert control.should_evaluate and control.should_save
