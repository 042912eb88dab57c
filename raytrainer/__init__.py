"""raytrainer: a Hugging Face-style Trainer whose runs span a Ray cluster.

    from raytrainer import Trainer, TrainingArguments
    args = TrainingArguments(output_dir="s3://bucket/run", num_workers=4, max_failures=3)
    Trainer(model=model, args=args, train_dataset=train, eval_dataset=val).train()
"""

from .argparser import ArgumentParser
from .args import TrainingArguments
from .callbacks.base import TrainerCallback
from .callbacks.early_stopping import EarlyStoppingCallback
from .callbacks.profiler import ProfilerCallback
from .callbacks.progress import PrinterCallback, ProgressCallback
from .data.collator import DefaultCollator
from .errors import ConfigError, StorageError
from .report_to import register_reporter
from .state import EvalPrediction, PredictionOutput, TrainerControl, TrainerState, TrainOutput
from .trainer import Trainer

__version__ = "0.1.0"

__all__ = [
    "ArgumentParser", "ConfigError", "DefaultCollator", "EarlyStoppingCallback", "EvalPrediction",
    "PredictionOutput", "PrinterCallback", "ProfilerCallback", "ProgressCallback", "StorageError", "Trainer",
    "TrainerCallback", "TrainerControl", "TrainerState", "TrainingArguments", "TrainOutput", "register_reporter",
]
