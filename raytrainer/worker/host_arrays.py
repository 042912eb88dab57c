"""Evaluation outputs on their way to the host: detached, as numpy, concatenated with their sequence axis padded.
Shared by the evaluation loop (`evaluation.py`) and the per-batch metrics (`batch_metrics.py`)."""

from __future__ import annotations

from typing import Any, List

import numpy as np
import torch

PAD = -100


def detached(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(detached(v) for v in value)
    return value.detach() if isinstance(value, torch.Tensor) else value


def to_numpy(value: Any) -> Any:
    """Predictions and labels as numpy arrays on the host; bfloat16 as float32 (numpy has no bfloat16), as
    transformers' Trainer hands them to compute_metrics."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        return type(value)(to_numpy(v) for v in value)
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            value = value.float()
        return value.numpy()
    return value


def concat_padded(parts: List[Any]) -> Any:
    """Concatenate along the first axis, padding the second axis (sequence length) with -100."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    if isinstance(parts[0], (tuple, list)):
        return type(parts[0])(concat_padded([p[i] for p in parts]) for i in range(len(parts[0])))
    if parts[0].ndim < 2 or all(p.shape[1:] == parts[0].shape[1:] for p in parts):
        return np.concatenate(parts, axis=0)
    width = max(p.shape[1] for p in parts)
    padded = []
    for p in parts:
        out = np.full((p.shape[0], width) + p.shape[2:], PAD, dtype=p.dtype)
        out[:, :p.shape[1]] = p
        padded.append(out)
    return np.concatenate(padded, axis=0)
