"""A trial's Trainer built from the recipe, without Ray: its arguments, folder, model_init and callbacks. The
trainable itself runs in tests/tune/test_search.py's real sweeps."""

import os
import pickle
import sys
import threading
import time

import pytest

from raytrainer import EarlyStoppingCallback, PrinterCallback, Trainer, TrainingArguments
from raytrainer.checkpoint import lease, manifest
from raytrainer.errors import ConfigError
from raytrainer.tune.hf_names import default_compute_objective
from raytrainer.tune.report import TuneReport
from raytrainer.tune.search import driverless_copy
from raytrainer.tune.trial import (
    ModelInitWithTrial,
    ShippedRecipe,
    TrialRecipe,
    committed_checkpoint,
    run_name,
    takes_trial,
    trial_arguments,
    trial_trainer,
    user_callbacks,
    wait_for_the_last_run,
)
from tests.models import TokenData, make_model


def model_init():
    return make_model()


def arguments(tmp_path, **kw):
    return TrainingArguments(output_dir=str(tmp_path / "sweep"), num_workers=1, use_gpu=False, max_steps=4,
                             learning_rate=1e-3, seed=3, **kw)


def test_the_trials_values_on_a_copy_cast_as_transformers_casts_them(tmp_path):
    args = arguments(tmp_path)
    run_dir = str(tmp_path / "sweep" / "run-a_00001")
    trial = trial_arguments(args, {"learning_rate": 0.01, "seed": 17.9, "num_train_epochs": 2,
                                   "hidden": 64}, run_dir)
    assert (trial.learning_rate, trial.seed, trial.output_dir) == (0.01, 17, run_dir)
    assert isinstance(trial.seed, int) and isinstance(trial.num_train_epochs, float)
    assert trial.disable_tqdm  # one display: the sweep's table
    assert (args.learning_rate, args.seed, args.output_dir) == (1e-3, 3, str(tmp_path / "sweep"))  # a copy
    # The default logging_dir (under output_dir) follows the trial into its run folder.
    assert trial.logging_dir.startswith(run_dir + "/") and args.logging_dir.startswith(args.output_dir)


def test_a_bad_value_fails_the_arguments_checks(tmp_path):
    with pytest.raises((ValueError, TypeError)):
        trial_arguments(arguments(tmp_path), {"learning_rate": -1.0}, str(tmp_path / "r"))


def test_run_folder_names_as_transformers():
    recipe = TrialRecipe(trainer=None, callbacks=[], compute_objective=default_compute_objective, hp_name=None,
                         output_dir="/o")
    assert run_name(recipe, {"learning_rate": 0.1}, "abc_00002") == "run-abc_00002"
    recipe.hp_name = lambda trial: f"lr-{trial['learning_rate']}"
    assert run_name(recipe, {"learning_rate": 0.1}, "abc_00002") == "lr-0.1"


def test_model_init_with_the_trial():
    assert not takes_trial(model_init) and takes_trial(lambda trial: None)
    with pytest.raises(ConfigError, match="0 or 1 argument"):
        takes_trial(lambda a, b: None)
    wrapped = pickle.loads(pickle.dumps(ModelInitWithTrial(_record_init, {"dim": 8})))
    assert wrapped()["dim"] == 8


def _record_init(trial):
    return dict(trial)


