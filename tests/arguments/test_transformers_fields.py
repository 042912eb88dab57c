"""transformers' scripts and our TrainingArguments: HfArgumentParser builds and parses it, our ArgumentParser
takes HfArgumentParser's keyword arguments, and the properties the example scripts read answer for the
driver. No Ray: everything here is argument handling."""

import dataclasses
import logging
import sys
from typing import Optional

import pytest

from raytrainer import ArgumentParser, ConfigError, TrainingArguments

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


@pytest.mark.parametrize("workers, world_size, mode", [(0, 1, "not_parallel"), (1, 1, "not_parallel"),
                                                        (2, 2, "distributed"), ((1, 4), 4, "distributed")])
def test_process_properties_answer_for_the_driver(workers, world_size, mode):
    args = TrainingArguments(num_workers=workers, gradient_accumulation_steps=12, use_gpu=False)
    assert (args.process_index, args.local_process_index, args.world_size) == (0, 0, world_size)
    assert args.should_log and args.should_save
    assert args.parallel_mode.value == mode
    assert args.parallel_mode is getattr(transformers.training_args.ParallelMode, mode.upper())
    assert str(args.device) == "cpu" and args.n_gpu == 0
    with args.main_process_first(desc="dataset map"):  # a no-op context manager on the driver
        pass
    assert args.local_rank == -1 and args.train_batch_size == args.per_device_train_batch_size


def test_device_describes_the_workers():
    gpu = TrainingArguments(num_workers=2, use_gpu=True)
    assert gpu.device.type == "cuda" and gpu.n_gpu == 1  # no GPU is needed on the driver to say so
    assert TrainingArguments(num_workers=2, use_cpu=True).device.type == "cpu"


def test_process_log_level_follows_transformers():
    assert TrainingArguments(log_level="info").get_process_log_level() == logging.INFO
    assert TrainingArguments().get_process_log_level() == transformers.utils.logging.get_verbosity()  # passive


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


def test_hub_token_is_redacted():
    args = TrainingArguments(hub_token="hf_secret_value", hub_model_id="me/model", hub_strategy="end")
    assert "hf_secret_value" not in repr(args) and "hf_secret_value" not in args.to_json_string()
    assert args.hub_token == "hf_secret_value"


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
])
def test_new_fields_refuse_what_cannot_work(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        TrainingArguments(**kwargs)


def test_backend_that_ray_train_sets_up_is_accepted():
    assert TrainingArguments(ddp_backend="gloo", use_gpu=False, num_workers=2).ddp_backend == "gloo"
    assert TrainingArguments(ddp_backend="nccl", use_gpu=True, num_workers=2).ddp_backend == "nccl"


def test_fsdp_config_in_accelerates_spelling():
    with pytest.warns(UserWarning, match="fsdp_use_orig_params.*FSDP1"):
        args = TrainingArguments(fsdp=True, fsdp_config={
            "fsdp_transformer_layer_cls_to_wrap": "GPT2Block,GPT2MLP", "fsdp_sharding_strategy": "SHARD_GRAD_OP",
            "fsdp_offload_params": "true", "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_version": 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_use_orig_params": True,
            "fsdp_cpu_ram_efficient_loading": False, "fsdp_activation_checkpointing": "false"})
    assert args.strategy == "fsdp"
    assert args.fsdp_config == {"transformer_layer_cls_to_wrap": ["GPT2Block", "GPT2MLP"],
                                "reshard_after_forward": False, "cpu_offload": True, "activation_checkpointing": False}
    for config, match in (({"fsdp_sharding_strategy": "HYBRID_SHARD"}, "strategy='ddp'"),
                          ({"fsdp_auto_wrap_policy": "SIZE_BASED_WRAP"}, "auto_wrap_policy"),
                          ({"fsdp_cpu_ram_efficient_loading": True}, "object store"),
                          ({"fsdp_bogus": 1}, "unknown key 'fsdp_bogus'")):
        with pytest.raises(ConfigError, match=match):
            TrainingArguments(fsdp=True, fsdp_config=config)
