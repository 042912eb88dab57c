"""The values each choice field of `TrainingArguments` accepts, read by its declaration (help text, argparse's
choices) and by its check (checks.py). The `optim` and `lr_scheduler_type` names are the optimizers' own
(`raytrainer/optimizers/`), the log levels verbosity's table.
"""

from __future__ import annotations

from ..verbosity import LOG_LEVELS as LEVEL_NUMBERS

INTERVALS = ("no", "steps", "epoch")  # logging_strategy, eval_strategy
SAVE_INTERVALS = (*INTERVALS, "best")  # save_strategy
STRATEGIES = ("ddp", "fsdp")  # strategy
LOG_LEVELS = tuple(LEVEL_NUMBERS)  # log_level, log_level_replica: transformers' names
CALLBACK_DECISIONS = ("same_step", "next_step")  # callback_decisions
TOKEN_COUNTS = ("all", "non_padding", "no")  # include_num_input_tokens_seen
SAMPLING_STRATEGIES = ("random", "sequential", "group_by_length", "batch_rebalance")  # transformers' choices
MP_CONTEXTS = ("fork", "spawn", "forkserver")  # dataloader_multiprocessing_context
DDP_BACKENDS = ("nccl", "gloo", "mpi", "xccl", "hccl", "cncl", "mccl")  # ddp_backend: transformers' choices
HUB_STRATEGIES = ("end", "every_save", "checkpoint", "all_checkpoints")  # hub_strategy
