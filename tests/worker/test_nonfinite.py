"""A NaN loss at step 3 (issue 20, 7): never trained on and committed silently. 'warn' (the default, as
transformers) names the step, also when a checkpoint is saved after it; 'skip' skips that update and keeps the
weights finite; 'stop' fails the run at step 3 before anything after it is saved. In the driver process."""

from __future__ import annotations

import math

import pytest
import torch

from raytrainer import ConfigError
from raytrainer.checkpoint import listing
from raytrainer.checkpoint.model_io import load_model_state
from raytrainer.worker.nonfinite import NonFiniteLossError
from tests.resume_script import SlowTrainer, TokenData, make_model, training_args


class NanAtStep3(SlowTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.state.global_step + 1 == 3 and model.training:
            loss = loss * float("nan")
        return loss


def _run(tmp_path, policy=None):
    extra = {} if policy is None else {"on_nonfinite_loss": policy}
    args = training_args(str(tmp_path / "run"), **extra)
    args.max_steps = 6
    trainer = NanAtStep3(model=make_model(), args=args, train_dataset=TokenData(44))
    return trainer, trainer.train


def _finite(state: dict) -> bool:
    return all(torch.isfinite(t).all() for t in state.values())


def test_warn_is_the_default_and_names_the_step(tmp_path, capfd):
    trainer, train = _run(tmp_path)
    train()
    err = capfd.readouterr().err
    assert "checkpoint-4 is saved after a NaN/Inf training loss at step 3" in err
    assert not _finite(trainer.model.state_dict())  # trains on, as transformers does


def test_skip_keeps_the_weights_finite(tmp_path, capfd):
    trainer, train = _run(tmp_path, "skip")
    output = train()
    assert output.global_step == 6
    assert "step 3: the training loss is NaN/Inf; its optimizer step is skipped" in capfd.readouterr().err
    assert _finite(trainer.model.state_dict())
    for info in listing.list_checkpoints(str(tmp_path / "run")):
        assert _finite(load_model_state(info.url))


def test_stop_fails_at_the_step_and_commits_nothing_after_it(tmp_path):
    trainer, train = _run(tmp_path, "stop")
    with pytest.raises(NonFiniteLossError, match="NaN/Inf at step 3"):
        train()
    assert [i.step for i in listing.list_checkpoints(str(tmp_path / "run"))] == []
    assert math.isfinite(float(trainer.model.head.weight.detach().sum()))  # the driver's model is untouched


def test_an_unknown_policy_is_refused_before_training(tmp_path):
    trainer, train = _run(tmp_path, "ignore")
    with pytest.raises(ConfigError, match="on_nonfinite_loss='ignore'"):
        train()
