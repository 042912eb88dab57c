"""transformers' per-process options, applied on every worker (and in the driver process when num_workers=0):
the seed or full determinism, TF32, the periodic device-cache emptying, and the count of input tokens seen; and
`torch_flags_kept`, which ends a job's process-wide flags with the job.

transformers applies these in the process that trains; here that is each Ray worker, so they are set where
the worker starts a job, not in the user's script.
"""

from __future__ import annotations

import contextlib
import os
import random
from typing import Iterator, Optional

import numpy as np
import torch

# What transformers' enable_full_determinism sets in the environment.
DETERMINISM_ENV = {"CUDA_LAUNCH_BLOCKING": "1", "CUBLAS_WORKSPACE_CONFIG": ":16:8",
                   "FLASH_ATTENTION_DETERMINISTIC": "1"}


def set_seed(seed: int):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def enable_full_determinism(seed: int):
    """transformers' `enable_full_determinism`: the seed, and deterministic kernels (slower)."""
    set_seed(seed)
    # Read by CUDA, cuBLAS and flash-attention when they start: effective for what starts after this.
    os.environ.update(DETERMINISM_ENV)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


@contextlib.contextmanager
def torch_flags_kept() -> Iterator[None]:
    """A job's process-wide torch flags end with it: deterministic algorithms, cuDNN's determinism and
    benchmarking, TF32 and the float32 matmul precision are put back as they were before the job. A kept worker
    runs job after job (coordinator/group.py): without this, a job with full_determinism (or tf32) would leave
    the next job, which did not ask for it, on the slower deterministic kernels."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              cudnn.deterministic, cudnn.benchmark, matmul.allow_tf32, cudnn.allow_tf32,
              torch.get_float32_matmul_precision(), {k: os.environ.get(k) for k in DETERMINISM_ENV})
    try:
        yield
    finally:
        algorithms, warn_only, cudnn.deterministic, cudnn.benchmark, matmul.allow_tf32, cudnn.allow_tf32, \
            precision, env = before
        torch.use_deterministic_algorithms(algorithms, warn_only=warn_only)
        torch.set_float32_matmul_precision(precision)
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def setup_process(args, device: torch.device):
    """Seed (or full determinism) and TF32 for this process, before the model is built."""
    if args.full_determinism:
        enable_full_determinism(args.seed)
    else:
        set_seed(args.seed)
    if args.tf32 is not None:
        if args.tf32 and device.type != "cuda":
            raise RuntimeError(f"tf32=True, but this worker trains on {device}: TF32 needs Ampere or newer GPUs. "
                               "Set use_gpu=True on a cluster with such GPUs, or drop tf32.")
        torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)
        torch.backends.cudnn.allow_tf32 = bool(args.tf32)


def empty_cache_if_due(args, global_step: int, device: torch.device):
    """torch_empty_cache_steps: release the device's cached blocks every N optimizer steps."""
    every = args.torch_empty_cache_steps
    if not every or global_step % every:
        return
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()
    elif device.type == "xpu":
        torch.xpu.empty_cache()


def input_tokens(batch: dict, mode: str, main_input: str, pad_token_id: Optional[int]) -> int:
    """Input tokens of one micro-batch for include_num_input_tokens_seen, as transformers counts them: 'all'
    the main input's elements; 'non_padding' the attention mask's ones, else the non-pad ids."""
    ids = batch.get(main_input)
    if not isinstance(ids, torch.Tensor):
        return 0
    if mode == "non_padding":
        mask = batch.get("attention_mask")
        if isinstance(mask, torch.Tensor):
            return int(mask.sum())
        if pad_token_id is not None:
            return int((ids != pad_token_id).sum())
    return ids.numel()
