"""LOMO and AdaLomo (raytrainer/optimizers/lomo_classes.py, built by optimizers/lomo.py) in a Trainer run: the
weights change inside `fused_backward` only, at the step's learning rate, and AdaLomo's state is in its
state_dict."""

from __future__ import annotations

import pytest
import torch

from raytrainer.optimizers import create_optimizer, create_scheduler, fused_backward, is_fused_backward
from tests.hf_models import tiny_model
from tests.optimizers.support import args_for, loss, needs


@pytest.mark.parametrize("optim", ["lomo", "adalomo"])
def test_lomo_updates_in_fused_backward_only(optim):
    needs(optim)
    model = tiny_model("llama")
    opt = create_optimizer(model, args_for(optim))
    assert is_fused_backward(opt) and not is_fused_backward(torch.optim.SGD(model.parameters(), lr=1))
    with pytest.raises(RuntimeError, match="call raytrainer.optimizers.fused_backward"):
        loss(model).backward()
    model.zero_grad(set_to_none=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    scheduler = create_scheduler(opt, args_for(optim), num_training_steps=4)
    fused_backward(opt, loss(model))  # at this step's lr
    assert opt.lr == scheduler.get_last_lr()[0]
    assert all(p.grad is None for p in model.parameters())  # consumed, nothing left to clip or step
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters())  # every one, the last too
    opt.step()  # a no-op (torch's base class raises)


def test_adalomo_state_is_in_its_state_dict():
    needs("adalomo")
    model = tiny_model("llama")
    opt = create_optimizer(model, args_for("adalomo"))
    states = [(opt.exp_avg_sq_row.get(n) if p.dim() > 1 else opt.exp_avg_sq[n], p) for n, p in model.named_parameters()]
    assert all(state.device == p.device for state, p in states)
    fused_backward(opt, loss(model))
    saved = opt.state_dict()
    assert saved["adalomo"]["step_num"] == 1
    other = create_optimizer(tiny_model("llama"), args_for("adalomo"))
    other.load_state_dict(saved)
    assert other.step_num == 1
    for name, tensor in opt.exp_avg_sq_row.items():
        assert torch.equal(other.exp_avg_sq_row[name], tensor)
