"""Every optim name once (the built-in ones and those of their own packages), and Liger's kernels: refused where
they cannot run, checked when the arguments are built (optimizers/registry.py) and in the preflight
(strategy/liger.py)."""

from __future__ import annotations

import pytest
import torch

from raytrainer import Trainer, TrainingArguments
from raytrainer.data.collator import DefaultCollator
from raytrainer.errors import ConfigError
from raytrainer.optimizers.packaged import NAMES
from raytrainer.optimizers.registry import OPTIMIZERS, create_optimizer
from tests.hf_models import tiny_model, tiny_rows
from tests.models import weights

transformers = pytest.importorskip("transformers")


def test_every_name_is_an_optim_choice():
    assert set(NAMES) <= set(OPTIMIZERS)
    assert {"galore_adamw", "galore_adamw_8bit", "galore_adafactor", "galore_adamw_layerwise",
            "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise", "apollo_adamw", "apollo_adamw_layerwise",
            "lomo", "adalomo", "grokadamw", "stable_adamw"} == set(NAMES)


def test_each_name_is_listed_once():
    assert len(set(OPTIMIZERS)) == len(OPTIMIZERS)


# ------------------------------------------------------------------ optimizer_cls_and_kwargs (transformers')
SGD_MOMENTUM = (torch.optim.SGD, {"lr": 0.5, "momentum": 0.9})


def test_optimizer_cls_and_kwargs_is_that_class_over_hfs_two_groups_with_its_kwargs():
    model = tiny_model("llama")
    args = TrainingArguments(weight_decay=0.1, optim="adafactor", learning_rate=1e-5)  # neither is read
    ours = create_optimizer(model, args, SGD_MOMENTUM)
    theirs = transformers.Trainer(model=model, args=transformers.TrainingArguments(weight_decay=0.1, use_cpu=True),
                                  optimizer_cls_and_kwargs=SGD_MOMENTUM).create_optimizer()
    assert type(ours) is torch.optim.SGD
    assert [{k: v for k, v in g.items() if k != "params"} for g in ours.param_groups] == [
        {k: v for k, v in g.items() if k != "params"} for g in theirs.param_groups]
    assert [[id(p) for p in g["params"]] for g in ours.param_groups] == [
        [id(p) for p in g["params"]] for g in theirs.param_groups]
    assert ours.param_groups[0]["lr"] == 0.5 and [g["weight_decay"] for g in ours.param_groups] == [0.1, 0.0]


def test_optimizer_cls_and_kwargs_is_checked_on_the_driver():
    model = tiny_model("llama")
    with pytest.raises(ConfigError, match="both name the optimizer"):
        Trainer(model=model, args=TrainingArguments(num_workers=0),
                optimizers=(torch.optim.SGD(model.parameters(), lr=0.1), None), optimizer_cls_and_kwargs=SGD_MOMENTUM)
    with pytest.raises(ConfigError, match="an optimizer class, a dict"):
        Trainer(model=model, args=TrainingArguments(num_workers=0), optimizer_cls_and_kwargs=torch.optim.SGD)


def test_a_run_with_optimizer_cls_and_kwargs_logs_transformers_numbers(tmp_path):
    """In this process, 3 steps of SGD with momentum from optimizer_cls_and_kwargs: transformers' losses, grad norms,
    learning rates (the kwargs' lr, scheduled) and weights. (On 2 workers the same, measured: 1e-6.)"""
    runs = {}
    for side, trainer_class, args_class, extra in (
            ("ours", Trainer, TrainingArguments, {"num_workers": 0}),
            ("theirs", transformers.Trainer, transformers.TrainingArguments, {"use_cpu": True})):
        args = args_class(output_dir=str(tmp_path / side), max_steps=3, per_device_train_batch_size=4, logging_steps=1,
                          save_strategy="no", report_to="none", disable_tqdm=True, seed=0, **extra)
        trainer = trainer_class(model=tiny_model("llama"), args=args, train_dataset=tiny_rows("llama", n=12),
                                data_collator=DefaultCollator(), optimizer_cls_and_kwargs=SGD_MOMENTUM)
        trainer.train()
        runs[side] = ([{k: h[k] for k in ("loss", "grad_norm", "learning_rate")} for h in trainer.state.log_history
                       if "loss" in h], weights(trainer.model))
    (ours, our_weights), (theirs, their_weights) = runs["ours"], runs["theirs"]
    assert [h["learning_rate"] for h in ours] == pytest.approx([0.5, 0.5 * 2 / 3, 0.5 / 3])
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine == pytest.approx(reference, rel=1e-5)
    for name, tensor in their_weights.items():
        torch.testing.assert_close(our_weights[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def _two_rates(base):
    """The subclass recipe: create_optimizer with its own groups (the head at 10x the rate) from
    get_decay_parameter_names and get_optimizer_cls_and_kwargs, written once for either Trainer."""

    class TwoRates(base):
        def create_optimizer(self, model=None):
            if self.optimizer is None:
                decay = set(self.get_decay_parameter_names(self.model))
                named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
                cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, self.model)
                self.optimizer = cls([
                    {"params": [p for n, p in named if n in decay and "lm_head" not in n],
                     "weight_decay": self.args.weight_decay},
                    {"params": [p for n, p in named if n not in decay and "lm_head" not in n], "weight_decay": 0.0},
                    {"params": [p for n, p in named if "lm_head" in n], "lr": kwargs["lr"] * 10}], **kwargs)
            return self.optimizer

    return TwoRates


def test_a_create_optimizer_override_with_transformers_helpers_logs_transformers_numbers(tmp_path):
    runs = {}
    for side, base, args_class, extra in (
            ("ours", Trainer, TrainingArguments, {"num_workers": 0}),
            ("theirs", transformers.Trainer, transformers.TrainingArguments, {"use_cpu": True})):
        args = args_class(output_dir=str(tmp_path / side), max_steps=3, per_device_train_batch_size=4, logging_steps=1,
                          learning_rate=1e-2, weight_decay=0.1, save_strategy="no", report_to="none",
                          disable_tqdm=True, seed=0, **extra)
        trainer = _two_rates(base)(model=tiny_model("llama"), args=args, train_dataset=tiny_rows("llama", n=12),
                                   data_collator=DefaultCollator())
        trainer.train()
        runs[side] = ([{k: h[k] for k in ("loss", "grad_norm")} for h in trainer.state.log_history if "loss" in h],
                      weights(trainer.model))
    (ours, our_weights), (theirs, their_weights) = runs["ours"], runs["theirs"]
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine == pytest.approx(reference, rel=1e-5)
    for name, tensor in their_weights.items():
        torch.testing.assert_close(our_weights[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_get_optimizer_cls_and_kwargs_gives_transformers_built_in_classes_and_refuses_packaged_ones():
    args = TrainingArguments(learning_rate=3e-4, adam_beta2=0.95, optim="adamw_torch")
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    theirs_cls, theirs_kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(
        transformers.TrainingArguments(learning_rate=3e-4, adam_beta2=0.95, optim="adamw_torch", use_cpu=True))
    assert cls is theirs_cls is torch.optim.AdamW and kwargs == theirs_kwargs
    with pytest.raises(ConfigError, match="built from the model's modules"):
        Trainer.get_optimizer_cls_and_kwargs(TrainingArguments(optim="lomo"))
