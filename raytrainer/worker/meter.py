"""What the loop measures between two logs: the loss, samples and tokens (reduced over ranks), and each
rank's own figures (step time, time waiting for data, throughput, memory) so a straggler is visible.

The loss stays on the device (no sync per step); the counts come from the CPU batch, so they are plain
numbers. Everything is reduced or gathered only when logging: one all-reduce and one small all-gather.
"""

from __future__ import annotations

import resource
import sys
import time

import torch


class Meter:
    def __init__(self, device):
        self.device = device
        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        self.samples = self.tokens = self.steps = 0
        self.data_wait = self.busy = 0.0  # this rank's seconds since the last log
        self.total = [0.0, 0.0, 0.0]  # loss, samples, steps: all ranks, whole run
        self.last_grad_norm = None
        self.last_time = time.time()

    def add_micro(self, loss, batch: dict, weight: float):
        self.loss.add_(loss)
        if weight:
            samples, tokens = _batch_counts(batch)
            self.samples += samples
            self.tokens += tokens

    def step_done(self, grad_norm, data_wait: float, busy: float):
        self.steps += 1
        self.last_grad_norm = grad_norm
        self.data_wait += data_wait
        self.busy += busy

    def flush(self, ctx, learning_rate: float) -> dict:
        """The log record since the last flush (empty if no step ran), with `rank_stats` for every rank."""
        mine = self._rank_figures(ctx.rank)
        packed = torch.stack([self.loss, *(torch.tensor(float(v), dtype=torch.float64, device=self.device)
                                           for v in (self.samples, self.tokens, self.steps))])
        loss_sum, samples, tokens, steps = ctx.all_reduce_sum(packed).tolist()
        ranks = ctx.all_gather_object(mine)
        steps /= ctx.world_size
        self.total = [self.total[0] + loss_sum, self.total[1] + samples, self.total[2] + steps]
        self.loss.zero_()
        self.samples = self.tokens = self.steps = 0
        self.data_wait = self.busy = 0.0
        now = time.time()
        elapsed, self.last_time = now - self.last_time, now
        if steps == 0:
            return {}
        logs = {"loss": loss_sum / steps}
        if self.last_grad_norm is not None:
            logs["grad_norm"] = float(self.last_grad_norm)
        logs["learning_rate"] = learning_rate
        logs["train_samples_per_second"] = round(samples / max(elapsed, 1e-9), 3)
        if tokens:
            logs["train_tokens_per_second"] = round(tokens / max(elapsed, 1e-9), 3)
        return {"logs": logs, "rank_stats": ranks}

    def _rank_figures(self, rank: int) -> dict:
        steps = max(self.steps, 1)
        return {"rank": rank, "step_time_s": round(self.busy / steps, 5),
                "data_wait_s": round(self.data_wait / steps, 5),
                "samples_per_second": round(self.samples / max(self.busy, 1e-9), 3),
                "memory_mb": round(_memory_mb(self.device), 1)}

    def totals(self, ctx) -> dict:
        self.flush(ctx, 0.0)  # fold in what was not logged yet
        loss_sum, samples, steps = self.total
        return {"loss_sum": loss_sum, "samples": samples, "steps": steps}


def _memory_mb(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


def _batch_counts(batch: dict):
    """(samples, tokens) of a micro-batch; tokens are attention-mask ones, else input_ids elements."""
    samples = 0
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            samples = value.shape[0]
            break
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        return samples, int(mask.sum())
    ids = batch.get("input_ids")
    return samples, ids.numel() if isinstance(ids, torch.Tensor) else 0
