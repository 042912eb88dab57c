"""The checks of `TrainingArguments`, one small function per topic, run at construction after normalisation
(normalise.py): a value that cannot work is a `ConfigError` naming the field and the fix, on the driver, before
anything starts.

`TOPICS`, at the end, is the one place that decides where a field's check lives: the topics in the order
`__post_init__` runs them, each with the fields it owns. A new field goes into the tuple of the topic it belongs
to, and its check into that topic's function (tests/arguments/test_checks.py fails for a field that no topic or
two topics own). The fields transformers has and raytrainer takes at their default only (the `refused` rows of
transformers_fields.py) belong to the last topic. The order is the order in which errors are found: with several
bad values, the first topic's is raised.
"""

from __future__ import annotations

from typing import Callable

from ..errors import ConfigError
from ..optimizers import OPTIMIZERS, SCHEDULERS, check_optimizer
from .choices import (
    CALLBACK_DECISIONS,
    DDP_BACKENDS,
    HUB_STRATEGIES,
    INTERVALS,
    LOG_LEVELS,
    MP_CONTEXTS,
    SAMPLING_STRATEGIES,
    SAVE_INTERVALS,
    STRATEGIES,
    TOKEN_COUNTS,
)
from .scaling import check_elastic_batch
from .transformers_fields import HF_FIELDS, REFUSED, field_default

# Keys of activation_checkpointing_kwargs that transformers 5 takes out for itself; not implemented here.
CHECKPOINTING_OWN_KEYS = ("every_n_layers", "offload")


def one_of(args, name: str, allowed: tuple) -> None:
    value = getattr(args, name)
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not supported; choose one of: {', '.join(map(str, allowed))}.")


def _positive(args, name: str) -> None:
    value = getattr(args, name)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ConfigError(f"{name}={value!r} must be a positive number.")


def _at_least_zero(args, name: str) -> None:
    if getattr(args, name) < 0:
        raise ConfigError(f"{name}={getattr(args, name)!r} must be >= 0.")


