"""Normalisation of `TrainingArguments`: every spelling it accepts brought to one form, before the checks
(checks.py) see the values. `__post_init__` calls `normalise`, whose steps run in this order:

1. transformers' enums become their strings; output_dir defaults to transformers' 'trainer_output', and local
   paths are made absolute where the user runs;
2. the JSON-object text of the dict fields becomes a dict (json_text.py; `fsdp_config`, which may also be a
   file, in step 5);
3. transformers' aliases and older spellings: gradient_checkpointing* and activation_checkpointing* hold one
   value, use_cpu means use_gpu=False, group_by_length is a train_sampling_strategy, True/False token counts,
   'no debug option' and an AcceleratorConfig that asks for nothing; a label_names string is a list;
4. report_to's names (report_to.py) and logging_dir's default;
5. the switches: a torch_compile backend or mode turns compilation on; transformers' `fsdp` sets
   strategy='fsdp', and fsdp_config becomes FSDP2's options (fsdp_config.py);
6. defaults derived as transformers derives them: eval_steps, metric_for_best_model, greater_is_better, do_eval;
7. num_workers: an int, or an elastic (min, max) tuple (scaling.py).

A value that cannot be brought to one form is a `ConfigError` here: text that is not a JSON object, two
spellings that disagree, an unknown reporter or FSDP option, a num_workers that is neither a count nor a range.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import socket

from ..errors import ConfigError
from ..storage import absolute_if_local, join
from .fsdp_config import normalise_config, parse_fsdp
from .json_text import EXAMPLE, parse_json_object
from .report_to import normalise_report_to
from .scaling import normalise_workers

# The dict fields whose text is JSON, and what their message suggests writing instead.
JSON_OBJECT_FIELDS = {"resources_per_worker": EXAMPLE, "storage_options": EXAMPLE, "liger_kernel_config": EXAMPLE,
                      "activation_checkpointing_kwargs": EXAMPLE, "gradient_checkpointing_kwargs": EXAMPLE,
                      "lr_scheduler_kwargs": "a JSON object such as '{\"num_cycles\": 1.0}'"}
# transformers' AcceleratorConfig() defaults: a config holding only these asks for nothing raytrainer lacks.
ACCELERATOR_DEFAULTS = {"split_batches": False, "dispatch_batches": None, "even_batches": True,
                        "use_seedable_sampler": True, "non_blocking": False, "gradient_accumulation_kwargs": None,
                        "use_configured_state": False}


def normalise(args) -> None:
    plain_values_and_paths(args)
    json_objects(args)
    transformers_spellings(args)
    reporting(args)
    switches(args)
    derived_defaults(args)
    args.num_workers = normalise_workers(args.num_workers)


def plain_values_and_paths(args) -> None:
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if isinstance(value, enum.Enum) and isinstance(value.value, str):
            # transformers' choices are enums there (IntervalStrategy.STEPS == "steps"), strings here
            setattr(args, f.name, value.value)
    if args.output_dir is None:
        args.output_dir = "trainer_output"
    args.output_dir = str(args.output_dir)  # a Path would collapse 's3://' to 's3:/'
    # Workers run in another directory (Ray's session folder): resolve local paths where the user is.
    args.output_dir = absolute_if_local(args.output_dir)
    if isinstance(args.resume_from_checkpoint, str):
        args.resume_from_checkpoint = absolute_if_local(args.resume_from_checkpoint)


def json_objects(args) -> None:
    for name, example in JSON_OBJECT_FIELDS.items():
        value = getattr(args, name)
        if isinstance(value, str):
            setattr(args, name, parse_json_object(value, name, example=example))
        elif value is not None and not isinstance(value, dict):  # (storage_options=1 crashed in fsspec, later)
            raise ConfigError(f"{name} must be a dict or {example}, got {type(value).__name__} {value!r}.")


def transformers_spellings(args) -> None:
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
    if isinstance(args.label_names, str):
        args.label_names = [args.label_names]


def default_logdir() -> str:
    """HF's (and torch's) TensorBoard default, relative to output_dir: runs/<Mon-dd_HH-MM-SS>_<host>."""
    from datetime import datetime

    return "runs/" + datetime.now().strftime("%b%d_%H-%M-%S") + "_" + socket.gethostname()


def reporting(args) -> None:
    args.report_to = normalise_report_to(args.report_to)
    if args.logging_dir is None:
        args.logging_dir = os.environ.get("TENSORBOARD_LOGGING_DIR") or join(args.output_dir, default_logdir())
    args.logging_dir = absolute_if_local(os.path.expanduser(str(args.logging_dir)))


def switches(args) -> None:
    if args.torch_compile_backend is not None or args.torch_compile_mode is not None:
        args.torch_compile = True  # as HF: naming a backend or mode turns compilation on
    if args.torch_compile and args.torch_compile_backend is None:
        args.torch_compile_backend = "inductor"
    options = parse_fsdp(args.fsdp)
    if options:
        args.strategy = "fsdp"  # HF's switch maps onto our strategy
    if args.strategy == "fsdp":  # else an fsdp_config is refused by the checks (checks.py)
        args.fsdp_config = normalise_config(args.fsdp_config, options)


def derived_defaults(args) -> None:
    if args.eval_steps is None and args.eval_strategy == "steps":
        args.eval_steps = args.logging_steps
    # HF's order: default the metric first, then derive greater_is_better only if the user left it unset.
    if args.load_best_model_at_end and args.metric_for_best_model is None:
        args.metric_for_best_model = "loss"
    if args.greater_is_better is None and args.metric_for_best_model is not None:
        args.greater_is_better = not args.metric_for_best_model.endswith("loss")
    if not args.do_eval and args.eval_strategy != "no":  # as transformers: evaluating during training is eval
        args.do_eval = True
