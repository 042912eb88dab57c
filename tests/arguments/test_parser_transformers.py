"""transformers' scripts and our TrainingArguments: HfArgumentParser builds and parses it, and our
ArgumentParser takes HfArgumentParser's keyword arguments. No Ray: everything here is argument handling."""

import dataclasses
import sys
from typing import Optional

import pytest

from raytrainer import ArgumentParser, TrainingArguments

transformers = pytest.importorskip("transformers")


@dataclasses.dataclass
class ModelArgs:  # the shape of transformers' example scripts' own dataclasses
    model_name_or_path: Optional[str] = dataclasses.field(default=None, metadata={"help": "a model"})


@dataclasses.dataclass
class DataArgs:
    dataset_name: Optional[str] = None
    max_train_samples: Optional[int] = None


SCRIPT_ARGV = ["--do_train", "--do_eval", "--output_dir", "x", "--num_workers", "2",
               "--per_device_train_batch_size", "4", "--label_names", "labels"]


def hf_parser():
    return transformers.HfArgumentParser([ModelArgs, DataArgs, TrainingArguments])


def test_transformers_parser_builds_from_every_field_and_parses_a_script_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    parser = hf_parser()  # builds an option for every field, or raises
    options = {a.dest for a in parser._actions}
    assert {f.name for f in dataclasses.fields(TrainingArguments)} <= options
    assert "--num_workers" in parser.format_help()  # every help text formats (argparse %-formats them)
    model, data, args = parser.parse_args_into_dataclasses(SCRIPT_ARGV + ["--model_name_or_path", "gpt2"])
    assert model.model_name_or_path == "gpt2" and data.dataset_name is None
    assert (args.do_train, args.do_eval, args.do_predict) == (True, True, False)
    assert args.num_workers == 2 and args.per_device_train_batch_size == 4 and args.label_names == ["labels"]
    assert args.output_dir == str(tmp_path / "x")


def test_transformers_parser_reads_unions_dicts_and_elastic_ranges():
    *_, args = hf_parser().parse_args_into_dataclasses([
        "--num_workers", "1,4", "--gradient_accumulation_steps", "12", "--fsdp", "--resources_per_worker",
        '{"CPU": 1}', "--lr_scheduler_kwargs", '{"power": 2.0}', "--report_to", "none", "--gradient_checkpointing",
        "--include_num_input_tokens_seen", "--optim_target_modules", "attn", "--train_sampling_strategy",
        "group_by_length", "--no_dataloader_pin_memory"])
    assert args.num_workers == (1, 4) and args.strategy == "fsdp"
    assert args.resources_per_worker == {"CPU": 1} and args.lr_scheduler_kwargs == {"power": 2.0}
    assert args.gradient_checkpointing is args.activation_checkpointing is True
    assert args.include_num_input_tokens_seen == "all" and args.optim_target_modules == "attn"
    assert args.train_sampling_strategy == "group_by_length" and args.dataloader_pin_memory is False


def test_our_parser_takes_the_transformers_keywords(tmp_path, monkeypatch):
    parser = ArgumentParser([ModelArgs, DataArgs, TrainingArguments])
    (tmp_path / "run.args").write_text("--learning_rate 0.1 --seed 3")
    (tmp_path / "more.args").write_text("--seed 4")
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "run.py")])
    *_, args = parser.parse_args_into_dataclasses(["--seed", "5"])  # run.args next to the script, then the CLI
    assert (args.learning_rate, args.seed) == (0.1, 5)
    *_, args = parser.parse_args_into_dataclasses([], look_for_args_file=False)
    assert args.learning_rate == TrainingArguments().learning_rate
    *_, args = parser.parse_args_into_dataclasses([], args_filename=str(tmp_path / "more.args"))
    assert (args.learning_rate, args.seed) == (TrainingArguments().learning_rate, 4)
    *_, args = parser.parse_args_into_dataclasses(["--args_file", str(tmp_path / "more.args")],
                                                  look_for_args_file=False, args_file_flag="--args_file")
    assert args.seed == 4
    *_, args, rest = parser.parse_args_into_dataclasses(SCRIPT_ARGV + ["--unknown", "1"],
                                                        return_remaining_strings=True)
    assert args.do_train and rest == ["--unknown", "1"]
    *_, args = parser.parse_args_into_dataclasses(["--include_num_input_tokens_seen", "non_padding"])
    assert args.include_num_input_tokens_seen == "non_padding"
    *_, args = parser.parse_args_into_dataclasses(["--report_to", "none", "--optim_target_modules", "attn.*"])
    assert args.report_to == [] and args.optim_target_modules == "attn.*"  # one value: the str, as transformers
    *_, args = parser.parse_args_into_dataclasses(["--optim_target_modules", "q_proj", "v_proj"])
    assert args.optim_target_modules == ["q_proj", "v_proj"]  # several: the list (transformers' parser: an error)


def test_our_parser_dict_json_and_yaml_files(tmp_path):
    parser = ArgumentParser([ModelArgs, TrainingArguments])
    model, args = parser.parse_dict({"model_name_or_path": "m", "num_workers": "1,2", "do_predict": True})
    assert model.model_name_or_path == "m" and args.num_workers == (1, 2) and args.do_predict
    (tmp_path / "a.json").write_text('{"seed": 9}')
    (tmp_path / "a.yaml").write_text("seed: 8\ninclude_num_input_tokens_seen: non_padding\n")
    assert parser.parse_json_file(str(tmp_path / "a.json"))[1].seed == 9
    assert parser.parse_yaml_file(str(tmp_path / "a.yaml"))[1].include_num_input_tokens_seen == "non_padding"

