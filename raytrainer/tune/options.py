"""transformers' `**kwargs` for Ray (those of `tune.run`) sorted into Tune's `TuneConfig`, `RunConfig` and the
trial's resources, with raytrainer's defaults; every unknown or meaningless one refused before any trial.

Nothing of Tune is rewritten: the scheduler, search algorithm, stoppers, callbacks and reporters are passed as
they are. Two things are added, as transformers' users expect them: `n_trials` is `num_samples`, and a
scheduler or search algorithm given without a metric gets the objective and `direction` (Tune refuses an ASHA
without a metric; transformers' users had to write `metric="objective"` by hand).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

from ..errors import ConfigError
from .report import OBJECTIVE

TUNE_CONFIG = ("metric", "mode", "search_alg", "scheduler", "max_concurrent_trials", "time_budget_s", "reuse_actors",
               "trial_name_creator", "trial_dirname_creator")
RUN_CONFIG = ("name", "stop", "callbacks", "progress_reporter", "verbose", "log_to_file", "sync_config",
              "failure_config", "storage_path", "storage_filesystem")
OURS = ("resources_per_trial", "resume", "raise_on_failed_trial", "max_failures", "fail_fast")
REFUSED = {
    "config": "the search space is hp_space (a function returning Tune's search space)",
    "num_samples": "the number of samples is n_trials",
    "keep_checkpoints_num": "each trial's checkpoints are raytrainer's, under output_dir/run-<trial id>: keep them "
                            "with TrainingArguments(save_total_limit=...)",
    "checkpoint_score_attr": "the best checkpoint of a trial is TrainingArguments(metric_for_best_model=...)'s",
    "checkpoint_freq": "each trial saves as TrainingArguments(save_strategy=..., save_steps=...) say",
    "checkpoint_at_end": "each trial saves as TrainingArguments(save_strategy=..., save_steps=...) say",
    "checkpoint_config": "each trial saves as TrainingArguments(save_strategy=..., save_steps=...) say",
    "local_dir": "the sweep's state is kept under output_dir (or storage_path=...)",
}
# The trial's actor only drives the run: its worker group is placed by the run itself (num_workers,
# resources_per_worker), in a placement group of Ray Train's own. The actor takes no CPU (a fraction of one would
# leave a node one whole CPU short for the workers); Tune refuses a trial that asks for nothing, so it asks for
# 1 MiB of memory.
TRIAL_ACTOR = {"cpu": 0, "memory": 1 << 20}
DEFAULT_NAME = "hp_search"  # the sweep's folder under output_dir: Tune's experiment state and each trial's results
# Schedulers that decide on intermediate results: without evaluations during training they never see one.
INTERMEDIATE = ("ASHAScheduler", "AsyncHyperBandScheduler", "HyperBandScheduler", "HyperBandForBOHB",
                "MedianStoppingRule", "PopulationBasedTraining", "PB2")


@dataclasses.dataclass
class TuneOptions:
    tune_config: Dict[str, Any]
    run_config: Dict[str, Any]
    resources: Dict[str, float]
    resume: Any = None
    raise_on_failed_trial: bool = True


def split_kwargs(kwargs: Dict[str, Any], n_trials: int, direction: str) -> TuneOptions:
    """Sort `**kwargs` as transformers passes them to `tune.run`; refuse the rest, naming what to use."""
    unknown = sorted(set(kwargs) - set(TUNE_CONFIG) - set(RUN_CONFIG) - set(OURS) - set(REFUSED))
    if unknown:
        raise ConfigError(f"hyperparameter_search(backend='ray') does not take {unknown}: it takes Tune's "
                          f"{sorted(TUNE_CONFIG + RUN_CONFIG + OURS)}.")
    for name in sorted(set(kwargs) & set(REFUSED)):
        raise ConfigError(f"hyperparameter_search(..., {name}=...) is not used here: {REFUSED[name]}.")
    tune_config = {k: kwargs[k] for k in TUNE_CONFIG if k in kwargs}
    run_config = {k: kwargs[k] for k in RUN_CONFIG if k in kwargs}
    tune_config["num_samples"] = n_trials
    resources = dict(kwargs.get("resources_per_trial") or {})  # none given: resources.trial_actor decides
    if "max_failures" in kwargs or "fail_fast" in kwargs:
        if "failure_config" in run_config:
            raise ConfigError("Pass either failure_config=FailureConfig(...) or max_failures/fail_fast, not both.")
        from ray.tune import FailureConfig

        run_config["failure_config"] = FailureConfig(max_failures=kwargs.get("max_failures", 0),
                                                     fail_fast=kwargs.get("fail_fast", False))
    # The warm worker group lives in the trial actor's process: a reused actor hands it to the next trial.
    tune_config.setdefault("reuse_actors", True)
    run_config.setdefault("name", DEFAULT_NAME)
    add_objective(tune_config, direction)
    return TuneOptions(tune_config, run_config, resources, kwargs.get("resume"),
                       kwargs.get("raise_on_failed_trial", True))


def has_metric(decider: Optional[Any]) -> bool:
    """Whether a scheduler or searcher was built with its own metric (Tune then refuses another one)."""
    return decider is not None and (getattr(decider, "_metric", None) or getattr(decider, "metric", None)) is not None


def add_objective(tune_config: Dict[str, Any], direction: str):
    """metric="objective" and mode from `direction`, unless the scheduler or searcher names its own metric or
    the caller gave one."""
    deciders = [tune_config.get("scheduler"), tune_config.get("search_alg")]
    if "metric" in tune_config or any(has_metric(d) for d in deciders):
        return
    tune_config["metric"] = OBJECTIVE
    tune_config.setdefault("mode", direction[:3])


def check_evaluates(args, scheduler: Optional[Any]):
    """transformers' check: a scheduler that decides on intermediate results needs evaluations during training."""
    name = type(scheduler).__name__
    if scheduler is None or name not in INTERMEDIATE:
        return
    if getattr(args, "eval_strategy", "no") in ("no", None):
        raise ConfigError(f"You are using {name} as a scheduler but you haven't enabled evaluation during training: "
                          f"the trials would never report an intermediate result to Ray Tune and {name} could not "
                          "stop any. Pass eval_strategy='steps' (and eval_steps) in the Trainer's arguments, or do "
                          f"not use {name}.")
    if exploits(scheduler) and not saves_at_every_evaluation(args):
        raise ConfigError(f"{name} starts a trial from another trial's checkpoint of the step it evaluated, so every "
                          "evaluation step must be a save step: pass save_strategy equal to eval_strategy "
                          f"({args.eval_strategy!r}) and, for 'steps', eval_steps a multiple of save_steps (now "
                          f"save_strategy={args.save_strategy!r}, eval_steps={args.eval_steps!r}, "
                          f"save_steps={args.save_steps!r}).")


