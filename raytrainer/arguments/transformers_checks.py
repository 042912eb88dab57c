"""The transformers fields that `TrainingArguments` gained for transformers' scripts: their
spellings brought to one form, then checked. Called from `TrainingArguments.__post_init__`.

What each field means is transformers_fields.py's table; this module only makes values consistent and turns
impossible ones into a `ConfigError` naming the fix, on the driver, before anything starts.
"""

from __future__ import annotations

import json

from ..errors import ConfigError
from .transformers_fields import refuse_unsupported

# Fields whose command-line form is JSON text (transformers parses these the same way).
JSON_DICT_FIELDS = ("resources_per_worker", "storage_options", "liger_kernel_config",
                    "activation_checkpointing_kwargs", "gradient_checkpointing_kwargs")
# Keys of activation_checkpointing_kwargs that transformers 5 takes out for itself; not implemented here.
CHECKPOINTING_OWN_KEYS = ("every_n_layers", "offload")
# transformers' AcceleratorConfig() defaults: a config holding only these asks for nothing raytrainer lacks.
ACCELERATOR_DEFAULTS = {"split_batches": False, "dispatch_batches": None, "even_batches": True,
                        "use_seedable_sampler": True, "non_blocking": False, "gradient_accumulation_kwargs": None,
                        "use_configured_state": False}


def normalise_hf_fields(args) -> None:
    for name in JSON_DICT_FIELDS:
        value = getattr(args, name)
        if isinstance(value, str):
            setattr(args, name, _json_object(name, value))
    # transformers 5: gradient_checkpointing* are aliases of activation_checkpointing*, used when the new name is
    # unset; afterwards both hold the same value, so code reading either name agrees.
    for old, new in (("gradient_checkpointing", "activation_checkpointing"),
                     ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs")):
        if getattr(args, new) is None and getattr(args, old) is not None:
            setattr(args, new, getattr(args, old))
        setattr(args, old, getattr(args, new))
    if args.activation_checkpointing is None:
        args.activation_checkpointing = args.gradient_checkpointing = False
    if isinstance(args.include_num_input_tokens_seen, bool):
        args.include_num_input_tokens_seen = "all" if args.include_num_input_tokens_seen else "no"
    if args.use_cpu:
        if args.use_gpu:
            raise ConfigError("use_cpu=True and use_gpu=True: choose one (use_cpu=True means workers without GPUs).")
        args.use_gpu = False
    if args.group_by_length:  # transformers 4's spelling
        if args.train_sampling_strategy not in ("random", "group_by_length"):
            raise ConfigError(f"group_by_length=True and train_sampling_strategy={args.train_sampling_strategy!r}: "
                              "choose one (train_sampling_strategy='group_by_length' is the same as the flag).")
        args.train_sampling_strategy = "group_by_length"
    args.group_by_length = args.train_sampling_strategy == "group_by_length"
    if args.debug in (None, [], ()):  # transformers' other spellings of "no debug option"
        args.debug = ""
    config = args.accelerator_config  # transformers' own default, AcceleratorConfig(), says nothing either
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    if isinstance(config, dict) and {**ACCELERATOR_DEFAULTS, **config} == ACCELERATOR_DEFAULTS:
        args.accelerator_config = None
    if not args.do_eval and args.eval_strategy != "no":  # as transformers: evaluating during training is eval
        args.do_eval = True


def validate_hf_fields(args) -> None:
    from .training_args import DDP_BACKENDS, HUB_STRATEGIES, MP_CONTEXTS, SAMPLING_STRATEGIES, TOKEN_COUNTS

    refuse_unsupported(args)
    _one_of(args, "include_num_input_tokens_seen", TOKEN_COUNTS)
    _one_of(args, "hub_strategy", HUB_STRATEGIES)
    _one_of(args, "train_sampling_strategy", SAMPLING_STRATEGIES)
    if args.train_sampling_strategy == "batch_rebalance":
        raise ConfigError("train_sampling_strategy='batch_rebalance' is not supported: use 'group_by_length' "
                          "(batches of similar lengths) or 'random'.")
    if args.dataloader_multiprocessing_context is not None:
        _one_of(args, "dataloader_multiprocessing_context", MP_CONTEXTS)
    for name in ("torch_empty_cache_steps", "dataloader_prefetch_factor", "ddp_bucket_cap_mb", "ddp_timeout"):
        value = getattr(args, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            unset = " (seconds)." if name == "ddp_timeout" else " (or None)."
            raise ConfigError(f"{name}={value!r} must be a positive int{unset}")
    if args.dataloader_prefetch_factor is not None and args.dataloader_num_workers == 0:
        raise ConfigError("dataloader_prefetch_factor is set but dataloader_num_workers=0: prefetching needs "
                          "DataLoader worker processes; set dataloader_num_workers > 0 or drop it.")
    if args.dataloader_persistent_workers and args.dataloader_num_workers == 0:
        raise ConfigError("dataloader_persistent_workers=True but dataloader_num_workers=0: there are no DataLoader "
                          "worker processes to keep; set dataloader_num_workers > 0 or drop it.")
    if not isinstance(args.length_column_name, str) or not args.length_column_name:
        raise ConfigError(f"length_column_name={args.length_column_name!r} must be a column name.")
    kwargs = args.activation_checkpointing_kwargs or {}
    own = [k for k in CHECKPOINTING_OWN_KEYS if k in kwargs]
    if own:
        raise ConfigError(f"activation_checkpointing_kwargs {own} are not supported: every block is checkpointed "
                          "(drop the key), or turn checkpointing off for speed.")
    if args.tf32 and (args.use_gpu is False or (args.max_workers == 0 and not args.use_gpu)):
        raise ConfigError("tf32=True needs GPU workers (Ampere or newer): set use_gpu=True, or drop tf32.")
    if args.ddp_backend is not None:
        _check_backend(args, DDP_BACKENDS)


def _check_backend(args, known: tuple) -> None:
    _one_of(args, "ddp_backend", known)
    if args.use_gpu is None and args.max_workers > 0:
        raise ConfigError(f"ddp_backend={args.ddp_backend!r}: Ray Train picks the backend from use_gpu (nccl with "
                          "GPUs, gloo without); set use_gpu to match, or drop ddp_backend.")
    expected = "nccl" if args.use_gpu else "gloo"
    if args.ddp_backend != expected:
        raise ConfigError(f"ddp_backend={args.ddp_backend!r} with use_gpu={args.use_gpu}: Ray Train sets up "
                          f"{expected!r} for these workers; drop ddp_backend (or use ddp_backend={expected!r}).")


def _one_of(args, name: str, allowed: tuple) -> None:
    value = getattr(args, name)
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not supported; choose one of: {', '.join(map(str, allowed))}.")


def _json_object(name: str, text: str):
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{name}={text!r} is not valid JSON ({e}); write a JSON object such as "
                          "'{\"key\": 1}'.") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{name}={text!r} must be a JSON object (a dict).")
    return value
