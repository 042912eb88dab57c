"""An MLflow run in a local sqlite store holds log_history's metrics at each step and the run's parameters."""

import json
import os

import pytest

mlflow = pytest.importorskip("mlflow")

from raytrainer import Trainer, TrainingArguments  # noqa: E402
from tests.models import TokenData, make_model  # noqa: E402


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"  # creating the tables takes seconds: once


@pytest.fixture
def store(tracking_uri, request, monkeypatch):
    """A sqlite tracking store and a fresh experiment, configured as a user would: HF's environment variables."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", request.node.name)
    monkeypatch.setenv("MLFLOW_TAGS", json.dumps({"team": "ml"}))
    for name in ("MLFLOW_RUN_ID", "MLFLOW_NESTED_RUN", "MLFLOW_FLATTEN_PARAMS", "MLFLOW_MAX_LOG_PARAMS"):
        monkeypatch.delenv(name, raising=False)
    yield mlflow.MlflowClient()
    while mlflow.active_run() is not None:  # a failed test must not leave a run open for the next one
        mlflow.end_run()


def train(tmp_path, report_to="mlflow", resume=None, **overrides):
    """A reporter's run in this process (num_workers=0): 6 steps, a log every 2, an evaluation every 3, with a
    storage secret the reporter must not show. tests/callbacks/test_wandb.py runs its reporter through it too."""
    args = dict(output_dir=str(tmp_path / "out"), num_workers=0, per_device_train_batch_size=4, max_steps=6,
                learning_rate=1e-2, optim="adamw_torch", logging_steps=2, eval_strategy="steps", eval_steps=3,
                save_strategy="no", disable_tqdm=True, report_to=report_to, run_name="tiny",
                storage_options={"key": "AKIAEXAMPLE", "secret": "s3cr3t"})
    args.update(overrides)
    trainer = Trainer(model=make_model(), args=TrainingArguments(**args), train_dataset=TokenData(40),
                      eval_dataset=TokenData(12, seed=1))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def history(client, run_id, key):
    points = client.get_metric_history(run_id, key)
    steps = [m.step for m in points]
    assert len(steps) == len(set(steps)), f"{key} logged twice at a step: {steps}"
    return {m.step: m.value for m in points}


def only_run(client):
    experiment = client.get_experiment_by_name(os.environ["MLFLOW_EXPERIMENT_NAME"])
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    return runs[0]


def test_run_holds_metrics_per_step_and_params(tmp_path, store):
    trainer = train(tmp_path)
    run = only_run(store)
    assert run.info.status == "FINISHED" and run.info.run_name == "tiny" and run.data.tags["team"] == "ml"
    log_history = trainer.state.log_history
    for key in ("loss", "learning_rate", "grad_norm", "eval_loss", "train_loss", "train_runtime"):
        expected = {h["step"]: h[key] for h in log_history if key in h}
        assert expected, key
        assert history(store, run.info.run_id, key) == pytest.approx(expected, rel=1e-12), key
    assert sorted(history(store, run.info.run_id, "loss")) == [2, 4, 6]
    assert sorted(history(store, run.info.run_id, "eval_loss")) == [3, 6]
    assert "step" not in run.data.metrics  # the x axis
    assert sorted(history(store, run.info.run_id, "rank0/step_time_s")) == [2, 4, 6]  # per-rank figures
    params = run.data.params
    assert params["learning_rate"] == "0.01" and params["max_steps"] == "6" and params["optim"] == "adamw_torch"
    assert "s3cr3t" not in json.dumps(params) and "<redacted>" in params["storage_options"]


def test_evaluate_after_training_goes_to_the_same_run(tmp_path, store):
    trainer = train(tmp_path)
    trainer.evaluate()
    run = only_run(store)
    assert history(store, run.info.run_id, "eval_loss")[6] == pytest.approx(trainer.state.log_history[-1]["eval_loss"])


def test_a_run_the_user_started_is_used_and_left_open(tmp_path, store):
    mlflow.set_experiment(os.environ["MLFLOW_EXPERIMENT_NAME"])
    with mlflow.start_run(run_name="mine") as mine:
        train(tmp_path)
        assert mlflow.active_run().info.run_id == mine.info.run_id
    run = only_run(store)
    assert run.info.run_id == mine.info.run_id and sorted(history(store, run.info.run_id, "loss")) == [2, 4, 6]


def test_long_params_are_dropped_with_a_warning(tmp_path, store):
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    long_names = [f"label_{i:04d}" for i in range(MAX_PARAM_VAL_LENGTH // 10 + 1)]
    from raytrainer.callbacks.mlflow import MLflowCallback
    from raytrainer.state import TrainerControl, TrainerState

    args = TrainingArguments(output_dir=str(tmp_path), label_names=long_names, report_to="mlflow")
    callback = MLflowCallback()
    with pytest.warns(UserWarning, match=r"\['label_names'\]"):
        callback.on_train_begin(args, TrainerState(), TrainerControl())
    callback.on_train_end(args, TrainerState(), TrainerControl())
    params = only_run(store).data.params
    assert "label_names" not in params and "learning_rate" in params