def _positive_int_or_none(args, name: str, unset: str = " (or None).") -> None:
    value = getattr(args, name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ConfigError(f"{name}={value!r} must be a positive int{unset}")


def batch_and_duration(args) -> None:
    batch = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")
    for name in batch:
        _positive(args, name)
    for name in batch:
        if int(getattr(args, name)) != getattr(args, name):
            raise ConfigError(f"{name}={getattr(args, name)!r} must be an integer.")
    if args.max_steps <= 0 and not args.num_train_epochs > 0:
        raise ConfigError(f"num_train_epochs={args.num_train_epochs!r} must be > 0 unless max_steps > 0.")
    if int(args.max_steps) != args.max_steps:
        raise ConfigError(f"max_steps={args.max_steps!r} must be an integer (-1 to train by epochs).")
    # The own loop keeps the global batch at every size of an elastic range. (A hosted run's batch is its
    # Trainer's, which HF keeps per device: hosting/options.py does not run this topic.)
    check_elastic_batch(args.num_workers, args.per_device_train_batch_size, args.gradient_accumulation_steps)


def optimizer_and_schedule(args) -> None:
    # 0 is allowed, as in transformers: evaluation-only and debugging runs train with it.
    rate = args.learning_rate
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not rate >= 0:
        raise ConfigError(f"learning_rate={rate!r} must be a number >= 0.")
    for name in ("weight_decay", "adam_epsilon", "max_grad_norm"):
        _at_least_zero(args, name)
    for name in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(args, name) < 1:
            raise ConfigError(f"{name}={getattr(args, name)!r} must be in [0, 1).")
    one_of(args, "optim", OPTIMIZERS)
    check_optimizer(args)  # the optimizer's package, optim_args, optim_target_modules, Liger's kernels
    if args.lr_scheduler_type in ("reduce_lr_on_plateau", "greedy"):
        raise ConfigError(f"lr_scheduler_type={args.lr_scheduler_type!r} is not supported: it is stepped by "
                          "evaluation metrics, not by the step count. Use a schedule by steps (one of "
                          f"{', '.join(SCHEDULERS)}), or a callback that lowers the learning rate on a plateau.")
    one_of(args, "lr_scheduler_type", SCHEDULERS)
    if args.lr_scheduler_kwargs is not None and not isinstance(args.lr_scheduler_kwargs, dict):
        raise ConfigError(f"lr_scheduler_kwargs={args.lr_scheduler_kwargs!r} must be a dict (or a JSON object).")
    warmup = args.warmup_steps
    if warmup < 0 or (isinstance(warmup, float) and not warmup.is_integer() and warmup >= 1):
        raise ConfigError(f"warmup_steps={warmup!r}: use an int number of steps or a float in [0, 1) as a ratio "
                          "of the total steps.")
    if not 0 <= args.label_smoothing_factor < 1:
        raise ConfigError(f"label_smoothing_factor={args.label_smoothing_factor!r} must be in [0, 1).")
    if args.neftune_noise_alpha is not None and not args.neftune_noise_alpha > 0:
        raise ConfigError(f"neftune_noise_alpha={args.neftune_noise_alpha!r} must be > 0 (or None to disable).")


def intervals_and_saving(args) -> None:
    one_of(args, "logging_strategy", INTERVALS)
    one_of(args, "eval_strategy", INTERVALS)
    one_of(args, "save_strategy", SAVE_INTERVALS)
    for name, strategy in (("logging_steps", args.logging_strategy), ("eval_steps", args.eval_strategy),
                           ("save_steps", args.save_strategy)):
        value = getattr(args, name)
        if strategy == "steps" and (value is None or value <= 0 or (value > 1 and int(value) != value)):
            raise ConfigError(f"{name}={value!r} must be a positive int (or a float in (0, 1) as a ratio "
                              f"of total steps) when the strategy is 'steps'.")
    if args.save_total_limit is not None and args.save_total_limit < 1:
        raise ConfigError(f"save_total_limit={args.save_total_limit!r} must be >= 1 (or None to keep all).")
    if args.save_strategy == "best" and args.metric_for_best_model is None:
        raise ConfigError("save_strategy='best' needs metric_for_best_model (e.g. 'eval_loss').")
    if args.load_best_model_at_end:
        if args.save_strategy not in ("best", args.eval_strategy):
            raise ConfigError(
                f"load_best_model_at_end needs save_strategy to match eval_strategy (got save_strategy="
                f"{args.save_strategy!r}, eval_strategy={args.eval_strategy!r}): set both to 'steps' or 'epoch'.")
        if args.eval_strategy == "steps" and args.save_strategy == "steps":
            # Ratios (< 1) compare as integers in millionths, as HF does: 0.2 % 0.1 is not 0 in floats.
            ratios = (args.save_steps < 1, args.eval_steps < 1)
            if ratios[0] != ratios[1] or round(args.save_steps * 1_000_000) % round(
                    args.eval_steps * 1_000_000) != 0:
                raise ConfigError(f"load_best_model_at_end needs save_steps ({args.save_steps}) to be a "
                                  f"multiple of eval_steps ({args.eval_steps}), both steps or both ratios.")
    if args.eval_delay < 0:
        raise ConfigError(f"eval_delay={args.eval_delay!r} must be >= 0.")


def workers_and_ray(args) -> None:
    if not args.worker_idle_timeout_s >= 0:
        raise ConfigError(f"worker_idle_timeout_s={args.worker_idle_timeout_s!r} must be >= 0 (seconds; 0 "
                          "releases the workers after each call).")
    for name in ("hang_warning_s", "hang_timeout_s"):
        if not getattr(args, name) >= 0:
            raise ConfigError(f"{name}={getattr(args, name)!r} must be >= 0 seconds (0 turns it off).")
    if 0 < args.hang_timeout_s <= args.hang_warning_s:
        raise ConfigError(f"hang_timeout_s={args.hang_timeout_s!r} must be above hang_warning_s="
                          f"{args.hang_warning_s!r}: the warning names the stalled rank before the timeout "
                          "restarts the group. Raise hang_timeout_s, or lower hang_warning_s (0 turns it off).")
    if not args.elastic_resize_monitor_interval_s >= 0:
        raise ConfigError(f"elastic_resize_monitor_interval_s={args.elastic_resize_monitor_interval_s!r} must be "
                          ">= 0 seconds.")
    for name in ("max_failures", "max_preemptions"):
        if getattr(args, name) < -1:
            raise ConfigError(f"{name}={getattr(args, name)!r} must be >= 0, or -1 for unlimited restarts.")
    resources = args.resources_per_worker
    if resources is not None:
        if not isinstance(resources, dict) or any(not isinstance(v, (int, float)) or v < 0
                                                  for v in resources.values()):
            raise ConfigError(f"resources_per_worker={resources!r} must be a dict of resource name to a "
                              "non-negative amount, e.g. {'CPU': 2, 'GPU': 1}.")
        if resources.get("GPU", 0) > 0 and args.use_gpu is False:
            raise ConfigError("resources_per_worker asks for a GPU but use_gpu=False: drop one of them.")


def logging_and_evaluation(args) -> None:
    peak = args.peak_flops_per_device
    if peak is not None and (isinstance(peak, bool) or not isinstance(peak, (int, float)) or not peak > 0):
        raise ConfigError(f"peak_flops_per_device={peak!r} must be a positive number of FLOP/s (e.g. 989e12 for an "
                          "H100 SXM in bf16), or None for the built-in table.")
    if args.callback_decisions not in CALLBACK_DECISIONS:
        raise ConfigError(f"callback_decisions={args.callback_decisions!r} must be 'same_step' (wait for the "
                          "driver's answer at each step) or 'next_step' (apply it one step later).")
    if args.eval_accumulation_steps is not None and (
            not isinstance(args.eval_accumulation_steps, int) or args.eval_accumulation_steps < 1):
        raise ConfigError(f"eval_accumulation_steps={args.eval_accumulation_steps!r} must be a positive int "
                          "(or None to keep predictions on the device until the end).")
    unknown = [name for name in (args.include_for_metrics or ()) if name not in ("inputs", "loss")]
    if unknown or isinstance(args.include_for_metrics, str):
        raise ConfigError(f"include_for_metrics={args.include_for_metrics!r}: a list of 'inputs' and 'loss' "
                          '(e.g. include_for_metrics=["inputs"]), what compute_metrics gets as '
                          "EvalPrediction.inputs and .losses.")
    one_of(args, "log_level", LOG_LEVELS)
    one_of(args, "log_level_replica", LOG_LEVELS)
    one_of(args, "include_num_input_tokens_seen", TOKEN_COUNTS)


def data_loading(args) -> None:
    _at_least_zero(args, "dataloader_num_workers")
    if args.label_names is not None and not all(isinstance(n, str) for n in args.label_names):
        raise ConfigError(f"label_names={args.label_names!r} must be a list of column names.")
    one_of(args, "train_sampling_strategy", SAMPLING_STRATEGIES)
    if args.train_sampling_strategy == "batch_rebalance":
        raise ConfigError("train_sampling_strategy='batch_rebalance' is not supported: use 'group_by_length' "
                          "(batches of similar lengths) or 'random'.")
    if args.dataloader_multiprocessing_context is not None:
        one_of(args, "dataloader_multiprocessing_context", MP_CONTEXTS)
    _positive_int_or_none(args, "dataloader_prefetch_factor")
    if args.dataloader_prefetch_factor is not None and args.dataloader_num_workers == 0:
        raise ConfigError("dataloader_prefetch_factor is set but dataloader_num_workers=0: prefetching needs "
                          "DataLoader worker processes; set dataloader_num_workers > 0 or drop it.")
    if args.dataloader_persistent_workers and args.dataloader_num_workers == 0:
        raise ConfigError("dataloader_persistent_workers=True but dataloader_num_workers=0: there are no DataLoader "
                          "worker processes to keep; set dataloader_num_workers > 0 or drop it.")
    if not isinstance(args.length_column_name, str) or not args.length_column_name:
        raise ConfigError(f"length_column_name={args.length_column_name!r} must be a column name.")


def strategy_precision_and_memory(args) -> None:
    if args.bf16 and args.fp16:
        raise ConfigError("bf16=True and fp16=True: choose one precision (bf16 on CPUs and Ampere+ GPUs).")
    if args.fsdp_config is not None and args.strategy != "fsdp":
        raise ConfigError("fsdp_config is set but FSDP is off: set strategy='fsdp' (or fsdp='full_shard "
                          "auto_wrap'), or drop fsdp_config.")
    one_of(args, "strategy", STRATEGIES)
    # gradient_checkpointing_kwargs and activation_checkpointing_kwargs hold one value (normalise.py).
    kwargs = args.gradient_checkpointing_kwargs
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ConfigError(f"gradient_checkpointing_kwargs={kwargs!r} must be a dict, e.g. {{'use_reentrant': False}}.")
    own = [k for k in CHECKPOINTING_OWN_KEYS if k in (kwargs or {})]
    if own:
        raise ConfigError(f"activation_checkpointing_kwargs {own} are not supported: every block is checkpointed "
                          "(drop the key), or turn checkpointing off for speed.")
    _positive_int_or_none(args, "torch_empty_cache_steps")


def devices_and_ddp(args) -> None:
    _positive_int_or_none(args, "ddp_bucket_cap_mb")
    _positive_int_or_none(args, "ddp_timeout", unset=" (seconds).")
    if args.tf32 and (args.use_gpu is False or (args.max_workers == 0 and not args.use_gpu)):
        raise ConfigError("tf32=True needs GPU workers (Ampere or newer): set use_gpu=True, or drop tf32.")
    if args.ddp_backend is None:
        return
    one_of(args, "ddp_backend", DDP_BACKENDS)
    if args.use_gpu is None and args.max_workers > 0:
        raise ConfigError(f"ddp_backend={args.ddp_backend!r}: Ray Train picks the backend from use_gpu (nccl with "
                          "GPUs, gloo without); set use_gpu to match, or drop ddp_backend.")
    expected = "nccl" if args.use_gpu else "gloo"
    if args.ddp_backend != expected:
        raise ConfigError(f"ddp_backend={args.ddp_backend!r} with use_gpu={args.use_gpu}: Ray Train sets up "
                          f"{expected!r} for these workers; drop ddp_backend (or use ddp_backend={expected!r}).")


def hub(args) -> None:
    one_of(args, "hub_strategy", HUB_STRATEGIES)


REFUSED_FIELDS = tuple(name for name, (status, _) in HF_FIELDS.items() if status == REFUSED)


def refused_transformers_fields(args) -> None:
    """A transformers field accepted at its default only: any other value names why and the fix (its note)."""
    for name in REFUSED_FIELDS:
        value, default = getattr(args, name), field_default(type(args), name)
        if value != default:
            raise ConfigError(f"{name}={value!r} is not supported (only its default, {default!r}): "
                              f"{HF_FIELDS[name][1]}")


def check_arguments_object(args, expected: type) -> None:
    """The Trainer's `args` must be raytrainer's arguments class. transformers' own (or a TRL config) was accepted
    and failed later, far from the cause (`AttributeError: ... 'max_workers'`): refused here, naming the class."""
    if isinstance(args, expected):
        return
    mro = [c for c in type(args).__mro__ if c.__module__.split(".")[0] in ("transformers", "trl")]
    name = type(args).__name__
    if mro:
        ours = "Seq2SeqTrainingArguments" if any(c.__name__ == "Seq2SeqTrainingArguments" for c in mro) else \
            "TrainingArguments"
        raise ConfigError(f"args is {type(args).__module__}.{name}: raytrainer's Trainer needs raytrainer.{ours} "
                          f"(the same fields, plus num_workers and the Ray options): `from raytrainer import {ours}`. "
                          "To run a transformers.Trainer subclass with its own arguments class (TRL's trainers), "
                          "use raytrainer.hosted(...).")
    raise ConfigError(f"args must be a raytrainer.{expected.__name__}, got {name}.")


# (check, the fields it owns), in the order __post_init__ runs them: the one place that says where a field's check
# lives. A field no check reads yet is listed too, under the topic its check would join.
TOPICS: tuple[tuple[Callable[..., None], tuple[str, ...]], ...] = (
    (batch_and_duration, ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                          "num_train_epochs", "max_steps", "average_tokens_across_devices")),
    (optimizer_and_schedule, ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
                              "max_grad_norm", "optim", "optim_args", "optim_target_modules", "use_liger_kernel",
                              "liger_kernel_config", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps",
                              "label_smoothing_factor", "neftune_noise_alpha")),
    (intervals_and_saving, ("output_dir", "run_name", "logging_strategy", "logging_steps", "logging_first_step",
                            "eval_strategy", "eval_steps", "eval_on_start", "eval_delay", "save_strategy",
                            "save_steps", "save_total_limit", "save_only_model", "save_async",
                            "load_best_model_at_end", "metric_for_best_model", "greater_is_better",
                            "resume_from_checkpoint", "ignore_data_skip", "restore_callback_states_from_checkpoint",
                            "enable_jit_checkpoint")),
    (workers_and_ray, ("num_workers", "elastic_resize_monitor_interval_s", "use_gpu", "use_cpu",
                       "resources_per_worker", "max_failures", "max_preemptions", "worker_idle_timeout_s",
                       "ray_address", "hang_warning_s", "hang_timeout_s", "storage_options",
                       "allow_local_output_dir_on_multinode", "storage_retry_timeout_s", "on_nonfinite_loss")),
    (logging_and_evaluation, ("log_level", "log_level_replica", "log_on_each_node", "disable_tqdm", "report_to",
                              "project", "logging_dir", "logging_nan_inf_filter", "include_num_input_tokens_seen",
                              "peak_flops_per_device", "callback_decisions", "prediction_loss_only",
                              "eval_accumulation_steps", "eval_use_gather_object", "batch_eval_metrics",
                              "include_for_metrics", "do_train",
                              "do_eval", "do_predict")),
    (data_loading, ("seed", "data_seed", "dataloader_drop_last", "dataloader_num_workers", "remove_unused_columns",
                    "label_names", "train_sampling_strategy", "group_by_length", "length_column_name",
                    "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
                    "dataloader_multiprocessing_context")),
    (strategy_precision_and_memory, ("strategy", "fsdp", "fsdp_config", "bf16", "fp16", "gradient_checkpointing",
                                     "gradient_checkpointing_kwargs", "activation_checkpointing",
                                     "activation_checkpointing_kwargs", "torch_compile", "torch_compile_backend",
                                     "torch_compile_mode", "use_cache", "full_determinism",
                                     "torch_empty_cache_steps")),
    (devices_and_ddp, ("tf32", "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers",
                       "ddp_static_graph", "ddp_timeout", "ddp_backend")),
    (hub, ("push_to_hub", "hub_token", "hub_private_repo", "hub_model_id", "hub_strategy", "hub_always_push",
           "hub_revision")),
    (refused_transformers_fields, REFUSED_FIELDS),
)
