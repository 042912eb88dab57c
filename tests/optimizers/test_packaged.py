"""The optimizers of their own packages: what the driver refuses before any actor starts (and why), and how each
is built (as transformers' Trainer builds it). No Trainer run here: tests/integration/test_optimizers_numbers.py
trains."""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch

from raytrainer.errors import ConfigError
from raytrainer.optimizers import create_optimizer
from tests.hf_models import tiny_model
from tests.optimizers.support import LOW_RANK, args_for, needs


@pytest.mark.parametrize("optim, module, extra", [
    ("galore_adamw", "galore_torch", "galore"), ("apollo_adamw_layerwise", "apollo_torch", "apollo"),
    ("adalomo", "lomo_optim", "lomo"), ("grokadamw", "grokadamw", "grokadamw"),
    ("stable_adamw", "optimi", "stable-adamw")])
def test_a_missing_package_names_the_extra(optim, module, extra, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    with pytest.raises(ConfigError, match=rf'pip install "raytrainer\[{extra}\]"'):
        args_for(optim)


# ---------------------------------------------------------------------- refused on the driver
@pytest.mark.parametrize("optim", ["galore_adamw_layerwise", "galore_adafactor_layerwise", "apollo_adamw_layerwise"])
def test_layerwise_runs_in_one_process_only(optim):
    needs(optim)
    for workers in (0, 1):
        args_for(optim, num_workers=workers)
    for workers in (2, (1, 2)):
        with pytest.raises(ConfigError, match=r"one process only .*num_workers=1") as err:
            args_for(optim, num_workers=workers)
        assert "before the workers could average it" in str(err.value)
    with pytest.raises(ConfigError, match="gradient_accumulation_steps=1"):
        args_for(optim, gradient_accumulation_steps=2)
    with pytest.raises(ConfigError, match="strategy='ddp'"):
        args_for(optim, num_workers=1, strategy="fsdp")
    with pytest.raises(ConfigError, match="bf16"):
        args_for(optim, fp16=True)


@pytest.mark.parametrize("optim", ["lomo", "adalomo"])
def test_lomo_is_refused_where_it_cannot_work(optim):
    needs(optim)
    args_for(optim, num_workers=2, gradient_accumulation_steps=2)  # several workers and accumulation: as HF
    with pytest.raises(ConfigError, match="strategy='ddp'"):
        args_for(optim, num_workers=2, strategy="fsdp")
    with pytest.raises(ConfigError, match="fp16's loss scaling"):
        args_for(optim, fp16=True)
    with pytest.raises(ConfigError, match="second backward pass"):
        args_for(optim, optim_args="clip_grad_norm=1.0")


def test_optim_args_take_transformers_names_and_defaults():
    needs("apollo_adamw")
    opt = create_optimizer(tiny_model("llama"), args_for("apollo_adamw", optim_args="rank=2,proj=svd,scale=0.5"))
    targeted = opt.param_groups[1]
    assert (targeted["rank"], targeted["proj"], targeted["scale"], targeted["update_proj_gap"]) == (2, "svd", 0.5, 200)
    with pytest.raises(ConfigError, match="'momentum' is not accepted by optim='apollo_adamw'; accepted: rank"):
        args_for("apollo_adamw", optim_args="momentum=0.9")
    with pytest.raises(ConfigError, match="must be one of random, svd"):
        args_for("apollo_adamw", optim_args="proj=gauss")
    needs("stable_adamw")
    opt = create_optimizer(tiny_model("plain"), args_for("stable_adamw", optim_args="decouple_lr=false,max_lr=1e-2"))
    assert opt.defaults["decouple_lr"] is False and opt.defaults["max_lr"] == 1e-2  # HF: bool("false") is True


def test_weight_decay_they_ignore_is_said():
    needs("galore_adamw")
    with pytest.warns(UserWarning, match="does not apply weight_decay=0.1"):
        args_for("galore_adamw", weight_decay=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        args_for("galore_adamw")
        needs("grokadamw")
        args_for("grokadamw", weight_decay=0.1)  # GrokAdamW gets it through the param groups, as in HF


# ---------------------------------------------------------------------- built as transformers builds them
def _layout(optimizer, model) -> list:
    names = {id(p): n for n, p in model.named_parameters()}
    inner = getattr(optimizer, "optimizers", None) or getattr(optimizer, "optimizer_dict", None)
    if inner is not None:  # layer-wise: one optimizer per parameter
        return [_layout(o, model) for o in inner.values()]
    return [([names[id(p)] for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
            for g in optimizer.param_groups]


@pytest.mark.parametrize("optim", ["galore_adamw", "galore_adafactor", "galore_adamw_layerwise", "apollo_adamw",
                                   "apollo_adamw_layerwise", "grokadamw", "stable_adamw"])
def test_built_as_transformers_builds_it(optim):
    needs(optim)
    transformers = pytest.importorskip("transformers")
    low_rank = optim.startswith(("galore", "apollo"))
    weight_decay = 0.0 if low_rank else 0.1  # the low-rank ones warn that they ignore it
    ours = create_optimizer(mine := tiny_model("llama"), args_for(optim, weight_decay=weight_decay,
                                                                  learning_rate=3e-3))
    hf_args = transformers.TrainingArguments(output_dir="unused", optim=optim, learning_rate=3e-3, use_cpu=True,
                                             weight_decay=weight_decay, report_to="none",
                                             **(LOW_RANK if low_rank else {}))
    theirs_model = tiny_model("llama")
    cls, kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(hf_args, theirs_model)
    params = kwargs.pop("optimizer_dict", None) or kwargs.pop("params", None)
    if params is None:  # Trainer.create_optimizer's groups: with and without weight decay
        decay = set(transformers.Trainer.get_decay_parameter_names(None, mine))
        names = {id(p): n for n, p in mine.named_parameters()}
        assert [({names[id(p)] for p in g["params"]}, g["weight_decay"]) for g in ours.param_groups] == [
            (decay, weight_decay), ({n for n, _ in mine.named_parameters()} - decay, 0.0)]
        assert isinstance(ours, cls) and ours.defaults == cls([torch.zeros(1)], **kwargs).defaults
        return
    theirs = cls(params, **kwargs)
    assert isinstance(ours, cls) or type(ours).__name__ == "LayerwiseOptimizer"
    assert _layout(ours, mine) == _layout(theirs, theirs_model)
    if not optim.endswith("_layerwise"):
        assert ours.defaults == theirs.defaults
