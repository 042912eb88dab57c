"""Which submodules are the model's repeated blocks: the units FSDP shards and activation checkpointing
recomputes.

In order: the class names the user gives (`fsdp_config["transformer_layer_cls_to_wrap"]`, HF's key); a
transformers model's `_no_split_modules`; `nn.TransformerEncoderLayer` / `nn.TransformerDecoderLayer`
instances; else the children of the model's largest `nn.ModuleList`.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from torch import nn

from ..errors import ConfigError

_TORCH_BLOCKS = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)


def find_blocks(model: nn.Module, class_names: Optional[Sequence[str]] = None) -> List[nn.Module]:
    """The blocks, innermost first (nested blocks must be wrapped before the blocks holding them)."""
    names = class_names or getattr(model, "_no_split_modules", None)
    modules = [m for _, m in model.named_modules() if m is not model]
    if names:
        found = [m for m in modules if type(m).__name__ in set(names)]
    else:
        found = [m for m in modules if isinstance(m, _TORCH_BLOCKS)]
        if not found:
            lists = [m for m in modules + [model] if isinstance(m, nn.ModuleList) and len(m)]
            found = list(max(lists, key=len)) if lists else []
    return list(reversed(found))


def unmatched_class_names(model: nn.Module, class_names: Sequence[str]) -> List[str]:
    present = {type(m).__name__ for m in model.modules()}
    return [name for name in class_names if name not in present]


def block_class_names(model: nn.Module) -> List[str]:
    """Class names of the model's submodules that repeat: what a user would likely list as blocks."""
    counts: dict = {}
    for m in model.modules():
        if m is not model and list(m.children()):
            counts[type(m).__name__] = counts.get(type(m).__name__, 0) + 1
    return sorted(name for name, n in counts.items() if n > 1 and name not in ("ModuleList", "Sequential"))


def check_wrap_classes(model: nn.Module, class_names: Optional[Sequence[str]]):
    """Class names that match no module are a mistake (a typo, another model's block): FSDP would silently
    shard the whole model as one unit. Checked on the driver when it has the model, and on each worker."""
    missing = unmatched_class_names(model, class_names or [])
    if missing:
        suggestions = block_class_names(model)
        raise ConfigError(f"fsdp_config['transformer_layer_cls_to_wrap'] names {missing}, which match no module of "
                          f"{type(model).__name__}: list the class names of its repeated blocks"
                          + (f" (e.g. {suggestions})" if suggestions else "") + ", or drop the key to wrap the "
                          "model's own _no_split_modules / transformer layers.")
