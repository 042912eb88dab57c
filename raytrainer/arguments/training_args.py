"""`TrainingArguments`: Hugging Face names, defaults and meanings, plus the few fields a Ray run needs.

This module holds the declarations (each field with its help text), the derived values and `to_dict`/`__repr__`.
At construction (`__post_init__`) every accepted spelling is brought to one form (normalise.py), then every
inconsistent value is rejected by the checks (checks.py, whose `TOPICS` say which check owns which field) with a
`ConfigError` naming the field and the fix, so a bad script fails in the driver in milliseconds, not minutes later
in an actor.

A new field: declare it here (with `_ours(...)` when transformers has no such field: its help text is also its
note in docs/arguments.md), put it in a topic of checks.py, normalise its spellings in normalise.py if it has
several, and regenerate docs/arguments.md (`python -m raytrainer.arguments.docs_table docs/arguments.md`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional, Tuple

from ..optimizers import OPTIMIZERS, SCHEDULERS
from .checks import TOPICS
from .choices import DDP_BACKENDS, HUB_STRATEGIES, LOG_LEVELS, MP_CONTEXTS, SAMPLING_STRATEGIES, STRATEGIES
from .normalise import normalise
from .process_view import DriverView
from .scaling import NumWorkers, WorkerRange
from .setters import Setters
from .transformers_fields import HF_FIELDS


def _help(text: str, *, choices=None, nargs=None, const=None, **kw) -> Any:
    """A field with its help text. The metadata holds only keys argparse accepts (help, choices, nargs, const):
    transformers' `HfArgumentParser` passes a field's metadata to `add_argument` unchanged."""
    extra = {k: v for k, v in (("choices", choices), ("nargs", nargs), ("const", const)) if v is not None}
    return field(metadata={"help": text, **extra}, **kw)


_OURS: list = []  # the fields declared with _ours(), named by @dataclass when it builds the class


def _ours(text: str, **kw) -> Any:
    """One of our own fields (transformers' TrainingArguments has no such field). Its help text is its one
    description: `OURS_FIELDS` below, docs/arguments.md's note."""
    declared = _help(text, **kw)
    _OURS.append(declared)
    return declared


def _refused(name: str, **kw) -> Any:
    """A transformers field accepted at its default only; its help text says why (from transformers_fields.py)."""
    return field(metadata={"help": "Only the default is supported: " + HF_FIELDS[name][1]}, **kw)


# Unions are written with `|` and in transformers' member order: HfArgumentParser picks the command-line type by
# position, and `typing.Union[...]` may hand back an equal union built elsewhere with its members in another order.
@dataclass
class TrainingArguments(DriverView, WorkerRange, Setters):
    # --- where things go ---
    output_dir: Optional[str] = _help(
        "Where checkpoints and the final model are written: a local path or any fsspec URL (s3://...). "
        "Defaults to 'trainer_output'.", default=None)
    run_name: Optional[str] = _help("A name for the run, shown in logs and stored in the trainer state.",
                                    default=None)
    project: str = _help("The Trackio project the run is logged under (report_to='trackio').",
                         default="huggingface")

    # --- duration and batch size ---
    per_device_train_batch_size: int = _help("Batch size per worker for training.", default=8)
    per_device_eval_batch_size: int = _help("Batch size per worker for evaluation.", default=8)
    gradient_accumulation_steps: int = _help("Micro-batches accumulated before each optimizer step.", default=1)
    num_train_epochs: float = _help("Total training epochs; fractional values allowed.", default=3.0)
    max_steps: int = _help("If > 0, the total number of optimizer steps; overrides num_train_epochs.",
                           default=-1)

    # --- optimizer and schedule ---
    learning_rate: float = _help("Initial learning rate.", default=5e-5)
    weight_decay: float = _help("Weight decay, never applied to biases and normalisation weights.", default=0.0)
    adam_beta1: float = _help("Adam beta1.", default=0.9)
    adam_beta2: float = _help("Adam beta2.", default=0.999)
    adam_epsilon: float = _help("Adam epsilon.", default=1e-8)
    max_grad_norm: float = _help("Gradient clipping norm; 0 disables clipping.", default=1.0)
    label_smoothing_factor: float = _help("Label smoothing epsilon (0 disables), as HF's LabelSmoother.",
                                          default=0.0)
    neftune_noise_alpha: Optional[float] = _help("NEFTune: noise on the input embeddings during training "
                                                 "(alpha, e.g. 5); None disables.", default=None)
    optim: str = _help(f"Optimizer: one of {', '.join(OPTIMIZERS)}.", default="adamw_torch_fused")
    lr_scheduler_type: str = _help(f"Scheduler: one of {', '.join(SCHEDULERS)}.", default="linear")
    lr_scheduler_kwargs: dict | str | None = _help(
        "Extra scheduler arguments, as transformers' get_scheduler takes them (polynomial: lr_end, power; cosine: "
        "num_cycles; cosine_with_min_lr: min_lr or min_lr_rate; warmup_stable_decay: num_decay_steps, ...).",
        default=None)
    warmup_steps: float = _help("Linear warm-up: an int number of steps, or a float in [0, 1) as a ratio of "
                                "the total steps.", default=0)

    # --- logging and evaluation ---
    logging_strategy: str = _help("When to log: no, steps, epoch.", default="steps")
    logging_steps: float = _help("Log every N steps (a float < 1 is a ratio of total steps).", default=500)
    logging_first_step: bool = _help("Also log the first step.", default=False)
    eval_strategy: str = _help("When to evaluate during training: no, steps, epoch.", default="no")
    eval_steps: Optional[float] = _help("Evaluate every N steps; defaults to logging_steps.", default=None)
    prediction_loss_only: bool = _help("In evaluate/predict, only return the loss.", default=False)
    disable_tqdm: bool = _help("Disable the progress bar on the driver.", default=False)
    eval_on_start: bool = _help("Evaluate once before the first training step (a sanity check).", default=False)
    eval_delay: float = _help("Epochs (eval_strategy='epoch') or steps to wait before the first evaluation.",
                              default=0)
    eval_accumulation_steps: Optional[int] = _help(
        "Move predictions to the CPU every N evaluation steps (bounds device memory); None: at the end.",
        default=None)
    log_level: str = _help(f"Log level of the main process: {', '.join(LOG_LEVELS)}. 'debug' also shows "
                           "Ray's and the libraries' own messages (or set RAYTRAINER_VERBOSE=1).", default="passive")
    log_level_replica: str = _help("Log level of the other workers (same choices). 'error' by default: they "
                                   "would repeat rank 0's warnings once per worker.", default="error")

    # --- saving (checkpoints) ---
    save_strategy: str = _help("When to save a checkpoint: no, steps, epoch, best.", default="steps")
    save_steps: float = _help("Save every N steps (a float < 1 is a ratio of total steps).", default=500)
    save_total_limit: Optional[int] = _help(
        "Keep at most this many committed checkpoints; the newest and the best are never deleted.", default=None)
    save_only_model: bool = _help("Save only the model (no optimizer, scheduler, RNG): cannot be resumed from.",
                                  default=False)
    load_best_model_at_end: bool = _help("Load the best checkpoint at the end of training.", default=False)
    metric_for_best_model: Optional[str] = _help("Metric that selects the best checkpoint (e.g. 'eval_loss').",
                                                 default=None)
    greater_is_better: Optional[bool] = _help("Whether a larger metric_for_best_model is better.", default=None)
    ignore_data_skip: bool = _help("On resume, start the interrupted epoch over instead of skipping the "
                                   "samples already seen.", default=False)
    resume_from_checkpoint: Optional[str] = _help("A checkpoint path/URL to resume from (train() argument "
                                                  "takes precedence).", default=None)

    # --- data ---
    seed: int = _help("Seed for model init, dropout and (unless data_seed) data order.", default=42)
    data_seed: Optional[int] = _help("Seed for the data order only.", default=None)
    dataloader_drop_last: bool = _help("Drop the last incomplete batch of each epoch.", default=False)
    dataloader_num_workers: int = _help("DataLoader worker processes per training worker.", default=0)
    remove_unused_columns: bool = _help("Drop dataset columns the model's forward does not accept.",
                                        default=True)
    label_names: Optional[List[str]] = _help("Names of the label keys in a batch; default: the forward's "
                                        "arguments containing 'label'.", default=None)
    average_tokens_across_devices: bool = _help(
        "Normalise the loss by the label tokens of the whole global batch (all ranks, all micro-steps).",
        default=True)

    # --- precision, memory, compilation (HF names) ---
    bf16: bool = _help("Mixed precision in bfloat16 (autocast; under FSDP a MixedPrecisionPolicy). CPUs and "
                       "Ampere+ GPUs.", default=False)
    fp16: bool = _help("Mixed precision in float16 with a gradient scaler. GPUs only.", default=False)
    gradient_checkpointing: Optional[bool] = _help(
        "Recompute each block's activations in backward to save memory (transformers 5 also calls it "
        "activation_checkpointing).", nargs="?", const=True, default=None)
    gradient_checkpointing_kwargs: dict | str | None = _help(
        "Arguments for gradient checkpointing, e.g. {'use_reentrant': False}.", default=None)
    torch_compile: bool = _help("torch.compile the model's blocks.", default=False)
    torch_compile_backend: Optional[str] = _help("torch.compile backend (implies torch_compile); default "
                                                 "'inductor'.", default=None)
    torch_compile_mode: Optional[str] = _help("torch.compile mode (implies torch_compile), e.g. "
                                              "'reduce-overhead'.", default=None)
    fsdp: Optional[str] = _help(  # a list of options or True are accepted too, as in HF
        "HF's FSDP switch: --fsdp alone (True), 'full_shard auto_wrap', 'shard_grad_op auto_wrap', 'full_shard "
        "offload auto_wrap'. Sets strategy='fsdp' (FSDP2).", nargs="?", const=True, default=None)
    fsdp_config: dict | str | None = _help(
        "FSDP options: transformer_layer_cls_to_wrap (block class names), reshard_after_forward, cpu_offload, "
        "activation_checkpointing. A dict, JSON text or a JSON file path.", default=None)

    # --- distributed (ours) ---
    num_workers: int | NumWorkers | Tuple[int, int] | str = _ours(
        "Training workers (one per GPU or CPU slot). 0 runs in the driver process, for debugging and notebooks. "
        "(min, max), or 'MIN,MAX' on the command line: an elastic run that starts once min workers can be placed "
        "and changes size at restarts, keeping the global batch of max workers.", default=1)
    elastic_resize_monitor_interval_s: float = _ours(
        "Elastic runs: how often Ray Train checks, while training is healthy, whether more workers fit; if so it "
        "restarts the group at the larger size from the newest committed checkpoint.", default=60.0)
    use_gpu: Optional[bool] = _ours("One GPU per worker. Default: use GPUs when the cluster has them.",
                                    default=None)
    resources_per_worker: dict | str | None = _ours(
        "Ray resources per worker, e.g. {'CPU': 4, 'GPU': 1} (JSON text on the command line).", default=None)
    strategy: str = _ours(f"Parallelism: one of {', '.join(STRATEGIES)} (fsdp: FSDP2, sharded checkpoints).",
                          default="ddp")
    max_failures: int = _ours("Worker-group restarts Ray Train may attempt from the newest committed "
                              "checkpoint (-1: unlimited). A lost node is a failure.", default=0)
    max_preemptions: int = _ours("Restarts after a preemption (a worker got SIGTERM, or Ray drains its node): "
                                 "checkpointed at the end of the step after the one in progress, counted apart from "
                                 "max_failures (-1: unlimited).",
                                 default=-1)
    worker_idle_timeout_s: float = _ours(
        "The worker group started by the first call is kept for the next train()/evaluate()/predict() and "
        "released after this many seconds without one (or by trainer.close()); 0 releases it after each call.",
        default=300.0)
    ray_address: Optional[str] = _ours("Ray cluster to use. Default: RAY_ADDRESS or a running cluster, else "
                                       "an embedded local Ray.", default=None)
    storage_options: dict | str | None = _ours(
        "fsspec options for output_dir (e.g. S3 endpoint_url, key; JSON text on the command line). Never logged "
        "or saved.", default=None)
    save_async: Optional[bool] = _ours(
        "Write checkpoints in the background while training continues. None (the default): in the background, "
        "except FSDP's sharded checkpoints on CPU workers, which are written inline (there a background write "
        "measured no faster: benchmarks/README.md).", default=None)
    allow_local_output_dir_on_multinode: bool = _ours(
        "Accept a local output_dir on a multi-node cluster (only if that path is shared storage, e.g. NFS).",
        default=False)
    storage_retry_timeout_s: float = _ours(
        "How long a transient storage error (connection refused or reset, timeout, S3 5xx) is retried, with "
        "backoff, before it counts as a failure. No space or permission denied fail at once.", default=120.0)
    on_nonfinite_loss: str = _ours(
        "A NaN/Inf training loss: 'warn' (train on, as transformers; a warning names the step, also when a "
        "checkpoint is saved after it), 'skip' (warn and skip that optimizer step), 'stop' (fail the run at that "
        "step, nothing saved after it).", default="warn")
    hang_warning_s: float = _ours(
        "A worker that makes no progress this long (a callback, a collective, data loading, a save that does not "
        "return) is named on the console with its rank, phase and line; repeated every as long. 0: off.",
        default=300.0)
    hang_timeout_s: float = _ours(
        "After this long without progress the stalled worker exits: Ray Train restarts the group from the newest "
        "committed checkpoint, one failure against max_failures (num_workers=0: a warning only). 0: off.",
        default=1800.0)
    peak_flops_per_device: Optional[float] = _ours(  # the throughput keys (worker/throughput.py)
        "Peak FLOP/s of one worker's device, for the train_mfu_percent log key (e.g. 989e12 for an H100 SXM in "
        "bf16). Default: known GPUs from a table; no MFU key on CPU or an unknown GPU.", default=None)

    callback_decisions: str = _ours(
        "When a driver callback's decision (stop, save, log, evaluate) in on_step_end or on_log takes effect: "
        "'same_step' (as transformers: each such step waits for the driver's answer) or 'next_step' (training "
        "goes on; every rank applies the answer at the next step's on_step_end, or at the epoch's last step). "
        "Decisions in other events apply at once.", default="same_step")

    # --- reporting and optimizer options ---
    report_to: None | str | list[str] = _help(
        "Where to report logs: 'none', 'all' (every installed reporter), or names among 'tensorboard', 'mlflow', "
        "'wandb', 'trackio' and those added with register_reporter().", default="none")
    logging_dir: Optional[str] = _ours(
        "TensorBoard log directory, local or a URL (s3://...): transformers 4's name, kept for scripts "
        "(transformers 5 reads TENSORBOARD_LOGGING_DIR). Default: TENSORBOARD_LOGGING_DIR, else "
        "<output_dir>/runs/<time>_<host>.", default=None)
    optim_args: Optional[str] = _help(
        "Extra optimizer arguments as 'key=value,key=value' (e.g. 'momentum=0.9,nesterov=True' for sgd, "
        "'r=0.5,weight_lr_power=2' for schedule_free_*).", default=None)

    # --- transformers' remaining fields. What each does: transformers_fields.py, docs/arguments.md ---
    # Read by scripts only, as in transformers.
    do_train: bool = _help("Run training. Not read by the Trainer: for scripts (transformers' examples).",
                           default=False)
    do_eval: bool = _help("Run evaluation; set when eval_strategy is not 'no'. Not read by the Trainer.",
                          default=False)
    do_predict: bool = _help("Run prediction on a test set. Not read by the Trainer.", default=False)

    # Optimizer, kernels and model (optimizers/ and strategy/prepare.py read them).
    optim_target_modules: None | str | list[str] = _help(
        "Modules the optimizer targets (names or a regex), for the optimizers that need them.", default=None)
    use_liger_kernel: bool = _help("Apply Liger kernels to the model.", default=False)
    liger_kernel_config: Optional[Dict[str, bool]] = _help(
        "Liger kernel options (kwargs of _apply_liger_kernel_to_instance); None: the defaults.", default=None)
    activation_checkpointing: Optional[bool] = _help(
        "transformers 5's name of gradient_checkpointing (either sets both).", nargs="?", const=True, default=None)
    activation_checkpointing_kwargs: Dict[str, Any] | str | None = _help(
        "transformers 5's name of gradient_checkpointing_kwargs (either sets both).", default=None)
    use_cache: bool = _help("model.config.use_cache on every worker, as transformers sets it.", default=False)
    tf32: Optional[bool] = _help("TF32 matmuls on Ampere+ GPUs, set on every worker; None keeps torch's default.",
                                 default=None)
    full_determinism: bool = _help("Deterministic algorithms on every worker (enable_full_determinism): "
                                   "reproducible, slower.", default=False)
    torch_empty_cache_steps: Optional[int] = _help("Empty the workers' device cache every N optimizer steps.",
                                                   default=None)

    # Logging, evaluation and checkpoint behaviour.
    logging_nan_inf_filter: bool = _help("Log a NaN/Inf step loss as the average so far; leave NaN/Inf batch "
                                         "losses out of eval_loss.", default=True)
    include_num_input_tokens_seen: str | bool = _help(
        "Count input tokens into state.num_input_tokens_seen and every log: 'all', 'non_padding' or 'no' "
        "(True/False: 'all'/'no').", default="no")
    log_on_each_node: bool = _help("Accepted: Ray forwards every worker's output to the driver, so rank 0 logs "
                                   "at log_level and the other ranks at log_level_replica on every node.",
                                   default=True)
    eval_use_gather_object: bool = _help("Accepted: evaluation outputs are always gathered as objects.",
                                         default=False)
    batch_eval_metrics: bool = _help("Call compute_metrics(EvalPrediction, compute_result=...) on rank 0 for each "
                                     "evaluation step's batches of all ranks, compute_result=True on the last; "
                                     "predictions are not kept.", default=False)
    include_for_metrics: List[str] = _help(
        'What compute_metrics gets besides predictions and labels (EvalPrediction.inputs, .losses): "inputs" (each '
        "batch's main input, padded with -100), \"loss\" (each batch's loss, once per row).", default_factory=list)
    restore_callback_states_from_checkpoint: bool = _help(
        "On resume, restore the state of callbacks that export one (EarlyStoppingCallback) from the checkpoint.",
        default=False)
    enable_jit_checkpoint: bool = _help("Accepted: on SIGTERM or a node drain raytrainer always saves at the next "
                                        "step and restarts from it (max_preemptions).", default=False)

    # Data loading.
    dataloader_pin_memory: bool = _help("Pin batches in host memory (on GPU workers).", default=True)
    dataloader_persistent_workers: bool = _help("Keep the DataLoader worker processes between epochs.",
                                                default=False)
    dataloader_prefetch_factor: Optional[int] = _help("Batches each DataLoader worker loads ahead (needs "
                                                      "dataloader_num_workers > 0).", default=None)
    dataloader_multiprocessing_context: Optional[str] = _help(
        "Start method of the DataLoader workers: fork, spawn or forkserver.", choices=MP_CONTEXTS, default=None)
    train_sampling_strategy: str = _help(
        "Training order: random, sequential, or group_by_length (batches of similar lengths, less padding).",
        choices=SAMPLING_STRATEGIES, default="random")
    length_column_name: str = _help("Column of precomputed lengths for group_by_length (else the lengths of the "
                                    "model's main input).", default="length")
    group_by_length: bool = _ours("transformers 4's spelling of train_sampling_strategy='group_by_length'.",
                                  default=False)

    # Devices and DDP.
    use_cpu: bool = _help("Workers without GPUs (the same as use_gpu=False).", default=False)
    ddp_find_unused_parameters: Optional[bool] = _help(
        "DDP's find_unused_parameters (None: False); True when some parameters get no gradient.", default=None)
    ddp_bucket_cap_mb: Optional[int] = _help("DDP's bucket_cap_mb.", default=None)
    ddp_broadcast_buffers: Optional[bool] = _help("DDP's broadcast_buffers.", default=None)
    ddp_static_graph: Optional[bool] = _help("DDP's static_graph.", default=None)
    ddp_timeout: int = _help("Seconds a collective of the workers' process group may wait (Ray Train's "
                             "TorchConfig timeout_s).", default=1800)
    ddp_backend: Optional[str] = _help("Accepted only as the backend Ray Train sets up: nccl on GPU workers, gloo "
                                       "on CPU ones.", choices=DDP_BACKENDS, default=None)

    # The Hub: read only with push_to_hub (hub/push.py).
    hub_token: Optional[str] = _help("Hub token for push_to_hub; never printed.", default=None)
    hub_private_repo: Optional[bool] = _help("Make the Hub repository private (push_to_hub).", default=None)
    hub_model_id: Optional[str] = _help("Hub repository name (push_to_hub, model card).", default=None)
    hub_strategy: str = _help("What push_to_hub pushes when: end, every_save, checkpoint, all_checkpoints.",
                              choices=HUB_STRATEGIES, default="every_save")
    hub_always_push: bool = _help("push_to_hub: push even when the previous push is not finished.", default=False)
    hub_revision: Optional[str] = _help("push_to_hub: the branch, tag or commit to push to.", default=None)

    push_to_hub: bool = _help("Push the saved model (and checkpoints, per hub_strategy) to the Hugging Face Hub "
                              "from the driver.", default=False)

    # Accepted at transformers' default only: any other value is a ConfigError saying why and what to use.
    bf16_full_eval: bool = _refused("bf16_full_eval", default=False)
    fp16_full_eval: bool = _refused("fp16_full_eval", default=False)
    auto_find_batch_size: bool = _refused("auto_find_batch_size", default=False)
    trackio_space_id: Optional[str] = _refused("trackio_space_id", default=None)
    trackio_bucket_id: Optional[str] = _refused("trackio_bucket_id", default=None)
    trackio_static_space_id: str | None | Literal[False] = _refused("trackio_static_space_id", default=None)
    eval_do_concat_batches: bool = _refused("eval_do_concat_batches", default=True)
    save_on_each_node: bool = _refused("save_on_each_node", default=False)
    accelerator_config: dict | str | None = _refused("accelerator_config", default=None)
    parallelism_config: Optional[Any] = _refused("parallelism_config", default=None)
    dataloader_in_order: bool = _refused("dataloader_in_order", default=True)
    deepspeed: dict | str | None = _refused("deepspeed", default=None)
    debug: str | List[str] = _refused("debug", default="")
    skip_memory_metrics: bool = _refused("skip_memory_metrics", default=True)
    local_rank: int = _refused("local_rank", default=-1)

    def __post_init__(self):
        normalise(self)  # every accepted spelling brought to one form (normalise.py)
        for check, _owned_fields in TOPICS:  # then the checks, topic by topic (checks.py)
            check(self)

    # ------------------------------------------------------------------ derived values
    @property
    def train_data_seed(self) -> int:
        return self.seed if self.data_seed is None else self.data_seed

    def get_warmup_steps(self, num_training_steps: int) -> int:
        if isinstance(self.warmup_steps, float) and self.warmup_steps < 1:
            return math.ceil(num_training_steps * self.warmup_steps)
        return int(self.warmup_steps)

    @staticmethod
    def resolve_interval(value: Optional[float], max_steps: int) -> int:
        """An interval in steps; floats below 1 are a ratio of the total (HF semantics)."""
        if value is None:
            return 0
        if value < 1:
            return max(1, math.ceil(max_steps * value))
        return int(value)

    def to_dict(self) -> dict:
        """The arguments as plain JSON values, with secrets (storage_options, *_token) redacted."""
        out = dataclasses.asdict(self)
        if out.get("storage_options"):
            out["storage_options"] = {k: "<redacted>" for k in out["storage_options"]}
        for name in out:
            if name.endswith("_token") and out[name] is not None:
                out[name] = f"<{name.upper()}>"  # transformers' placeholder
        return out

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)

    def __repr__(self) -> str:  # never print credentials
        body = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"{type(self).__name__}({body})"


# Our own fields (transformers has none of them), each with its one description, its help text: docs/arguments.md's
# table shows it as the field's note.
OURS_FIELDS: Dict[str, str] = {declared.name: declared.metadata["help"] for declared in _OURS}
