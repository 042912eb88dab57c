"""`DefaultCollator`: a list of examples (dicts) to a batch of tensors, padding 1-D sequences to the longest.

It is HF's `default_data_collator` (label/label_ids -> labels, equal shapes stacked) plus the dynamic padding
of `DataCollatorWithPadding` for examples that are already tokenized, so a tokenized `datasets.Dataset` trains
without a tokenizer on the workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError
from .columns import LABEL_ALIASES


def pad_token_id_of(processing_class: Any) -> int:
    """The pad id of a tokenizer (or of a processor's tokenizer); 0 when there is none."""
    for owner in (processing_class, getattr(processing_class, "tokenizer", None)):
        pad = getattr(owner, "pad_token_id", None)
        if pad is not None:
            return int(pad)
    return 0


def _is_text(value: Any) -> bool:
    """True for values a model cannot take: strings, None, and (nested) lists or arrays of strings."""
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "USO"
    return value is None or isinstance(value, (str, bytes))


def _python_scalars(values: list):
    """One tensor for a column of plain python ints (int64) or floats (float32); None for anything else."""
    kind = type(values[0])
    if kind not in (int, float) or any(type(v) is not kind for v in values):
        return None
    return torch.tensor(values, dtype=torch.int64 if kind is int else torch.float32)


def _to_tensor(key: str, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        # As datasets' torch format does: numpy floats -> float32, ints -> int64, so the batch is the same
        # whichever format (python, numpy, torch) the dataset rows come in. A read-only array (a Ray Data
        # batch, zero-copy from the object store) is copied: torch would otherwise warn on every batch.
        readonly = isinstance(value, np.ndarray) and not value.flags.writeable
        tensor = torch.tensor(value) if readonly else torch.as_tensor(value)
        if tensor.is_floating_point():
            return tensor.to(torch.float32)
        if tensor.is_complex() or tensor.dtype == torch.bool:
            return tensor
        return tensor.to(torch.int64)
    if isinstance(value, (bool, int, float, list, tuple)):
        try:
            tensor = torch.tensor(value)
        except (TypeError, ValueError, RuntimeError) as e:
            raise ConfigError(f"collator: cannot make a tensor from {key!r} ({e}).") from None
        if tensor.is_floating_point():
            return tensor.to(torch.float32)  # python floats: float32 whatever the default dtype
        if tensor.numel() == 0 and isinstance(value, (list, tuple)):
            return tensor.to(torch.int64)  # an empty token list is still a token list
        return tensor
    raise ConfigError(f"collator: {key!r} holds a {type(value).__name__}, which DefaultCollator cannot batch; "
                      "drop the column (remove_unused_columns) or pass your own data_collator.")


@dataclass
class DefaultCollator:
    pad_token_id: int = 0
    label_pad_token_id: int = -100
    padding_side: str = "right"

    def __post_init__(self):
        if self.padding_side not in ("left", "right"):
            raise ConfigError(f"padding_side={self.padding_side!r} must be 'left' or 'right'.")

    def __call__(self, features: list) -> dict[str, torch.Tensor]:
        if not features:
            raise ConfigError("collator: got an empty list of examples.")
        rows = [self._rename_labels(f) for f in features]
        for row in rows[1:]:
            if row.keys() != rows[0].keys():
                odd = sorted(row.keys() ^ rows[0].keys())
                raise ConfigError(f"collator: {odd} missing from some examples; every example needs the same keys.")
        batch: dict[str, torch.Tensor] = {}
        lengths = None
        for key in rows[0]:
            values = [row[key] for row in rows]
            scalar = _python_scalars(values)
            if scalar is not None:  # fast path: a column of python ints or floats (labels, ids)
                batch[key] = scalar
                continue
            if all(isinstance(v, torch.Tensor) for v in values):
                tensors = values  # a torch dataset's rows: no text check, nothing to convert
            else:
                text = [_is_text(v) for v in values]
                if all(text):
                    continue  # e.g. a raw "text" column next to its input_ids
                if any(text):
                    raise ConfigError(f"collator: {key!r} is a string or None in some examples and numeric in "
                                      "others.")
                tensors = [_to_tensor(key, v) for v in values]
            shape = tensors[0].shape
            if all(t.shape == shape for t in tensors):
                batch[key] = torch.stack(tensors)
            elif all(t.dim() == 1 for t in tensors):
                batch[key] = self._pad(tensors, self._pad_value(key))
                if key == "input_ids":
                    lengths = [len(t) for t in tensors]
            else:
                raise ConfigError(f"collator: {key!r} has shapes {[tuple(t.shape) for t in tensors]}; only 1-D "
                                  "sequences are padded, anything else must have one shape across examples.")
        if not batch:
            raise ConfigError(f"collator: no numeric values in the examples (keys: {list(rows[0])}); tokenize the "
                              "text first, or pass a data_collator that does.")
        if lengths is not None and "attention_mask" not in batch:
            # From the lengths, not from pad_token_id: the pad id may also be a real token (e.g. eos).
            batch["attention_mask"] = self._pad([torch.ones(n, dtype=torch.int64) for n in lengths], 0)
        return batch

    @staticmethod
    def _rename_labels(feature: Any) -> dict:
        if not isinstance(feature, Mapping):
            raise ConfigError(f"collator: examples must be dicts (column name -> value), got "
                              f"{type(feature).__name__}.")
        if feature.keys().isdisjoint(LABEL_ALIASES):
            return feature  # nothing to rename: read as it is, never written
        row = dict(feature)
        for alias in LABEL_ALIASES:
            if alias in row:
                if "labels" in row:
                    raise ConfigError(f"collator: an example has both {alias!r} and 'labels'; keep one.")
                row["labels"] = row.pop(alias)
        return row

    def _pad_value(self, key: str) -> int:
        if key == "labels":
            return self.label_pad_token_id
        if key.endswith("input_ids"):  # input_ids, decoder_input_ids
            return self.pad_token_id
        return 0  # attention_mask, token_type_ids, special_tokens_mask, ...

    def _pad(self, tensors: list[torch.Tensor], value: int) -> torch.Tensor:
        longest = max(len(t) for t in tensors)
        dtype = tensors[0].dtype
        for t in tensors[1:]:
            dtype = torch.promote_types(dtype, t.dtype)
        out = torch.full((len(tensors), longest), value, dtype=dtype)
        for i, t in enumerate(tensors):
            if self.padding_side == "right":
                out[i, :len(t)] = t
            else:
                out[i, longest - len(t):] = t
        return out
