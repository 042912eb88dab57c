"""Elastic num_workers: the spellings the command line and YAML accept, and the bad ranges refused on the
driver before any actor starts (principle 4)."""

import pytest

from raytrainer import ConfigError, Trainer, TrainingArguments
from raytrainer.arguments.parser import ArgumentParser
from tests.models import TokenData, make_model
from tests.support import SESSION_CPUS


@pytest.mark.parametrize("value, message", [
    ((3, 2), r"min \(3\) is larger than max \(2\)"),
    ((0, 2), "minimum of an elastic range must be >= 1"),
    ((1.0, 2), "two integers"),
    ([1, 2, 3], "two integers"),
    ("two", "must be an int >= 0 or a"),
    ((2, 3), r"cannot be kept at 2 worker\(s\).*gradient_accumulation_steps to a multiple of 2"),
])
def test_bad_ranges_are_refused(value, message):
    with pytest.raises(ConfigError, match=message):
        TrainingArguments(output_dir="/tmp/x", num_workers=value)


def test_ranges_from_the_command_line_and_yaml(tmp_path):
    parser = ArgumentParser(TrainingArguments)
    (args,) = parser.parse_args_into_dataclasses(["--num_workers", "1,4", "--gradient_accumulation_steps", "3"])
    assert args.num_workers == (1, 4) and args.elastic and (args.min_workers, args.max_workers) == (1, 4)
    config = tmp_path / "c.yaml"
    config.write_text("num_workers: [1, 2]\n")
    (args,) = parser.parse_args_into_dataclasses([str(config)])
    assert args.num_workers == (1, 2)
    (args,) = parser.parse_args_into_dataclasses(["--num_workers", "2"])
    assert args.num_workers == 2 and not args.elastic
    assert TrainingArguments(num_workers=[2, 2]).max_workers == 2  # a list becomes a tuple; min == max is fixed
    with pytest.raises(SystemExit):  # argparse's usage error, as for any unconvertible option
        parser.parse_args_into_dataclasses(["--num_workers", "1,x"])


@pytest.mark.usefixtures("ray_session")
def test_a_minimum_the_cluster_cannot_place_is_refused_before_any_actor(tmp_path):
    # The test session's Ray has 6 CPUs: 7 one-CPU workers can never be placed; the maximum may exceed it.
    assert SESSION_CPUS == 6
    trainer = Trainer(model=make_model(), args=TrainingArguments(output_dir=str(tmp_path), num_workers=(7, 8),
                                                                 gradient_accumulation_steps=56),
                      train_dataset=TokenData(8))
    with pytest.raises(ConfigError, match=r"num_workers=\(7, 8\) \(at least 7 to start\) needs 7 CPU"):
        trainer.train()
