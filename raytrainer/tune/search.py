"""`Trainer.hyperparameter_search` on Ray Tune: transformers' signature, defaults and `BestRun`.

The sweep, on the driver: check everything (backend, model_init, direction, the search space against the
arguments, the scheduler, the trial's resources), then Tune's `Tuner` runs `trial.run_trial` for each trial
(a raytrainer run in output_dir/run-<trial id>), reading the objective that each trial's driver-side callback
reports at every evaluation (report.py). The sweep's state lives under output_dir/hp_search (or `name=`): the
same call run again after its driver died restores it (`Tuner.restore`): finished trials are not run again,
unfinished ones resume from their committed checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Callable, Dict, Optional, Union

from .. import storage
from ..coordinator import cluster, holders
from ..errors import ConfigError, missing_package
from . import options as tune_options, resources
from .hf_names import BestRun, default_compute_objective, default_hp_space_ray
from .report import OBJECTIVE
from .trial import ShippedRecipe, TrialRecipe, run_trial, takes_trial, trial_arguments, user_callbacks

BACKENDS = ("ray", "optuna")
CHECKPOINT_PERIOD_ENV = "TUNE_GLOBAL_CHECKPOINT_S"  # read by Tune's controller when fit() starts
NO_MODEL_INIT = "To use hyperparameter search, you need to pass your model through a model_init function."  # HF's


def hyperparameter_search(trainer, hp_space: Optional[Callable[[Any], Dict[str, Any]]] = None,
                          compute_objective: Optional[Callable[[Dict[str, float]], float]] = None,
                          n_trials: int = 20, direction: str = "minimize", backend: Union[str, Any, None] = None,
                          hp_name: Optional[Callable[[Any], str]] = None, **kwargs) -> BestRun:
    """See `Trainer.hyperparameter_search`."""
    backend = choose_backend(backend)
    if trainer.model_init is None:
        raise RuntimeError(NO_MODEL_INIT)
    if backend == "optuna":
        return optuna_search(trainer, hp_space, compute_objective, n_trials, direction, hp_name, **kwargs)
    direction = check_direction(direction)
    space = (hp_space or default_hp_space_ray)(None)
    check_space(trainer, space)
    opts = tune_options.split_kwargs(kwargs, n_trials, direction)
    tune_options.check_evaluates(trainer.args, opts.tune_config.get("scheduler"))

    from ray import tune

    cluster.connect(trainer.args.ray_address)
    import ray

    totals = ray.cluster_resources()
    opts.resources = resources.trial_actor(trainer.args, opts.resources)
    resources.check_trial_placeable(trainer.args, opts.resources, totals)
    opts.tune_config.setdefault("max_concurrent_trials",
                                resources.default_concurrency(trainer.args, opts.resources, totals))
    tune_options.check_synchronous_fits(opts.tune_config.get("scheduler"), space, n_trials,
                                        opts.tune_config["max_concurrent_trials"])
    # This process's idle worker groups (an earlier train() of the script) would hold what the trials' groups
    # need: released now if the first trials would not fit beside them.
    need = resources.trial_needs(trainer.args, opts.resources)
    holders.check_room({k: v * opts.tune_config["max_concurrent_trials"] for k, v in need.items()},
                       "the trials of hyperparameter_search")

    recipe = recipe_of(trainer, compute_objective, hp_name)
    recipe.exploits = tune_options.exploits(opts.tune_config.get("scheduler"))
    shipped = ShippedRecipe.of(recipe, ship_modules=cluster.workers_may_be_elsewhere())
    trainable = tune.with_resources(tune.with_parameters(run_trial, recipe=shipped), opts.resources)
    tuner = make_tuner(trainable, space, opts, trainer.args)
    with state_saved_often():
        grid = tuner.fit()
    if opts.raise_on_failed_trial and grid.errors:
        raise RuntimeError(f"{len(grid.errors)} trial(s) of the sweep failed; the first: {grid.errors[0]!r}. The "
                           "same call again retries them (resume_errored), keeping the finished ones.")
    best = grid.get_best_result(metric=OBJECTIVE, mode=direction[:3], scope=os.environ.get("RAY_SCOPE", "last"))
    return BestRun(best.metrics["trial_id"], best.metrics[OBJECTIVE], best.config, grid)


@contextlib.contextmanager
def state_saved_often():
    """Tune saves the sweep's state (which trial finished, which runs) at most every few seconds by default
    ("auto"); a driver that dies between two saves would run again a trial that had finished. The trials here
    last seconds to hours and the state is a small JSON: saved after each step of Tune's loop (a value the
    user set in TUNE_GLOBAL_CHECKPOINT_S is kept)."""
    if CHECKPOINT_PERIOD_ENV in os.environ:
        yield
        return
    os.environ[CHECKPOINT_PERIOD_ENV] = "0"
    try:
        yield
    finally:
        os.environ.pop(CHECKPOINT_PERIOD_ENV, None)


def optuna_search(trainer, hp_space, compute_objective, n_trials: int, direction, hp_name, **kwargs):
    """backend="optuna": the space checked on one sampled trial, then the study in this process (optuna_search.py)."""
    from .optuna_search import optuna_space, run_optuna, sample_optuna

    if isinstance(direction, (list, tuple)):
        for one in direction:
            check_direction(one)
    else:
        check_direction(direction)
    space = optuna_space(hp_space)
    check_space(trainer, sample_optuna(space))
    return run_optuna(recipe_of(trainer, compute_objective, hp_name), space, n_trials, direction, **kwargs)


def choose_backend(backend) -> str:
    """"ray" (the default) or "optuna" (where it is installed); anything else is refused."""
    name = getattr(backend, "value", backend) or "ray"
    if name not in BACKENDS:
        raise ConfigError(f"backend={name!r} is not a hyperparameter search backend here: use 'ray' (Ray Tune) or "
                          "'optuna'.")
    if name == "optuna":
        try:
            import optuna  # noqa: F401
        except ImportError:
            raise missing_package("optuna", "optuna", "hyperparameter_search(backend='optuna')") from None
    return name


def check_direction(direction) -> str:
    if isinstance(direction, (list, tuple)):
        raise ConfigError("A list of directions (multi-objective search) is Optuna's only, as in transformers: pass "
                          "backend='optuna', or one direction ('minimize' or 'maximize') to Ray Tune.")
    if direction not in ("minimize", "maximize"):
        raise ConfigError(f"direction={direction!r}: pass 'minimize' or 'maximize'.")
    return direction


def check_space(trainer, space: Dict[str, Any]):
    """Every key of the space sets a TrainingArguments field, or is model_init(trial)'s; one sampled trial
    gives arguments that pass their checks (a bad value fails here, not in a trial's actor)."""
    if not isinstance(space, dict) or not space:
        raise ConfigError("hp_space must return a non-empty dict of hyperparameters (Ray Tune's search space), "
                          f"got {space!r}.")
    fields = {f.name for f in dataclasses.fields(trainer.args) if f.init}
    unknown = sorted(set(space) - fields)
    if unknown and not takes_trial(trainer.model_init):
        raise ConfigError(f"The search space names {unknown}, which are not TrainingArguments fields, and "
                          "model_init takes no argument to receive them: rename them to argument names "
                          "(learning_rate, ...), or write model_init(trial) to read them.")
    try:
        trial_arguments(trainer.args, sample(space), storage.join(trainer.args.output_dir, "run-check"))
    except (TypeError, ValueError) as error:
        raise ConfigError(f"A trial of the search space gives arguments that fail their checks: {error}") from error


def sample(space: Dict[str, Any]) -> Dict[str, Any]:
    """One trial's values: a Tune domain sampled, a grid's first value, a plain value as it is."""
    out = {}
    for key, value in space.items():
        if isinstance(value, dict) and "grid_search" in value:
            value = value["grid_search"][0]
        elif hasattr(value, "sample") and callable(value.sample):
            value = value.sample()
        out[key] = value
    return out


def recipe_of(trainer, compute_objective, hp_name) -> TrialRecipe:
    """What every trial of either backend is built from."""
    return TrialRecipe(trainer=driverless_copy(trainer), callbacks=user_callbacks(trainer),
                       compute_objective=compute_objective or default_compute_objective, hp_name=hp_name,
                       output_dir=trainer.args.output_dir)


def driverless_copy(trainer):
    """The Trainer as each trial receives it: model built by model_init (never shipped), no callbacks, no pool
    (Trainer.__getstate__ leaves them out, as for its workers)."""
    import copy

    shipped = copy.copy(trainer)
    shipped.model = shipped.model_wrapped = None
    return shipped


def sweep_storage(output_dir: str, storage_options: Optional[dict]):
    """Tune's storage_path and filesystem for output_dir: a local path as it is; a URL through fsspec with the
    arguments' storage_options (pyarrow's wrapper of an fsspec filesystem), as every other write of the run."""
    if storage.is_local(output_dir):
        return storage.local_path(output_dir), None
    import fsspec
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    fs, path = fsspec.core.url_to_fs(output_dir, **(storage_options or {}))
    return path, PyFileSystem(FSSpecHandler(fs))


def make_tuner(trainable, space: Dict[str, Any], opts: tune_options.TuneOptions, args):
    """A new sweep, or the one already under its folder (its driver died, or it finished: then nothing runs
    again and the same best run comes back)."""
    from ray import tune

    run_config = dict(opts.run_config)
    if "storage_path" not in run_config:
        run_config["storage_path"], filesystem = sweep_storage(args.output_dir, args.storage_options)
        if filesystem is not None:
            run_config.setdefault("storage_filesystem", filesystem)
    path = storage.join(run_config["storage_path"], run_config["name"])  # a local or a filesystem's path
    filesystem = run_config.get("storage_filesystem")
    if tune.Tuner.can_restore(path, storage_filesystem=filesystem):
        if opts.resume is False:
            raise ConfigError(f"A sweep already lives in {path} and resume=False: remove that folder, or pass "
                              "another name=... (or output_dir) to start a new sweep.")
        return tune.Tuner.restore(path, trainable, resume_unfinished=True, resume_errored=True,
                                  storage_filesystem=filesystem)
    return tune.Tuner(trainable, param_space=space, tune_config=tune.TuneConfig(**opts.tune_config),
                      run_config=tune.RunConfig(**run_config))
