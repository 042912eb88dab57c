"""`Trainer.hyperparameter_search`: bad input fails on the driver before any trial; real sweeps on the session's Ray
(Ray Tune as it is, 1-worker trials of the tiny model): ASHA, a trial losing its worker, the sweep's driver dying
mid-sweep and run again; Population Based Training, a trial continuing the better trial's checkpoint with new
values."""

import json
import os
import sys

import pytest

from raytrainer import Trainer, TrainerCallback, TrainingArguments
from raytrainer.checkpoint.listing import list_checkpoints
from raytrainer.errors import ConfigError
from raytrainer.tune.hf_names import BestRun
from raytrainer.tune.report import POINTER
from raytrainer.tune.search import NO_MODEL_INIT, check_space, choose_backend, sample
from tests.models import TokenData, make_model
from tests.support import die_once_committed

ray_tune = pytest.importorskip("ray.tune")
from ray.tune import Callback  # noqa: E402
from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining  # noqa: E402


def model_init():
    return make_model()


def arguments(output_dir: str, **kw) -> TrainingArguments:
    base = dict(output_dir=output_dir, num_workers=1, use_gpu=False, per_device_train_batch_size=4, max_steps=6,
                eval_strategy="steps", eval_steps=2, save_steps=2, logging_steps=2, optim="adamw_torch",
                disable_tqdm=True)
    return TrainingArguments(**{**base, **kw})


def trainer_of(args, cls=Trainer, **kw) -> Trainer:
    return cls(model_init=model_init, args=args, train_dataset=TokenData(32), eval_dataset=TokenData(8, seed=1),
                   **kw)


def lr_space(values):
    return lambda trial: {"learning_rate": ray_tune.grid_search(list(values))}


# ------------------------------------------------------------------ checks before any trial (no Ray needed)
def test_without_model_init_transformers_error(tmp_path):
    trainer = Trainer(model=make_model(), args=arguments(str(tmp_path)), train_dataset=TokenData(8))
    with pytest.raises(RuntimeError, match=NO_MODEL_INIT):
        trainer.hyperparameter_search(hp_space=lr_space([1e-3]), n_trials=1)


def test_backends(monkeypatch):
    assert choose_backend(None) == choose_backend("ray") == "ray"
    with pytest.raises(ConfigError, match="use 'ray'.*'optuna'"):
        choose_backend("sigopt")
    monkeypatch.setitem(sys.modules, "optuna", None)  # as where it is not installed: the extra is named
    with pytest.raises(ConfigError, match="raytrainer\\[optuna\\]"):
        choose_backend("optuna")


def test_direction_and_kwargs_are_checked_first(tmp_path):
    trainer = trainer_of(arguments(str(tmp_path)))
    with pytest.raises(ConfigError, match="'minimize' or 'maximize'"):
        trainer.hyperparameter_search(hp_space=lr_space([1e-3]), direction="down")
    with pytest.raises(ConfigError, match="backend=.optuna., or one direction"):
        trainer.hyperparameter_search(hp_space=lr_space([1e-3]), direction=["minimize", "maximize"])
    with pytest.raises(ConfigError, match="n_trials"):
        trainer.hyperparameter_search(hp_space=lr_space([1e-3]), num_samples=3)
    with pytest.raises(ConfigError, match="eval_strategy='steps'"):
        trainer_of(arguments(str(tmp_path), eval_strategy="no")).hyperparameter_search(
            hp_space=lr_space([1e-3]), scheduler=ASHAScheduler())


def test_a_space_that_names_no_argument_fails(tmp_path):
    trainer = trainer_of(arguments(str(tmp_path)))
    with pytest.raises(ConfigError, match="\\['hidden_size'\\].*model_init\\(trial\\)"):
        check_space(trainer, {"hidden_size": ray_tune.choice([8, 16])})
    with pytest.raises(ConfigError, match="non-empty dict"):
        check_space(trainer, {})
    with pytest.raises(ConfigError, match="fail their checks"):
        check_space(trainer, {"learning_rate": ray_tune.uniform(-2.0, -1.0)})
    trainer.model_init = lambda trial: make_model()  # model_init(trial) reads the keys that are not arguments
    check_space(trainer, {"hidden_size": ray_tune.choice([8, 16]), "learning_rate": ray_tune.loguniform(1e-4, 1e-2)})


