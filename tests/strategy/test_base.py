"""The single-device strategy (raytrainer/strategy/base.py), the methods every strategy gives the loop: a step
through them is a plain torch step, clip_grad_norm clips as torch does (max_grad_norm=0: measured, not clipped),
and only rank 0 hands its weights to the host. DDP and FSDP on 2 workers: tests/integration/test_distributed.py,
tests/integration/test_fsdp.py."""

from __future__ import annotations

import copy

import torch

from raytrainer import TrainingArguments
from raytrainer.strategy.base import Strategy
from raytrainer.worker_context import WorkerContext
from tests.models import make_model


def batch():
    generator = torch.Generator().manual_seed(3)
    return torch.randint(0, 16, (4, 6), generator=generator)


def loss_of(model, ids):
    return model(input_ids=ids, labels=ids)["loss"]


def test_a_step_through_the_strategy_is_a_plain_torch_step(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0)
    strategy = Strategy(WorkerContext(), args)
    ours = strategy.setup(make_model(1))
    plain = copy.deepcopy(ours)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, plain)]
    with strategy.no_sync(ours), strategy.autocast():
        loss = loss_of(ours, batch())
    strategy.backward(loss)
    norm = strategy.clip_grad_norm(ours, 0.5, optimizers[0])
    strategy.optimizer_step(optimizers[0])
    loss_of(plain, batch()).backward()
    expected = torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.5)
    optimizers[1].step()
    assert torch.equal(norm, expected) and norm > 0.5  # clipped: the norm before clipping is returned
    for (name, a), b in zip(ours.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), name
    assert strategy.unwrap(ours) is ours and strategy.name == "single" and not strategy.shards_state


def test_max_grad_norm_zero_measures_without_clipping(tmp_path):
    strategy = Strategy(WorkerContext(), TrainingArguments(output_dir=str(tmp_path), num_workers=0))
    model = strategy.setup(make_model(2))
    loss_of(model, batch()).backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    norm = strategy.clip_grad_norm(model, 0.0)
    assert torch.allclose(norm, torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, [p for p in model.parameters() if p.grad is not None]))


def test_only_rank_0_hands_its_weights_to_the_host(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0)
    model = make_model(3)
    on_rank_0 = Strategy(WorkerContext(rank=0, world_size=2), args).host_state_dict(model)
    assert on_rank_0.keys() == model.state_dict().keys()
    assert all(torch.equal(on_rank_0[k], v) for k, v in model.state_dict().items())
    assert Strategy(WorkerContext(rank=1, world_size=2), args).host_state_dict(model) is None
