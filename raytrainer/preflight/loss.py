"""The loss on two samples, computed on the driver before any worker starts: what every worker would compute
first, so a dataset, a model or a compute_loss that cannot train fails once, here, naming the fix."""

from __future__ import annotations

import contextlib
import logging
import random
import time
from typing import Any, Optional

import numpy
import torch

from ..data.columns import LABEL_ALIASES, count_label_items, dataset_columns, dropped_label_columns
from ..data.ray_data import is_ray_dataset, sample_rows
from ..data.streaming import first_rows, is_stream
from ..errors import ConfigError
from ..worker.hooks import batch_collator, call_compute_loss


def check_loss(trainer, dataset: Any, dataset_name: str) -> Optional[float]:
    """Run the loss on two samples, on the driver, so a missing or dropped label column, a model that returns
    no loss, or a loss training cannot use (not a scalar, no gradient, NaN) fails here rather than in every
    worker. Returns the seconds it took (train()'s start-up timeline shows them), None when skipped: with
    model_init (no model object on the driver yet) or without a dataset."""
    model = trainer.model
    if model is None or dataset is None:
        return None
    started = time.perf_counter()
    with _untouched(model):
        _check_loss(trainer, model, dataset, dataset_name)
    return time.perf_counter() - started


@contextlib.contextmanager
def _untouched(model):
    """A check leaves the run as it found it: the forward in train mode moves BatchNorm's running statistics
    (and its count) and draws dropout masks from torch's random stream; the buffers and every random stream
    (torch's, CUDA's, Python's, numpy's) are put back, so the run's first step is the one it would have had."""
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    cpu, py, np_state = torch.get_rng_state(), random.getstate(), numpy.random.get_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name in buffers and buffers[name].shape == buffer.shape:
                    buffer.copy_(buffers[name])
        torch.set_rng_state(cpu)
        random.setstate(py)
        numpy.random.set_state(np_state)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _check_loss(trainer, model, dataset: Any, dataset_name: str):
    rows = (sample_rows(dataset) if is_ray_dataset(dataset) else first_rows(dataset, 2) if is_stream(dataset)
            else [dataset[i] for i in range(min(2, len(dataset)))])
    if not rows:  # a stream (its emptiness is known only once read)
        raise ConfigError(f"{dataset_name} is empty: iterating it gave no row.")
    batch = batch_collator(trainer)(rows)
    _check_labels_kept(trainer, rows, batch, dataset_name)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    was_training = model.training
    items = count_label_items(batch, trainer.label_names)
    try:
        # With gradients on, to see that the loss reaches the parameters; the graph keeps none of the activations
        # backward would need (dropped as they are saved), so memory stays as under no_grad.
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_drop, _drop):
            loss = call_compute_loss(trainer, model, batch, num_items_in_batch=items)
    except Exception as exc:
        raise ConfigError(_loss_failure(trainer, dataset, dataset_name, exc)) from exc
    finally:
        model.train(was_training)
    _check_loss_value(trainer, loss, dataset_name, items)


def _drop(_):
    return None


def _check_labels_kept(trainer, rows: list, batch: dict, dataset_name: str):
    """A label column the collator dropped (text: the default collator batches numbers only) would train a
    model without labels, or fail later as 'no loss'."""
    for name, example in dropped_label_columns(rows, batch, trainer.label_names):
        raise ConfigError(
            f"{dataset_name}'s {name!r} column holds {type(example).__name__} values (e.g. {example!r}), which the "
            "data collator dropped: the model would get no labels. Map them to numbers first (class ids: "
            f"dataset.class_encode_column({name!r}), or a label2id dict in dataset.map; token ids for text "
            "targets), or pass a data_collator that turns them into tensors.")


def _check_loss_value(trainer, loss: Any, dataset_name: str, items: Optional[int]):
    """What backward() and the optimizer need: a tensor, a scalar, a graph to the parameters, a finite value."""
    where = f"The loss on two samples of {dataset_name} (computed on the driver before any worker started)"
    source = "compute_loss_func" if trainer.compute_loss_func is not None else f"{type(trainer).__name__}.compute_loss"
    if not isinstance(loss, torch.Tensor):
        raise ConfigError(f"{where} is a {type(loss).__name__}, not a torch tensor: {source} must return the loss "
                          "tensor (a scalar computed from the model's outputs).")
    if loss.dim() != 0:
        raise ConfigError(f"{where} has shape {tuple(loss.shape)}, not a scalar: reduce it in {source} (.mean() "
                          "over its items, or .sum() / num_items_in_batch) so that backward() gets one number.")
    if not loss.requires_grad:
        frozen = not any(p.requires_grad for p in trainer.model.parameters())
        why = (f"no parameter of {type(trainer.model).__name__} requires grad: unfreeze the ones to train "
               "(param.requires_grad_(True))" if frozen else
               f"{source} cut it off the model's parameters: do not .detach() it, call .item() on it or compute it "
               "under torch.no_grad(), and build it from the model's outputs")
        raise ConfigError(f"{where} does not require grad, so training could not update anything: {why}.")
    value = float(loss.detach())
    if not torch.isfinite(loss.detach()) and items != 0:  # no label item in these rows: a 0/0 is theirs, not a bug
        if trainer.args.on_nonfinite_loss == "skip":
            logging.getLogger("raytrainer").warning("%s is %s; on_nonfinite_loss='skip' skips such steps.", where,
                                                    value)
            return
        raise ConfigError(f"{where} is {value}: check the labels (values the loss accepts, rows with some label "
                          "not -100), the inputs and the model's initialisation and dtype; or set "
                          "on_nonfinite_loss='skip' to train on past steps with a NaN/Inf loss.")


def _loss_failure(trainer, dataset, dataset_name: str, exc: Exception) -> str:
    columns = (list(sample_rows(dataset, 1)[0]) if is_ray_dataset(dataset) else
               list(first_rows(dataset, 1)[0]) if is_stream(dataset) else dataset_columns(dataset)) or []
    present = set(columns) | ({"labels"} if set(LABEL_ALIASES) & set(columns) else set())
    missing = [n for n in trainer.label_names if n not in present]
    if missing and trainer.compute_loss_func is None:
        return (f"{dataset_name} has no {missing[0]!r} column, which {type(trainer.model).__name__} needs to "
                f"compute its loss (columns: {columns}). Add the label column, point label_names at it, or "
                f"pass compute_loss_func=.... The model said: {exc}")
    return (f"Computing the loss on two samples of {dataset_name} failed on the driver, before any worker "
            f"started: {type(exc).__name__}: {exc}")