def test_sample_takes_one_value_of_each_kind():
    values = sample({"a": ray_tune.grid_search([3, 4]), "b": ray_tune.choice([7]), "c": 5})
    assert values == {"a": 3, "b": 7, "c": 5}


# ------------------------------------------------------------------ one real sweep, its driver dying once
class DriverDies(Callback):
    """Tune callback (runs in the sweep's driver): raises once, when the run with `learning_rate` reports `step`,
    as a driver that dies there. Tune then kills every trial's actor (its worker group with it) and the sweep's
    state is what it saved last. It is pickled into the sweep's state, hence the marker file: it fires once."""

    def __init__(self, marker: str, learning_rate: float, step: int):
        self.marker, self.learning_rate, self.step = marker, learning_rate, step

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if (trial.config["learning_rate"] == self.learning_rate and result["step"] == self.step
                and not os.path.exists(self.marker)):
            open(self.marker, "w").close()
            raise RuntimeError("the sweep's driver dies here")


class RestartsToFile(TrainerCallback):
    """A user's driver callback (each trial runs a copy): the run's group restarts, as lines of restarts.jsonl in
    the trial's run folder."""

    def on_restart(self, args, state, control, cause=None, **kwargs):
        with open(os.path.join(args.output_dir, "restarts.jsonl"), "a") as f:
            f.write(json.dumps({"step": state.global_step, "cause": cause}) + "\n")


class WorkerDiesOnce(Trainer):
    """The 1e-2 trial's worker kills its own process during step 3, once, after checkpoint-2 is committed: the
    trial's run restarts its worker group from that checkpoint, as any run (max_failures=1). The marker sits
    beside the trials' run folders, where every copy of the trial's Trainer finds it."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        marker = os.path.join(os.path.dirname(self.args.output_dir), "worker-died")
        if self.args.learning_rate == 1e-2 and self.state.global_step + 1 == 3 and not os.path.exists(marker):
            die_once_committed(os.path.join(self.args.output_dir, "checkpoint-2"), marker)
        return super().training_step(model, inputs, num_items_in_batch)


def committed(run_dir: str) -> dict:
    return {c.step: c.committed for c in list_checkpoints(run_dir)}


def manifest_times(run_dir: str) -> dict:
    return {name: os.stat(os.path.join(run_dir, name)).st_mtime_ns for name in sorted(os.listdir(run_dir))
            if name.startswith("checkpoint-")}


def test_a_sweep_whose_driver_dies_then_resumes_and_its_best_run_equals_a_plain_run(tmp_path, ray_session):
    """...and a worker lost inside a trial restarts that trial's group from its newest committed checkpoint."""
    out = str(tmp_path / "sweep")
    # Sequential trials (max_concurrent_trials=1) in grid order, so ASHA's decisions do not depend on which trial
    # reported first. 3e-3 runs alone to its end; 1e-2 beats it at each evaluation; 1e-6 is the worst at its
    # first evaluation and ASHA stops it there.
    grid = [3e-3, 1e-2, 1e-6]
    search = dict(hp_space=lr_space(grid), n_trials=1, max_concurrent_trials=1,
                  scheduler=ASHAScheduler(max_t=100, grace_period=1, reduction_factor=2), verbose=0,
                  callbacks=[DriverDies(str(tmp_path / "died"), learning_rate=1e-2, step=4)])

    with pytest.raises(Exception, match="driver dies here"):
        trainer_of(arguments(out, max_failures=1), cls=WorkerDiesOnce,
                   callbacks=[RestartsToFile()]).hyperparameter_search(**search)
    assert os.path.exists(os.path.join(out, "worker-died"))  # the 1e-2 trial lost its worker at step 3
    runs = sorted(d for d in os.listdir(out) if d.startswith("run-"))
    assert len(runs) == 2  # the first trial finished, the second died after its evaluation at step 4
    first, second = (os.path.join(out, r) for r in runs)
    assert committed(first) == {2: True, 4: True, 6: True}
    assert committed(second).get(2)  # the died trial's run resumes from its newest committed checkpoint
    finished_at = manifest_times(first)

    best = trainer_of(arguments(out, max_failures=1), cls=WorkerDiesOnce,  # the same call, run again
                      callbacks=[RestartsToFile()]).hyperparameter_search(**search)

    assert isinstance(best, BestRun)
    assert best.hyperparameters == {"learning_rate": 1e-2} and f"run-{best.run_id}" == runs[1]
    results = {r.config["learning_rate"]: r.metrics for r in best.run_summary}
    assert best.objective == results[1e-2]["objective"]  # what Tune recorded
    assert manifest_times(first) == finished_at  # the finished trial did not run again
    assert committed(second) == {2: True, 4: True, 6: True} and results[1e-2]["step"] == 6
    stopped = os.path.join(out, f"run-{results[1e-6]['trial_id']}")
    # ASHA stopped it at its first evaluation. The sweep's last trial: Tune ends its actor right after the stop
    # (docs/tune.md), so its run may not have committed the stop step's checkpoint; none later exists.
    assert results[1e-6]["step"] == 2 and results[1e-6]["training_iteration"] == 1
    assert all(step <= 2 for step in committed(stopped))
    # Checkpoints live in the runs' folders only: Tune's folder holds the sweep's state and results.
    tune_files = [f for _, dirs, files in os.walk(os.path.join(out, "hp_search")) for f in dirs + files]
    assert not any(name.startswith("checkpoint") for name in tune_files)

    # The best trial (interrupted, then resumed from its checkpoint) ends where a plain uninterrupted run ends.
    plain = trainer_of(arguments(str(tmp_path / "plain"), learning_rate=1e-2))
    plain.train()
    plain_loss = plain.evaluate()["eval_loss"]
    print(f"best objective {best.objective!r}, Tune's record {results[1e-2]['objective']!r}, plain run {plain_loss!r}")
    assert plain_loss == best.objective
    with open(os.path.join(second, "checkpoint-6", "trainer_state.json")) as f:
        state = json.load(f)
    assert state["global_step"] == 6
    # Its worker lost at step 3 (the first call): the trial's run restarted its group once, from checkpoint-2, as
    # its driver callbacks heard. (Whether that run committed checkpoint-4 before the sweep's driver died at step
    # 4's report is a race: the state files cannot say it every time.)
    with open(os.path.join(second, "restarts.jsonl")) as f:
        restarts = [json.loads(line) for line in f]
    assert [(r["step"], "rank 0 lost" in r["cause"]) for r in restarts] == [(2, True)], restarts
    # As transformers records a trial (no hp_name: no trial name).
    assert state["is_hyper_param_search"] and state["trial_params"] == {"learning_rate": 1e-2}
    assert state["trial_name"] is None


