"""What the loop measures between two logs: the loss, samples, tokens and estimated model FLOPs (reduced
over ranks), and each rank's own figures (step time, time waiting for data, throughput, memory) so a
straggler is visible.

The micro-batches' losses are kept as they are, no device operation and no sync per step, and summed on the
host every FOLD_MICRO_STEPS micro-batches and at each log; the counts come from the CPU batch, so they are plain
numbers. Everything is reduced only when logging, in one all-reduce. Throughput is over the wall time since
the previous log (evaluation and saving in between included, as torchtitan), so
train_tokens_per_second x train_step_time_s = train_tokens_per_step. The keys: docs/callbacks.md.
"""

from __future__ import annotations

import math
import resource
import sys
import time
from typing import Optional

import torch

from .throughput import ModelFlops

# How many micro-batch losses the meter keeps before summing them (one host read per that many).
FOLD_MICRO_STEPS = 256

# Each rank's own figures since the last log, in the order `_rank_figures` returns them.
RANK_FIGURES = ("step_time_s", "data_wait_s", "samples_per_second", "tokens_per_second", "memory_mb")


class Meter:
    def __init__(self, device, nan_inf_filter: bool = False, model_flops: Optional[ModelFlops] = None,
                 peak_flops: Optional[float] = None):
        self.device = device
        self.model_flops = model_flops  # None: no FLOP/s or MFU keys
        self.peak_flops = peak_flops  # this device's peak FLOP/s; None: unknown, no MFU key
        self.estimated_flops = 0.0  # model FLOPs of this rank's batches since the last log (throughput.py)
        self.nan_inf_filter = nan_inf_filter  # logging_nan_inf_filter: see add_micro
        self.loss = 0.0  # this rank's loss since the last log: the kept losses are summed into it
        self._kept: list = []  # (a micro-batch's loss tensor, steps done since the last log when it was added)
        self.samples = self.tokens = self.steps = 0
        self.flos = 0.0  # transformers' estimate (Trainer.floating_point_ops), summed over ranks when logging
        self.data_wait = self.busy = 0.0  # this rank's seconds since the last log
        self.total = [0.0, 0.0, 0.0]  # loss, samples, steps: all ranks, whole run
        self.last_grad_norm = self.last_learning_rate = None
        self.last_time = time.time()
        if device.type == "cuda":  # this run's peak: a kept worker group's earlier jobs do not count
            torch.cuda.reset_peak_memory_stats(device)

    def add_micro(self, loss, batch: dict, weight: float, flos: float = 0.0):
        self._kept.append((loss, self.steps))
        if len(self._kept) >= FOLD_MICRO_STEPS:
            self._sum_kept()
        self.flos += flos
        if weight:
            samples, tokens = _batch_counts(batch)
            self.samples += samples
            self.tokens += tokens
            if self.model_flops is not None:
                self.estimated_flops += self.model_flops.batch(samples, tokens, _seq_len(batch))

    def _sum_kept(self):
        """Add the kept losses to `loss` in order, in float64 (one host read). A NaN/Inf loss counts as the
        average since the last log with logging_nan_inf_filter, transformers' rule."""
        if not self._kept:
            return
        values = host_values([loss for loss, _ in self._kept])
        for value, (_, steps) in zip(values, self._kept):
            if self.nan_inf_filter and not math.isfinite(value):
                value = self.loss / (1 + steps)
            self.loss += value
        self._kept = []

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
        self._sum_kept()
        # The peaks ride along: their sum is the group's peak, and `known` says whether every rank knew its own.
        counts = (self.loss, self.samples, self.tokens, self.steps, self.flos, self.estimated_flops,
                  self.peak_flops or 0.0, 1.0 if self.peak_flops else 0.0)
        sums = torch.tensor([float(v) for v in counts], dtype=torch.float64, device=self.device)
        reduced = ctx.all_reduce_sum(torch.cat([sums, rows.flatten()])).tolist()
        loss_sum, samples, tokens, steps, flos, model_flops, peak, known = reduced[:8]
        figures = reduced[8:]
        ranks = [{"rank": r, **{name: round(figures[r * len(RANK_FIGURES) + i], 5)
                                for i, name in enumerate(RANK_FIGURES)}} for r in range(ctx.world_size)]
        steps /= ctx.world_size
        self.total = [self.total[0] + loss_sum, self.total[1] + samples, self.total[2] + steps]
        self.loss = 0.0
        self.samples = self.tokens = self.steps = 0
        self.flos = self.estimated_flops = 0.0
        self.data_wait = self.busy = 0.0
        now = time.time()
        elapsed, self.last_time = now - self.last_time, now
        if steps == 0:
            return {"flos": flos} if flos else {}
        logs = {"loss": loss_sum / steps}
        if self.last_grad_norm is not None:
            logs["grad_norm"] = float(self.last_grad_norm)
        logs["learning_rate"] = self.last_learning_rate
        logs.update(_throughput(max(elapsed, 1e-9), steps, samples, tokens, model_flops, ctx.world_size,
                                peak if known == ctx.world_size else None))
        logs["peak_memory_mb"] = max(r["memory_mb"] for r in ranks)
        return {"logs": logs, "rank_stats": ranks, "flos": flos}

    def _rank_figures(self) -> list:
        steps = max(self.steps, 1)
        busy = max(self.busy, 1e-9)
        return [self.busy / steps, self.data_wait / steps, self.samples / busy, self.tokens / busy,
                _memory_mb(self.device)]

    def totals(self, ctx) -> dict:
        last = self.flush(ctx)  # fold in what was not logged yet
        loss_sum, samples, steps = self.total
        return {"loss_sum": loss_sum, "samples": samples, "steps": steps, "flos": last.get("flos", 0.0)}


def host_values(losses: list) -> list:
    """Loss tensors (0-d or one element, any float dtype, on the device) as float64 host numbers: one read."""
    return torch.cat([loss.reshape(1).to(torch.float64) for loss in losses]).tolist()


def _throughput(elapsed: float, steps: float, samples: float, tokens: float, model_flops: float,
                world_size: int, peak: Optional[float]) -> dict:
    """The log record's throughput keys, named as transformers (train_*_per_second) and torchtitan (tflops,
    mfu) name theirs. Step time and tokens per step stay unrounded: tokens/s x step time = tokens per step."""
    out = {"train_step_time_s": elapsed / steps, "train_samples_per_second": round(samples / elapsed, 3)}
    if tokens:
        out.update(train_tokens_per_second=round(tokens / elapsed, 3), train_tokens_per_step=tokens / steps,
                   train_tokens_per_second_per_device=round(tokens / elapsed / world_size, 3))
    if model_flops:
        out["train_tflops_per_device"] = _significant(model_flops / elapsed / world_size / 1e12)
        if peak:  # the sum of the ranks' peaks
            out["train_mfu_percent"] = _significant(100 * model_flops / elapsed / peak)
    return out


def _significant(value: float, digits: int = 6) -> float:
    """Rounded to significant digits: a tiny model's TFLOP/s (1e-6) must not round to 0."""
    return float(f"{value:.{digits}g}")


def _memory_mb(device) -> float:
    """Peak memory of this rank: on a GPU, torch.cuda.max_memory_allocated (tensors only, not the caching
    allocator's reserve) since the run started; on CPU, the process's max RSS (everything the process holds,
    since the process started: it cannot be reset)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


def _seq_len(batch: dict) -> int:
    """A token batch's (padded) sequence length, for the attention FLOPs; 0 without a 2-d input."""
    for key in ("input_ids", "attention_mask"):
        value = batch.get(key)
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            return int(value.shape[1])
    return 0


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
