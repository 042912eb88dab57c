"""The global batch a run started with, kept when it resumes at another world size.

global batch = per_device_train_batch_size x gradient_accumulation_steps x world size. It is stored in the
trainer state at the first start (`stateful_callbacks["raytrainer"]["global_batch_size"]`); a run resumed
with M workers accumulates global / (per_device_train_batch_size x M) micro-batches per step, so every step
sees the same samples as before (the data position is already a global sample offset).
"""

from __future__ import annotations

from typing import Optional

from ..errors import ConfigError


def global_batch_size(args, world_size: int) -> int:
    return args.per_device_train_batch_size * args.gradient_accumulation_steps * world_size


def accumulation_to_keep(saved: Optional[dict], args, world_size: int) -> Optional[int]:
    """The gradient_accumulation_steps that keeps the saved run's global batch at `world_size`, or None when
    nothing needs to change (same world size, or a checkpoint that does not record its global batch).

    `saved` is the checkpoint's own trainer-state fields. Raises ConfigError when it cannot be kept."""
    saved = saved or {}
    total, saved_world = saved.get("global_batch_size"), saved.get("world_size")
    if not total or not saved_world or saved_world == world_size:
        return None
    per_step = args.per_device_train_batch_size * world_size
    if total % per_step:
        b = args.per_device_train_batch_size
        workers = [m for m in range(1, total // b + 1) if (total // b) % m == 0] if total % b == 0 else []
        sizes = [s for s in range(1, total // world_size + 1) if (total // world_size) % s == 0] \
            if total % world_size == 0 else []
        fixes = []
        if workers:
            fixes.append(f"resume with num_workers in {workers}")
        if sizes:
            fixes.append(f"set per_device_train_batch_size to one of {sizes}")
        raise ConfigError(
            f"Cannot keep the global batch when resuming at {world_size} workers: the run started with a global "
            f"batch of {total} samples ({saved_world} workers), which is not a multiple of "
            f"per_device_train_batch_size ({b}) x {world_size} workers = {per_step}. "
            + (" or ".join(fixes) + "." if fixes else "Start a new run instead of resuming."))
    accumulation = total // per_step
    return None if accumulation == args.gradient_accumulation_steps else accumulation
