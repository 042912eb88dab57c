"""Hugging Face's `fsdp` / `fsdp_config` arguments, checked and reduced to the few options FSDP2 has.

Pure Python (no torch import): `TrainingArguments` validates these at construction, on the driver.

    fsdp="full_shard auto_wrap"          -> strategy "fsdp", reshard after forward (ZeRO-3)
    fsdp="shard_grad_op auto_wrap"       -> strategy "fsdp", keep parameters unsharded after forward (ZeRO-2)
    fsdp="full_shard offload auto_wrap"  -> as full_shard, parameters and optimizer state on the CPU
    fsdp_config={"transformer_layer_cls_to_wrap": ["GPT2Block"], "reshard_after_forward": True,
                 "cpu_offload": False}
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from ..errors import ConfigError

FSDP_OPTIONS = ("full_shard", "shard_grad_op", "offload", "auto_wrap")
# Keys we act on. HF also writes them with an "fsdp_" prefix (accelerate's config files); both are accepted.
CONFIG_KEYS = ("transformer_layer_cls_to_wrap", "reshard_after_forward", "cpu_offload", "activation_checkpointing",
               "version")


def parse_fsdp(value: Any) -> list:
    """HF's `fsdp` argument (a space-separated string, a list of options, True or False) as a list."""
    if value in (None, False, "", []):
        return []
    if value is True:
        return ["full_shard", "auto_wrap"]
    options = value.split() if isinstance(value, str) else list(value)
    unknown = [o for o in options if o not in FSDP_OPTIONS]
    if unknown:
        raise ConfigError(f"fsdp={value!r}: {unknown[0]!r} is not supported; combine {', '.join(FSDP_OPTIONS)} "
                          "(e.g. fsdp='full_shard auto_wrap'). FSDP2 shards over all workers: hybrid_shard and "
                          "no_shard have no equivalent here (use strategy='ddp' for no sharding).")
    if "full_shard" in options and "shard_grad_op" in options:
        raise ConfigError(f"fsdp={value!r}: choose one of full_shard and shard_grad_op.")
    return options


def normalise_config(config: Any, fsdp_options: list) -> dict:
    """`fsdp_config` (dict, JSON text or a JSON file path, as HF) merged with the `fsdp` options."""
    if config is None:
        config = {}
    if isinstance(config, str):
        try:
            if os.path.isfile(config):
                with open(config) as f:
                    config = json.load(f)
            else:
                config = json.loads(config)
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"fsdp_config={config!r} is neither a JSON file nor a JSON object ({exc}).") \
                from None
    if not isinstance(config, dict):
        raise ConfigError(f"fsdp_config={config!r} must be a dict (or a JSON file / JSON object).")
    out: dict = {}
    for key, value in config.items():
        name = key[len("fsdp_"):] if key.startswith("fsdp_") else key
        if name not in CONFIG_KEYS:
            raise ConfigError(f"fsdp_config has an unknown key {key!r}; supported: {', '.join(CONFIG_KEYS)}.")
        out[name] = value
    wrap = out.get("transformer_layer_cls_to_wrap")
    if isinstance(wrap, str):
        wrap = [w.strip() for w in wrap.split(",") if w.strip()]
    if wrap is not None and (not isinstance(wrap, (list, tuple)) or not all(isinstance(w, str) for w in wrap)):
        raise ConfigError(f"fsdp_config['transformer_layer_cls_to_wrap']={wrap!r} must be a list of class names, "
                          "e.g. ['GPT2Block'].")
    out["transformer_layer_cls_to_wrap"] = list(wrap) if wrap else None
    for name in ("reshard_after_forward", "cpu_offload", "activation_checkpointing"):
        if name in out and not isinstance(out[name], bool):
            raise ConfigError(f"fsdp_config[{name!r}]={out[name]!r} must be true or false.")
    if out.get("version", 2) not in (2, "2"):
        raise ConfigError(f"fsdp_config['version']={out['version']!r}: only FSDP2 is supported; drop the key or "
                          "set it to 2.")
    out.pop("version", None)
    # The fsdp string's options fill in what the config does not say.
    out.setdefault("reshard_after_forward", "shard_grad_op" not in fsdp_options)
    out.setdefault("cpu_offload", "offload" in fsdp_options)
    out.setdefault("activation_checkpointing", False)
    return out


def wrap_classes(config: Optional[dict]) -> Optional[list]:
    return (config or {}).get("transformer_layer_cls_to_wrap")
