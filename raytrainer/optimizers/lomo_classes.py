"""`lomo_optim`'s Lomo and AdaLomo, made fit for a Trainer run (imported only when one is built):

- their gradients are averaged across the ranks before they are used (see lomo.py);
- `step()` is a no-op (the update happened in backward; torch's base class would raise), and a backward that
  is not `fused_backward` raises instead of updating silently at a stale learning rate;
- AdaLomo builds on a CPU-only torch (its constructor calls `.cuda()` on each state tensor), with its state on
  each parameter's device, and its state (second-moment factors, step count) is in `state_dict()`, so a run
  resumes exactly.
"""

from __future__ import annotations

import contextlib

import lomo_optim
import torch
import torch.distributed as dist


def average_gradients_across_ranks(model: torch.nn.Module) -> list:
    """Hooks that replace each parameter's gradient, once complete, by its mean over the ranks (gloo has no AVG:
    a sum, divided). None on one process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return []
    world_size = dist.get_world_size()

    def average(param: torch.Tensor):
        if param.grad is not None:
            dist.all_reduce(param.grad)
            param.grad.div_(world_size)

    return [p.register_post_accumulate_grad_hook(average) for p in model.parameters() if p.requires_grad]


class _FusedOnly:
    """Refuses a plain `loss.backward()`: the hooks would update the weights at a stale learning rate and leave
    the last parameter's gradient for a step that never comes, silently."""

    _in_fused_backward = False

    def fuse_update(self):  # called by the constructor, before it registers the hooks
        update = super().fuse_update()

        def guarded(x):
            if not (self._in_fused_backward or self.gather_norm):
                raise RuntimeError(
                    f"{type(self).__name__} updates the weights inside backward: call "
                    "raytrainer.optimizers.fused_backward(optimizer, loss) instead of loss.backward() (the "
                    "Trainer's training_step does; an override of it must too).")
            return update(x)

        return guarded

    def fused_backward(self, loss, lr):
        self._in_fused_backward = True
        try:
            return super().fused_backward(loss, lr)
        finally:
            self._in_fused_backward = False

    def step(self, closure=None):
        """The weights were updated in backward."""
        return closure() if closure is not None else None


class Lomo(_FusedOnly, lomo_optim.Lomo):
    def __init__(self, model: torch.nn.Module, lr: float = 1e-3, **kwargs):
        super().__init__(model, lr=lr, **kwargs)
        self._average_hooks = average_gradients_across_ranks(model)


@contextlib.contextmanager
def _cuda_is_a_no_op():
    """`tensor.cuda()` returns the tensor itself, while AdaLomo's constructor runs on a torch without CUDA."""
    if torch.cuda.is_available():
        yield
        return
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda = original


_STATES = ("exp_avg_sq", "exp_avg_sq_row", "exp_avg_sq_col")


class AdaLomo(_FusedOnly, lomo_optim.AdaLomo):
    def __init__(self, model: torch.nn.Module, lr: float = 1e-3, **kwargs):
        with _cuda_is_a_no_op():
            super().__init__(model, lr=lr, **kwargs)
        devices = {name: p.device for name, p in model.named_parameters()}
        for attr in _STATES:
            state = getattr(self, attr)
            for name in state:
                state[name] = state[name].to(devices[name])
        self._average_hooks = average_gradients_across_ranks(model)

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["adalomo"] = {"step_num": self.step_num, **{attr: dict(getattr(self, attr)) for attr in _STATES}}
        return state

    def load_state_dict(self, state_dict: dict):
        own = state_dict.get("adalomo")
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "adalomo"})
        if own is None:
            return
        self.step_num = own["step_num"]
        for attr in _STATES:
            mine = getattr(self, attr)
            for name, tensor in own[attr].items():
                mine[name].copy_(tensor)
