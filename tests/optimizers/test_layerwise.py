"""The layer-wise optimizers: each parameter steps inside backward, and the state (with GaLore's projectors as
snapshots) round-trips through state_dict."""

from __future__ import annotations

import pytest
import torch

from raytrainer.optimizers import create_optimizer, create_scheduler
from tests.hf_models import tiny_model
from tests.optimizers.support import args_for, loss, needs


def test_layerwise_state_round_trips():
    needs("galore_adamw_layerwise")
    model = tiny_model("llama")
    args = args_for("galore_adamw_layerwise")
    opt = create_optimizer(model, args)
    scheduler = create_scheduler(opt, args, num_training_steps=4)
    before = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    loss(model).backward()  # each parameter steps as its gradient completes
    assert all(p.grad is None for p in model.parameters())
    assert not torch.equal(before, model.model.layers[0].self_attn.q_proj.weight)
    opt.step(), scheduler.step()
    saved = opt.state_dict()
    assert len(saved["per_parameter"]) == len(list(model.parameters()))
    projected = [s for s in saved["per_parameter"] if any("projector" in v for v in s["state"].values())]
    assert len(projected) == 4  # q_proj and v_proj of 2 layers
    live = next(iter(opt.optimizers[model.model.layers[0].self_attn.q_proj.weight].state.values()))
    assert projected[0]["state"][0]["projector"] is not live["projector"]  # a snapshot, not the live object
    other_model = tiny_model("llama")
    other = create_optimizer(other_model, args)
    other.load_state_dict(saved)
    assert other.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    with pytest.raises(ValueError, match="per-parameter optimizers"):
        other.load_state_dict({**saved, "per_parameter": saved["per_parameter"][:-1]})
