"""The `_layerwise` optimizers: one optimizer per parameter, stepped inside backward as soon as that parameter's
gradient is complete, then the gradient is freed (transformers' `LayerWiseDummyOptimizer` and its hooks).

Only one process can run them (the gradient is used before data parallelism could average it) and only without
gradient accumulation: the driver refuses other settings (packaged.py). The loop sees an ordinary optimizer
whose `step()` and `zero_grad()` do nothing; its one placeholder group carries the learning rate that the
schedule sets, and each per-parameter optimizer takes it just before stepping. (transformers gives every
parameter its own copy of the schedule instead; all start from the same learning rate, so the numbers agree.)
Gradient clipping finds no gradients left and reports a norm of 0, as transformers' does.

Unlike transformers' dummy, `state_dict()` holds every per-parameter optimizer's state, so a run resumes exactly.
"""

from __future__ import annotations

from typing import Dict

import torch


class LayerwiseOptimizer(torch.optim.Optimizer):
    def __init__(self, optimizers: Dict[torch.nn.Parameter, torch.optim.Optimizer], lr: float):
        self.optimizers = optimizers
        super().__init__([torch.zeros(1)], {"lr": lr})  # a placeholder parameter: the schedule's lr lives here
        self._hooks = [p.register_post_accumulate_grad_hook(self._step_parameter)
                       for p in optimizers if p.requires_grad]

    def _step_parameter(self, param: torch.nn.Parameter):
        if param.grad is None:
            return
        optimizer = self.optimizers[param]
        for group in optimizer.param_groups:
            group["lr"] = self.param_groups[0]["lr"]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def step(self, closure=None):
        """The parameters were stepped in backward."""
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True):
        """Each parameter's gradient was freed right after its step."""

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["per_parameter"] = [optimizer.state_dict() for optimizer in self.optimizers.values()]
        return state

    def load_state_dict(self, state_dict: dict):
        per_parameter = state_dict["per_parameter"]
        if len(per_parameter) != len(self.optimizers):
            raise ValueError(f"the checkpoint holds {len(per_parameter)} per-parameter optimizers, this model "
                             f"has {len(self.optimizers)} parameters.")
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "per_parameter"})
        for optimizer, state in zip(self.optimizers.values(), per_parameter):
            optimizer.load_state_dict(state)

    def remove_hooks(self):
        """Detach from the model (a later optimizer of the same model must not find these steps in backward)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
