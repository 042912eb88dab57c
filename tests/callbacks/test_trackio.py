"""report_to="trackio": a run in Trackio's local store (TRACKIO_DIR in tmp_path, read back through Trackio's own
SQLite storage) holds log_history's metrics at each step and the arguments; a resume continues the same run (by
the name kept in the checkpoint, here one Trackio chose), and so does a hosted transformers.Trainer's."""

import json
import os
import tempfile

import pytest

# Trackio reads TRACKIO_DIR once, when it is imported (its modules keep the path): the store is this process's
# temporary folder, never the user's ~/.cache/huggingface/trackio. Each test logs under a project of its own.
os.environ["TRACKIO_DIR"] = tempfile.mkdtemp(prefix="raytrainer-test-trackio-")
trackio = pytest.importorskip("trackio")

from tests.callbacks.test_mlflow import train as reporting_run  # noqa: E402


@pytest.fixture
def trackio_dir(tmp_path):
    """The run's output under tmp_path; the run Trackio has open (an evaluate() after training) finished after."""
    yield tmp_path
    try:
        trackio.finish()
    except RuntimeError:  # no run open
        pass


def logs_of(project: str, name: str) -> dict:
    """{step: {metric: value}} of one run, as Trackio stored it."""
    from trackio.sqlite_storage import SQLiteStorage

    rows = {}
    for row in SQLiteStorage.get_logs(project, name):
        rows.setdefault(row["step"], {}).update({k: v for k, v in row.items() if k not in ("step", "timestamp")})
    return rows


def series(rows: dict, key: str) -> dict:
    return {step: row[key] for step, row in rows.items() if key in row}


def test_run_holds_metrics_per_step_and_config(trackio_dir):
    from trackio.sqlite_storage import SQLiteStorage

    trainer = reporting_run(trackio_dir, report_to="trackio", project="rt-test")
    assert SQLiteStorage.get_runs("rt-test") == ["tiny"]  # args.run_name
    rows = logs_of("rt-test", "tiny")
    for key, name in (("loss", "train/loss"), ("learning_rate", "train/learning_rate"),
                      ("grad_norm", "train/grad_norm"), ("eval_loss", "eval/loss")):
        expected = {h["step"]: h[key] for h in trainer.state.log_history if key in h}
        assert expected and series(rows, name) == pytest.approx(expected, rel=1e-12), key
    assert sorted(series(rows, "train/loss")) == [2, 4, 6] and sorted(series(rows, "eval/loss")) == [3, 6]
    assert sorted(series(rows, "rank0/step_time_s")) == [2, 4, 6]  # per-rank figures
    assert not series(rows, "train/train_runtime")  # the run's one-off figures are not curves, as in HF
    config = SQLiteStorage.get_run_config("rt-test", "tiny")
    assert config["learning_rate"] == 0.01 and config["max_steps"] == 6 and config["model/num_parameters"] > 0
    assert "s3cr3t" not in json.dumps(config)


def test_resumed_run_continues_the_run_named_in_the_checkpoint(trackio_dir):
    from trackio.sqlite_storage import SQLiteStorage

    reporting_run(trackio_dir, report_to="trackio", run_name=None, max_steps=4, save_strategy="steps", save_steps=2)
    checkpoint = trackio_dir / "out" / "checkpoint-4"
    stored = json.loads((checkpoint / "trackio_run.json").read_text())
    assert stored["project"] == "huggingface" and stored["name"]  # HF's default project; a name Trackio chose
    trainer = reporting_run(trackio_dir, report_to="trackio", run_name=None, resume=str(checkpoint), max_steps=6,
                            save_strategy="no")
    assert SQLiteStorage.get_runs("huggingface") == [stored["name"]]  # one run, continued
    rows = logs_of("huggingface", stored["name"])
    assert sorted(series(rows, "train/loss")) == [2, 4, 6]
    assert series(rows, "train/loss")[6] == pytest.approx(
        next(h["loss"] for h in trainer.state.log_history if h.get("step") == 6 and "loss" in h))


def test_hosted_transformers_trainer_reports_and_resumes_into_one_run(trackio_dir):
    """The hosted mode (in process): report_to="trackio" and project of the script's arguments run on the
    driver; a resume continues the run."""
    transformers = pytest.importorskip("transformers")
    from trackio.sqlite_storage import SQLiteStorage

    import raytrainer
    from tests.hosted.test_api_on_ray import tiny_llama
    from tests.hosted.test_host_sync import Rows

    def run(max_steps, resume=None):
        args = transformers.TrainingArguments(
            output_dir=str(trackio_dir / "hosted"), max_steps=max_steps, logging_steps=1, save_steps=2,
            per_device_train_batch_size=2, learning_rate=1e-3, report_to="trackio", project="hosted-test",
            run_name="script", use_cpu=True, disable_tqdm=True)
        trainer = raytrainer.hosted(transformers.Trainer, num_workers=0, disable_tqdm=True)(
            model=tiny_llama(), args=args, train_dataset=Rows(16))
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    run(2)
    trainer = run(4, resume=True)
    assert SQLiteStorage.get_runs("hosted-test") == ["script"]
    rows = logs_of("hosted-test", "script")
    expected = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    assert sorted(series(rows, "train/loss")) == [1, 2, 3, 4]
    assert {s: v for s, v in series(rows, "train/loss").items() if s > 2} == pytest.approx(
        {s: v for s, v in expected.items() if s > 2}, rel=1e-6)
    assert SQLiteStorage.get_run_config("hosted-test", "script")["learning_rate"] == 1e-3
