"""The built-in optimizers (torch's, transformers' Adafactor, schedule-free): parameter groups as HF's Trainer
makes them, each optimizer built and stepped, `optim_args` parsed and checked, schedule-free train/eval modes and
an exact resume."""

import re
import warnings

import pytest
import torch
from torch import nn
from transformers.optimization import Adafactor  # what optim="adafactor" means (transformers' Trainer)

from raytrainer.arguments.training_args import TrainingArguments
from raytrainer.errors import ConfigError
from raytrainer.optimizers import OPTIMIZERS, create_optimizer, create_scheduler
from raytrainer.optimizers.builtin import get_decay_parameter_names


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.layer_norm = nn.LayerNorm(4)  # excluded by module type, not by name ("layer_norm" has no pattern)
        self.rms = nn.RMSNorm(4)
        self.q_norm = nn.Linear(4, 4, bias=False)  # excluded by the "_norm" name pattern


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.block = Block()
        self.norm = nn.Linear(4, 4)  # ".norm." pattern
        self.head = nn.Linear(4, 2)
        self.scale = nn.Parameter(torch.ones(1))


def test_decay_names_follow_hf_rule():
    model = Tiny()
    decay = set(get_decay_parameter_names(model))
    assert decay == {"embed.weight", "block.proj.weight", "head.weight", "scale"}
    transformers = pytest.importorskip("transformers")
    hf = transformers.Trainer.get_decay_parameter_names(None, model)  # `self` is unused there
    assert set(hf) - {"block.rms.weight"} == decay  # HF excludes RMSNorm only by name; we also by type


def test_param_groups_split_decay_and_skip_frozen():
    model = Tiny()
    model.embed.weight.requires_grad_(False)
    opt = create_optimizer(model, TrainingArguments(weight_decay=0.1, optim="adamw_torch"))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    ids = lambda ps: {id(p) for p in ps}  # noqa: E731
    assert ids(decay["params"]) == ids([model.block.proj.weight, model.head.weight, model.scale])
    assert id(model.head.bias) in ids(no_decay["params"])
    assert id(model.block.layer_norm.weight) in ids(no_decay["params"])
    assert id(model.embed.weight) not in ids(decay["params"]) | ids(no_decay["params"])


@pytest.mark.parametrize("optim, cls", [("adamw_torch", torch.optim.AdamW), ("adamw_torch_fused", torch.optim.AdamW),
                                        ("sgd", torch.optim.SGD), ("adafactor", Adafactor)])
def test_each_optimizer_builds_and_steps(optim, cls):
    assert optim in OPTIMIZERS
    model = Tiny()
    args = TrainingArguments(optim=optim, learning_rate=1e-2, weight_decay=0.01)
    opt = create_optimizer(model, args)
    assert type(opt) is cls and opt.defaults["lr"] == 1e-2
    if optim.startswith("adamw"):
        assert opt.defaults["betas"] == (args.adam_beta1, args.adam_beta2)
        assert opt.defaults["eps"] == args.adam_epsilon
        assert bool(opt.defaults["fused"]) == (optim == "adamw_torch_fused")
    before = model.head.weight.detach().clone()
    model.head(model.embed(torch.tensor([1]))).sum().backward()
    opt.step()
    assert not torch.equal(before, model.head.weight)


def test_fused_falls_back_with_a_warning():
    model = nn.Linear(2, 2, dtype=torch.complex64)  # fused AdamW takes only real floating point params
    with pytest.warns(UserWarning, match="non-fused"):
        opt = create_optimizer(model, TrainingArguments(optim="adamw_torch_fused"))
    assert not opt.defaults["fused"]


def test_no_trainable_params_is_a_config_error():
    model = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ConfigError, match="requires_grad"):
        create_optimizer(model, TrainingArguments())


# ---------------------------------------------------------------------- optim_args and schedule-free optimizers
def test_optim_args_are_parsed_and_applied():
    model = Tiny()
    sgd = create_optimizer(model, TrainingArguments(optim="sgd", optim_args="momentum=0.9, nesterov=True"))
    assert sgd.defaults["momentum"] == 0.9 and sgd.defaults["nesterov"] is True
    adamw = create_optimizer(model, TrainingArguments(optim="adamw_torch", optim_args="amsgrad=true,maximize=False"))
    assert adamw.defaults["amsgrad"] is True and adamw.defaults["maximize"] is False


@pytest.mark.parametrize("optim, text, field", [
    ("sgd", "momentum", "'key=value'"),
    ("sgd", "momentum=0.9=1", "'key=value'"),
    ("sgd", "betas_typo=1", "accepted: momentum"),
    ("sgd", "lr=0.1", "learning_rate"),
    ("adamw_torch", "eps=1e-6", "adam_epsilon"),
    ("sgd", "momentum=fast", "must be a number"),
    ("sgd", "nesterov=maybe", "true or false"),
])
def test_bad_optim_args_fail_at_construction_naming_the_fix(optim, text, field):
    with pytest.raises(ConfigError, match=re.escape(field)):
        TrainingArguments(optim=optim, optim_args=text)


def test_schedule_free_kwargs_match_transformers():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("schedulefree")
    for optim in ("schedule_free_adamw", "schedule_free_sgd", "schedule_free_radam"):
        kw = dict(optim=optim, learning_rate=3e-3, weight_decay=0.05, warmup_steps=7, lr_scheduler_type="constant",
                  optim_args="r=0.5,weight_lr_power=1.5")
        hf_cls, hf_kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(
            transformers.TrainingArguments(output_dir="x", **kw))
        opt = create_optimizer(nn.Linear(2, 2), TrainingArguments(**kw))
        assert type(opt) is hf_cls
        for key, value in hf_kwargs.items():
            if key != "weight_decay":  # per parameter group here (none on biases), as for every optimizer
                assert opt.defaults[key] == value, (optim, key)
        assert opt.param_groups[0]["weight_decay"] == 0.05


