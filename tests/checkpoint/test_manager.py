"""save_async=None, the default, follows what benchmarks/checkpoint.py measured: saves in the background,
except FSDP's sharded checkpoints on CPU workers, which are written inline; an explicit value always wins."""

import pytest
import torch

from raytrainer import TrainingArguments
from raytrainer.checkpoint.manager import background_saves

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize("save_async, sharded, device, expected", [
    (None, False, CPU, True), (None, True, CPU, False), (None, False, GPU, True), (None, True, GPU, True),
    (True, True, CPU, True), (False, False, GPU, False)])
def test_the_default_is_background_but_for_sharded_saves_on_cpu(save_async, sharded, device, expected):
    assert background_saves(save_async, sharded, device) is expected


def test_the_arguments_default_is_none_and_names_the_rule(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path))
    assert args.save_async is None
    assert "FSDP" in TrainingArguments.__dataclass_fields__["save_async"].metadata["help"]
