"""The low-rank optimizers, GaLore and APOLLO (raytrainer/optimizers/low_rank.py): their target modules must be
nn.Linear layers, 8-bit GaLore needs a CUDA GPU (refused on the driver before any actor starts), and the
layer-wise GaLore Adafactor gets transformers' fixed step size. How they are built against transformers:
tests/optimizers/test_packaged.py; trained: tests/integration/test_optimizers_numbers.py."""

from __future__ import annotations

import pytest
import torch

from raytrainer.arguments.training_args import TrainingArguments
from raytrainer.errors import ConfigError
from raytrainer.optimizers import check_run, create_optimizer
from tests.hf_models import tiny_model
from tests.optimizers.support import FakeTrainer, args_for, needs


def test_low_rank_needs_linear_target_modules():
    needs("galore_adamw")
    with pytest.raises(ConfigError, match="needs optim_target_modules"):
        TrainingArguments(output_dir="unused", optim="galore_adamw")
    with pytest.raises(ConfigError, match="list of module names"):
        TrainingArguments(output_dir="unused", optim="galore_adamw", optim_target_modules=3)
    model = tiny_model("llama")
    with pytest.raises(ConfigError, match="matches no nn.Linear"):
        check_run(FakeTrainer(args_for("galore_adamw", optim_target_modules=["no_such_module"]), model), False)
    with pytest.warns(UserWarning, match="not nn.Linear"):  # 'self_attn' names the attention block itself
        check_run(FakeTrainer(args_for("galore_adamw", optim_target_modules=["self_attn"]), model), False)
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        check_run(FakeTrainer(args_for("galore_adamw", optim_target_modules="q_proj(("), model), False)


def test_eight_bit_galore_is_refused_without_a_gpu():
    needs("galore_adamw_8bit")
    for optim in ("galore_adamw_8bit", "galore_adamw_8bit_layerwise"):
        if not torch.cuda.is_available():  # in-process, no CUDA: the arguments alone decide
            with pytest.raises(ConfigError, match=r"needs a CUDA GPU \(galore_torch's GaLoreAdamW8bit calls "
                                                  r"torch.cuda.synchronize\(\).*optim='galore_adamw"):
                args_for(optim)
        with pytest.raises(ConfigError, match="needs a CUDA GPU"):
            args_for(optim, num_workers=1, use_gpu=False)
    # On a cluster the driver learns at train() whether the workers get GPUs: the preflight refuses then.
    args = args_for("galore_adamw_8bit", num_workers=2)
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        check_run(FakeTrainer(args), use_gpu=False)
    check_run(FakeTrainer(args), use_gpu=True)


def test_galore_adafactor_layerwise_gets_the_fixed_step_size():
    """transformers sets scale_parameter/relative_step=False for galore_adafactor only; its layer-wise form then
    fails in Adafactor ('Cannot combine manual lr and relative_step=True'). Both forms build here."""
    needs("galore_adafactor_layerwise")
    opt = create_optimizer(tiny_model("llama"), args_for("galore_adafactor_layerwise"))
    inner = next(iter(opt.optimizers.values()))
    assert inner.defaults["relative_step"] is False and inner.defaults["scale_parameter"] is False
