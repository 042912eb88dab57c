"""The event model on real worker groups: every event reaches a driver callback exactly once whatever the
world size, control decisions (driver and per-rank callbacks) are applied by every rank at the same step,
and the per-rank figures show a straggler."""

import collections
import time

import pytest

from raytrainer import Trainer, TrainerCallback, TrainingArguments
from raytrainer.callbacks.event_names import EVENTS
from raytrainer.callbacks.progress import straggler
from raytrainer.checkpoint.listing import list_checkpoints
from tests.models import TokenData, make_model

pytestmark = pytest.mark.usefixtures("ray_session")


class Count(TrainerCallback):
    """Counts every on_* call (observes only: the workers never wait for it)."""
    observes_only = True

    def __init__(self):
        self.counts = collections.Counter()
        for event in EVENTS:
            setattr(self, f"on_{event}", self._counter(event))

    def _counter(self, event):
        def on_event(args, state, control, **kwargs):
            self.counts[event] += 1
        return on_event


def args_for(tmp_path, num_workers, batch, **extra):
    options = dict(output_dir=str(tmp_path / f"w{num_workers}"), num_workers=num_workers,
                   per_device_train_batch_size=batch, gradient_accumulation_steps=2, num_train_epochs=2,
                   logging_steps=2, eval_strategy="steps", eval_steps=3, save_steps=4, learning_rate=1e-2,
                   per_device_eval_batch_size=8 // max(num_workers, 1), disable_tqdm=True, seed=5)
    return TrainingArguments(**{**options, **extra})


def test_every_event_reaches_a_driver_callback_once_whatever_the_world_size(tmp_path):
    counts = {}
    for workers, batch in ((0, 4), (2, 2)):
        count = Count()
        trainer = Trainer(model=make_model(), args=args_for(tmp_path, workers, batch), callbacks=[count],
                          train_dataset=TokenData(33), eval_dataset=TokenData(13, seed=1))
        trainer.train()
        trainer.evaluate()
        trainer.predict(TokenData(13, seed=2))
        counts[workers] = dict(count.counts)
    assert counts[2] == counts[0]
    expected_steps = 10  # 33 samples, global batch 8 (2 micro-steps of 4): 5 steps per epoch, 2 epochs
    assert counts[0]["step_end"] == counts[0]["step_begin"] == counts[0]["optimizer_step"] == expected_steps
    # One per micro-step but the last of each step: 9 micro-batches per epoch, the 5th step has only one.
    assert counts[0]["substep_end"] == 2 * 4
    assert counts[0]["train_begin"] == counts[0]["train_end"] == counts[0]["init_end"] == 1
    assert counts[0]["epoch_begin"] == counts[0]["epoch_end"] == 2
    assert counts[0]["evaluate"] == 4 + 1 and counts[0]["predict"] == 1  # steps 3, 6, 9, the last (10) + evaluate()
    assert counts[0]["save"] == 3  # steps 4, 8 and the last (10)
    assert counts[0]["prediction_step"] > 0


class StopOnEveryRankCallback(TrainerCallback):
    """Runs inside the loop on every rank; only rank 1 asks to stop, at step 5."""
    on_every_rank = True

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        assert model is not None and optimizer is not None  # as HF passes them
        if kwargs["train_dataloader"].batch_sampler.rank == 1 and state.global_step == 5:
            control.should_training_stop = True


class SaveAndEvaluateAt(TrainerCallback):
    """A driver callback asking for a save at step 2 and an evaluation at step 4 (HF's control flags)."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            control.should_save = True
        if state.global_step == 4:
            control.should_evaluate = True


class SlowRankOne(Trainer):
    """Rank 1's data path sleeps: a straggler the per-rank figures must point at."""

    def get_train_dataloader(self):
        loader = super().get_train_dataloader()
        if self.ctx.rank == 1:
            collate = loader.collate_fn

            def slow(features):
                time.sleep(0.05)
                return collate(features)
            loader.collate_fn = slow
        return loader


def test_control_from_the_driver_and_from_one_rank_is_applied_by_every_rank_at_the_same_step(tmp_path):
    """One 2-worker run: the driver asks for a save at 2 and an evaluation at 4, rank 1's own callback stops
    the run at 5 (a final checkpoint follows); rank 1 is slowed and must show as the straggler."""
    seen = []

    class Watch(TrainerCallback):
        observes_only = True

        def on_log(self, args, state, control, logs=None, rank_stats=None, **kwargs):
            if rank_stats and "loss" in logs:
                seen.append(rank_stats)

    args = args_for(tmp_path, 2, 2, eval_strategy="no", save_steps=100, max_steps=10, logging_steps=2)
    trainer = SlowRankOne(model=make_model(), args=args, train_dataset=TokenData(33),
                          eval_dataset=TokenData(13, seed=1),
                          callbacks=[StopOnEveryRankCallback(), SaveAndEvaluateAt(), Watch()])
    assert trainer.train().global_step == 5
    saved = [info.step for info in list_checkpoints(args.output_dir) if info.committed]
    assert saved == [2, 5]  # both saves gather every rank's RNG state: every rank took part
    assert [h["step"] for h in trainer.state.log_history if "eval_loss" in h] == [4]

    assert len(seen) == 2 and all({s["rank"] for s in stats} == {0, 1} for stats in seen)
    for stats in seen:  # steps 1-2 and 3-4: two micro-batches of 0.05 s per step on rank 1
        assert straggler(stats)["rank"] == 1
        assert stats[1]["data_wait_s"] >= 0.1 > 0.05 > stats[0]["data_wait_s"]


class AskAtSteps(TrainerCallback):
    """A driver callback asking for a save after step 2, an evaluation after step 5 (the first epoch's last
    step) and a stop in on_log at step 6."""

    def on_step_end(self, args, state, control, **kwargs):
        control.should_save = state.global_step == 2
        control.should_evaluate = state.global_step == 5

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.global_step == 6:
            control.should_training_stop = True


@pytest.mark.parametrize("workers", [0, 2])
def test_next_step_decisions_apply_one_step_later_or_at_the_epochs_last_step(tmp_path, workers):
    """callback_decisions="next_step": training does not wait for the driver's answer; every rank applies it
    at the next step's on_step_end (save asked at 2 -> 3, stop asked at 6 -> 7 with its final checkpoint), or
    at the step itself when it ends an epoch (evaluation asked at 5). The same steps whatever the world size."""
    args = args_for(tmp_path, workers, 4 // max(workers, 1), eval_strategy="no", save_steps=100, max_steps=10,
                    callback_decisions="next_step")
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(33), eval_dataset=TokenData(13, seed=1),
                      callbacks=[AskAtSteps()])
    assert trainer.train().global_step == 7
    assert [info.step for info in list_checkpoints(args.output_dir) if info.committed] == [3, 7]
    assert [h["step"] for h in trainer.state.log_history if "eval_loss" in h] == [5]


def test_callback_decisions_names_its_two_values(tmp_path):
    from raytrainer import ConfigError

    with pytest.raises(ConfigError, match="'same_step'.*'next_step'"):
        TrainingArguments(output_dir=str(tmp_path), callback_decisions="later")
