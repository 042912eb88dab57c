"""raytrainer: a Hugging Face-style Trainer whose runs span a Ray cluster.

    from raytrainer import Trainer, TrainingArguments
    args = TrainingArguments(output_dir="s3://bucket/run", num_workers=4, max_failures=3)
    Trainer(model=model, args=args, train_dataset=train, eval_dataset=val).train()
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Imported on first use (PEP 562): a process that needs one module of the package (the event sink actor, a
# Ray Train helper) does not pay for torch and transformers' imports.
_EXPORTS = {
    "ArgumentParser": ".arguments.parser", "TrainingArguments": ".arguments.training_args",
    "TrainerCallback": ".callbacks.base",
    "EarlyStoppingCallback": ".callbacks.early_stopping", "ProfilerCallback": ".callbacks.profiler",
    "PrinterCallback": ".callbacks.progress", "ProgressCallback": ".callbacks.progress",
    "DefaultCollator": ".data.collator", "ConfigError": ".errors", "StorageError": ".errors",
    "register_reporter": ".arguments.report_to", "EvalPrediction": ".state", "PredictionOutput": ".state",
    "TrainerControl": ".state", "TrainerState": ".state", "TrainOutput": ".state", "Trainer": ".trainer",
    "hosted": ".hosting.api", "HostedTrainer": ".hosting.api", "launch": ".hosting.launch_script",
    "get_last_checkpoint": ".checkpoint.listing", "Seq2SeqTrainer": ".seq2seq_trainer",
    "Seq2SeqTrainingArguments": ".arguments.seq2seq_args",
}

__all__ = [
    "ArgumentParser", "ConfigError", "DefaultCollator", "EarlyStoppingCallback", "EvalPrediction",
    "HostedTrainer", "PredictionOutput", "PrinterCallback", "ProfilerCallback", "ProgressCallback",
    "Seq2SeqTrainer", "Seq2SeqTrainingArguments", "StorageError",
    "Trainer", "TrainerCallback", "TrainerControl", "TrainerState", "TrainingArguments", "TrainOutput",
    "get_last_checkpoint", "hosted", "launch", "register_reporter",
]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'raytrainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # for type checkers and IDEs: the names as plain imports
    from .arguments.parser import ArgumentParser
    from .arguments.report_to import register_reporter
    from .arguments.seq2seq_args import Seq2SeqTrainingArguments
    from .arguments.training_args import TrainingArguments
    from .callbacks.base import TrainerCallback
    from .callbacks.early_stopping import EarlyStoppingCallback
    from .callbacks.profiler import ProfilerCallback
    from .callbacks.progress import PrinterCallback, ProgressCallback
    from .checkpoint.listing import get_last_checkpoint
    from .data.collator import DefaultCollator
    from .errors import ConfigError, StorageError
    from .hosting.api import HostedTrainer, hosted
    from .hosting.launch_script import launch
    from .seq2seq_trainer import Seq2SeqTrainer
    from .state import EvalPrediction, PredictionOutput, TrainerControl, TrainerState, TrainOutput
    from .trainer import Trainer
