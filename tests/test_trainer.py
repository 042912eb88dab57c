"""The Trainer methods transformers' documents teach to call or override: the subclassing guide's
`get_train_dataloader` recipe (`self._get_dataloader`, `self._train_batch_size`) with a `_get_train_sampler`
override on 2 workers, `is_world_process_zero` there and on the driver, a user error in an override as one
line, `get_eval_dataloader`/`get_test_dataloader` (`create_model_card`: tests/hub/test_model_card.py; `push_to_hub`:
tests/hub/test_push.py)."""

import json
import os
import time

import pytest
import torch

from raytrainer import Trainer, TrainingArguments
from raytrainer.coordinator.pump import TrainingError
from raytrainer.data.user_sampler import draw
from raytrainer.worker_context import WorkerContext
from tests.models import TokenData, make_model

# Odd samples weigh nothing: a worker that trains on one did not use the override's sampler.
WEIGHTS = [1.0 if i % 2 == 0 else 0.0 for i in range(40)]


class RecipeTrainer(Trainer):
    fail_on_rank = None

    def get_train_dataloader(self):  # the subclassing guide's recipe, verbatim
        return self._get_dataloader(dataset=self.train_dataset, description="Training",
                                    batch_size=self._train_batch_size, sampler_fn=self._get_train_sampler,
                                    is_training=True)

    def _get_train_sampler(self, train_dataset=None):
        return torch.utils.data.WeightedRandomSampler(WEIGHTS, num_samples=24)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training and self.ctx.world_size > 1:
            if self.fail_on_rank == self.ctx.rank:
                raise ValueError("labels out of range")
            with open(os.path.join(self.args.output_dir, f"rank{self.ctx.rank}"), "a") as f:
                f.write(json.dumps([inputs["idx"].tolist(), self.is_world_process_zero(),
                                    self.is_local_process_zero()]) + "\n")
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def _seen(output_dir, rank):
    with open(os.path.join(output_dir, f"rank{rank}")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.usefixtures("ray_session")
def test_the_guides_dataloader_recipe_and_a_sampler_override_on_two_workers_and_an_error_in_one_line(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=2, per_device_train_batch_size=4, max_steps=3,
                             save_strategy="no", disable_tqdm=True, learning_rate=1e-2)
    trainer = RecipeTrainer(model=make_model(), args=args, train_dataset=TokenData(40))
    assert trainer.is_world_process_zero() and trainer.is_local_process_zero()  # the driver
    trainer.train()

    # Every rank drew the override's order for the epoch and took its share of each global batch of 8.
    order = draw(torch.utils.data.WeightedRandomSampler(WEIGHTS, num_samples=24), args.train_data_seed, 0)
    for rank in (0, 1):
        seen = _seen(args.output_dir, rank)
        assert [batch for batch, _, _ in seen] == [order[8 * s + 4 * rank:8 * s + 4 * rank + 4] for s in range(3)]
        assert all(zero == (rank == 0) and local == (rank == 0) for _, zero, local in seen)

    trainer.fail_on_rank = 1
    started = time.time()
    with pytest.raises(TrainingError) as caught:
        trainer.train()
    message = str(caught.value)
    assert message.startswith("train() failed on worker rank 1: RecipeTrainer.compute_loss raised ValueError: "
                              "labels out of range (test_trainer.py:"), message
    assert "\n" not in message and len(message) < 200
    assert "Traceback" in caught.value.worker_traceback and "labels out of range" in caught.value.worker_traceback
    assert time.time() - started < 120


def test_eval_and_test_dataloaders_keep_transformers_semantics_and_shard_in_order(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, per_device_eval_batch_size=2)
    trainer = Trainer(model=make_model(), args=args, eval_dataset={"a": TokenData(6), "b": TokenData(9, seed=1)})
    trainer.ctx = WorkerContext(rank=1, world_size=2)  # what rank 1 of 2 builds
    b = trainer.get_eval_dataloader("b")  # a str names one of the eval datasets
    assert [i for batch in b for i in batch["idx"].tolist()] == [4, 5, 6, 7, 8]  # the second contiguous half
    assert len(trainer.get_test_dataloader(TokenData(4)).dataset) == 2

    class Reversed(Trainer):
        def _get_eval_sampler(self, eval_dataset):
            return list(reversed(range(len(eval_dataset))))  # any iterable of indices, like a Sampler

    reverse = Reversed(model=make_model(), args=args)
    reverse.ctx = WorkerContext(rank=0, world_size=2)
    assert [i for batch in reverse.get_test_dataloader(TokenData(6)) for i in batch["idx"].tolist()] == [5, 4, 3]
    with pytest.raises(ValueError, match="evaluation requires an eval_dataset"):
        Trainer(model=make_model(), args=args).get_eval_dataloader()


def test_after_a_resume_the_driver_callbacks_see_the_checkpoints_log_history_as_in_transformers(tmp_path):
    """transformers loads the checkpoint's trainer_state.json: a callback's `state.log_history` after a resume
    holds the earlier run's records, then this run's. The driver's state mirror starts from the checkpoint's."""
    from raytrainer import TrainerCallback

    seen = {}

    class Steps(TrainerCallback):
        def on_train_end(self, args, state, control, **kwargs):
            seen["end"] = [h["step"] for h in state.log_history if "loss" in h]

    def run(max_steps, resume):
        args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, max_steps=max_steps, save_steps=2,
                                 logging_steps=1, per_device_train_batch_size=4, disable_tqdm=True,
                                 report_to="none")
        trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(32), callbacks=[Steps()])
        trainer.train(resume_from_checkpoint=resume)
        return [h["step"] for h in trainer.state.log_history if "loss" in h]

    assert run(2, None) == seen["end"] == [1, 2]
    assert run(4, True) == seen["end"] == [1, 2, 3, 4]  # the resumed run's callbacks: [3, 4] before
