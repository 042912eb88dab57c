"""backend="optuna": the prune callback without Ray, and one real study of two raytrainer runs in this process's
pool (a grid sampler and a threshold pruner: the same trials every run)."""

import json
import os

import pytest

from raytrainer.errors import ConfigError
from raytrainer.state import TrainerControl, TrainerState
from raytrainer.tune.hf_names import default_compute_objective
from raytrainer.tune.optuna_search import OptunaReport, run_optuna
from raytrainer.tune.trial import TrialRecipe
from tests.tune.test_search import arguments, trainer_of

optuna = pytest.importorskip("optuna")


class FakeTrial:
    def __init__(self, prune_at: int):
        self.prune_at, self.reports = prune_at, []

    def report(self, value, step):
        self.reports.append((step, value))

    def should_prune(self):
        return self.reports[-1][0] >= self.prune_at


def state_at(step: int) -> TrainerState:
    state = TrainerState()
    state.global_step = step
    return state


def test_a_prune_stops_the_run_at_that_evaluation():
    trial = FakeTrial(prune_at=4)
    report = OptunaReport(trial, default_compute_objective)
    control = TrainerControl()
    report.on_evaluate(None, state_at(2), control, metrics={"eval_loss": 3.0, "epoch": 0.5})
    assert trial.reports == [(2, 3.0)] and not control.should_training_stop and report.objective == 3.0
    report.on_evaluate(None, state_at(4), control, metrics={"eval_loss": 2.0})
    assert report.pruned and control.should_training_stop and trial.reports[-1] == (4, 2.0)
    report.on_evaluate(None, state_at(6), TrainerControl(), metrics={"eval_loss": 1.0})
    assert len(trial.reports) == 2  # nothing after the prune


def test_multi_objective_studies_do_not_prune():
    trial = FakeTrial(prune_at=0)
    report = OptunaReport(trial, lambda m: [m["eval_loss"], 1.0], prunes=False)
    control = TrainerControl()
    report.on_evaluate(None, state_at(2), control, metrics={"eval_loss": 3.0})
    assert trial.reports == [] and report.objective == [3.0, 1.0] and not control.should_training_stop


def test_trials_at_once_are_refused(tmp_path):
    recipe = TrialRecipe(trainer=None, callbacks=[], compute_objective=default_compute_objective, hp_name=None,
                         output_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="n_jobs at 1"):
        run_optuna(recipe, lambda trial: {}, 2, "minimize", n_jobs=2)


def test_an_optuna_study_of_raytrainer_runs(tmp_path, ray_session):
    out = str(tmp_path / "sweep")
    grid = {"learning_rate": [1e-2, 1e-6]}
    best = trainer_of(arguments(out)).hyperparameter_search(
        hp_space=lambda trial: {"learning_rate": trial.suggest_float("learning_rate", 1e-6, 1e-2, log=True)},
        n_trials=2, backend="optuna", sampler=optuna.samplers.GridSampler(grid),
        pruner=optuna.pruners.ThresholdPruner(upper=3.45))  # 1e-6's loss at step 2 is ~3.53, 1e-2's ~3.39

    assert best.hyperparameters == {"learning_rate": 1e-2}
    runs = {t.params["learning_rate"]: t for t in best.run_summary.trials}
    assert runs[1e-6].state == optuna.trial.TrialState.PRUNED and max(runs[1e-6].intermediate_values) == 2
    kept = os.path.join(out, f"run-{best.run_id}")
    with open(os.path.join(kept, "checkpoint-6", "trainer_state.json")) as f:
        evaluations = [h for h in json.load(f)["log_history"] if "eval_loss" in h]
    assert evaluations[-1]["step"] == 6 and evaluations[-1]["eval_loss"] == best.objective
    # The pruned run stopped at step 2 on every rank, in this process: its stop step's checkpoint is committed.
    pruned = os.path.join(out, f"run-{runs[1e-6].number}")
    assert sorted(d for d in os.listdir(pruned) if d.startswith("checkpoint-")) == ["checkpoint-2"]
