"""What the model's forward accepts, which batch keys are labels, and how many label items a batch holds."""

from __future__ import annotations

import functools
import inspect
import sys
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
    """Whether the model normalises its own loss by a `num_items_in_batch` it is given.

    Only a model that says so: an `accepts_loss_kwargs` attribute (HF's switch), or a forward with a named
    `num_items_in_batch` parameter. A bare `**kwargs` is not taken as a yes, as transformers' Trainer takes it:
    transformers 5 gives nearly every model `**kwargs`, and BERT-family heads then ignore the count and return
    their own mean, which that rule scales by the world size (2x the loss and gradients on 2 workers). Every
    other model's own mean is rescaled by its label items instead (`compute_loss`), which is exact for both
    kinds of model."""
    if hasattr(model, "accepts_loss_kwargs"):
        return bool(model.accepts_loss_kwargs)
    names, _ = forward_signature(model)
    return "num_items_in_batch" in names


def loss_shifts_labels(model: nn.Module) -> bool:
    """Whether the model's loss predicts label[i + 1] at position i (a decoder-only LM), so that the first
    label of each row is never a target and is not counted. transformers decides it from `loss_type` alone,
    which GPT-2 leaves unset (its counts are then (L-1)/L too high); here the loss function the model really
    uses (its `loss_type`) or its class name decides. Encoder-decoders feed right-shifted
    decoder inputs: every label is a target."""
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return False
    name = type(model).__name__
    if name.endswith("ForCausalLM") or name.endswith("LMHeadModel"):
        return True
    if "transformers" not in sys.modules:  # no transformers model here: skip its loss module's import
        return False
    try:
        from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss
    except ImportError:
        return False
    return LOSS_MAPPING.get(getattr(model, "loss_type", None)) is ForCausalLMLoss


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
    """Wraps a collator so it only sees the keys the model accepts (`remove_unused_columns`). `reads_only`: the
    collator never writes to the examples it is given (DefaultCollator), so examples with nothing to drop pass
    as they are; any other collator gets copies, as transformers' does, so a dataset's own rows stay intact."""

    def __init__(self, collator, keep: Iterable[str], reads_only: bool = False):
        self.collator = collator
        self.keep = frozenset(keep) | frozenset(LABEL_ALIASES)
        self.reads_only = reads_only

    def __call__(self, features):
        keep = self.keep
        if self.reads_only and all(f.keys() <= keep for f in features):
            return self.collator(features)  # a copy of each row per step costs the loop more than the step's ops
        return self.collator([{k: v for k, v in f.items() if k in keep} for f in features])


def dropped_label_columns(rows: list, batch: dict, label_names: Iterable[str]) -> List[Tuple[str, Any]]:
    """(label column, an example value) for each label column of the rows that the collated batch lacks: a
    collator drops what it cannot batch (DefaultCollator: text and None) without a word."""
    dropped = []
    for name in label_names:
        aliases = (name,) + (LABEL_ALIASES if name == "labels" else ())
        source = next((a for a in aliases if rows and isinstance(rows[0], dict) and a in rows[0]), None)
        if source is not None and name not in batch and source not in batch:
            dropped.append((source, rows[0][source]))
    return dropped


def label_items(batch: dict, label_names: Iterable[str], shift: bool = False) -> Optional[torch.Tensor]:
    """Label elements that count towards the loss (not IGNORE_INDEX), as a tensor on the labels' device (no
    host sync); None if the batch has no labels. `shift`: the model predicts the next label (a causal LM), so
    position 0 is no target; a collator's own `shift_labels` column is counted as it is."""
    total = None
    for name in label_names:
        labels = batch.get(name)
        if not isinstance(labels, torch.Tensor):
            continue
        if labels.is_floating_point():
            count = torch.tensor(labels.numel(), device=labels.device)
        else:
            shifted = batch.get("shift_labels")
            if isinstance(shifted, torch.Tensor):
                labels = shifted
            elif shift and labels.dim() > 1:
                labels = labels[..., 1:]
            count = labels.ne(IGNORE_INDEX).sum()
        total = count if total is None else total + count
    return total


def count_label_items(batch: dict, label_names: Iterable[str], shift: bool = False) -> Optional[int]:
    """`label_items` as a plain int (one host sync when the labels are on a GPU)."""
    items = label_items(batch, label_names, shift)
    return None if items is None else int(items)


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


def default_ignore_keys(model) -> list:
    """The outputs of `model` that are no predictions, as transformers' Trainer reads them: its config's
    `keys_to_ignore_at_inference` (transformers < 5.24: `["past_key_values"]` on generative models), else
    `["cache"]` for a model with a config (transformers >= 5.24 returns its generation cache under that name
    and dropped the attribute); nothing for a plain torch model."""
    config = getattr(model, "config", None)
    if config is None:
        return []
    return list(getattr(config, "keys_to_ignore_at_inference", ["cache"]))


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
