"""Liger kernels (raytrainer/strategy/liger.py): refused where they cannot run (no GPU, no package), naming the
fix; off, the model is untouched."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from raytrainer.arguments.training_args import TrainingArguments
from raytrainer.errors import ConfigError
from raytrainer.strategy import liger
from tests.hf_models import tiny_model


def test_liger_is_refused_on_cpu_and_without_its_package(monkeypatch):
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="use_liger_kernel=True, but this run's workers have no GPU.*Triton"):
            TrainingArguments(output_dir="unused", use_liger_kernel=True, num_workers=0)
    with pytest.raises(ConfigError, match="no GPU"):
        TrainingArguments(output_dir="unused", use_liger_kernel=True, num_workers=2, use_gpu=False)
    with pytest.raises(ConfigError, match="must be a dict"):
        TrainingArguments(output_dir="unused", use_liger_kernel=True, num_workers=2, liger_kernel_config=["rope"])
    args = TrainingArguments(output_dir="unused", use_liger_kernel=True, num_workers=2)  # GPUs may be there
    with pytest.raises(ConfigError, match="get no GPU"):
        liger.check_run(args, use_gpu=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "liger_kernel" else real(name, *a))
    with pytest.raises(ConfigError, match=r'pip install "raytrainer\[liger\]"'):
        liger.check_run(args, use_gpu=True)
    model = tiny_model("plain")
    assert liger.apply_liger_kernel(model, TrainingArguments(output_dir="unused")) is model  # off: untouched
