"""Every field of transformers' `TrainingArguments`, and what raytrainer does with it: the one place that says so.

    same       transformers' meaning (a note may name values that are refused, each a ConfigError)
    different  accepted, with another meaning or default on a Ray run: the note says what and why
    refused    accepted at transformers' default; any other value is a ConfigError naming why and what to use

Our own fields (status `ours`) are described by their declarations (training_args.OURS_FIELDS). The `refused` rows
are enforced at construction by checks.py's last topic, and `python -m raytrainer.arguments.docs_table
docs/arguments.md` writes the table of docs/arguments.md from both classes (a test fails when the file and the
classes disagree, or when transformers has a field that is not classified here). Pure data and the stdlib.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Tuple

SAME, DIFFERENT, REFUSED, OURS = "same", "different", "refused", "ours"
# What the Trackio arguments' refusal proposes instead.
NO_SPACE = ("report_to='trackio' logs to Trackio's local store on the driver; upload it afterwards with "
            "`trackio sync --project <project> --space-id <id>`.")

_OUT_OF_MEMORY = ("a rank that runs out of memory inside DDP's or FSDP's collectives leaves the other ranks waiting, "
                  "so the batch cannot be halved mid-run with every rank agreeing")

# transformers field -> (status, note). In transformers' field order; the table follows it.
HF_FIELDS: Dict[str, Tuple[str, str]] = {
    "output_dir": (DIFFERENT, "A local path or any fsspec URL (s3://...); local paths are made absolute, since the "
                              "workers run in another directory."),
    "per_device_train_batch_size": (SAME, "Per worker."),
    "num_train_epochs": (SAME, ""),
    "max_steps": (SAME, ""),
    "learning_rate": (SAME, ""),
    "lr_scheduler_type": (SAME, "Every schedule by steps that transformers names (raytrainer/optimizers/"
                                "schedules.py); reduce_lr_on_plateau and greedy, stepped by metrics, are refused."),
    "lr_scheduler_kwargs": (SAME, ""),
    "warmup_steps": (SAME, "An int number of steps, or a float in [0, 1) as a ratio."),
    "optim": (SAME, "The optimizers raytrainer/optimizers/ implements; others are refused."),
    "optim_args": (SAME, ""),
    "weight_decay": (SAME, "Not applied to biases and normalisation weights, as transformers."),
    "adam_beta1": (SAME, ""),
    "adam_beta2": (SAME, ""),
    "adam_epsilon": (SAME, ""),
    "optim_target_modules": (SAME, "Read by the optimizers that need it (GaLore, APOLLO: raytrainer/optimizers/)."),
    "gradient_accumulation_steps": (SAME, "An elastic run raises it at smaller world sizes to keep the global "
                                          "batch."),
    "average_tokens_across_devices": (SAME, ""),
    "max_grad_norm": (SAME, ""),
    "label_smoothing_factor": (SAME, ""),
    "bf16": (SAME, "Autocast; under FSDP a MixedPrecisionPolicy."),
    "fp16": (SAME, "GPUs only, with a gradient scaler."),
    "bf16_full_eval": (REFUSED, "evaluation runs under the training precision (autocast), the model is never cast "
                                "for it; set bf16=True for bfloat16 evaluation."),
    "fp16_full_eval": (REFUSED, "evaluation runs under the training precision (autocast), the model is never cast "
                                "for it; set fp16=True for float16 evaluation on GPUs."),
    "tf32": (SAME, "Set on every worker; True without GPUs is a ConfigError (on the driver when use_gpu=False or "
                   "use_cpu=True, else when the worker starts)."),
    "activation_checkpointing": (SAME, "transformers 5's name; gradient_checkpointing mirrors it."),
    "activation_checkpointing_kwargs": (SAME, "gradient_checkpointing_kwargs mirrors it. The every_n_layers and "
                                              "offload keys are refused (every block is checkpointed)."),
    "gradient_checkpointing": (SAME, "Deprecated alias of activation_checkpointing, as in transformers 5."),
    "gradient_checkpointing_kwargs": (SAME, "Deprecated alias of activation_checkpointing_kwargs."),
    "torch_compile": (SAME, "Compiles each block (FSDP's hooks stay outside the compiled regions)."),
    "torch_compile_backend": (SAME, ""),
    "torch_compile_mode": (SAME, ""),
    "use_liger_kernel": (SAME, "Liger's kernels patched into a transformers model on every worker, GPUs only "
                               "(raytrainer/strategy/liger.py)."),
    "liger_kernel_config": (SAME, ""),
    "use_cache": (SAME, "Set on the model's config on every worker before training, as transformers does at "
                        "Trainer construction."),
    "neftune_noise_alpha": (SAME, ""),
    "torch_empty_cache_steps": (SAME, "Empties the worker's device cache after every N optimizer steps."),
    "auto_find_batch_size": (REFUSED, f"{_OUT_OF_MEMORY}; lower per_device_train_batch_size and raise "
                                      "gradient_accumulation_steps by the same factor (the global batch is per-device "
                                      "batch x accumulation x workers)."),
    "logging_strategy": (SAME, ""),
    "logging_steps": (SAME, ""),
    "logging_first_step": (SAME, ""),
    "log_on_each_node": (DIFFERENT, "Ray forwards every worker's output to the driver's console, so rank 0 logs at "
                                    "log_level and every other rank at log_level_replica whatever the node; "
                                    "should_log is True on the driver."),
    "logging_nan_inf_filter": (SAME, "A NaN/Inf step loss is logged as the average so far; NaN/Inf evaluation "
                                     "batch losses are left out of eval_loss."),
    "include_num_input_tokens_seen": (SAME, "'all', 'non_padding', 'no' (True/False map to 'all'/'no'); counted over "
                                            "all ranks into state.num_input_tokens_seen and every log."),
    "log_level": (SAME, "Rank 0's level."),
    "log_level_replica": (DIFFERENT, "Default 'error', not 'warning': N workers would print rank 0's warnings N "
                                     "times."),
    "disable_tqdm": (SAME, "The progress bar is the driver's. transformers' None becomes False here, as it does "
                           "there unless the transformers logger is set above WARNING."),
    "report_to": (SAME, "'none', 'all', 'tensorboard', 'mlflow', 'wandb', 'trackio' and reporters added with "
                        "register_reporter(); others are refused."),
    "run_name": (SAME, ""),
    "project": (SAME, "The Trackio project (report_to='trackio')."),
    "trackio_space_id": (REFUSED, "no Space is synced during the run; " + NO_SPACE),
    "trackio_bucket_id": (REFUSED, "no bucket is synced during the run; " + NO_SPACE),
    "trackio_static_space_id": (REFUSED, "no static Space is made from the run; " + NO_SPACE),
    "eval_strategy": (SAME, ""),
    "eval_steps": (SAME, ""),
    "eval_delay": (SAME, ""),
    "per_device_eval_batch_size": (SAME, "Per worker."),
    "prediction_loss_only": (SAME, ""),
    "eval_on_start": (SAME, ""),
    "eval_do_concat_batches": (REFUSED, "predictions are gathered from every rank and concatenated in dataset order; "
                                        "keep it True (use batch_eval_metrics to bound memory)."),
    "eval_use_gather_object": (DIFFERENT, "Outputs are always gathered as objects (all_gather_object), so nested and "
                                          "non-tensor outputs work whatever this says."),
    "eval_accumulation_steps": (SAME, ""),
    "include_for_metrics": (SAME, "inputs: each batch's main input (the model's main_input_name), gathered from "
                                  "every rank in dataset order and padded with -100; loss: each batch's loss, "
                                  "once per row."),
    "batch_eval_metrics": (SAME, "compute_metrics(EvalPrediction, compute_result) is called on rank 0 for each "
                                 "step's batches of all ranks (CPU tensors), compute_result=True on the last; "
                                 "evaluate() keeps no predictions, predict() still returns them."),
    "save_only_model": (SAME, "Resuming from such a checkpoint loads the weights and the trainer state and starts "
                              "a fresh optimizer, with a warning (the scheduler continues at the saved step)."),
    "save_strategy": (SAME, ""),
    "save_steps": (SAME, ""),
    "save_on_each_node": (REFUSED, "checkpoints go to one storage URL every worker reaches; use shared storage "
                                   "(s3://..., NFS with allow_local_output_dir_on_multinode=True)."),
    "save_total_limit": (SAME, "The newest (by commit time) and the best checkpoints are never deleted while "
                               "training; with 1, only the best once training ends, as in transformers."),
    "enable_jit_checkpoint": (DIFFERENT, "Always on, whatever this says: on SIGTERM or a Ray node drain every rank "
                                         "saves within two step boundaries, at the same step, and the run restarts "
                                         "from that checkpoint (max_preemptions)."),
    "push_to_hub": (SAME, "From the driver through huggingface_hub, committed checkpoints only (hub_strategy); "
                          "the repository is created or found before any worker starts."),
    "hub_token": (SAME, "Read only with push_to_hub; never printed (to_dict/repr redact it)."),
    "hub_private_repo": (SAME, "Read only with push_to_hub."),
    "hub_model_id": (SAME, "Read only with push_to_hub and by the model card."),
    "hub_strategy": (SAME, "end, every_save, checkpoint, all_checkpoints; read only with push_to_hub."),
    "hub_always_push": (SAME, "Read only with push_to_hub."),
    "hub_revision": (SAME, "Read only with push_to_hub."),
    "load_best_model_at_end": (SAME, ""),
    "metric_for_best_model": (SAME, ""),
    "greater_is_better": (SAME, ""),
    "ignore_data_skip": (SAME, ""),
    "restore_callback_states_from_checkpoint": (SAME, "Callbacks with state() (EarlyStoppingCallback) are restored "
                                                      "on the driver from the checkpoint's trainer_state.json."),
    "full_determinism": (SAME, "enable_full_determinism(seed) on every worker instead of set_seed."),
    "seed": (SAME, ""),
    "data_seed": (SAME, ""),
    "use_cpu": (DIFFERENT, "Means use_gpu=False: the workers get no GPU (use_gpu=True with it is a ConfigError)."),
    "accelerator_config": (REFUSED, "raytrainer does not run accelerate's Accelerator: batches are sharded by its own "
                                    "sampler (data/sampler.py); drop it."),
    "parallelism_config": (REFUSED, "use strategy='ddp' or 'fsdp' (FSDP2 over all workers) and num_workers; "
                                    "tensor, context and hybrid parallelism are not available."),
    "dataloader_drop_last": (SAME, ""),
    "dataloader_num_workers": (SAME, "Per training worker; an iterable dataset is read in the worker's process."),
    "dataloader_pin_memory": (SAME, "Only where the worker's device is a GPU."),
    "dataloader_persistent_workers": (SAME, ""),
    "dataloader_prefetch_factor": (SAME, "Needs dataloader_num_workers > 0, as in transformers."),
    "dataloader_multiprocessing_context": (SAME, ""),
    "dataloader_in_order": (REFUSED, "the data position of a checkpoint and the evaluation gather rely on batches "
                                     "arriving in order; keep it True."),
    "remove_unused_columns": (SAME, ""),
    "label_names": (SAME, ""),
    "train_sampling_strategy": (SAME, "random, sequential, group_by_length (mega-batches of 50 global batches "
                                      "sorted by length, the longest first); batch_rebalance is refused. A "
                                      "ray.data.Dataset or an iterable dataset keeps its stream's order, as "
                                      "transformers ignores it for an IterableDataset."),
    "length_column_name": (SAME, ""),
    "ddp_find_unused_parameters": (DIFFERENT, "None means False (transformers: True unless gradient checkpointing); "
                                              "set True when the model has parameters without gradients."),
    "ddp_bucket_cap_mb": (SAME, ""),
    "ddp_broadcast_buffers": (SAME, ""),
    "ddp_static_graph": (SAME, ""),
    "ddp_backend": (SAME, "Ray Train sets up NCCL on GPU workers and gloo on CPU ones: only that value (with "
                          "use_gpu set to match) is accepted."),
    "ddp_timeout": (SAME, "Ray Train's TorchConfig(timeout_s=...) for the workers' process group."),
    "fsdp": (SAME, "True, or transformers' older option strings; sets strategy='fsdp' (FSDP2)."),
    "fsdp_config": (SAME, "transformers' keys and accelerate's fsdp_-prefixed spelling (fsdp_offload_params, "
                          "fsdp_sharding_strategy, ...). FSDP1-only keys are ignored with a warning, as transformers "
                          "does under FSDP2; checkpoints are sharded whatever state_dict_type says (save_model() "
                          "writes the full model); size-based wrapping, XLA and cpu_ram_efficient_loading are "
                          "refused."),
    "deepspeed": (REFUSED, "use strategy='fsdp' (fsdp='full_shard auto_wrap' is ZeRO-3, 'shard_grad_op auto_wrap' "
                           "ZeRO-2, with 'offload' for CPU offload)."),
    "debug": (REFUSED, "the underflow/overflow detector and TPU metrics are not available; register transformers' "
                       "DebugUnderflowOverflow on the model yourself."),
    "skip_memory_metrics": (REFUSED, "every log already carries the ranks' peak memory (peak_memory_mb; each rank's "
                                     "in rank_stats memory_mb): keep it True."),
    "do_train": (SAME, "Not read by the Trainer: for scripts."),
    "do_eval": (SAME, "Not read by the Trainer: for scripts. Set True when eval_strategy is not 'no'."),
    "do_predict": (SAME, "Not read by the Trainer: for scripts."),
    "resume_from_checkpoint": (DIFFERENT, "train() resumes from it when its own resume_from_checkpoint argument is "
                                          "None (transformers leaves it to scripts)."),
    "local_rank": (REFUSED, "torch.distributed.launch sets it; raytrainer starts its own workers: run the script "
                            "with plain python and --num_workers N (local_process_index answers the question)."),
}


def field_default(cls: type, name: str) -> Any:
    f = cls.__dataclass_fields__[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default

