"""One trial: a raytrainer run with the trial's hyperparameters, inside a Ray Tune function trainable.

`run_trial` is the trainable. It runs in Tune's trial actor, a thin driver for the run: it builds the trial's
Trainer from the user's (`TrialRecipe`: the Trainer pickled without its callbacks, pool and model, as every
worker receives it), with the hyperparameters set on a copy of the `TrainingArguments` and
`output_dir/run-<trial id>` as the run's output_dir, and calls `train()`, which places the trial's own worker
group (`num_workers` workers, DDP or FSDP as the arguments say) and commits its checkpoints there. Tune keeps
no copy of them: its folder holds the trial's results only.

The actor is reused from trial to trial (`reuse_actors=True`): the worker group the last trial ran on stays in
the actor's pool (coordinator/holders.py), and the next trial of the same shape takes it warm.

A trial whose run folder already holds a committed checkpoint resumes from it (Tune restarts an unfinished
trial after its driver died; the trial continues where its run left off, principle 3).

Under Population Based Training, Tune starts a trial with a checkpoint of its choice: the trial's own (after a
pause) or another trial's (an exploit, with this trial's new hyperparameters). Ours name a run's committed
checkpoint (report.py); the trial resumes from it keeping its own optimizer hyperparameters
(checkpoint/hyperparameters.py): the donor's weights, moments, step and data position, this trial's learning
rate.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import os
import time
from typing import Any, Callable, Dict, List, Optional, Union

from .. import code_paths, storage
from ..callbacks.base import CallbackHandler
from ..callbacks.progress import PrinterCallback, ProgressCallback
from ..callbacks.reporters import reporter_callbacks
from ..checkpoint import lease
from ..checkpoint.listing import newest_committed
from ..checkpoint.manifest import is_committed
from ..coordinator import holders
from ..errors import ConfigError
from ..state import TrainerState
from ..verbosity import configure_worker, worker_level
from .report import TuneReport, TuneReportAtCommit, pointed_checkpoint

# Tune waits this long (s) for a reused actor's last trial to end before giving the actor to the next one
# (`FunctionTrainable.reset_config`; Ray's default is 2 s). A trial that Tune stopped is still ending then:
# its workers stop at the evaluation's step and the run returns. Cut at 2 s, Tune would kill the actor and its
# warm worker group with it.
THREAD_TIMEOUT_ENV = "TUNE_FUNCTION_THREAD_TIMEOUT_S"
THREAD_TIMEOUT_S = "300"
# How long a trial started again waits for its last run (in another actor) to end and release the run folder.
LEASE_WAIT_S = 600.0
LEASE_POLL_S = 0.5


@dataclasses.dataclass
class TrialRecipe:
    """What every trial is built from, put into the object store once (`tune.with_parameters`)."""

    trainer: Any  # the user's Trainer as the workers get it: no callback handler, pool or model
    callbacks: List[Any]  # the user's driver callbacks (not the progress bar, not the reporters: rebuilt per trial)
    compute_objective: Callable[[Dict[str, float]], float]
    hp_name: Optional[Callable[[Dict[str, Any]], str]]
    output_dir: str  # the sweep's: each trial's run is a folder in it
    exploits: bool = False  # Population Based Training: reports carry checkpoints, trials start from them


@dataclasses.dataclass(frozen=True)
class ShippedRecipe:
    """The recipe as Tune's trial actors receive it: the driver's import path (code_paths.py) beside the pickled
    recipe, installed before the recipe is unpickled. A model, dataset or collator class from a folder the
    script put on sys.path (or from a module of the driver's, on several nodes) then unpickles in the trial's
    actor as it does on raytrainer's workers; Tune starts its actors with Ray's paths only."""

    code: Any  # code_paths.DriverCode
    pickled: bytes

    @classmethod
    def of(cls, recipe: TrialRecipe, ship_modules: bool) -> "ShippedRecipe":
        import cloudpickle
        import ray

        return cls(code_paths.capture(ship=ship_modules, put=ray.put), cloudpickle.dumps(recipe))

    def open(self) -> TrialRecipe:
        import cloudpickle
        import ray

        code_paths.install(self.code, fetch=ray.get)
        return cloudpickle.loads(self.pickled)


def run_name(recipe: TrialRecipe, config: Dict[str, Any], trial_id: str) -> str:
    """transformers' name of a trial's folder: `hp_name(trial)`, else `run-<trial id>`."""
    return recipe.hp_name(config) if recipe.hp_name is not None else f"run-{trial_id}"


def trial_arguments(args, config: Dict[str, Any], run_dir: str):
    """A copy of the arguments with the trial's values, each cast to the type of the field's value as
    transformers casts it (tune.uniform(1, 40) for `seed` gives an int seed), checked as any arguments are
    (TrainingArguments' __post_init__). Keys that name no argument are the model_init's (left out here)."""
    fields = {f.name for f in dataclasses.fields(args) if f.init}
    values = {}
    for key, value in config.items():
        if key not in fields:
            continue
        old = getattr(args, key, None)
        if isinstance(old, (bool, int, float, str)) and not isinstance(value, type(old)):
            value = type(old)(value)
        values[key] = value
    logging_dir = args.logging_dir
    if logging_dir and logging_dir.startswith(storage.join(args.output_dir, "")):
        logging_dir = None  # the default, under output_dir: derived again under the trial's run folder
    # The trial process shows no progress bar and no start-up line: the sweep's table is the one display.
    return dataclasses.replace(args, **values, output_dir=run_dir, logging_dir=logging_dir, disable_tqdm=True)


class ModelInitWithTrial:
    """model_init(trial) as transformers calls it (`call_model_init`): the trial's hyperparameters as its one
    argument. The workers call `model_init()`; this carries the trial's values to them."""

    def __init__(self, model_init: Callable, config: Dict[str, Any]):
        self.model_init = model_init
        self.config = dict(config)

    def __call__(self):
        return self.model_init(self.config)


def takes_trial(model_init: Callable) -> bool:
    """Whether model_init takes the trial (one parameter), as transformers counts them; more is an error."""
    count = len(inspect.signature(model_init).parameters)
    if count > 1:
        raise ConfigError("model_init should have 0 or 1 argument (the trial's hyperparameters).")
    return count == 1


def trial_trainer(recipe: TrialRecipe, config: Dict[str, Any], run_dir: str, report: TuneReport):
    """The user's Trainer for one trial: its class (a subclass's hooks run on the workers), its datasets and
    functions, the trial's arguments, and callbacks of its own."""
    trainer = copy.copy(recipe.trainer)
    trainer.args = trial_arguments(recipe.trainer.args, config, run_dir)
    if takes_trial(trainer.model_init):
        trainer.model_init = ModelInitWithTrial(trainer.model_init, config)
    trainer.model = trainer.model_wrapped = None  # built from model_init on the workers (and here, at the end)
    # What the run's state records of the trial, as transformers': its values, and hp_name's name for it (the
    # run folder's name; None without hp_name).
    trainer._trial = dict(config)
    trainer._trial_name = storage.basename(run_dir) if recipe.hp_name is not None else None
    trainer.state = TrainerState()
    trainer.callback_handler = CallbackHandler([], trainer.args, trainer.state)
    for callback in [*recipe.callbacks, *reporter_callbacks(trainer.args), report]:
        trainer.add_callback(copy.deepcopy(callback) if callback is not report else callback)
    trainer.callback_handler.context = {"model": None, "processing_class": trainer.processing_class}
    trainer._pool_user = holders.PoolUser(owner=f"the trial in {run_dir}")
    return trainer


def user_callbacks(trainer) -> List[Any]:
    """The Trainer's driver callbacks that each trial gets a copy of: all but the progress display (one table
    for the sweep) and the reporters (rebuilt from each trial's arguments, writing under its run folder)."""
    reporters = tuple(type(r) for r in reporter_callbacks(trainer.args))
    return [c for c in trainer.callback_handler.callbacks
            if not isinstance(c, (ProgressCallback, PrinterCallback) + reporters)]


def run_trial(config: Dict[str, Any], recipe: Union[ShippedRecipe, TrialRecipe]):
    """The Tune trainable: one raytrainer run for this trial, its evaluations reported to Tune."""
    from ray import tune

    if isinstance(recipe, ShippedRecipe):
        recipe = recipe.open()

    os.environ.setdefault(THREAD_TIMEOUT_ENV, THREAD_TIMEOUT_S)  # read by this actor's next reset_config
    trial_id = tune.get_context().get_trial_id()
    run_dir = storage.join(recipe.output_dir, run_name(recipe, config, trial_id))
    report = (TuneReportAtCommit if recipe.exploits else TuneReport)(recipe.compute_objective)
    trainer = trial_trainer(recipe, config, run_dir, report)
    if trainer.args.num_workers == 0:
        # The loop trains in this actor: quiet as a worker is (transformers' "Writing model shards" bar at every
        # checkpoint, from every trial, would interleave under the sweep's table).
        configure_worker(worker_level(trainer.args, 0, driver_ran_model=False))
    pointed = pointed_checkpoint(tune.get_checkpoint())
    wait_for_the_last_run(run_dir, trainer.args.storage_options)
    if pointed is not None:  # PBT: the checkpoint Tune chose, this trial's or another's, with this trial's values
        trainer._own_hyperparameters = True
        trainer.train(resume_from_checkpoint=committed_checkpoint(pointed, trainer.args.storage_options))
    else:
        # Tune restarts a trial that had not finished when the sweep's driver died: its run resumes from its
        # newest committed checkpoint (none: it starts over, as it never saved).
        resume = newest_committed(run_dir, trainer.args.storage_options) is not None
        trainer.train(resume_from_checkpoint=True if resume else None)
    if report.stopped:
        # Tune's session took its stop (a SystemExit in tune.report, caught there to stop the run at one step):
        # end the trial's thread as that SystemExit would have. Returning instead, Tune's wrapper would report
        # once more into the closed session and wait there forever, and Tune's reuse of this actor with it.
        raise SystemExit(0)
    # No evaluation during training: one at the end, as transformers' Ray backend. Under PBT the last step was
    # evaluated with its checkpoint (TuneReportAtCommit); a run continued at its last step trains nothing and
    # reports nothing.
    if report.reported == 0 and not report.with_checkpoint:
        trainer.evaluate()


def wait_for_the_last_run(run_dir: str, storage_options: Optional[dict]):
    """Tune may start a paused trial again (PBT) in another actor while its last run, in the old one, still stops:
    a step, then its stop's checkpoint and commit. That run holds the run folder's lease, and the new run would be
    refused (LeaseHeldError, seen with synchronous PBT). Wait until it ends (or its lease goes stale: its actor
    was ended), at most LEASE_WAIT_S; the new run then takes the lease, or names the holder if it is still held."""
    deadline = time.monotonic() + LEASE_WAIT_S
    while lease.live_holder(run_dir, storage_options) is not None and time.monotonic() < deadline:
        time.sleep(LEASE_POLL_S)


def committed_checkpoint(pointed: Dict[str, Any], storage_options: Optional[dict]) -> str:
    """The run checkpoint a PBT trial continues. Tune had it once committed (report.py); gone since, the trial
    cannot continue it."""
    url = pointed["url"]
    if not is_committed(url, storage_options):
        raise RuntimeError(f"Population Based Training continues this trial from {url}, which is no longer a "
                           "committed checkpoint: removed since (save_total_limit rotates a run's checkpoints "
                           "out: keep more of them, or save_total_limit=None) or damaged.")
    return url
