"""The hosted mode's checks on the driver, before any worker starts: what it refuses, naming the fix, and the
arguments object rebuilt on each rank from its fields (raytrainer/hosting/api.py; a launched script's own checks:
test_launch_script.py)."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer, TrainingArguments

import raytrainer
from raytrainer.errors import ConfigError
from raytrainer.hosting.api import _fields


class TeamTrainer(Trainer):
    """A team's own subclass, as Axolotl-style code has."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def test_a_trainer_instance_is_refused_with_the_fix(tmp_path):
    trainer = Trainer(model=torch.nn.Linear(2, 2), args=TrainingArguments(output_dir=str(tmp_path), use_cpu=True))
    with pytest.raises(ConfigError, match=r"Pass the class and its arguments instead: raytrainer.hosted\(Trainer"):
        raytrainer.hosted(trainer, num_workers=2)


def test_a_class_that_is_no_trainer_is_refused():
    with pytest.raises(ConfigError, match="not a transformers.Trainer subclass"):
        raytrainer.hosted(torch.nn.Linear)


def test_raytrainer_arguments_given_to_a_foreign_trainer_are_refused(tmp_path):
    build = raytrainer.hosted(TeamTrainer, num_workers=2)
    ours = raytrainer.TrainingArguments(output_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"give raytrainer's options beside the trainer: raytrainer.hosted\("
                                          r"TeamTrainer, num_workers=2\)"):
        build(model=torch.nn.Linear(2, 2), args=ours)


def test_a_raytrainer_option_inside_the_trainer_arguments_is_refused(tmp_path):
    build = raytrainer.hosted(TeamTrainer)
    with pytest.raises(ConfigError, match=r"num_workers given to TeamTrainer: .* raytrainer.hosted\(TeamTrainer, "
                                          r"num_workers=...\)"):
        build(model=torch.nn.Linear(2, 2), args=TrainingArguments(output_dir=str(tmp_path)), num_workers=2)


def test_an_unknown_hosted_option_is_refused_naming_where_training_settings_go():
    with pytest.raises(ConfigError, match=r"learning_rate, which is not an option of a hosted run.*SFTConfig"):
        raytrainer.hosted(TeamTrainer, num_workers=2, learning_rate=1e-3)
    with pytest.raises(ConfigError, match="resume='yes'"):
        raytrainer.hosted(TeamTrainer, resume="yes")


@pytest.mark.parametrize("make", [
    lambda out: TrainingArguments(output_dir=out, use_cpu=True, lr_scheduler_type="cosine", report_to="tensorboard",
                                  gradient_accumulation_steps=3),
    lambda out: Seq2SeqTrainingArguments(output_dir=out, use_cpu=True, predict_with_generate=True,
                                         generation_max_length=8, generation_num_beams=2),
], ids=["TrainingArguments", "Seq2SeqTrainingArguments"])
def test_arguments_are_rebuilt_equal_from_their_fields(make):
    given = make("s3://bucket/run")
    rebuilt = type(given)(**_fields(given))
    assert rebuilt.to_dict() == given.to_dict()


def test_trl_configs_are_rebuilt_for_the_worker_group_size():
    """GRPO derives generation_batch_size from the number of processes: the driver's one process must not fix it."""
    trl = pytest.importorskip("trl")
    warnings.simplefilter("ignore")
    derived = trl.GRPOConfig(output_dir="out", use_cpu=True, per_device_train_batch_size=2, num_generations=2)
    assert derived.generation_batch_size == 2  # 2 rows x 1 process x 1 step
    fields = _fields(derived)
    assert fields["generation_batch_size"] is None and fields["steps_per_generation"] == 1
    chosen = trl.GRPOConfig(output_dir="out", use_cpu=True, per_device_train_batch_size=2, num_generations=2,
                            steps_per_generation=4)
    fields = _fields(chosen)
    assert fields["generation_batch_size"] is None and fields["steps_per_generation"] == 4
    for config in (trl.SFTConfig(output_dir="out", use_cpu=True, packing=True, max_length=32),
                   trl.DPOConfig(output_dir="out", use_cpu=True), trl.RewardConfig(output_dir="out", use_cpu=True)):
        assert type(config)(**_fields(config)).to_dict() == config.to_dict()


def test_seq2seq_trainer_passes_the_class_checks():
    assert callable(raytrainer.hosted(Seq2SeqTrainer, num_workers=2))


def test_storage_and_the_lease_are_checked_on_the_driver_before_any_worker(tmp_path, monkeypatch):
    """The arguments are on the driver: an output_dir another run writes, or S3 without credentials, is refused
    by train() itself, one message, and nothing is dispatched (no Ray, no worker group)."""
    from raytrainer.checkpoint import lease
    from raytrainer.errors import StorageError
    from raytrainer.hosting import api

    def dispatched(*args, **kwargs):
        raise AssertionError("dispatched: the check came after the workers")
    monkeypatch.setattr(api, "dispatch_order", dispatched)
    build = raytrainer.hosted(TeamTrainer, num_workers=2)
    held = lease.acquire(str(tmp_path / "run"), "another-run", heartbeat=False)
    try:
        trainer = build(model=torch.nn.Linear(2, 2), args=TrainingArguments(output_dir=str(tmp_path / "run")))
        with pytest.raises(StorageError, match="is being written by another run"):
            trainer.train()
    finally:
        held.release()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    remote = raytrainer.hosted(TeamTrainer, num_workers=2, storage_options={"endpoint_url": "http://127.0.0.1:9"})
    trainer = remote(model=torch.nn.Linear(2, 2), args=TrainingArguments(output_dir="s3://nobucket/run"))
    with pytest.raises(StorageError, match="No usable credentials for s3://nobucket/run"):
        trainer.train()
