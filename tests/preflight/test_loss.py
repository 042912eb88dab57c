"""The driver's 2-sample loss check: a loss training cannot use (not a tensor, not a scalar, no gradient, NaN)
and a label column the collator dropped fail on the driver, naming the fix; a worker's missing module names
where code comes from. No Ray: the check runs in this process."""

import logging

import pytest
import torch

from raytrainer import ConfigError, Trainer, TrainingArguments
from raytrainer.preflight import loss as loss_check
from raytrainer.preflight.loss import check_loss
from tests.models import TokenData, make_model


def trainer_of(tmp_path, cls=Trainer, model=None, dataset=None, **kw):
    args = TrainingArguments(output_dir=str(tmp_path / "out"), num_workers=0, max_steps=2, disable_tqdm=True, **kw)
    return cls(model=model or make_model(), args=args, train_dataset=dataset or TokenData(8))


def check(trainer):
    check_loss(trainer, trainer.train_dataset, "train_dataset")


class PerTokenLoss(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logits = model(**{k: v for k, v in inputs.items() if k != "labels"})["logits"]
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), inputs["labels"].flatten(), reduction="none")


class DetachedLoss(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, num_items_in_batch=num_items_in_batch).detach()


class FloatLoss(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, num_items_in_batch=num_items_in_batch).item()


class NanLoss(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, num_items_in_batch=num_items_in_batch) * float("nan")


def test_the_default_loss_passes_and_leaves_no_gradient_behind(tmp_path):
    trainer = trainer_of(tmp_path)
    check(trainer)
    assert all(p.grad is None for p in trainer.model.parameters())


@pytest.mark.parametrize("cls, message", [
    (PerTokenLoss, r"has shape \(\d+,\), not a scalar: reduce it in PerTokenLoss.compute_loss \(.mean\(\)"),
    (DetachedLoss, r"does not require grad.*DetachedLoss.compute_loss cut it off the model's parameters: do not "
                   r"\.detach\(\) it"),
    (FloatLoss, r"is a float, not a torch tensor: FloatLoss.compute_loss must return the loss tensor"),
    (NanLoss, r"is nan: check the labels .* or set on_nonfinite_loss='skip'"),
])
def test_a_loss_training_cannot_use_fails_on_the_driver_naming_the_fix(tmp_path, cls, message):
    with pytest.raises(ConfigError, match=r"The loss on two samples of train_dataset .*" + message):
        check(trainer_of(tmp_path, cls=cls))


def test_a_frozen_model_is_named(tmp_path):
    model = make_model().requires_grad_(False)
    with pytest.raises(ConfigError, match=r"no parameter of TinyLM requires grad: unfreeze the ones to train"):
        check(trainer_of(tmp_path, model=model))


def test_a_nan_loss_under_skip_is_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="raytrainer"):
        check(trainer_of(tmp_path, cls=NanLoss, on_nonfinite_loss="skip"))
    assert "is nan; on_nonfinite_loss='skip' skips such steps" in caplog.text


class TextLabels(torch.utils.data.Dataset):
    def __init__(self, column):
        self.rows = [{"input_ids": torch.tensor([1, 2, 3]), column: text} for text in ("positive", "negative")]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


@pytest.mark.parametrize("column", ["labels", "label"])
def test_a_text_label_column_the_collator_drops_is_named(tmp_path, column):
    with pytest.raises(ConfigError, match=rf"train_dataset's '{column}' column holds str values \(e.g. 'positive'\), "
                                          r"which the data collator dropped.*class_encode_column"):
        check(trainer_of(tmp_path, dataset=TextLabels(column)))


def test_the_check_keeps_no_activation_for_backward(tmp_path, monkeypatch):
    """Gradients are on to see that the loss reaches the parameters, but no saved activation is kept: the
    driver's memory is that of a no_grad forward (a large model's 2 rows would otherwise hold gigabytes)."""
    trainer = trainer_of(tmp_path)
    kept = []
    original = loss_check.call_compute_loss

    def spy(*args, **kwargs):
        loss = original(*args, **kwargs)
        kept.append(loss)
        return loss
    monkeypatch.setattr(loss_check, "call_compute_loss", spy)
    check(trainer)
    assert kept[0].requires_grad
    with pytest.raises((RuntimeError, TypeError), match="unpack_hook"):  # nothing saved: backward cannot run
        kept[0].backward()


class WithBatchNorm(torch.nn.Module):
    """A BatchNorm (running statistics, a count) and dropout (torch's random stream) before a token-mean loss."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.drop = torch.nn.Dropout(0.5)
        self.head = torch.nn.Linear(8, 64)

    def forward(self, input_ids, labels=None, **kwargs):
        hidden = self.drop(self.norm(self.embed(input_ids).transpose(1, 2)).transpose(1, 2))
        logits = self.head(hidden)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return {"loss": loss, "logits": logits}


def test_the_check_leaves_buffers_and_random_streams_as_it_found_them(tmp_path):
    """The first training step after the check is the one it would have been without it (issue 31 item 3:
    BatchNorm's running statistics moved and dropout drew from torch's stream, so step 1 differed)."""
    import random

    import numpy

    torch.manual_seed(0)
    model = WithBatchNorm()
    trainer = trainer_of(tmp_path, model=model)
    buffers = {k: v.clone() for k, v in model.state_dict().items()}
    random.seed(1)
    numpy.random.seed(1)
    streams = (torch.get_rng_state(), random.getstate(), numpy.random.get_state()[1].copy())
    check(trainer)
    assert all(torch.equal(v, buffers[k]) for k, v in model.state_dict().items())
    assert int(model.norm.num_batches_tracked) == 0
    assert torch.equal(torch.get_rng_state(), streams[0]) and random.getstate() == streams[1]
    assert (numpy.random.get_state()[1] == streams[2]).all()
