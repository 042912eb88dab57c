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


# Each rank's own figures since the last log, in the order `_rank_figures` returns them.
RANK_FIGURES = ("step_time_s", "data_wait_s", "samples_per_second", "memory_mb")


class Meter:
    def __init__(self, device, nan_inf_filter: bool = False):
        self.device = device
        self.nan_inf_filter = nan_inf_filter  # logging_nan_inf_filter: see add_micro
        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        self.samples = self.tokens = self.steps = 0
        self.flos = 0.0  # transformers' estimate (Trainer.floating_point_ops), summed over ranks when logging
        self.data_wait = self.busy = 0.0  # this rank's seconds since the last log
        self.total = [0.0, 0.0, 0.0]  # loss, samples, steps: all ranks, whole run
        self.last_grad_norm = self.last_learning_rate = None
        self.last_time = time.time()

    def add_micro(self, loss, batch: dict, weight: float, flos: float = 0.0):
        if self.nan_inf_filter:  # transformers' rule: a NaN/Inf loss counts as the average since the last log
            loss = torch.where(torch.isfinite(loss), loss, self.loss / (1 + self.steps))  # on the device: no sync
        self.loss.add_(loss)
        self.flos += flos
        if weight:
            samples, tokens = _batch_counts(batch)
            self.samples += samples
            self.tokens += tokens

    def step_done(self, grad_norm, learning_rate: float, data_wait: float, busy: float):
        self.steps += 1
        self.last_grad_norm, self.last_learning_rate = grad_norm, learning_rate
        self.data_wait += data_wait
        self.busy += busy

    def flush(self, ctx) -> dict:
        """The log record since the last flush (empty if no step ran), with `rank_stats` for every rank.
        One all-reduce carries both the sums and each rank's own figures (a row per rank, zeros elsewhere)."""
        rows = torch.zeros((ctx.world_size, len(RANK_FIGURES)), dtype=torch.float64, device=self.device)
        rows[ctx.rank] = torch.tensor(self._rank_figures(), dtype=torch.float64)
        sums = torch.stack([self.loss, *(torch.tensor(float(v), dtype=torch.float64, device=self.device)
                                         for v in (self.samples, self.tokens, self.steps, self.flos))])
        reduced = ctx.all_reduce_sum(torch.cat([sums, rows.flatten()])).tolist()
        loss_sum, samples, tokens, steps, flos = reduced[:5]
        figures = reduced[5:]
        ranks = [{"rank": r, **{name: round(figures[r * len(RANK_FIGURES) + i], 5)
                                for i, name in enumerate(RANK_FIGURES)}} for r in range(ctx.world_size)]
        steps /= ctx.world_size
        self.total = [self.total[0] + loss_sum, self.total[1] + samples, self.total[2] + steps]
        self.loss.zero_()
        self.samples = self.tokens = self.steps = 0
        self.flos = 0.0
        self.data_wait = self.busy = 0.0
        now = time.time()
        elapsed, self.last_time = now - self.last_time, now
        if steps == 0:
            return {"flos": flos} if flos else {}
        logs = {"loss": loss_sum / steps}
        if self.last_grad_norm is not None:
            logs["grad_norm"] = float(self.last_grad_norm)
        logs["learning_rate"] = self.last_learning_rate
        logs["train_samples_per_second"] = round(samples / max(elapsed, 1e-9), 3)
        if tokens:
            logs["train_tokens_per_second"] = round(tokens / max(elapsed, 1e-9), 3)
        return {"logs": logs, "rank_stats": ranks, "flos": flos}

    def _rank_figures(self) -> list:
        steps = max(self.steps, 1)
        return [self.busy / steps, self.data_wait / steps, self.samples / max(self.busy, 1e-9),
                _memory_mb(self.device)]

    def totals(self, ctx) -> dict:
        last = self.flush(ctx)  # fold in what was not logged yet
        loss_sum, samples, steps = self.total
        return {"loss_sum": loss_sum, "samples": samples, "steps": steps, "flos": last.get("flos", 0.0)}


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
