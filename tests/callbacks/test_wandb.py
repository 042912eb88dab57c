"""report_to="wandb": an offline W&B run, read back from the run-*.wandb record log it writes, holds log_history's
metrics at each step, the evaluations and the arguments; a resumed run continues the same W&B run id."""

import glob
import json
import os
import struct

import pytest

wandb = pytest.importorskip("wandb")
from wandb.proto import wandb_internal_pb2  # noqa: E402

from tests.callbacks.test_mlflow import train as reporting_run  # noqa: E402

BLOCK, HEADER = 32768, 7  # wandb's record log: leveldb's log format after a 7-byte header (":W&B", magic, version)


@pytest.fixture
def wandb_dir(tmp_path, monkeypatch):
    """Offline, silent, in tmp_path: no network, no login; every run finished after the test."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "raytrainer-test")
    for name in ("WANDB_RUN_ID", "WANDB_RESUME", "WANDB_LOG_MODEL", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path
    wandb.finish()
    wandb.teardown()  # the wandb-core service process ends here, not at the interpreter's exit


def records(path):
    """The protobuf Records of one run-*.wandb file (no network, no wandb sync)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", path
    pos, pieces = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if length == 0 and kind == 0:
            pos += left
            continue
        pieces += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):  # FULL, or the LAST piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def read_runs(root):
    """Each offline run directory's {run_id, history: {step: {key: value}}, config, summary}, oldest first."""
    wandb.finish()
    wandb.teardown()  # the service has closed its files (wandb.finish alone may return before the last write)
    runs = []
    for path in sorted(glob.glob(os.path.join(str(root), "wandb", "offline-run-*", "run-*.wandb"))):
        run = {"history": {}, "config": {}, "summary": {}}
        for record in records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run["run_id"], run["start"] = record.run.run_id, record.run.start_time.ToNanoseconds()
                run["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
            elif kind == "config":
                run["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
            elif kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                run["history"].setdefault(row["_step"], {}).update(row)
            elif kind == "summary":
                run["summary"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                       for i in record.summary.update})
        runs.append(run)
    return sorted(runs, key=lambda run: run["start"])  # a resumed run's directory is named <id>-1


def train(tmp_path, resume=None, **overrides):
    return reporting_run(tmp_path, report_to="wandb", resume=resume, **overrides)


def series(run, key):
    return {step: row[key] for step, row in run["history"].items() if key in row}


def test_run_holds_metrics_per_step_config_and_summary(wandb_dir):
    trainer = train(wandb_dir)
    trainer.evaluate()  # after training: the same run, at the last step
    wandb.finish()
    [run] = read_runs(wandb_dir)
    log_history = trainer.state.log_history
    for key, name in (("loss", "train/loss"), ("learning_rate", "train/learning_rate"),
                      ("grad_norm", "train/grad_norm"), ("eval_loss", "eval/loss")):
        expected = {}
        for h in log_history:
            if key in h:
                expected[h["step"]] = h[key]  # evaluate() after training: its value is the one kept at step 6
        assert expected, key
        assert series(run, name) == pytest.approx(expected, rel=1e-12), key
    assert sorted(series(run, "train/loss")) == [2, 4, 6] and sorted(series(run, "eval/loss")) == [3, 6]
    assert series(run, "train/global_step") == {2: 2, 3: 3, 4: 4, 6: 6}
    assert sorted(series(run, "rank0/step_time_s")) == [2, 4, 6]  # per-rank figures
    final = next(h for h in log_history if "train_loss" in h)  # the run's figures: its summary, as HF keeps them
    assert run["summary"]["train_loss"] == pytest.approx(final["train_loss"])
    assert run["summary"]["train_runtime"] == pytest.approx(final["train_runtime"])
    assert not series(run, "train/train_loss") and not series(run, "train/train_runtime")
    config = run["config"]
    assert config["learning_rate"] == 0.01 and config["max_steps"] == 6 and config["optim"] == "adamw_torch"
    assert config["model/num_parameters"] > 0
    assert "s3cr3t" not in json.dumps(config)


def test_resumed_run_continues_the_same_wandb_run(wandb_dir):
    train(wandb_dir, max_steps=4, save_strategy="steps", save_steps=2)
    checkpoint = wandb_dir / "out" / "checkpoint-4"
    stored = json.loads((checkpoint / "wandb_run.json").read_text())
    # As a new process would find it: no run open, and the first run's service gone with its files closed. With
    # finish() alone, the step-4 row of the first run was missing from its file once (CI, 2026-11-28): finish()
    # may return before the service's last write, and the resumed run (the same id) started meanwhile.
    wandb.finish()
    wandb.teardown()
    trainer = train(wandb_dir, resume=str(checkpoint), max_steps=6, save_strategy="no")
    wandb.finish()
    first, resumed = read_runs(wandb_dir)
    assert first["run_id"] == resumed["run_id"] == stored["run_id"]
    assert sorted(series(first, "train/loss")) == [2, 4] and sorted(series(resumed, "train/loss")) == [6]
    assert series(resumed, "train/loss")[6] == pytest.approx(
        next(h["loss"] for h in trainer.state.log_history if h.get("step") == 6 and "loss" in h))


def test_wandb_run_id_from_the_environment_wins(wandb_dir, monkeypatch):
    monkeypatch.setenv("WANDB_RUN_ID", "fromenv123")
    train(wandb_dir, max_steps=2, eval_strategy="no")
    wandb.finish()
    [run] = read_runs(wandb_dir)
    assert run["run_id"] == "fromenv123" and sorted(series(run, "train/loss")) == [2]


def test_hosted_transformers_trainer_reports_and_resumes_into_one_run(wandb_dir):
    """The hosted mode (in process): report_to="wandb" of the script's arguments runs on the driver; a resume
    continues the run."""
    transformers = pytest.importorskip("transformers")
    import raytrainer
    from tests.hosted.test_api_on_ray import tiny_llama
    from tests.hosted.test_host_sync import Rows

    def run(max_steps, resume=None):
        args = transformers.TrainingArguments(
            output_dir=str(wandb_dir / "hosted"), max_steps=max_steps, logging_steps=1, save_steps=2,
            per_device_train_batch_size=2, learning_rate=1e-3, report_to="wandb", use_cpu=True, disable_tqdm=True)
        trainer = raytrainer.hosted(transformers.Trainer, num_workers=0, disable_tqdm=True)(
            model=tiny_llama(), args=args, train_dataset=Rows(16))
        trainer.train(resume_from_checkpoint=resume)
        wandb.finish()
        return trainer

    run(2)
    trainer = run(4, resume=True)
    first, resumed = read_runs(wandb_dir)
    assert first["run_id"] == resumed["run_id"]
    assert sorted(series(first, "train/loss")) == [1, 2] and sorted(series(resumed, "train/loss")) == [3, 4]
    expected = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h and h["step"] > 2}
    assert series(resumed, "train/loss") == pytest.approx(expected, rel=1e-6)
    assert first["config"]["learning_rate"] == 1e-3
