"""Real Ray Train worker groups with gloo process groups: the same run on 2 workers, 1 worker and in the
driver process ends with the same weights; a distributed evaluation equals the single-process one.

41 samples in global batches of 8: the last micro-batch of each epoch has one sample, so rank 1 runs a
zero-weight filler there, which must change nothing.
"""

import numpy as np
import pytest
import torch

from raytrainer import Trainer, TrainingArguments
from raytrainer.checkpoint.manifest import is_committed
from tests.models import TokenData, assert_same_weights, make_model, weights
from tests.test_startup import assert_consistent

pytestmark = pytest.mark.usefixtures("ray_session")


def train(tmp_path, num_workers, batch, **extra):
    options = dict(output_dir=str(tmp_path / f"w{num_workers}"), num_workers=num_workers,
                   per_device_train_batch_size=batch, num_train_epochs=2, learning_rate=1e-2, optim="adamw_torch",
                   logging_steps=3, save_strategy="no", disable_tqdm=True, seed=7)
    args = TrainingArguments(**{**options, **extra})
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(41))
    return trainer, trainer.train()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return train(tmp_path_factory.mktemp("ref"), num_workers=0, batch=8)


def test_two_workers_batch_4_equal_one_worker_batch_8_and_in_process(tmp_path, reference):
    ref_trainer, ref_out = reference
    two, two_out = train(tmp_path, num_workers=2, batch=4)
    again, _ = train(tmp_path, num_workers=2, batch=4, max_steps=1)  # on the group `two` left
    one, one_out = train(tmp_path, num_workers=1, batch=8)
    # The start-up timeline (raytrainer/startup.py), driver and rank 0 sides; a reused group starts at once.
    assert_consistent(two.state.startup, two.state.startup["group"])
    assert {"object store", "sink start", "group start"} <= set(two.state.startup["phases_s"])
    assert_consistent(again.state.startup, "reused")
    # ~0 on an idle machine; on 2 busy cores rank 0 may still be releasing the last job's memory (2 s seen).
    assert again.state.startup["phases_s"]["group start"] < 5.0
    assert two_out.global_step == one_out.global_step == ref_out.global_step == 12
    assert_same_weights(weights(two.model), weights(ref_trainer.model))
    assert_same_weights(weights(one.model), weights(ref_trainer.model))
    losses = lambda t: [h["loss"] for h in t.state.log_history if "loss" in h]  # noqa: E731
    np.testing.assert_allclose(losses(two), losses(ref_trainer), rtol=1e-5)
    assert len(losses(two)) == 4


def test_model_init_that_builds_other_weights_on_rank_1_trains_from_rank_0s(tmp_path, reference):
    """A shipped model is one pickle on every rank, so DDP skips its start-up broadcast; model_init builds
    a model on each rank, and there rank 0's weights must still reach the others before the first step."""
    def model_init():
        model = make_model()
        if torch.distributed.is_initialized() and torch.distributed.get_rank() == 1:
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(1.0)
        return model

    args = TrainingArguments(output_dir=str(tmp_path / "init"), num_workers=2, per_device_train_batch_size=4,
                             num_train_epochs=2, learning_rate=1e-2, optim="adamw_torch", logging_steps=3,
                             save_strategy="no", disable_tqdm=True, seed=7,
                             data_seed=7)  # make_model() reseeds: without data_seed the order follows it (as HF's)
    trainer = Trainer(model_init=model_init, args=args, train_dataset=TokenData(41))
    trainer.train()
    assert_same_weights(weights(trainer.model), weights(reference[0].model))


def test_two_workers_with_accumulation_match_in_process(tmp_path, reference, monkeypatch):
    ref_trainer, _ = reference
    monkeypatch.chdir(tmp_path)  # a relative output_dir means the driver's directory, not the workers'
    acc, _ = train(tmp_path, num_workers=2, batch=2, gradient_accumulation_steps=2, output_dir="relative-run",
                   save_strategy="steps", save_steps=100)
    assert_same_weights(weights(acc.model), weights(ref_trainer.model))
    assert is_committed(str(tmp_path / "relative-run" / "checkpoint-12"))


def test_distributed_evaluate_on_odd_size_equals_one_process(tmp_path):
    def metrics(p):
        mask = p.label_ids != -100
        return {"accuracy": float((p.predictions.argmax(-1)[mask] == p.label_ids[mask]).mean()),
                "n": float(len(p.label_ids))}

    results = {}
    for workers in (0, 2):
        args = TrainingArguments(output_dir=str(tmp_path), num_workers=workers, per_device_eval_batch_size=3,
                                 disable_tqdm=True)
        trainer = Trainer(model=make_model(), args=args, eval_dataset=TokenData(13, seed=5),
                          compute_metrics=metrics)
        results[workers] = trainer.evaluate()
    assert results[2]["eval_n"] == results[0]["eval_n"] == 13
    assert results[2]["eval_accuracy"] == pytest.approx(results[0]["eval_accuracy"])


def test_without_global_token_averaging_the_logged_loss_is_the_mean_of_rank_losses(tmp_path):
    """average_tokens_across_devices=False: each rank normalises by its own tokens, DDP averages; the logged
    loss of step 1 is the mean of the two ranks' token-mean losses (not their sum)."""
    from raytrainer.data.collator import DefaultCollator
    from raytrainer.data.sampler import DistributedBatchSampler

    trainer, _ = train(tmp_path, num_workers=2, batch=4, average_tokens_across_devices=False, max_steps=1,
                       logging_first_step=True)
    data, model = TokenData(41), make_model()
    rank_losses = []
    for rank in range(2):
        indices = next(iter(DistributedBatchSampler(41, 4, rank=rank, world_size=2, seed=7)))
        batch = DefaultCollator()([data[i] for i in indices])
        rank_losses.append(model(batch["input_ids"], labels=batch["labels"])["loss"].item())
    assert trainer.state.log_history[0]["loss"] == pytest.approx(sum(rank_losses) / 2, rel=1e-5)
