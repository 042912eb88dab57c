"""GrokAdamW (`grokadamw`), with its per-parameter state where torch keeps an optimizer's state.

The package keeps it in each param group's dict, keyed by the parameter tensor: `state_dict()` then saves the
tensors themselves as keys, and `load_state_dict()` brings back groups whose keys are the saved copies, so a
resumed run starts its moments from zero. Here the state lives in `self.state` between steps (standard
`state_dict()`/`load_state_dict()`), and is lent to the group dict only during `step()`.
"""

from __future__ import annotations

import warnings

import grokadamw
import torch


class GrokAdamW(grokadamw.GrokAdamW):
    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            group["state"] = {p: self.state[p] for p in group["params"] if self.state.get(p)}
        try:
            with warnings.catch_warnings():  # it enters torch.cuda.amp.autocast() on every step, also on CPU
                warnings.filterwarnings("ignore", message=".*autocast.*")
                warnings.filterwarnings("ignore", message=".*CUDA is not available.*")
                return super().step(closure)
        finally:
            for group in self.param_groups:
                for p, state in group.pop("state", {}).items():
                    self.state[p] = state