# ------------------------------------------------------------------ Population Based Training
class LogsToFile(TrainerCallback):
    """A user's driver callback (each trial runs a copy): each run's first step and its log records, as lines of
    logs.jsonl in the trial's run folder."""

    def on_train_begin(self, args, state, control, **kwargs):
        self._write(args, {"begin": state.global_step})

    def on_log(self, args, state, control, logs=None, **kwargs):
        self._write(args, {"step": state.global_step, **(logs or {})})

    @staticmethod
    def _write(args, record):
        with open(os.path.join(args.output_dir, "logs.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")


def read_runs(run_dir: str):
    """[{"begin": step, "steps": {step: log record}}] for each run of the trial, in order."""
    runs = []
    with open(os.path.join(run_dir, "logs.jsonl")) as f:
        for record in map(json.loads, f):
            if "begin" in record:
                runs.append({"begin": record["begin"], "steps": {}})
            elif "loss" in record:
                runs[-1]["steps"][record["step"]] = record
    return runs


@pytest.mark.parametrize("num_workers", [1, 0])  # each trial a worker group, or the loop in its Tune actor
def test_population_based_training_continues_the_better_trials_checkpoint_with_the_new_values(tmp_path, num_workers,
                                                                                              ray_session):
    out = str(tmp_path / "pbt")
    # Both trials evaluate and save at step 3; PBT (synchronous: both reach step 3 before it decides) keeps
    # 1e-2, and the 1e-6 trial continues 1e-2's checkpoint-3 with the learning rate PBT gives it (the one value
    # of its mutations). Both then train step 4 from the same checkpoint-3: the same weights and data, two rates.
    # Their last step is evaluated and saved (under PBT every result has its checkpoint): their final results.
    pbt = PopulationBasedTraining(time_attr="step", perturbation_interval=3, quantile_fraction=0.5, synch=True,
                                  hyperparam_mutations={"learning_rate": [5e-3]})
    args = arguments(out, max_steps=4, eval_steps=3, save_steps=3, logging_steps=1, lr_scheduler_type="constant",
                     num_workers=num_workers)
    best = trainer_of(args, callbacks=[LogsToFile()]).hyperparameter_search(
        hp_space=lr_space([1e-2, 1e-6]), n_trials=1, scheduler=pbt, max_concurrent_trials=2, verbose=0)

    results = {r.config["learning_rate"]: r.metrics for r in best.run_summary}
    assert set(results) == {1e-2, 5e-3}, sorted(results)  # the 1e-6 trial now holds 5e-3
    assert results[1e-2]["step"] == results[5e-3]["step"] == 4  # each trial's last step: a result of its own
    donor = read_runs(os.path.join(out, f"run-{results[1e-2]['trial_id']}"))
    exploiter = read_runs(os.path.join(out, f"run-{results[5e-3]['trial_id']}"))
    # Each trial's first run trained from step 0 to 3 at least (Tune's pause reaches the workers a step after the
    # checkpoint's commit: step 4 or the run's end), its last run from checkpoint-3 to step 4.
    assert exploiter[0]["begin"] == donor[0]["begin"] == 0
    assert [exploiter[0]["steps"][s]["learning_rate"] for s in (1, 2, 3)] == [1e-6] * 3
    assert [donor[0]["steps"][s]["learning_rate"] for s in (1, 2, 3)] == [1e-2] * 3
    assert exploiter[-1]["begin"] == donor[-1]["begin"] == 3
    after, donor_after = exploiter[-1]["steps"], donor[-1]["steps"]
    assert sorted(after) == sorted(donor_after) == [4]
    assert after[4]["learning_rate"] == 5e-3 and donor_after[4]["learning_rate"] == 1e-2
    # The exploiter's last run is the donor's checkpoint-3: its step 4 (the loss of the weights after step 3, on the
    # same data) equals the donor's to the bit, where its own step 3 did not.
    assert after[4]["loss"] == donor_after[4]["loss"]
    assert exploiter[0]["steps"][3]["loss"] != donor[0]["steps"][3]["loss"]
    # Tune's checkpoints are pointers to the runs' committed ones: no weights in Tune's folder.
    tune_files = [f for _, _, files in os.walk(os.path.join(out, "hp_search")) for f in files]
    assert POINTER in tune_files and not any(f.endswith((".safetensors", ".bin", ".pt")) for f in tune_files)
    assert best.hyperparameters in ({"learning_rate": 1e-2}, {"learning_rate": 5e-3})


# ------------------------------------------------------------------ trials that train in their Tune actors
def test_trials_of_num_workers_0_train_in_their_actors_and_the_best_equals_a_plain_run(tmp_path, ray_session):
    """num_workers=0 (docs/tune.md, "Many short trials of one process"): each trial is the same loop in its Tune
    actor, no worker group; ASHA stops the worse trial at its first evaluation, the run folders hold committed
    checkpoints, and the best trial's objective is a plain in-process run's."""
    out = str(tmp_path / "in-actors")
    best = trainer_of(arguments(out, num_workers=0)).hyperparameter_search(
        hp_space=lr_space([1e-2, 1e-6]), n_trials=1, max_concurrent_trials=1, verbose=0,
        scheduler=ASHAScheduler(max_t=100, grace_period=1, reduction_factor=2))
    results = {r.config["learning_rate"]: r.metrics for r in best.run_summary}
    assert best.hyperparameters == {"learning_rate": 1e-2}
    assert results[1e-2]["step"] == 6 and results[1e-6]["step"] == 2  # 1e-6 stopped at its first evaluation
    assert committed(os.path.join(out, f"run-{results[1e-2]['trial_id']}")) == {2: True, 4: True, 6: True}
    assert results[1e-2]["pid"] != os.getpid()  # trained in Tune's actor, not here
    plain = trainer_of(arguments(str(tmp_path / "plain"), num_workers=0, learning_rate=1e-2))
    plain.train()
    assert plain.evaluate()["eval_loss"] == best.objective
