"""What the tests of the optimizers of their own packages share: skip when a package is missing, arguments for
one of them, a stand-in Trainer for the preflight's check, and a loss of the tiny llama."""

from __future__ import annotations

import pytest
import torch

from raytrainer.arguments.training_args import TrainingArguments
from raytrainer.optimizers import packaged

TARGETS = ["q_proj", "v_proj"]
LOW_RANK = {"optim_target_modules": TARGETS, "optim_args": "rank=4"}


def needs(optim: str):
    if packaged.missing_package(optim) is not None:
        pytest.skip(f"{optim}'s package is not installed")


def args_for(optim: str, **kw) -> TrainingArguments:
    extra = LOW_RANK if optim.startswith(("galore", "apollo")) else {}
    return TrainingArguments(output_dir="unused", optim=optim, **{"num_workers": 0, **extra, **kw})


class FakeTrainer:
    def __init__(self, args, model=None):
        self.args, self.model = args, model


def loss(model):
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    return model(input_ids=ids, labels=ids).loss
