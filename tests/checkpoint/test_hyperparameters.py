"""A resume that keeps the run's own optimizer hyperparameters (a PBT trial continuing another trial's checkpoint):
the checkpoint's moments, step and schedule position with this run's learning rate, weight decay and betas."""

import pytest
import torch

from raytrainer.checkpoint.hyperparameters import own_hyperparameters, put_back


def decay(step: int) -> float:
    return 1.0 / (1 + step)


def optimizer_and_schedule(lr: float, weight_decay: float, betas=(0.9, 0.999), seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=betas)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, decay)


def train(model, optimizer, scheduler, steps: int):
    for _ in range(steps):
        model(torch.ones(3, 4)).pow(2).sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def test_the_checkpoints_state_with_this_runs_values():
    donor, donor_opt, donor_sched = optimizer_and_schedule(lr=1e-2, weight_decay=0.1)
    train(donor, donor_opt, donor_sched, 3)
    saved_opt, saved_sched = donor_opt.state_dict(), donor_sched.state_dict()

    model, optimizer, scheduler = optimizer_and_schedule(lr=5e-3, weight_decay=0.0, betas=(0.8, 0.9), seed=1)
    model.load_state_dict(donor.state_dict())
    own = own_hyperparameters(optimizer, scheduler)
    optimizer.load_state_dict(saved_opt)
    scheduler.load_state_dict(saved_sched)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * decay(3))  # a plain resume: the donor's values
    put_back(optimizer, scheduler, own)

    group = optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(5e-3 * decay(3)) and group["initial_lr"] == 5e-3
    assert group["weight_decay"] == 0.0 and group["betas"] == (0.8, 0.9)
    assert scheduler.last_epoch == 3 and scheduler.base_lrs == [5e-3]
    assert scheduler.get_last_lr() == [group["lr"]]  # what the loop logs as learning_rate
    for mine, theirs in zip(model.parameters(), donor.parameters()):  # the donor's moments and step, unchanged
        moments, donor_moments = optimizer.state[mine], donor_opt.state[theirs]
        assert torch.equal(moments["exp_avg"], donor_moments["exp_avg"]) and moments["step"] == donor_moments["step"]
    train(model, optimizer, scheduler, 1)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(5e-3 * decay(4))  # the schedule goes on from step 3


def test_another_optimizer_shape_is_named():
    _, optimizer, scheduler = optimizer_and_schedule(lr=1e-3, weight_decay=0.0)
    own = own_hyperparameters(optimizer, scheduler)
    optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))]})
    with pytest.raises(ValueError, match="2 parameter groups and this run's 1"):
        put_back(optimizer, scheduler, own)
