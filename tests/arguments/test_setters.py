"""transformers' fluent setters on TrainingArguments (raytrainer/arguments/setters.py): every one sets the fields
transformers' sets, to the same values, defaults and given values alike; a refused value raises and leaves the
fields as they were."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from raytrainer import TrainingArguments
from raytrainer.errors import ConfigError

transformers = pytest.importorskip("transformers")

CALLS = [
    ("set_training", {}), ("set_training", {"learning_rate": 1e-4, "batch_size": 4, "num_epochs": 2,
                                            "gradient_accumulation_steps": 2, "activation_checkpointing": True}),
    ("set_evaluate", {}), ("set_evaluate", {"strategy": "steps", "steps": 100, "batch_size": 16, "loss_only": True}),
    ("set_testing", {"batch_size": 4}),
    ("set_save", {}), ("set_save", {"strategy": "epoch", "total_limit": 2}),
    ("set_logging", {}), ("set_logging", {"strategy": "steps", "steps": 10, "first_step": True}),
    ("set_optimizer", {}), ("set_optimizer", {"name": "sgd", "learning_rate": 0.1, "args": "momentum=0.9"}),
    ("set_lr_scheduler", {"name": "cosine_with_min_lr", "max_steps": 100, "warmup_steps": 0.1}),
    ("set_dataloader", {"train_batch_size": 16, "eval_batch_size": 4, "drop_last": True, "num_workers": 2,
                        "persistent_workers": True, "prefetch_factor": 2, "sampler_seed": 7}),
    ("set_push_to_hub", {"model_id": "me/model", "strategy": "end", "private_repo": True}),
]


# Where the same setting is spelled differently: report_to "none" is stored as [] here; set_evaluate's default
# delay None (transformers stores it, then compares it with steps) is its field's default, 0.
SAME = {("report_to", "none"): "[]", ("eval_delay", "None"): "0"}


def _values(args, names) -> dict:
    values = {name: str(getattr(getattr(args, name), "value", getattr(args, name))) for name in names}
    return {name: SAME.get((name, value), value) for name, value in values.items()}


@pytest.mark.parametrize("method, kwargs", CALLS)
def test_each_setter_sets_transformers_fields_to_transformers_values(method, kwargs, tmp_path):
    theirs = transformers.TrainingArguments(str(tmp_path), use_cpu=True)
    before = {f.name: getattr(theirs, f.name) for f in dataclasses.fields(theirs)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert getattr(theirs, method)(**kwargs) is theirs
    changed = {name for name, value in before.items() if getattr(theirs, name) != value}
    ours = TrainingArguments(output_dir=str(tmp_path), num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert getattr(ours, method)(**kwargs) is ours
    assert _values(ours, changed) == _values(theirs, changed)


def test_a_refused_value_raises_and_leaves_the_fields_as_they_were(tmp_path):
    ours = TrainingArguments(output_dir=str(tmp_path), num_workers=0, learning_rate=3e-4)
    optim = ours.optim
    with pytest.raises(ConfigError, match="optim"):
        ours.set_optimizer(name="adamw_not_an_optimizer", learning_rate=1.0)
    assert (ours.optim, ours.learning_rate) == (optim, 3e-4)
    with pytest.raises(ConfigError, match="positive number of steps"):
        ours.set_evaluate(strategy="steps", steps=0)
    assert ours.set_training(learning_rate=1e-3).set_evaluate("epoch").learning_rate == 1e-3  # they chain
