"""Hugging Face's `fsdp` / `fsdp_config` arguments, checked and reduced to the few options FSDP2 has.

Pure Python (no torch import): `TrainingArguments` normalises these at construction, on the driver
(arguments/normalise.py), into the dict `strategy/fsdp.py` reads.

    fsdp="full_shard auto_wrap"          -> strategy "fsdp", reshard after forward (ZeRO-3)
    fsdp="shard_grad_op auto_wrap"       -> strategy "fsdp", keep parameters unsharded after forward (ZeRO-2)
    fsdp="full_shard offload auto_wrap"  -> as full_shard, parameters and optimizer state on the CPU
    fsdp_config={"transformer_layer_cls_to_wrap": ["GPT2Block"], "reshard_after_forward": True,
                 "cpu_offload": False}
    fsdp_config={"fsdp_transformer_layer_cls_to_wrap": "GPT2Block", "fsdp_sharding_strategy": "FULL_SHARD",
                 "fsdp_offload_params": False, "fsdp_state_dict_type": "SHARDED_STATE_DICT"}   (accelerate's)
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from ..errors import ConfigError
from .json_text import parse_json_object

FSDP_OPTIONS = ("full_shard", "shard_grad_op", "offload", "auto_wrap")
# Keys we act on, in transformers' spelling; accelerate's config files prefix them with "fsdp_" and name a few
# differently (RENAMED). transformers accepts both spellings, so do we.
CONFIG_KEYS = ("transformer_layer_cls_to_wrap", "reshard_after_forward", "cpu_offload", "activation_checkpointing",
               "version")
RENAMED = {"offload_params": "cpu_offload"}
# Keys whose value must be what FSDP2 here always does (else a ConfigError naming the key): value -> accepted.
FIXED = {"auto_wrap_policy": ("TRANSFORMER_BASED_WRAP",), "min_num_params": (0, "0"),
         "state_dict_type": ("SHARDED_STATE_DICT", "FULL_STATE_DICT"), "cpu_ram_efficient_loading": (False,),
         "xla": (False,), "xla_fsdp_v2": (False,), "xla_fsdp_grad_ckpt": (False,)}
WHY_FIXED = {
    "auto_wrap_policy": "FSDP2 here shards each block (transformer_layer_cls_to_wrap, else the model's "
                        "_no_split_modules / transformer layers); drop the key",
    "min_num_params": "size-based wrapping is not available; list block classes in transformer_layer_cls_to_wrap",
    "state_dict_type": "checkpoints are sharded (torch.distributed.checkpoint), save_model() writes the full model",
    "cpu_ram_efficient_loading": "the weights travel once through Ray's object store to every worker; drop it",
    "xla": "there is no XLA support; drop it", "xla_fsdp_v2": "there is no XLA support; drop it",
    "xla_fsdp_grad_ckpt": "there is no XLA support; drop it",
}
# accelerate's sharding strategies: the two FSDP2 has, as reshard_after_forward.
SHARDING = {"FULL_SHARD": True, "1": True, "SHARD_GRAD_OP": False, "2": False}
# FSDP1 options that FSDP2 does not have; transformers ignores them too under FSDP2 (with version 2).
FSDP1_ONLY = ("backward_prefetch", "forward_prefetch", "use_orig_params", "sync_module_states",
              "limit_all_gathers")
# What a bad fsdp_config text should have been (json_text's message ends "write <this>.").
CONFIG_EXAMPLE = ("a JSON object such as '{\"transformer_layer_cls_to_wrap\": [\"GPT2Block\"]}', or the path of a "
                  "JSON file")


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
    """`fsdp_config` (dict, JSON text or a JSON file path, as HF) in transformers' or accelerate's spelling,
    merged with the `fsdp` options."""
    config = _as_dict(config)
    out: dict = {}
    for key, value in config.items():
        name = key[len("fsdp_"):] if key.startswith("fsdp_") else key
        name = RENAMED.get(name, name)
        if name == "sharding_strategy":
            out.setdefault("reshard_after_forward", _sharding(key, value))
        elif name in FSDP1_ONLY:
            warnings.warn(f"fsdp_config[{key!r}] is an FSDP1 option that FSDP2 does not have: ignored, as "
                          "transformers does under FSDP2.", stacklevel=6)  # the user's TrainingArguments(...)
        elif name in FIXED:
            if _plain(value) not in FIXED[name]:
                raise ConfigError(f"fsdp_config[{key!r}]={value!r} is not supported: {WHY_FIXED[name]}.")
        elif name == "xla_fsdp_settings":
            if value:
                raise ConfigError(f"fsdp_config[{key!r}] is not supported: {WHY_FIXED['xla']}.")
        elif name in CONFIG_KEYS:
            out[name] = value
        else:
            raise ConfigError(f"fsdp_config has an unknown key {key!r}; supported: {', '.join(CONFIG_KEYS)} (also "
                              "with accelerate's fsdp_ prefix, and fsdp_offload_params, fsdp_sharding_strategy).")
    wrap = out.get("transformer_layer_cls_to_wrap")
    if isinstance(wrap, str):
        wrap = [w.strip() for w in wrap.split(",") if w.strip()]
    if wrap is not None and (not isinstance(wrap, (list, tuple)) or not all(isinstance(w, str) for w in wrap)):
        raise ConfigError(f"fsdp_config['transformer_layer_cls_to_wrap']={wrap!r} must be a list of class names, "
                          "e.g. ['GPT2Block'].")
    out["transformer_layer_cls_to_wrap"] = list(wrap) if wrap else None
    if isinstance(out.get("reshard_after_forward"), str) and out["reshard_after_forward"].upper() in SHARDING:
        out["reshard_after_forward"] = SHARDING[out["reshard_after_forward"].upper()]  # FSDP1's spelling
    for name in ("reshard_after_forward", "cpu_offload", "activation_checkpointing"):
        if name in out:
            out[name] = _plain(out[name])
            if not isinstance(out[name], bool):
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


def _as_dict(config: Any) -> dict:
    if isinstance(config, str):
        if os.path.isfile(config):
            try:
                with open(config, encoding="utf-8") as f:
                    text = f.read()
            except OSError as exc:
                raise ConfigError(f"fsdp_config={config!r}: the file cannot be read ({exc}).") from None
            config = parse_json_object(text, "fsdp_config", example=CONFIG_EXAMPLE, shown=f"{config!r} (a file)")
        else:
            config = parse_json_object(config, "fsdp_config", example=CONFIG_EXAMPLE)
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ConfigError(f"fsdp_config={config!r} must be a dict (or a JSON file / JSON object).")
    return config


def _plain(value: Any) -> Any:
    """accelerate's YAML writes booleans as 'true'/'false' at times, and transformers reads them as such."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def _sharding(key: str, value: Any) -> bool:
    text = str(value).upper()
    if text not in SHARDING:
        raise ConfigError(f"fsdp_config[{key!r}]={value!r} is not supported: FSDP2 shards over all workers, as "
                          "FULL_SHARD (reshard after forward) or SHARD_GRAD_OP (keep parameters until backward); "
                          "for no sharding use strategy='ddp'.")
    return SHARDING[text]

