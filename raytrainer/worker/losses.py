"""Losses the trainer computes itself instead of the model: label smoothing (HF's `LabelSmoother`)."""

from __future__ import annotations

from typing import Optional

import torch

from ..data.columns import IGNORE_INDEX


def label_smoothed_loss(logits: torch.Tensor, labels: torch.Tensor, epsilon: float,
                        num_items_in_batch: Optional[int] = None, shift_labels: bool = False) -> torch.Tensor:
    """(1 - epsilon) * NLL + epsilon * mean NLL over all classes, over label items that are not -100.

    Normalised by `num_items_in_batch` when given (a share of the global batch), else by this batch's items,
    exactly as Hugging Face's `LabelSmoother`."""
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    if shift_labels:
        logits, labels = logits[..., :-1, :].contiguous(), labels[..., 1:].contiguous()
    log_probs = -torch.nn.functional.log_softmax(logits.float(), dim=-1)
    if labels.dim() == log_probs.dim() - 1:
        labels = labels.unsqueeze(-1)
    padding = labels.eq(IGNORE_INDEX)
    nll = log_probs.gather(dim=-1, index=torch.clamp(labels, min=0)).masked_fill(padding, 0.0)
    smoothed = log_probs.sum(dim=-1, keepdim=True, dtype=torch.float32).masked_fill(padding, 0.0)
    items = num_items_in_batch if num_items_in_batch is not None else int(padding.numel() - padding.sum())
    nll, smoothed = nll.sum() / max(items, 1), smoothed.sum() / (max(items, 1) * log_probs.shape[-1])
    return (1 - epsilon) * nll + epsilon * smoothed
