"""The checks (checks.py): each inconsistent value is a ConfigError naming the field (and, for a refused
transformers field, why and the fix); edge values that work are accepted; every field belongs to one topic."""

import dataclasses

import pytest

from raytrainer.arguments.checks import TOPICS
from raytrainer.arguments.training_args import TrainingArguments
from raytrainer.arguments.transformers_fields import HF_FIELDS, REFUSED, field_default
from raytrainer.errors import ConfigError


@pytest.mark.parametrize("kwargs, field", [
    ({"learning_rate": "fast"}, "learning_rate"),
    ({"learning_rate": -1e-3}, "learning_rate"),
    ({"per_device_train_batch_size": 0}, "per_device_train_batch_size"),
    ({"per_device_eval_batch_size": 0}, "per_device_eval_batch_size"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
    ({"optim": "adamw_apex"}, "optim"),
    ({"lr_scheduler_type": "reduce_lr_on_plateau"}, "lr_scheduler_type"),  # stepped by metrics
    ({"lr_scheduler_type": "cosine_restarts"}, "lr_scheduler_type"),
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


@pytest.mark.parametrize("kwargs, match", [
    ({"include_num_input_tokens_seen": "some"}, "include_num_input_tokens_seen"),
    ({"hub_strategy": "sometimes"}, "hub_strategy"),
    ({"train_sampling_strategy": "batch_rebalance"}, "batch_rebalance.*group_by_length"),
    ({"torch_empty_cache_steps": 0}, "torch_empty_cache_steps"),
    ({"dataloader_prefetch_factor": 2}, "dataloader_prefetch_factor.*dataloader_num_workers > 0"),
    ({"dataloader_persistent_workers": True}, "dataloader_persistent_workers.*dataloader_num_workers > 0"),
    ({"dataloader_multiprocessing_context": "thread"}, "dataloader_multiprocessing_context"),
    ({"use_cpu": True, "use_gpu": True}, "use_cpu"),
    ({"group_by_length": True, "train_sampling_strategy": "sequential"}, "group_by_length"),
    ({"tf32": True, "use_gpu": False}, "tf32"),
    ({"tf32": True, "num_workers": 0}, "tf32"),
    ({"ddp_backend": "nccl", "use_gpu": False}, "ddp_backend='nccl'.*'gloo'"),
    ({"ddp_backend": "gloo", "num_workers": 2}, "ddp_backend.*set use_gpu"),
    ({"activation_checkpointing": True, "activation_checkpointing_kwargs": {"every_n_layers": 2}}, "every_n_layers"),
    ({"resources_per_worker": "{not json"}, "resources_per_worker"),
    ({"include_for_metrics": ["input"]}, r"include_for_metrics=\['input'\]: a list of 'inputs' and 'loss'"),
    ({"include_for_metrics": "loss"}, r"include_for_metrics='loss': a list of 'inputs' and 'loss'"),
])
def test_new_fields_refuse_what_cannot_work(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        TrainingArguments(**kwargs)


def test_backend_that_ray_train_sets_up_is_accepted():
    assert TrainingArguments(ddp_backend="gloo", use_gpu=False, num_workers=2).ddp_backend == "gloo"
    assert TrainingArguments(ddp_backend="nccl", use_gpu=True, num_workers=2).ddp_backend == "nccl"


def _other_value(name: str):
    """A value transformers accepts for a refused field that is not its default."""
    default = field_default(TrainingArguments, name)
    special = {"debug": "underflow_overflow", "accelerator_config":
               {"split_batches": True}, "deepspeed": {"zero_optimization": {"stage": 2}}, "parallelism_config": "x",
               "trackio_static_space_id": False}
    if name in special:
        return special[name]
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 7
    return "other"


@pytest.mark.parametrize("name", [n for n, (status, _) in HF_FIELDS.items() if status == REFUSED])
def test_refused_fields_name_the_field_why_and_the_fix(name):
    TrainingArguments(**{name: field_default(TrainingArguments, name)})  # the default is accepted
    with pytest.raises(ConfigError, match=rf"^{name}=.* is not supported .*: {HF_FIELDS[name][1][:20]}"):
        TrainingArguments(**{name: _other_value(name)})


def test_push_to_hub_is_accepted_not_a_type_error():
    args = TrainingArguments(output_dir="out", push_to_hub=True, hub_model_id="me/model")
    assert args.push_to_hub and args.hub_model_id == "me/model"


def test_every_field_belongs_to_exactly_one_topic():
    """TOPICS decides where a field's check lives: a new field must be placed in one topic."""
    owned = [name for _, names in TOPICS for name in names]
    repeated = sorted({name for name in owned if owned.count(name) > 1})
    assert not repeated, f"fields in two topics of raytrainer/arguments/checks.py: {repeated}"
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert not set(owned) - fields, f"TOPICS names what is not a field: {sorted(set(owned) - fields)}"
    assert not fields - set(owned), ("fields no topic of raytrainer/arguments/checks.py owns (add each to the topic "
                                     f"its check belongs to): {sorted(fields - set(owned))}")
