"""The seed documents' user code, unchanged but for the import, on 2 workers and in process: same logged
losses and weights for the same micro-batches (2 workers x 4 == in process 4 x accumulation 2)."""

import numpy as np
import pytest

from raytrainer import TrainingArguments
from raytrainer.checkpoint.listing import newest_committed
from tests.integration.user_code.seeds import (
    ClassificationData,
    CustomTrainer,
    DPOStyleTrainer,
    StopAtStep,
    tiny_classifier,
)
from tests.models import assert_same_weights, weights

pytestmark = pytest.mark.usefixtures("ray_session")


def run(trainer_cls, tmp_path, num_workers, **extra):
    accumulation = 2 if num_workers == 0 else 1
    args = TrainingArguments(output_dir=str(tmp_path / f"w{num_workers}"), num_workers=num_workers,
                             per_device_train_batch_size=4, gradient_accumulation_steps=accumulation,
                             max_steps=6, logging_steps=1, learning_rate=1e-2, optim="adamw_torch",
                             save_strategy="no", disable_tqdm=True, seed=3)
    trainer = trainer_cls(model=tiny_classifier(), args=args, train_dataset=ClassificationData(40), **extra)
    trainer.train()
    return trainer


def losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("trainer_cls, extra", [
    (CustomTrainer, {}),
    (DPOStyleTrainer, {"beta": 0.5}),
], ids=["custom-class-weighted-loss", "dpo-style-reference-model"])
def test_user_compute_loss_gives_the_same_losses_and_weights_on_2_workers(tmp_path, trainer_cls, extra):
    if trainer_cls is DPOStyleTrainer:
        extra = {**extra, "ref_model": tiny_classifier(seed=1)}
    in_process = run(trainer_cls, tmp_path, 0, **extra)
    two = run(trainer_cls, tmp_path, 2, **extra)
    # A per-batch mean is averaged over micro-steps and ranks: not doubled on 2 workers (the seed's bug).
    np.testing.assert_allclose(losses(two), losses(in_process), rtol=1e-5)
    assert 0.9 < losses(in_process)[0] < 1.4  # ~ln(3) for 3 balanced classes: a mean, not a sum
    assert_same_weights(weights(two.model), weights(in_process.model))
    if trainer_cls is DPOStyleTrainer:
        # The reference model stays what it was: frozen, not trained, not saved as the model.
        assert_same_weights(weights(two.ref_model), weights(tiny_classifier(seed=1)))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_callback_returning_a_dict_stops_every_rank_at_its_step_with_a_final_checkpoint(tmp_path, num_workers):
    args = TrainingArguments(output_dir=str(tmp_path / "run"), num_workers=num_workers,
                             per_device_train_batch_size=4, max_steps=30, logging_steps=5, save_steps=100,
                             learning_rate=1e-3, disable_tqdm=True)
    trainer = CustomTrainer(model=tiny_classifier(), args=args, train_dataset=ClassificationData(80),
                            callbacks=[StopAtStep(10)])
    output = trainer.train()
    assert output.global_step == trainer.state.global_step == 10
    # Saving the final checkpoint gathers every rank's RNG state: it commits only if every rank stopped at 10.
    assert newest_committed(args.output_dir).endswith("checkpoint-10")
