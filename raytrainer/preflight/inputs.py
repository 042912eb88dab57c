"""The inputs of a call, checked before anything else: its datasets and the arguments that need them."""

from __future__ import annotations

from typing import Any

from ..data.ray_data import check_train_length, is_ray_dataset
from ..data.sampler import epoch_end
from ..data.streaming import is_stream, stream_length
from ..errors import ConfigError
from ..worker.batch_metrics import check_compute_metrics
from ..worker.hooks import WorkerHooks
from ..worker.neftune import input_embeddings
from ..worker.nonfinite import POLICIES


def check_dataset(dataset: Any, name: str):
    """A map-style dataset with a length, not empty; or a stream (a Ray Dataset, an iterable dataset: their
    length may be unknown)."""
    if dataset is None or is_ray_dataset(dataset):
        return
    if is_stream(dataset):
        check_stream(dataset, name)
        return
    if not hasattr(dataset, "__getitem__"):
        raise ConfigError(f"{name} must be a map-style dataset (datasets.Dataset or a torch Dataset with "
                          "__len__ and __getitem__), an iterable dataset (datasets.IterableDataset, a torch "
                          f"IterableDataset) or a ray.data.Dataset; got a {type(dataset).__name__}.")
    try:
        size = len(dataset)
    except TypeError as exc:
        raise ConfigError(f"{name} has no len(): use a map-style dataset.") from exc
    if size == 0:
        raise ConfigError(f"{name} is empty.")


def check_stream(dataset: Any, name: str):
    """An iterable dataset is read whole by every worker, which keeps its share (data/streaming.py): one that
    split_dataset_by_node already cut to one node's part would leave the others' rows out, silently."""
    if getattr(dataset, "_distributed", None) is not None:  # what datasets.distributed.split_dataset_by_node sets
        raise ConfigError(f"{name} was split with datasets.distributed.split_dataset_by_node: pass the whole "
                          "stream. Every worker reads it and keeps its share of each global batch.")


def check_stream_length(dataset: Any, args):
    """As transformers: a stream without len() needs max_steps (its epoch's length is unknown)."""
    if is_stream(dataset) and stream_length(dataset) is None and args.max_steps <= 0:
        raise ConfigError(f"train_dataset is an iterable dataset ({type(dataset).__name__}) without a length: set "
                          "max_steps to the number of optimizer steps to train (a new pass over the stream starts "
                          "when it ends), as transformers requires.")


def check_drop_last(dataset: Any, args):
    """With dataloader_drop_last, a map-style train_dataset smaller than one global micro-batch (at the most
    workers the run uses) gives no batch at all: the run would end at step 0 (transformers fails on it too, asking
    for max_steps). Epochs end at the last full global micro-batch (data/sampler.py's epoch_end)."""
    if not args.dataloader_drop_last or is_ray_dataset(dataset) or is_stream(dataset):
        return
    workers = max(args.max_workers, 1)
    global_micro_batch = args.per_device_train_batch_size * workers
    if epoch_end(len(dataset), global_micro_batch, drop_last=True) == 0:
        raise ConfigError(f"train_dataset has {len(dataset)} rows, fewer than one micro-batch on every worker "
                          f"({args.per_device_train_batch_size} x {workers} worker(s) = {global_micro_batch}), and "
                          "dataloader_drop_last=True drops them: nothing would train. Lower "
                          "per_device_train_batch_size or num_workers, or set dataloader_drop_last=False.")


def check_train_inputs(trainer):
    """train()'s datasets, and the arguments that need a dataset, a model or compute_metrics."""
    args = trainer.args
    if trainer.train_dataset is None:
        raise ConfigError("train() needs a train_dataset: pass Trainer(train_dataset=...).")
    check_dataset(trainer.train_dataset, "train_dataset")
    if type(trainer).get_train_dataloader is WorkerHooks.get_train_dataloader:  # else the override batches
        check_drop_last(trainer.train_dataset, args)
    if is_ray_dataset(trainer.train_dataset):
        check_train_length(trainer.train_dataset, args)
    check_stream_length(trainer.train_dataset, args)
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
