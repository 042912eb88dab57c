import json
from dataclasses import dataclass, field
from typing import Optional

import pytest

from raytrainer.arguments.parser import ArgumentParser
from raytrainer.arguments.training_args import TrainingArguments
from raytrainer.errors import ConfigError


@dataclass
class ModelArgs:
    model_name: str = field(metadata={"help": "Which model to build."})
    hidden_size: int = 64
    dropout: Optional[float] = None
    tags: Optional[list] = None


def parse(*argv):
    (args,) = ArgumentParser(TrainingArguments).parse_args_into_dataclasses(list(argv))
    return args


def test_cli_values_have_field_types():
    args = parse("--learning_rate", "3e-4", "--num_workers", "4", "--output_dir", "s3://b/run")
    assert args.learning_rate == 3e-4 and isinstance(args.learning_rate, float)
    assert args.num_workers == 4 and isinstance(args.num_workers, int)
    assert args.output_dir == "s3://b/run"
    assert parse().learning_rate == TrainingArguments().learning_rate  # defaults come from the dataclass


@pytest.mark.parametrize("field_name", ["warmup_steps", "logging_steps", "save_steps"])
def test_step_counts_keep_int_literals(field_name):
    as_int = getattr(parse(f"--{field_name}", "10"), field_name)
    assert as_int == 10 and isinstance(as_int, int)
    assert getattr(parse(f"--{field_name}", "0.1"), field_name) == 0.1
    assert isinstance(parse("--num_train_epochs", "2").num_train_epochs, float)  # not a step count


@pytest.mark.parametrize("argv, expected", [
    (["--logging_first_step"], True),
    (["--logging_first_step", "true"], True),
    (["--logging_first_step", "yes"], True),
    (["--logging_first_step", "1"], True),
    (["--logging_first_step", "no"], False),
    (["--logging_first_step", "0"], False),
    ([], False),
])
def test_bool_flags(argv, expected):
    assert parse(*argv).logging_first_step is expected


def test_no_flag_for_true_defaults_and_optional_bool():
    assert parse("--no_remove_unused_columns").remove_unused_columns is False
    assert parse("--remove_unused_columns", "false").remove_unused_columns is False
    assert parse().remove_unused_columns is True
    assert parse().use_gpu is None and parse("--use_gpu").use_gpu is True


def test_bad_bool_is_a_usage_error():
    with pytest.raises(SystemExit):
        parse("--logging_first_step", "maybe")


def test_dict_and_list_options():
    args = parse("--lr_scheduler_type", "polynomial", "--lr_scheduler_kwargs", '{"power": 2.0}',
                 "--resources_per_worker", '{"CPU": 2}', "--label_names", "start", "end")
    assert args.lr_scheduler_kwargs == {"power": 2.0}
    assert args.resources_per_worker == {"CPU": 2}
    assert args.label_names == ["start", "end"]


def test_yaml_file(tmp_path):
    path = tmp_path / "run.yaml"
    # `3e-4` without a dot is a string to PyYAML; the parser converts it as the CLI would.
    path.write_text("learning_rate: 3e-4\nnum_workers: 2\nlr_scheduler_kwargs: {num_cycles: 1.0}\n"
                    "remove_unused_columns: false\n")
    (args,) = ArgumentParser(TrainingArguments).parse_yaml_file(str(path))
    assert (args.learning_rate, args.num_workers) == (3e-4, 2)
    assert args.lr_scheduler_kwargs == {"num_cycles": 1.0}
    assert args.remove_unused_columns is False


def test_json_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"learning_rate": 1e-3, "warmup_steps": 0.1, "label_names": ["y"]}))
    (args,) = ArgumentParser(TrainingArguments).parse_json_file(str(path))
    assert (args.learning_rate, args.warmup_steps, args.label_names) == (1e-3, 0.1, ["y"])


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_config_file_then_cli_overrides(tmp_path, suffix):
    path = tmp_path / f"run{suffix}"
    path.write_text(json.dumps({"learning_rate": 1e-3, "num_workers": 2, "seed": 7}))  # JSON is valid YAML
    args = parse(str(path), "--learning_rate", "3e-4", "--no_remove_unused_columns")
    assert (args.learning_rate, args.num_workers, args.seed) == (3e-4, 2, 7)
    assert args.remove_unused_columns is False


def test_unknown_keys_are_named(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("learning_rate: 1.0e-3\nlearning_rat: 3.0e-4\n")
    parser = ArgumentParser(TrainingArguments)
    with pytest.raises(ConfigError, match="learning_rat"):
        parser.parse_yaml_file(str(path))
    with pytest.raises(ConfigError, match="learning_rat"):
        parser.parse_args_into_dataclasses([str(path)])
    with pytest.raises(ConfigError, match="num_gpus"):
        parser.parse_dict({"num_gpus": 2})
    assert parser.parse_dict({"num_gpus": 2}, allow_extra_keys=True)[0].num_workers == 1
    with pytest.raises(ConfigError, match="--num_gpus"):
        parser.parse_args_into_dataclasses(["--num_gpus", "2"])


def test_remaining_strings():
    args, remaining = ArgumentParser(TrainingArguments).parse_args_into_dataclasses(
        ["--seed", "3", "--extra", "x"], return_remaining_strings=True)
    assert args.seed == 3 and remaining == ["--extra", "x"]


def test_validation_errors_propagate_unchanged(tmp_path):
    parser = ArgumentParser(TrainingArguments)
    with pytest.raises(ConfigError, match="learning_rate"):
        parser.parse_args_into_dataclasses(["--learning_rate", "-1"])
    with pytest.raises(ConfigError, match="max_failures"):
        parser.parse_dict({"max_failures": -2})
    path = tmp_path / "bad.yaml"
    path.write_text("optim: adamw_apex\n")
    with pytest.raises(ConfigError, match="optim"):
        parser.parse_args_into_dataclasses([str(path)])


def test_two_dataclasses(tmp_path):
    parser = ArgumentParser([ModelArgs, TrainingArguments])
    model, train = parser.parse_args_into_dataclasses(
        ["--model_name", "tiny", "--dropout", "0.1", "--tags", "a", "b", "--learning_rate", "2e-5"])
    assert (model.model_name, model.hidden_size, model.dropout, model.tags) == ("tiny", 64, 0.1, ["a", "b"])
    assert train.learning_rate == 2e-5
    path = tmp_path / "both.yaml"
    path.write_text("model_name: small\nhidden_size: 32\nnum_workers: 3\n")
    model, train = parser.parse_args_into_dataclasses([str(path), "--hidden_size", "16"])
    assert (model.model_name, model.hidden_size, train.num_workers) == ("small", 16, 3)
    with pytest.raises(ConfigError, match="--model_name"):  # required field missing
        parser.parse_args_into_dataclasses([])
    assert "Which model to build." in parser.format_help()


def test_a_learning_rate_of_zero_is_accepted_as_in_transformers():
    """Evaluation-only and debugging runs train with learning_rate=0.0; a negative rate is refused."""
    assert TrainingArguments(learning_rate=0.0).learning_rate == 0.0
    with pytest.raises(ConfigError, match=r"learning_rate=-0.1 must be a number >= 0"):
        TrainingArguments(learning_rate=-0.1)
