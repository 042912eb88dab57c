"""What the model's forward accepts, which batch keys are labels, and how many label items a batch holds."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Iterable, List, Optional, Tuple

import torch
from torch import nn

IGNORE_INDEX = -100
LABEL_ALIASES = ("label", "label_ids")


def forward_signature(model: nn.Module) -> Tuple[List[str], bool]:
    """The forward's named parameters, and whether it also takes **kwargs."""
    forward = model.forward
    func = getattr(forward, "__func__", None)  # cache by the function: the loop asks on every step
    names, var_kw = _signature(func) if func is not None else _signature(forward, bound=True)
    return list(names), var_kw


@functools.lru_cache(maxsize=128)
def _signature(func, bound: bool = False) -> Tuple[Tuple[str, ...], bool]:
    params = list(inspect.signature(func).parameters.values())[0 if bound else 1:]
    names = tuple(p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
    return names, any(p.kind == p.VAR_KEYWORD for p in params)


def accepts_argument(func, name: str) -> bool:
    """Whether `func` takes an argument `name` (by that name or through **kwargs)."""
    names, var_kw = _signature(func)
    return var_kw or name in names


def default_label_names(model: nn.Module) -> List[str]:
    names, _ = forward_signature(model)
    return [n for n in names if "label" in n] or ["labels"]


def accepts_loss_kwargs(model: nn.Module) -> bool:
    """Whether the model normalises its own loss by `num_items_in_batch` (HF's rule)."""
    if hasattr(model, "accepts_loss_kwargs"):
        return bool(model.accepts_loss_kwargs)
    names, var_kw = forward_signature(model)
    return var_kw or "num_items_in_batch" in names


def dataset_columns(dataset: Any) -> Optional[List[str]]:
    """Column names of a `datasets.Dataset`, or the keys of a torch dataset's first item; None if unknown."""
    names = getattr(dataset, "column_names", None)
    if isinstance(names, list):
        return names
    try:
        first = dataset[0]
    except Exception:
        return None
    return list(first.keys()) if isinstance(first, dict) else None


class ColumnFilter:
    """Wraps a collator so it only sees the keys the model accepts (`remove_unused_columns`)."""

    def __init__(self, collator, keep: Iterable[str]):
        self.collator = collator
        self.keep = frozenset(keep) | frozenset(LABEL_ALIASES)

    def __call__(self, features):
        return self.collator([{k: v for k, v in f.items() if k in self.keep} for f in features])


def count_label_items(batch: dict, label_names: Iterable[str]) -> Optional[int]:
    """Label elements that count towards the loss (not IGNORE_INDEX); None if the batch has no labels."""
    total, found = 0, False
    for name in label_names:
        labels = batch.get(name)
        if isinstance(labels, torch.Tensor):
            found = True
            total += int(labels.ne(IGNORE_INDEX).sum()) if not labels.is_floating_point() else labels.numel()
    return total if found else None


def extract_loss(outputs: Any, input_keys: Iterable[str] = ()) -> torch.Tensor:
    """The loss from a model's outputs: a dict/ModelOutput key, an attribute, or a tuple's first element."""
    loss = None
    if isinstance(outputs, dict):
        loss = outputs.get("loss")
    elif hasattr(outputs, "loss"):
        loss = outputs.loss
    elif isinstance(outputs, (tuple, list)) and outputs and isinstance(outputs[0], torch.Tensor):
        loss = outputs[0]
    elif isinstance(outputs, torch.Tensor) and outputs.dim() == 0:
        loss = outputs
    if loss is None:
        keys = list(outputs.keys()) if isinstance(outputs, dict) else type(outputs).__name__
        raise ValueError(
            f"The model did not return a loss from the inputs, only: {keys}. The inputs it received were: "
            f"{', '.join(input_keys)}. Either give the dataset a label column the model's forward takes "
            "(see label_names), or pass compute_loss_func=... to the Trainer.")
    return loss


def extract_logits(outputs: Any, ignore_keys: Iterable[str] = ()) -> Any:
    """Everything the model returned except the loss (and `ignore_keys`); a single tensor when only one."""
    ignore = set(ignore_keys or ()) | {"loss"}
    if isinstance(outputs, dict):
        values = tuple(v for k, v in outputs.items() if k not in ignore and v is not None)
    elif isinstance(outputs, (tuple, list)):
        values = tuple(outputs[1:]) if outputs and outputs[0].dim() == 0 else tuple(outputs)
    elif isinstance(outputs, torch.Tensor):
        values = (outputs,)
    else:
        values = ()
    if not values:
        return None
    return values[0] if len(values) == 1 else values
