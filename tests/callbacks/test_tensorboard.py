"""TensorBoard event files, read back with TensorBoard's own EventAccumulator, hold log_history's values at
each logged step: in process and on S3 (moto); on 2 Ray workers in test_ray_run.py."""

import glob
import os
import tempfile

import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from raytrainer import Trainer, TrainingArguments  # noqa: E402
from raytrainer.callbacks.tensorboard import TensorBoardCallback  # noqa: E402
from tests.models import TokenData, make_model  # noqa: E402


def read(logdir: str) -> EventAccumulator:
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalars(acc: EventAccumulator, tag: str) -> dict:
    points = acc.Scalars(tag)
    steps = [e.step for e in points]
    assert len(steps) == len(set(steps)), f"{tag} written twice at a step: {steps}"
    return {e.step: e.value for e in points}


def train(tmp_path, num_workers=0, **overrides):
    args = dict(output_dir=str(tmp_path / "out"), num_workers=num_workers, per_device_train_batch_size=4,
                max_steps=6, learning_rate=1e-2, optim="adamw_torch", logging_steps=1, eval_strategy="steps",
                eval_steps=3, save_strategy="no", disable_tqdm=True, report_to="tensorboard")
    args.update(overrides)
    trainer = Trainer(model=make_model(), args=TrainingArguments(**args), train_dataset=TokenData(40),
                      eval_dataset=TokenData(12, seed=1))
    trainer.train()
    return trainer


def check_against_log_history(acc: EventAccumulator, trainer, log_steps=(1, 2, 3, 4, 5, 6), eval_steps=(3, 6)):
    history = trainer.state.log_history
    logged = {h["step"]: h["loss"] for h in history if "loss" in h}
    assert sorted(logged) == list(log_steps)
    assert scalars(acc, "train/loss") == pytest.approx(logged, rel=1e-6)  # float32 in the event file
    lrs = {h["step"]: h["learning_rate"] for h in history if "learning_rate" in h}
    assert scalars(acc, "train/learning_rate") == pytest.approx(lrs, rel=1e-6)
    evals = {h["step"]: h["eval_loss"] for h in history if "eval_loss" in h}
    assert sorted(evals) == list(eval_steps)
    assert scalars(acc, "eval/loss") == pytest.approx(evals, rel=1e-6)
    last = trainer.state.global_step
    assert scalars(acc, "train/train_loss") == pytest.approx({last: trainer.state.log_history[-1]["train_loss"]})
    assert "train/step" not in acc.Tags()["scalars"]  # the x axis, not a curve
    assert "args" in str(acc.Tags()["tensors"])  # the arguments as text, as HF writes them


def test_in_process_default_logging_dir_under_output_dir(tmp_path):
    trainer = train(tmp_path)
    runs = glob.glob(str(tmp_path / "out" / "runs" / "*"))
    assert len(runs) == 1 and runs[0] == trainer.args.logging_dir  # output_dir/runs/<time>_<host>
    check_against_log_history(read(runs[0]), trainer)


def test_s3_logging_dir_in_process(tmp_path, s3_server, s3_bucket):
    import s3fs

    opts = dict(s3_server.storage_options)
    staging_before = set(glob.glob(os.path.join(tempfile.gettempdir(), "raytrainer-tensorboard-*")))
    trainer = train(tmp_path, output_dir=s3_bucket + "/run", storage_options=opts)
    assert trainer.args.logging_dir.startswith(s3_bucket + "/run/runs/")
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
    files = fs.find(trainer.args.logging_dir)
    assert len(files) == 1 and "events.out.tfevents." in files[0]
    fs.get(files[0], str(tmp_path / "down" / os.path.basename(files[0])))
    check_against_log_history(read(str(tmp_path / "down")), trainer)
    text = str(read(str(tmp_path / "down")).Tensors("args/text_summary")[0].tensor_proto.string_val[0])
    assert "testing" not in text and "<redacted>" in text  # storage_options never reach the event file
    # The local staging copy is gone.
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "raytrainer-tensorboard-*"))) <= staging_before