def test_the_trials_trainer_has_its_own_arguments_callbacks_and_pool(tmp_path):
    stop = EarlyStoppingCallback(early_stopping_patience=2)
    trainer = Trainer(model_init=model_init, args=arguments(tmp_path, eval_strategy="steps", eval_steps=2,
                                                                metric_for_best_model="eval_loss"),
                      train_dataset=TokenData(8), eval_dataset=TokenData(4, seed=1), callbacks=[stop])
    carried = user_callbacks(trainer)
    assert carried == [stop]  # not the progress bar
    recipe = TrialRecipe(trainer=pickle.loads(pickle.dumps(driverless_copy(trainer))), callbacks=carried,
                         compute_objective=default_compute_objective, hp_name=None,
                         output_dir=trainer.args.output_dir)
    report = TuneReport(default_compute_objective, report=lambda r: None)
    run_dir = str(tmp_path / "sweep" / "run-x_00000")
    trial = trial_trainer(recipe, {"learning_rate": 0.05}, run_dir, report)
    assert type(trial) is Trainer and trial.args.output_dir == run_dir and trial.args.learning_rate == 0.05
    assert trial.model is None and trial.model_init is model_init
    callbacks = trial.callback_handler.callbacks
    assert report in callbacks and not any(isinstance(c, PrinterCallback) for c in callbacks)
    copied = [c for c in callbacks if isinstance(c, EarlyStoppingCallback)]
    assert len(copied) == 1 and copied[0] is not stop  # each trial's own state
    assert trial._pool_user is not trainer._pool_user and trial.state is not trainer.state
    assert trainer.args.output_dir == str(tmp_path / "sweep")  # the user's Trainer is left as it was
    # What its state will record, as transformers': the trial's values; a name only from hp_name.
    assert trial._trial == {"learning_rate": 0.05} and trial._trial_name is None and trainer._trial is None
    recipe.hp_name = lambda values: f"lr-{values['learning_rate']}"
    named = trial_trainer(recipe, {"learning_rate": 0.05}, str(tmp_path / "sweep" / "lr-0.05"), report)
    assert named._trial_name == "lr-0.05"


def test_a_shipped_recipe_brings_the_drivers_import_path(tmp_path, monkeypatch):
    """A class from a folder the script put on sys.path unpickles in Tune's trial actor, which Tune starts with
    Ray's paths only: the recipe travels pickled beside the driver's import path, installed first."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / "sweep_user_module.py").write_text("class Marker:\n    pass\n")
    monkeypatch.syspath_prepend(str(folder))
    import sweep_user_module

    recipe = TrialRecipe(trainer=None, callbacks=[sweep_user_module.Marker()],
                         compute_objective=default_compute_objective, hp_name=None, output_dir=str(tmp_path))
    shipped = ShippedRecipe.of(recipe, ship_modules=False)
    monkeypatch.delitem(sys.modules, "sweep_user_module")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(folder)])
    opened = shipped.open()
    assert type(opened.callbacks[0]).__name__ == "Marker" and str(folder) in sys.path


# ------------------------------------------------------------------ a PBT trial's checkpoint, once committed
def checkpoint_at(run_dir, step: int, committed: bool = True) -> str:
    url = str(run_dir / f"checkpoint-{step}")
    os.makedirs(url)
    with open(os.path.join(url, "model.safetensors"), "wb") as f:
        f.write(bytes(64))
    if committed:
        manifest.commit(url, step)
    return url


def test_a_pbt_trial_continues_a_committed_checkpoint_and_names_one_gone_since(tmp_path):
    run_dir = tmp_path / "run-donor"
    url = checkpoint_at(run_dir, 4)
    pointed = {"url": url, "step": 4}
    assert committed_checkpoint(pointed, None) == url
    manifest.uncommit(url)  # as save_total_limit's rotation starts a removal
    with pytest.raises(RuntimeError, match="no longer a committed checkpoint.*save_total_limit"):
        committed_checkpoint(pointed, None)


def test_a_trial_started_again_waits_for_its_last_run_to_release_the_folder(tmp_path):
    """PBT starts a paused trial again, maybe in another actor, while its last run still stops there."""
    run_dir = str(tmp_path / "run-a")
    held = lease.acquire(run_dir, "the-last-run")
    threading.Timer(1.0, held.release).start()
    started = time.monotonic()
    wait_for_the_last_run(run_dir, None)
    assert time.monotonic() - started >= 0.9 and lease.live_holder(run_dir) is None
    with lease.acquire(run_dir, "the-new-run"):  # taken at once now
        pass
