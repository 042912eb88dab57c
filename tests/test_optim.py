import pickle
import warnings

import pytest
import torch
from torch import nn

from raytrainer.args import OPTIMIZERS, SCHEDULERS, TrainingArguments
from raytrainer.errors import ConfigError
from raytrainer.optim import create_optimizer, create_scheduler, get_decay_parameter_names


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
                                        ("sgd", torch.optim.SGD), ("adafactor", torch.optim.Adafactor)])
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


def _lrs(scheduler, steps):
    out = []
    for _ in range(steps):
        out.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return out


def _opt(lr=1e-3):
    return torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=lr)


SPECIFIC_KWARGS = {"cosine": {"num_cycles": 1.5}, "polynomial": {"lr_end": 1e-5, "power": 2.0}}


@pytest.mark.parametrize("name, kw", [(n, None) for n in SCHEDULERS] + list(SPECIFIC_KWARGS.items()))
@pytest.mark.parametrize("warmup", [0, 5, 0.13])  # none, int steps, ratio (0.13 * 20 = 2.6 -> 3 steps)
def test_schedule_matches_transformers(name, kw, warmup):
    transformers = pytest.importorskip("transformers")
    steps = 20
    args = TrainingArguments(lr_scheduler_type=name, warmup_steps=warmup, lr_scheduler_kwargs=kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant + warmup warns that warmup is ignored
        ours = create_scheduler(_opt(), args, steps)
    hf = transformers.get_scheduler(name, _opt(), num_warmup_steps=args.get_warmup_steps(steps),
                                    num_training_steps=steps, scheduler_specific_kwargs=kw)
    assert _lrs(ours, steps + 2) == pytest.approx(_lrs(hf, steps + 2), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("warmup", [4, 0.2])
def test_warmup_as_int_and_ratio(warmup):
    lrs = _lrs(create_scheduler(_opt(1.0), TrainingArguments(warmup_steps=warmup), 20), 6)
    assert lrs == pytest.approx([0, 0.25, 0.5, 0.75, 1.0, 15 / 16])


def test_constant_with_warmup_warns():
    with pytest.warns(UserWarning, match="constant_with_warmup"):
        create_scheduler(_opt(), TrainingArguments(lr_scheduler_type="constant", warmup_steps=3), 10)


def test_scheduler_kwargs_are_checked():
    with pytest.raises(ConfigError, match="num_cycles"):
        create_scheduler(_opt(), TrainingArguments(lr_scheduler_kwargs={"num_cycles": 2}), 10)
    with pytest.raises(ConfigError, match="lr_end"):
        create_scheduler(_opt(1e-3), TrainingArguments(lr_scheduler_type="polynomial",
                                                       lr_scheduler_kwargs={"lr_end": 1.0}), 10)
    with pytest.raises(ConfigError, match="num_training_steps"):
        create_scheduler(_opt(), TrainingArguments(), 0)


def test_polynomial_when_warmup_fills_the_run():
    args = TrainingArguments(lr_scheduler_type="polynomial", warmup_steps=10)
    lrs = _lrs(create_scheduler(_opt(1.0), args, 10), 12)  # HF divides by zero at step 10
    assert lrs[10] == pytest.approx(1e-7)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_scheduler_pickles_and_resumes(name):
    args = TrainingArguments(lr_scheduler_type=name, warmup_steps=0 if name == "constant" else 3)
    model = nn.Linear(2, 2)
    opt = create_optimizer(model, args)
    sched = create_scheduler(opt, args, 20)
    _lrs(sched, 7)
    clone = pickle.loads(pickle.dumps(sched))  # whole object: what travels to a Ray actor
    assert clone.get_last_lr() == sched.get_last_lr()
    # state_dict round trip: what a checkpoint stores and a resumed run loads into a fresh scheduler.
    state = pickle.loads(pickle.dumps(sched.state_dict()))
    fresh = create_scheduler(create_optimizer(nn.Linear(2, 2), args), args, 20)
    fresh.load_state_dict(state)
    assert _lrs(fresh, 10) == _lrs(sched, 10) == _lrs(clone, 10)
