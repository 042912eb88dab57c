"""One 2-worker Ray run with a reporter and an early stop (one worker-group start for both): the stop
reaches every rank at the same step, and the driver writes one TensorBoard event file with log_history's
values and per-rank curves."""

import glob
import os
import signal
import threading

import pytest

pytest.importorskip("tensorboard")

from raytrainer import EarlyStoppingCallback, Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from raytrainer.checkpoint.listing import list_checkpoints  # noqa: E402
from tests.callbacks.test_tensorboard import check_against_log_history, read, scalars  # noqa: E402
from tests.models import TokenData, make_model  # noqa: E402


def test_early_stop_and_tensorboard_on_two_workers(tmp_path, ray_session):
    logdir = str(tmp_path / "tb")
    # A learning rate so small that the eval loss moves by far less than the threshold: no evaluation after
    # the first improves it, so patience 2 stops the run at the third evaluation (step 6 of 20).
    args = TrainingArguments(output_dir=str(tmp_path / "out"), num_workers=2, per_device_train_batch_size=4,
                             max_steps=20, learning_rate=1e-9, optim="adamw_torch", eval_strategy="steps",
                             eval_steps=2, save_steps=2, load_best_model_at_end=True, logging_steps=1,
                             disable_tqdm=True, report_to="tensorboard", logging_dir=logdir)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(40), eval_dataset=TokenData(8, seed=1),
                      callbacks=[EarlyStoppingCallback(early_stopping_patience=2, early_stopping_threshold=0.01)])
    output = trainer.train()

    # Every rank stopped at step 6 (a rank that went on would hang the collectives) and the last checkpoint is
    # the stop step's.
    assert output.global_step == trainer.state.global_step == 6
    assert {c.step: c.committed for c in list_checkpoints(args.output_dir)} == {2: True, 4: True, 6: True}

    assert len(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))) == 1  # one writer, on the driver
    acc = read(logdir)
    check_against_log_history(acc, trainer, log_steps=range(1, 7), eval_steps=(2, 4, 6))
    for rank in (0, 1):  # per-rank figures, so a straggler shows as a curve apart
        assert sorted(scalars(acc, f"rank{rank}/data_wait_s")) == [1, 2, 3, 4, 5, 6]
        assert sorted(scalars(acc, f"rank{rank}/step_time_s")) == [1, 2, 3, 4, 5, 6]


def test_a_ctrl_c_stop_keeps_its_newest_checkpoint_under_save_total_limit_1(tmp_path, ray_session):
    """save_total_limit=1 with a best: transformers deletes every checkpoint but the best when training ends, and
    so does raytrainer at a real end (tests/checkpoint/test_contents.py). A run stopped by Ctrl-C has not ended:
    the same call continues from its newest checkpoint, which stays beside the best."""
    assert threading.current_thread() is threading.main_thread()  # where train() takes Ctrl-C over

    class CtrlC(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C: save at the next step boundary, stop

    # greater_is_better on the eval loss, which falls: the first evaluation (step 2) stays the best.
    args = TrainingArguments(output_dir=str(tmp_path / "out"), num_workers=2, per_device_train_batch_size=4,
                             max_steps=20, learning_rate=1e-2, eval_strategy="steps", eval_steps=2, save_steps=2,
                             save_total_limit=1, load_best_model_at_end=True, metric_for_best_model="loss",
                             greater_is_better=True, disable_tqdm=True)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(40), eval_dataset=TokenData(8, seed=1),
                      callbacks=[CtrlC()])
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    stopped_at = trainer.state.global_step  # the driver hears of step 3 within its flush interval: later
    assert trainer.state.best_model_checkpoint.endswith("checkpoint-2") and 2 < stopped_at < 20
    assert {c.step for c in list_checkpoints(args.output_dir) if c.committed} == {2, stopped_at}
