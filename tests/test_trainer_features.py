"""Trainer features from the HF argument list, in process: NEFTune, label smoothing, and their bad values
(eval_on_start, eval_delay and eval_accumulation_steps: tests/worker/test_evaluation.py)."""

import pytest
import torch

from raytrainer import ConfigError, Trainer, TrainingArguments
from raytrainer.data.collator import DefaultCollator
from raytrainer.data.sampler import DistributedBatchSampler
from raytrainer.worker.losses import label_smoothed_loss
from tests.models import TokenData, make_model


def args(tmp_path, **extra):
    options = dict(output_dir=str(tmp_path), num_workers=0, per_device_train_batch_size=8, max_steps=6,
                   logging_steps=2, learning_rate=1e-2, save_strategy="no", disable_tqdm=True, seed=1)
    return TrainingArguments(**{**options, **extra})


def test_neftune_changes_training_and_leaves_the_embedding_as_trained(tmp_path):
    plain = Trainer(model=make_model(), args=args(tmp_path), train_dataset=TokenData(40))
    plain.train()
    noisy = Trainer(model=make_model(), args=args(tmp_path, neftune_noise_alpha=5.0), train_dataset=TokenData(40))
    noisy.train()
    losses = lambda t: [h["loss"] for h in t.state.log_history if "loss" in h]  # noqa: E731
    assert losses(noisy) != losses(plain)
    embedding = noisy.model.emb
    assert not embedding._forward_hooks  # the noise hook is gone: the layer is plain again
    ids = torch.arange(8)[None]
    torch.testing.assert_close(embedding(ids), embedding.weight[ids])


def test_label_smoothing_gives_hf_label_smoother_loss(tmp_path):
    trainer = Trainer(model=make_model(), args=args(tmp_path, label_smoothing_factor=0.1, max_steps=1,
                                                    logging_steps=1, learning_rate=1e-9),
                      train_dataset=TokenData(40))
    trainer.train()
    data = TokenData(40)
    batch = DefaultCollator()([data[i] for i in next(iter(DistributedBatchSampler(40, 8, seed=1)))])
    logits = make_model()(batch["input_ids"])["logits"]
    log_probs = -torch.log_softmax(logits, -1)
    mask = batch["labels"] != -100
    nll = log_probs.gather(-1, batch["labels"].clamp(min=0)[..., None])[..., 0][mask].mean()
    smooth = log_probs.mean(-1)[mask].mean()
    expected = 0.9 * nll + 0.1 * smooth
    assert trainer.state.log_history[0]["loss"] == pytest.approx(expected.item(), rel=1e-5)
    assert label_smoothed_loss(logits, batch["labels"], 0.0).item() == pytest.approx(nll.item(), rel=1e-5)


@pytest.mark.parametrize("field, value, message", [
    ("label_smoothing_factor", 1.0, "label_smoothing_factor=1.0 must be in"),
    ("neftune_noise_alpha", 0, "neftune_noise_alpha=0 must be > 0"),
    ("eval_delay", -1, "eval_delay=-1 must be >= 0"),
    ("eval_accumulation_steps", 0, "eval_accumulation_steps=0 must be a positive int"),
    ("log_level", "loud", "log_level='loud' is not supported; choose one of: debug"),
    ("log_level_replica", "x", "log_level_replica='x' is not supported"),
])
def test_bad_values_name_the_field(tmp_path, field, value, message):
    with pytest.raises(ConfigError, match=message):
        TrainingArguments(output_dir=str(tmp_path), **{field: value})


def test_neftune_on_a_model_without_embeddings_fails_on_the_driver(tmp_path):
    class NoEmbedding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 2)

        def forward(self, x, labels=None):
            return {"loss": self.linear(x).sum()}

    data = [{"x": torch.ones(4), "labels": 0}] * 4
    trainer = Trainer(model=NoEmbedding(), args=args(tmp_path, num_workers=2, neftune_noise_alpha=5.0),
                      train_dataset=data)
    with pytest.raises(ConfigError, match="needs an embedding layer.*Set neftune_noise_alpha=None"):
        trainer.train()