def test_schedule_free_warmup_ratio_is_resolved_with_the_run_length():
    pytest.importorskip("schedulefree")
    args = TrainingArguments(optim="schedule_free_adamw", lr_scheduler_type="constant", warmup_steps=0.1)
    opt = create_optimizer(nn.Linear(2, 2), args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 'constant ignores warmup' must not fire: the optimizer does the warm-up
        create_scheduler(opt, args, 50)
    assert {g["warmup_steps"] for g in opt.param_groups} == {5}


def test_schedule_free_with_a_decaying_schedule_warns():
    pytest.importorskip("schedulefree")
    with pytest.warns(UserWarning, match="lr_scheduler_type='constant'"):
        TrainingArguments(optim="schedule_free_sgd")  # HF's default schedule is linear


def test_missing_schedulefree_names_the_extra(monkeypatch):
    import importlib.util
    import sys

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "schedulefree" else real_find_spec(name, *a))
    with pytest.raises(ConfigError, match=re.escape('optim=\'schedule_free_adamw\' needs the \'schedulefree\' '
                                                    'package, which is not installed: pip install '
                                                    '"raytrainer[schedulefree]"')):
        TrainingArguments(optim="schedule_free_adamw", lr_scheduler_type="constant")
    # Also where the optimizer is built (e.g. on a worker whose image lacks the package).
    monkeypatch.setitem(sys.modules, "schedulefree", None)  # makes `import schedulefree` raise ImportError
    from raytrainer.optimizers.builtin import optimizer_class
    with pytest.raises(ConfigError, match=re.escape('pip install "raytrainer[schedulefree]"')):
        optimizer_class("schedule_free_sgd")


def test_train_and_eval_mode_helpers():
    pytest.importorskip("schedulefree")
    from raytrainer.optimizers.builtin import optimizer_eval_mode, optimizer_train_mode

    model = nn.Linear(2, 1)
    args = TrainingArguments(optim="schedule_free_adamw", lr_scheduler_type="constant", learning_rate=0.1)
    opt = create_optimizer(model, args)
    for _ in range(3):
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        opt.zero_grad()
    y = model.weight.detach().clone()
    optimizer_eval_mode(opt)  # weights move to the averaged point x
    assert not opt.param_groups[0]["train_mode"] and not torch.equal(model.weight, y)
    optimizer_train_mode(opt)
    assert opt.param_groups[0]["train_mode"]
    torch.testing.assert_close(model.weight.detach(), y)
    sgd = create_optimizer(model, TrainingArguments(optim="sgd"))
    optimizer_eval_mode(sgd), optimizer_train_mode(sgd)  # no-ops for optimizers without modes


def _sf_run(output_dir, steps, save_steps, resume=None):
    from raytrainer import Trainer
    from tests.models import TokenData, make_model

    args = TrainingArguments(output_dir=output_dir, num_workers=0, per_device_train_batch_size=8, max_steps=steps,
                             optim="schedule_free_adamw", lr_scheduler_type="constant", learning_rate=2e-2,
                             warmup_steps=2, logging_steps=1, save_steps=save_steps, disable_tqdm=True)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(64))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_schedule_free_adamw_trains_and_resumes_exactly(tmp_path):
    pytest.importorskip("schedulefree")
    from tests.models import assert_same_weights, weights

    full = _sf_run(str(tmp_path / "full"), steps=24, save_steps=12)
    losses = [h["loss"] for h in full.state.log_history if "loss" in h]
    assert len(losses) == 24 and sum(losses[-4:]) / 4 < 0.9 * sum(losses[:4]) / 4  # it learns
    # The checkpoint holds the schedule-free state (z, the running average's weight sum), and resuming from it
    # ends where the uninterrupted run ends.
    checkpoint = str(tmp_path / "full" / "checkpoint-12")
    saved = torch.load(checkpoint + "/optimizer.pt", weights_only=False)
    assert all("z" in s for s in saved["state"].values())
    assert saved["param_groups"][0]["weight_sum"] > 0 and saved["param_groups"][0]["k"] == 12
    resumed = _sf_run(str(tmp_path / "resumed"), steps=24, save_steps=12, resume=checkpoint)
    assert resumed.state.global_step == 24
    assert_same_weights(weights(resumed.model), weights(full.model), atol=1e-6)
    assert [h["loss"] for h in resumed.state.log_history if "loss" in h] == pytest.approx(losses, rel=1e-6)


def test_optim_args_tuples_and_names_that_args_set_only_for_adam():
    # adam_epsilon is Adam's: Adafactor's own eps pair comes through optim_args (tuples as 'a:b').
    opt = create_optimizer(Tiny(), TrainingArguments(optim="adafactor", optim_args="eps=1e-29:1e-2,decay_rate=-0.5"))
    assert opt.defaults["decay_rate"] == -0.5 and opt.defaults["eps"] == (1e-29, 1e-2)
    # transformers' Adafactor with its Trainer's settings (the schedule sets the rate), as optim="adafactor" there
    assert not opt.defaults["relative_step"] and not opt.defaults["scale_parameter"]
    with pytest.raises(ConfigError, match="2 values"):
        TrainingArguments(optim="adafactor", optim_args="eps=1e-3")
