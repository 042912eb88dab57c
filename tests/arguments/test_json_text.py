"""The one parser of JSON-object text (json_text.py), as the dict fields, fsdp_config and the argument parser
use it: blank text is unset, anything but a JSON object is an error in one shape."""

import pytest

from raytrainer.arguments.json_text import parse_json_object
from raytrainer.arguments.parser import ArgumentParser
from raytrainer.arguments.training_args import TrainingArguments
from raytrainer.errors import ConfigError


def test_an_object_a_blank_and_what_is_refused():
    assert parse_json_object('{"a": [1, 2]}', "x") == {"a": [1, 2]}
    assert parse_json_object("  ", "x") is None
    with pytest.raises(ConfigError, match=r"^x='\{a' is not valid JSON \(.*\); write a JSON object such as"):
        parse_json_object("{a", "x")
    with pytest.raises(ConfigError, match=r"^x='\[1\]' must be a JSON object \(a dict\)\.$"):
        parse_json_object("[1]", "x")
    with pytest.raises(ConfigError, match=r"^not valid JSON .*; write a dict\.$"):
        parse_json_object("{a", example="a dict")


@pytest.mark.parametrize("field, example", [
    ("lr_scheduler_kwargs", '{"num_cycles": 1.0}'),
    ("gradient_checkpointing_kwargs", '{"key": 1}'),
    ("storage_options", '{"key": 1}'),
    ("fsdp_config", '{"transformer_layer_cls_to_wrap": ["GPT2Block"]}'),
])
def test_each_field_names_itself_and_an_example(field, example):
    extra = {"strategy": "fsdp"} if field == "fsdp_config" else {}
    with pytest.raises(ConfigError) as error:
        TrainingArguments(**{field: "{nope"}, **extra)
    assert str(error.value).startswith(f"{field}='{{nope' is not valid JSON (")
    assert f"write a JSON object such as '{example}'" in str(error.value)


def test_fsdp_config_from_a_json_file(tmp_path):
    path = tmp_path / "fsdp.json"
    path.write_text('{"transformer_layer_cls_to_wrap": ["Block"]}')
    assert TrainingArguments(fsdp=True, fsdp_config=str(path)).fsdp_config["transformer_layer_cls_to_wrap"] == ["Block"]
    path.write_text("[1]")
    with pytest.raises(ConfigError, match=r"fsdp_config=.*fsdp\.json' \(a file\) must be a JSON object"):
        TrainingArguments(fsdp=True, fsdp_config=str(path))


def test_the_argument_parser_reports_a_usage_error_or_names_the_key(capsys):
    parser = ArgumentParser(TrainingArguments)
    with pytest.raises(SystemExit):
        parser.parse_args_into_dataclasses(["--storage_options", "{nope"])
    assert "argument --storage_options/--storage-options: not valid JSON (" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"^storage_options='\[1\]': must be a JSON object \(a dict\)\.$"):
        parser.parse_dict({"storage_options": "[1]"})
