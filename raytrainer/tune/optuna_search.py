"""`hyperparameter_search(backend="optuna")`: transformers' Optuna backend, each trial a raytrainer run.

Optuna's study runs in the driver's process, one trial after another (as transformers runs it): each trial is
the Trainer built as a Ray trial's (trial.py: a copy of the arguments with the trial's values,
output_dir/run-<trial number>, callbacks of its own), and its `train()` takes the worker group the last trial
left idle in this process's pool: no Tune, no trial actor, a warm group from the second trial on. A pruner reads
the objective at each evaluation (`trial.report`); when it prunes, the run stops at that evaluation's step on
every rank (the same `should_training_stop` as Tune's stop), and the trial ends as `optuna.TrialPruned`.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union

from .. import storage
from ..callbacks.base import TrainerCallback
from ..errors import ConfigError
from .hf_names import BestRun
from .report import WholeEvaluation, objective_of
from .trial import TrialRecipe, run_name, trial_trainer

OPTIMIZE_KWARGS = ("timeout", "n_jobs", "gc_after_trial", "catch")  # study.optimize's, as transformers takes them


class OptunaReport(TrainerCallback):
    """on_evaluate (driver): the objective to Optuna (`trial.report` at the global step); a prune becomes
    `should_training_stop` at this step on every rank. Multi-objective studies cannot prune (Optuna)."""

    observes_only = False  # every rank waits for its answer at the evaluation's step

    def __init__(self, trial, compute_objective: Callable[[Dict[str, float]], Any], prunes: bool = True):
        self.trial = trial
        self.compute_objective = compute_objective
        self.prunes = prunes
        self.objective = None
        self.pruned = False
        self.evaluation = WholeEvaluation()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        whole = self.evaluation.add(metrics, kwargs)
        if self.pruned or whole is None:
            return
        _, self.objective = objective_of(self.compute_objective, whole)  # as report.TuneReport's
        if not self.prunes:
            return
        self.trial.report(self.objective, state.global_step)
        if self.trial.should_prune():
            self.pruned = True
            control.should_training_stop = True


def optuna_space(hp_space: Optional[Callable]) -> Callable:
    if hp_space is not None:
        return hp_space
    from transformers.trainer_utils import default_hp_space_optuna

    return default_hp_space_optuna


def sample_optuna(hp_space: Callable) -> Dict[str, Any]:
    """One trial's values from a throwaway study, to check the space against the arguments before any run."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return dict(hp_space(optuna.create_study().ask()))


def run_optuna(recipe: TrialRecipe, hp_space: Callable, n_trials: int, direction: Union[str, List[str]],
               **kwargs) -> Union[BestRun, List[BestRun]]:
    """transformers' `run_hp_search_optuna`, each trial a raytrainer run in output_dir/run-<trial number>."""
    import optuna

    optimize = {k: kwargs.pop(k) for k in OPTIMIZE_KWARGS if k in kwargs}
    if optimize.get("n_jobs", 1) != 1:
        raise ConfigError("backend='optuna' runs its trials one after another in this process (each on its own "
                          "worker group): leave n_jobs at 1, or use backend='ray' (max_concurrent_trials=...) for "
                          "trials at once.")
    optimize["n_jobs"] = 1
    directions = list(direction) if isinstance(direction, (list, tuple)) else None

    def objective(trial):
        config = dict(hp_space(trial))
        report = OptunaReport(trial, recipe.compute_objective, prunes=directions is None)
        run_dir = storage.join(recipe.output_dir, run_name(recipe, trial, str(trial.number)))
        trainer = trial_trainer(recipe, config, run_dir, report)
        trainer.train()
        if report.pruned:
            raise optuna.TrialPruned()
        if report.objective is None:  # no evaluation during training: one now, as transformers does
            trainer.evaluate()
        return report.objective

    try:
        study = optuna.create_study(direction=None if directions else direction, directions=directions, **kwargs)
    except TypeError as error:
        raise ConfigError(f"backend='optuna' passes **kwargs to optuna.create_study (and {list(OPTIMIZE_KWARGS)} "
                          f"to study.optimize): {error}") from error
    study.optimize(objective, n_trials=n_trials, **optimize)
    if directions is None:
        best = study.best_trial
        return BestRun(str(best.number), best.value, best.params, study)
    return [BestRun(str(t.number), t.values, t.params, study) for t in study.best_trials]
