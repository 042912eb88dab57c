"""Normalisation (normalise.py): transformers' enums, aliases and older spellings become one form, local paths
are made absolute where the user runs, and the defaults transformers derives are derived."""

import pytest

from raytrainer.arguments.training_args import TrainingArguments
from raytrainer.errors import ConfigError


def test_output_dir_default_and_str():
    import os
    assert TrainingArguments().output_dir == os.path.abspath("trainer_output")  # HF's default, made absolute
    import pathlib
    assert TrainingArguments(output_dir=pathlib.Path("/tmp/run")).output_dir == "/tmp/run"


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


def test_script_flags_and_aliases_follow_transformers():
    assert TrainingArguments(eval_strategy="epoch").do_eval is True
    assert TrainingArguments(include_num_input_tokens_seen=True).include_num_input_tokens_seen == "all"
    assert TrainingArguments(include_num_input_tokens_seen=False).include_num_input_tokens_seen == "no"
    args = TrainingArguments(activation_checkpointing=True, activation_checkpointing_kwargs='{"use_reentrant": true}')
    assert args.gradient_checkpointing is True and args.gradient_checkpointing_kwargs == {"use_reentrant": True}
    assert TrainingArguments(gradient_checkpointing=True).activation_checkpointing is True
    assert TrainingArguments(use_cpu=True).use_gpu is False
    assert TrainingArguments(group_by_length=True).train_sampling_strategy == "group_by_length"
    assert TrainingArguments(accelerator_config={"split_batches": False}).accelerator_config is None
    assert TrainingArguments(debug=[]).debug == ""


def test_local_output_dir_is_made_absolute_where_the_user_runs_and_urls_are_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = TrainingArguments(output_dir="runs/a", resume_from_checkpoint="runs/a/checkpoint-5")
    assert args.output_dir == str(tmp_path / "runs" / "a")
    assert args.resume_from_checkpoint == str(tmp_path / "runs" / "a" / "checkpoint-5")
    assert TrainingArguments(output_dir="s3://bucket/run").output_dir == "s3://bucket/run"



@pytest.mark.parametrize("field", ["storage_options", "resources_per_worker", "lr_scheduler_kwargs"])
def test_a_dict_field_given_neither_a_dict_nor_json_text_is_refused_naming_both(field):
    with pytest.raises(ConfigError, match=rf"{field} must be a dict or a JSON object .*got int 1"):
        TrainingArguments(output_dir="out", **{field: 1})
    assert getattr(TrainingArguments(output_dir="out", **{field: '{"a": 1}'}), field) == {"a": 1}