def test_replayed_steps_after_a_restart_replace_the_stale_points(tmp_path):
    """After a worker-group restart from checkpoint-2, steps 3.. are logged again: TensorBoard shows the new
    values only (a SessionLog START at step 3 purges what was written for steps >= 3)."""
    from raytrainer.state import TrainerControl, TrainerState

    args = TrainingArguments(output_dir=str(tmp_path), logging_dir=str(tmp_path / "tb"))
    state, control, cb = TrainerState(), TrainerControl(), TensorBoardCallback()
    cb.on_train_begin(args, state, control)
    for step in (1, 2, 3, 4):
        state.global_step = step
        cb.on_log(args, state, control, logs={"loss": 10.0 + step})
    state.global_step = 2
    cb.on_restart(args, state, control)
    for step in (3, 4, 5):
        state.global_step = step
        cb.on_log(args, state, control, logs={"loss": 20.0 + step})
    cb.on_train_end(args, state, control)
    points = [(e.step, e.value) for e in read(str(tmp_path / "tb")).Scalars("train/loss")]
    assert points == [(1, 11.0), (2, 12.0), (3, 23.0), (4, 24.0), (5, 25.0)]  # no stale point left


def test_an_unreachable_logging_dir_warns_and_training_goes_on(tmp_path):
    opts = {"endpoint_url": "http://127.0.0.1:9", "key": "AKIAEXAMPLE", "secret": "s3cr3t",
            "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1}}  # fail fast: nothing listens
    args = TrainingArguments(output_dir=str(tmp_path), logging_dir="s3://no-such-bucket/tb", storage_options=opts)
    from raytrainer.state import TrainerControl, TrainerState

    cb = TensorBoardCallback()
    state = TrainerState(global_step=1)
    cb.on_train_begin(args, state, TrainerControl())
    with pytest.warns(UserWarning, match="could not be uploaded") as record:
        cb.on_log(args, state, TrainerControl(), logs={"loss": 1.0})  # warns once ...
        cb.on_log(args, state, TrainerControl(), logs={"loss": 1.0})
        cb.on_train_end(args, state, TrainerControl())  # ... and again when the last upload fails
    assert len(record) == 2
    for warning in record:
        assert "s3cr3t" not in str(warning.message) and "AKIAEXAMPLE" not in str(warning.message)


def test_a_resumed_run_hides_what_an_earlier_run_logged_after_its_checkpoint(tmp_path):
    """The driver died at step 4 after checkpoint-2; the rerun logs 3.. again into the same logging_dir."""
    from raytrainer.state import TrainerControl, TrainerState

    args = TrainingArguments(output_dir=str(tmp_path), logging_dir=str(tmp_path / "tb"))
    first, state = TensorBoardCallback(), TrainerState()
    first.on_train_begin(args, state, TrainerControl())
    for step in (1, 2, 3, 4):
        state.global_step = step
        first.on_log(args, state, TrainerControl(), logs={"loss": 10.0 + step})
    first.tb_writer.flush()  # killed: never closed
    second, state = TensorBoardCallback(), TrainerState(global_step=2)
    second.on_train_begin(args, state, TrainerControl())
    for step in (3, 4):
        state.global_step = step
        second.on_log(args, state, TrainerControl(), logs={"loss": 20.0 + step})
    second.on_train_end(args, state, TrainerControl())
    points = [(e.step, e.value) for e in read(str(tmp_path / "tb")).Scalars("train/loss")]
    assert points == [(1, 11.0), (2, 12.0), (3, 23.0), (4, 24.0)]  # no stale point left


def test_evaluate_after_training_writes_each_scalar_once_to_one_more_file(tmp_path):
    """HF closes its writer at the end of training, so an evaluate() after it opens one new event file; the
    evaluation arrives as on_log and on_evaluate and is written once, and a second evaluate() adds no file.
    (A value already written at that step and tag, as the last in-training evaluation's, is not written again.)"""
    trainer = train(tmp_path)
    metrics = trainer.evaluate(TokenData(8, seed=2))
    trainer.evaluate(TokenData(8, seed=2))
    files = glob.glob(os.path.join(trainer.args.logging_dir, "events.out.tfevents.*"))
    assert len(files) == 2, files
    after = read(max(files, key=os.path.getmtime))
    assert scalars(after, "eval/loss") == pytest.approx({6: metrics["eval_loss"]}, rel=1e-6)
