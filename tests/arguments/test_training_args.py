import dataclasses
import enum
import json
import pickle

import pytest

from raytrainer.arguments.training_args import RAY_FIELDS, TrainingArguments
from raytrainer.errors import ConfigError


def _plain(value):
    return value.value if isinstance(value, enum.Enum) else value  # HF stores strategies as str enums


# Defaults that differ from HF's on purpose (docs/arguments.md says why).
DELIBERATE_DEFAULTS = {"log_level_replica": "error",  # N workers would repeat rank 0's warnings N times
                       "disable_tqdm": False}  # transformers' None resolves to False too (at WARNING)


def test_defaults_match_transformers():
    transformers = pytest.importorskip("transformers")
    from raytrainer.arguments.transformers_fields import field_default

    hf_cls = transformers.TrainingArguments
    hf_names = {f.name for f in dataclasses.fields(hf_cls)}
    ours = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert hf_names <= ours  # every transformers field is accepted (tests/arguments/test_transformers_fields.py: how)
    for name in sorted(hf_names):
        expected = DELIBERATE_DEFAULTS.get(name, field_default(hf_cls, name))
        assert field_default(TrainingArguments, name) == expected, name
        assert type(field_default(TrainingArguments, name)) is type(expected), name
    # Instances too, where transformers keeps plain values after __post_init__.
    hf, mine = hf_cls(output_dir="x"), TrainingArguments()
    for name in ("learning_rate", "warmup_steps", "logging_steps", "save_steps", "optim", "seed", "fsdp_config",
                 "gradient_checkpointing", "activation_checkpointing", "include_num_input_tokens_seen"):
        assert _plain(getattr(hf, name)) == getattr(mine, name), name
    # Every field that is not HF's is declared as ours.
    assert ours - hf_names == set(RAY_FIELDS)


def test_output_dir_default_and_str():
    import os
    assert TrainingArguments().output_dir == os.path.abspath("trainer_output")  # HF's default, made absolute
    import pathlib
    assert TrainingArguments(output_dir=pathlib.Path("/tmp/run")).output_dir == "/tmp/run"


@pytest.mark.parametrize("kwargs, field", [
    ({"learning_rate": 0}, "learning_rate"),
    ({"learning_rate": -1e-3}, "learning_rate"),
    ({"per_device_train_batch_size": 0}, "per_device_train_batch_size"),
    ({"per_device_eval_batch_size": 0}, "per_device_eval_batch_size"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
    ({"optim": "adamw_apex"}, "optim"),
    ({"lr_scheduler_type": "cosine_with_restarts"}, "lr_scheduler_type"),
    ({"warmup_steps": 1.5}, "warmup_steps"),
    ({"warmup_steps": -1}, "warmup_steps"),
    ({"eval_strategy": "steps", "eval_steps": 0}, "eval_steps"),
    ({"save_strategy": "best"}, "metric_for_best_model"),
    ({"load_best_model_at_end": True, "eval_strategy": "epoch", "save_strategy": "steps"}, "load_best_model_at_end"),
    ({"load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 10, "save_steps": 15},
     "load_best_model_at_end"),
    ({"num_workers": -1}, "num_workers"),
    ({"max_failures": -2}, "max_failures"),
    ({"lr_scheduler_kwargs": "{not json"}, "lr_scheduler_kwargs"),
    ({"resources_per_worker": {"GPU": 1}, "use_gpu": False}, "use_gpu"),
])
def test_inconsistent_values_raise_naming_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        TrainingArguments(**kwargs)


def test_accepted_edge_values():
    assert TrainingArguments(warmup_steps=0.1).get_warmup_steps(20) == 2
    assert TrainingArguments(warmup_steps=5).get_warmup_steps(20) == 5
    assert TrainingArguments(max_failures=-1, num_workers=0).max_failures == -1
    # Ratios compare exactly even where float modulo does not (0.2 % 0.1 != 0).
    TrainingArguments(load_best_model_at_end=True, eval_strategy="steps", eval_steps=0.1, save_steps=0.2)
    TrainingArguments(save_strategy="best", metric_for_best_model="accuracy")


def test_transformers_enums_are_accepted_as_their_strings():
    """transformers takes its choices as enums or as their strings; here both become the string."""
    pytest.importorskip("transformers")
    from transformers.trainer_utils import HubStrategy, IntervalStrategy, SaveStrategy, SchedulerType
    from transformers.training_args import OptimizerNames

    args = TrainingArguments(eval_strategy=IntervalStrategy.STEPS, save_strategy=SaveStrategy.EPOCH,
                             logging_strategy=IntervalStrategy.EPOCH, lr_scheduler_type=SchedulerType.COSINE,
                             optim=OptimizerNames.SGD, hub_strategy=HubStrategy.CHECKPOINT)
    values = {name: getattr(args, name) for name in ("eval_strategy", "save_strategy", "logging_strategy",
                                                       "lr_scheduler_type", "optim", "hub_strategy")}
    assert values == {"eval_strategy": "steps", "save_strategy": "epoch", "logging_strategy": "epoch",
                      "lr_scheduler_type": "cosine", "optim": "sgd", "hub_strategy": "checkpoint"}
    assert all(type(value) is str for value in values.values())
    with pytest.raises(ConfigError, match="optim='adamw_bnb_8bit' is not supported"):
        TrainingArguments(optim=OptimizerNames.ADAMW_BNB)


def test_derived_values_follow_hf():
    args = TrainingArguments(eval_strategy="steps", logging_steps=50)
    assert args.eval_steps == 50  # defaults to logging_steps
    assert TrainingArguments(metric_for_best_model="accuracy").greater_is_better is True
    best = TrainingArguments(load_best_model_at_end=True, eval_strategy="steps")
    assert (best.metric_for_best_model, best.greater_is_better) == ("loss", False)
    assert TrainingArguments(lr_scheduler_kwargs='{"num_cycles": 1}').lr_scheduler_kwargs == {"num_cycles": 1}
    assert TrainingArguments(label_names="y").label_names == ["y"]


def test_storage_secrets_never_in_repr_or_dict():
    args = TrainingArguments(output_dir="s3://bucket/run",
                             storage_options={"key": "AKIAEXAMPLE", "secret": "hunter2-secret",
                                              "client_kwargs": {"endpoint_url": "http://127.0.0.1:1"}})
    for text in (repr(args), str(args), json.dumps(args.to_dict()), args.to_json_string()):
        assert "hunter2-secret" not in text and "AKIAEXAMPLE" not in text
        assert "s3://bucket/run" in text
    assert args.storage_options["secret"] == "hunter2-secret"  # still usable by the workers
    assert pickle.loads(pickle.dumps(args)).storage_options == args.storage_options


def test_local_output_dir_is_made_absolute_where_the_user_runs_and_urls_are_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = TrainingArguments(output_dir="runs/a", resume_from_checkpoint="runs/a/checkpoint-5")
    assert args.output_dir == str(tmp_path / "runs" / "a")
    assert args.resume_from_checkpoint == str(tmp_path / "runs" / "a" / "checkpoint-5")
    assert TrainingArguments(output_dir="s3://bucket/run").output_dir == "s3://bucket/run"
