"""The inputs of a call, checked before anything else: its datasets and the arguments that need them."""

from __future__ import annotations

from typing import Any

import torch

from ..data.ray_data import check_train_length, is_ray_dataset
from ..errors import ConfigError
from ..worker.batch_metrics import check_compute_metrics
from ..worker.neftune import input_embeddings
from ..worker.nonfinite import POLICIES


def check_dataset(dataset: Any, name: str):
    """A map-style dataset with a length, not empty (a Ray Dataset streams: its length may be unknown)."""
    if dataset is None or is_ray_dataset(dataset):
        return
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__getitem__"):
        raise ConfigError(f"{name} must be a map-style dataset (datasets.Dataset or a torch Dataset with "
                          "__len__ and __getitem__); iterable datasets are not supported yet.")
    try:
        size = len(dataset)
    except TypeError as exc:
        raise ConfigError(f"{name} has no len(): use a map-style dataset.") from exc
    if size == 0:
        raise ConfigError(f"{name} is empty.")


def check_train_inputs(trainer):
    """train()'s datasets, and the arguments that need a dataset, a model or compute_metrics."""
    args = trainer.args
    if trainer.train_dataset is None:
        raise ConfigError("train() needs a train_dataset: pass Trainer(train_dataset=...).")
    check_dataset(trainer.train_dataset, "train_dataset")
    if is_ray_dataset(trainer.train_dataset):
        check_train_length(trainer.train_dataset, args)
    if getattr(args, "on_nonfinite_loss", "warn") not in POLICIES:
        raise ConfigError(f"on_nonfinite_loss={args.on_nonfinite_loss!r}: choose one of {', '.join(POLICIES)}.")
    if args.batch_eval_metrics:  # transformers checks this at Trainer construction
        check_compute_metrics(trainer.compute_metrics)
    if args.eval_strategy != "no" and trainer.eval_dataset is None:
        raise ConfigError(f"eval_strategy={args.eval_strategy!r} needs an eval_dataset: pass "
                          "Trainer(eval_dataset=...) or set eval_strategy='no'.")
    if args.neftune_noise_alpha is not None and trainer.model is not None:
        try:
            input_embeddings(trainer.model)
        except ValueError as exc:
            raise ConfigError(f"{exc} Set neftune_noise_alpha=None.") from None
    evals = trainer.eval_dataset if isinstance(trainer.eval_dataset, dict) else {"": trainer.eval_dataset}
    for key, dataset in evals.items():
        check_dataset(dataset, f"eval_dataset[{key!r}]" if key else "eval_dataset")
