"""transformers' per-process options, applied on every worker (and in the driver process when num_workers=0):
the seed or full determinism, TF32, the periodic device-cache emptying, and the count of input tokens seen.

transformers applies these in the process that trains; here that is each Ray worker, so they are set where
the worker starts a job, not in the user's script.
"""

from __future__ import annotations

import os
import random
from typing import Optional

import numpy as np
import torch


def set_seed(seed: int):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def enable_full_determinism(seed: int):
    """transformers' `enable_full_determinism`: the seed, and deterministic kernels (slower)."""
    set_seed(seed)
    # Read by CUDA, cuBLAS and flash-attention when they start: effective for what starts after this.
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"
    os.environ["FLASH_ATTENTION_DETERMINISTIC"] = "1"
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


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
