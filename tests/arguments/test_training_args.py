"""The dataclass itself: every transformers field is declared with transformers' default, ours are the rest
(declared with `_ours`), and to_dict/repr never show a secret."""

import dataclasses
import enum
import json
import pickle

import pytest

from raytrainer.arguments.training_args import OURS_FIELDS, TrainingArguments


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
    assert ours - hf_names == set(OURS_FIELDS)


def test_storage_secrets_never_in_repr_or_dict():
    args = TrainingArguments(output_dir="s3://bucket/run",
                             storage_options={"key": "AKIAEXAMPLE", "secret": "hunter2-secret",
                                              "client_kwargs": {"endpoint_url": "http://127.0.0.1:1"}})
    for text in (repr(args), str(args), json.dumps(args.to_dict()), args.to_json_string()):
        assert "hunter2-secret" not in text and "AKIAEXAMPLE" not in text
        assert "s3://bucket/run" in text
    assert args.storage_options["secret"] == "hunter2-secret"  # still usable by the workers
    assert pickle.loads(pickle.dumps(args)).storage_options == args.storage_options


def test_hub_token_is_redacted():
    args = TrainingArguments(hub_token="hf_secret_value", hub_model_id="me/model", hub_strategy="end")
    assert "hf_secret_value" not in repr(args) and "hf_secret_value" not in args.to_json_string()
    assert args.hub_token == "hf_secret_value"

