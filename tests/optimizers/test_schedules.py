"""The learning-rate schedules: the same factors as transformers' `get_scheduler`, warm-up as steps or a ratio,
their kwargs checked, and a scheduler that pickles and resumes."""

import pickle
import warnings

import pytest
import torch
from torch import nn

from raytrainer.arguments.training_args import TrainingArguments
from raytrainer.errors import ConfigError
from raytrainer.optimizers import SCHEDULERS, create_optimizer
from raytrainer.optimizers.schedules import create_scheduler


def _lrs(scheduler, steps):
    out = []
    for _ in range(steps):
        out.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return out


def _opt(lr=1e-3):
    return torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=lr)


# What a schedule cannot run without (HF refuses it too), and other kwargs than the defaults.
NEEDED = {"cosine_with_min_lr": {"min_lr_rate": 0.1}, "cosine_warmup_with_min_lr": {"min_lr": 2e-4},
          "warmup_stable_decay": {"num_decay_steps": 6}}
SPECIFIC_KWARGS = [("cosine", {"num_cycles": 1.5}), ("polynomial", {"lr_end": 1e-5, "power": 2.0}),
                   ("cosine_with_restarts", {"num_cycles": 3}), ("inverse_sqrt", {"timescale": 7}),
                   ("cosine_with_min_lr", {"min_lr": 1e-4, "num_cycles": 1.0}),
                   ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.05, "warmup_lr_rate": 0.2}),
                   ("warmup_stable_decay", {"num_decay_steps": 5, "num_stable_steps": 8, "warmup_type": "cosine",
                                            "decay_type": "1-sqrt", "min_lr_ratio": 0.1}),
                   ("warmup_stable_decay", {"num_decay_steps": 4, "warmup_type": "1-sqrt", "decay_type": "linear"})]


@pytest.mark.parametrize("name, kw", [(n, NEEDED.get(n)) for n in SCHEDULERS] + SPECIFIC_KWARGS)
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
    with pytest.raises(ConfigError, match="exactly one of min_lr and min_lr_rate"):
        create_scheduler(_opt(), TrainingArguments(lr_scheduler_type="cosine_with_min_lr"), 10)
    with pytest.raises(ConfigError, match="needs num_decay_steps"):
        create_scheduler(_opt(), TrainingArguments(lr_scheduler_type="warmup_stable_decay"), 10)
    with pytest.raises(ConfigError, match="decay_type='step'"):
        create_scheduler(_opt(), TrainingArguments(lr_scheduler_type="warmup_stable_decay", lr_scheduler_kwargs={
            "num_decay_steps": 2, "decay_type": "step"}), 10)


def test_polynomial_when_warmup_fills_the_run():
    args = TrainingArguments(lr_scheduler_type="polynomial", warmup_steps=10)
    lrs = _lrs(create_scheduler(_opt(1.0), args, 10), 12)  # HF divides by zero at step 10
    assert lrs[10] == pytest.approx(1e-7)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_scheduler_pickles_and_resumes(name):
    args = TrainingArguments(lr_scheduler_type=name, warmup_steps=0 if name == "constant" else 3,
                             lr_scheduler_kwargs=NEEDED.get(name))
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