def check_synchronous_fits(scheduler: Optional[Any], space: Dict[str, Any], n_trials: int, concurrent: int):
    """Synchronous PBT waits at each perturbation for every trial, and Tune starts a trial only while fewer than
    max_concurrent_trials are unfinished (a paused one is unfinished): more trials than that waited forever
    (measured: 4 trials, 2 at a time, nothing after the first two for 10 minutes)."""
    if not (exploits(scheduler) and getattr(scheduler, "_synch", False)):
        return
    total = n_trials
    for value in space.values():
        if isinstance(value, dict) and "grid_search" in value:
            total *= len(value["grid_search"])
    if total > concurrent:
        raise ConfigError(f"{type(scheduler).__name__}(synch=True) waits at each perturbation for every trial, and "
                          f"Tune starts at most max_concurrent_trials={concurrent} trials before earlier ones finish "
                          f"(a paused trial has not finished): the sweep's {total} trials would wait forever. Pass "
                          f"fewer trials (n_trials times the grid's size <= {concurrent}), max_concurrent_trials="
                          f"{total} where the cluster fits them, or synch=False.")


def exploits(scheduler: Optional[Any]) -> bool:
    """Population Based Training (and PB2): trials start from other trials' checkpoints (tune/trial.py)."""
    return type(scheduler).__name__ in ("PopulationBasedTraining", "PB2")


def saves_at_every_evaluation(args) -> bool:
    """Whether every step the arguments evaluate at is also a step they save at (eval_steps unset is
    logging_steps, as in transformers)."""
    evaluate, save = args.eval_strategy, args.save_strategy  # plain strings: TrainingArguments normalises enums
    if evaluate != save or evaluate not in ("steps", "epoch"):
        return False
    if evaluate == "epoch":
        return True
    every = args.eval_steps if args.eval_steps is not None else args.logging_steps
    if isinstance(every, float) or isinstance(args.save_steps, float):  # fractions of the run: equal ones only
        return every == args.save_steps
    return every % args.save_steps == 0
