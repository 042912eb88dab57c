"""Evaluation and prediction on every rank, gathered without duplicated or missing samples.

Each rank takes a contiguous slice of the dataset (`eval_shard`); predictions and labels are gathered to
every rank in rank order, which is the dataset order. Sequences of different lengths are padded with -100
when batches are concatenated (HF's `nested_concat` rule). Metrics are computed once, on rank 0, and
broadcast, so every rank holds the same values for decisions (best checkpoint, early stopping).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, List, Optional

import numpy as np
import torch

from ..data.columns import count_label_items, loss_shifts_labels
from ..data.ray_batches import RayEvalLoader, interleave
from ..data.streaming import StreamEvalLoader
from ..state import EvalPrediction, PredictionOutput
from .batch_metrics import BatchMetrics
from .host_arrays import concat_padded, detached, to_numpy
from .watchdog import current as current_watchdog

# Loaders whose rank r holds batches r, r + world, ... of the whole stream (ray_batches.interleave restores the order).
INTERLEAVED = (RayEvalLoader, StreamEvalLoader)


def _batch_size(batch: dict) -> int:
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.shape[0]
    return 1


class PredictionBuffer:
    """Predictions and labels of the batches so far. They stay on the device (no sync per batch) and move
    to host memory every `move_every` batches (HF's eval_accumulation_steps; None: at the end), which
    bounds the device memory they hold. `peak_device_bytes` records that bound as measured."""

    def __init__(self, move_every: Optional[int]):
        self.move_every = move_every
        self.pending: List[Any] = []
        self.host: List[Any] = []
        self.peak_device_bytes = 0

    def add(self, logits: Any, labels: Any):
        self.pending.append((logits, labels))
        self.peak_device_bytes = max(self.peak_device_bytes, sum(_nbytes(p) for p in self.pending))
        if self.move_every is not None and len(self.pending) >= self.move_every:
            self.move_to_host()

    def move_to_host(self):
        self.host.extend((to_numpy(p), to_numpy(label)) for p, label in self.pending)
        self.pending = []

    def concatenated(self):
        self.move_to_host()
        return concat_padded([p for p, _ in self.host]), concat_padded([label for _, label in self.host])


class MetricExtras:
    """What include_for_metrics asks compute_metrics to get besides predictions and labels, as transformers'
    evaluation loop makes it: "inputs", each batch's main input (padded with -100 across batches), or under
    batch_eval_metrics the step's whole batch (a dict); "loss", each batch's loss repeated once per row. On the
    host: these are read only when asked for."""

    def __init__(self, include: Optional[List[str]], main_input_name: str, whole_batch: bool):
        self.inputs_wanted, self.losses_wanted = "inputs" in (include or ()), "loss" in (include or ())
        self.main_input_name, self.whole_batch = main_input_name, whole_batch
        self.inputs: List[np.ndarray] = []
        self.losses: List[np.ndarray] = []

    def of(self, batch: dict, loss: Any, size: int) -> tuple:
        inputs = None
        if self.inputs_wanted:
            inputs = ({k: to_numpy(v) for k, v in batch.items() if isinstance(v, torch.Tensor)} if self.whole_batch
                      else to_numpy(batch[self.main_input_name]))
        losses = np.full(size, float(loss), dtype=np.float32) if self.losses_wanted and loss is not None else None
        return inputs, losses

    def keep(self, inputs: Optional[np.ndarray], losses: Optional[np.ndarray]):
        if inputs is not None:
            self.inputs.append(inputs)
        if losses is not None:
            self.losses.append(losses)

    def concatenated(self) -> tuple:
        return concat_padded(self.inputs), concat_padded(self.losses)


def _nbytes(value: Any) -> int:
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


def eval_sets(dataset: Any, metric_key_prefix: str = "eval") -> List[tuple]:
    """(metric key prefix, dataset) of each evaluation an `evaluate()` of `dataset` makes: a dict of eval datasets
    is one evaluation per dataset, its metrics named `<prefix>_<name>_...` (transformers' rule)."""
    if isinstance(dataset, dict):
        return [(f"{metric_key_prefix}_{name}", each) for name, each in dataset.items()]
    return [(metric_key_prefix, dataset)]


def evaluation_loop(trainer, dataloader, prediction_loss_only: Optional[bool] = None, ignore_keys=None,
                    metric_key_prefix: str = "eval", on_step: Optional[Callable[[str], None]] = None,
                    keep_predictions: bool = False, buffer: Optional[PredictionBuffer] = None) -> PredictionOutput:
    """`on_step(event)` is told of each batch ("prediction_step"), for the driver's callbacks.
    `keep_predictions`: return the predictions under batch_eval_metrics too (predict(), as transformers).
    `buffer`: where the predictions wait for the host (made here from eval_accumulation_steps unless given)."""
    args, ctx = trainer.args, trainer.ctx
    if prediction_loss_only is None:
        prediction_loss_only = args.prediction_loss_only
    start = time.time()
    model = trainer.model  # unwrapped: evaluation needs no gradient synchronisation
    # The loss is the mean over every label item of the set (a batch's mean weighs by its items), whatever the
    # batching: transformers weighs each batch's mean by its rows, which depends on how rows fall into batches.
    loss_sum, weight, count = None, 0, 0  # loss_sum stays None when the model gives no loss (no labels)
    shift = loss_shifts_labels(model)
    buffer = PredictionBuffer(args.eval_accumulation_steps) if buffer is None else buffer
    # batch_eval_metrics: metrics step by step, predictions not kept (but for predict(), as transformers).
    batched = BatchMetrics(trainer) if args.batch_eval_metrics and trainer.compute_metrics is not None else None
    # Every rank reads the whole stream of a Ray Dataset or an iterable dataset, so it knows after the pass how
    # many it is short of; otherwise the count is a collective, agreed before any forward pass.
    interleaved = isinstance(dataloader, INTERLEAVED)
    missing = 0 if interleaved else _passes_behind(trainer, dataloader)
    # include_for_metrics: each batch's main input and its loss once per row, on the host (as transformers)
    extras = MetricExtras(args.include_for_metrics, getattr(model, "main_input_name", "input_ids"), batched is not None)
    batch = None
    watch = current_watchdog()  # a mark per batch: a long evaluation is progress, not a stall
    for batch in dataloader:
        watch.phase("evaluation batch")
        size = _batch_size(batch)
        loss, logits, label = trainer.prediction_step(model, batch, prediction_loss_only, ignore_keys=ignore_keys)
        inputs, losses = extras.of(batch, loss, size)
        if loss is not None:
            items = count_label_items(batch, trainer.label_names, shift)
            items = size if items is None else items
            if args.logging_nan_inf_filter and not math.isfinite(float(loss)):  # HF leaves it out of eval_loss
                loss_sum = loss_sum or 0.0
            else:
                loss_sum, weight = (loss_sum or 0.0) + float(loss) * items, weight + items
        count += size
        if logits is not None and trainer.preprocess_logits_for_metrics is not None:
            logits = trainer.preprocess_logits_for_metrics(logits, label)
        if batched is not None:
            batched.add(logits, label, inputs, losses)
        if batched is None or keep_predictions:
            buffer.add(detached(logits), detached(label))
        if batched is None:  # batch_eval_metrics handed them to compute_metrics with the step
            extras.keep(inputs, losses)
        if on_step is not None:
            on_step("prediction_step")
    if interleaved and _sharded(trainer):
        missing = dataloader.passes_behind()
    if missing:
        _filler_passes(trainer, model, dataloader, batch, missing, prediction_loss_only, ignore_keys)
    batch_metrics = batched.finish() if batched is not None else None  # after the fillers: see batch_metrics.py
    preds, labels = buffer.concatenated()

    sizes = dataloader.sizes if interleaved else None
    gathered = ctx.all_gather_object((loss_sum, count, preds, labels, sizes, weight, *extras.concatenated()))
    losses = [g[0] for g in gathered if g[0] is not None]
    num_samples = sum(g[1] for g in gathered)
    loss_weight = sum(g[5] for g in gathered)

    def in_order(index: int):
        if interleaved:  # rank r holds batches r, r + world, ...: back to dataset order
            return interleave([g[index] for g in gathered], [g[4] for g in gathered], concat_padded)
        return concat_padded([g[index] for g in gathered])  # contiguous shards in rank order: the dataset order

    all_preds, all_labels, all_inputs, all_losses = in_order(2), in_order(3), in_order(6), in_order(7)

    metrics = {}
    if ctx.is_main:
        watch.phase("compute_metrics")
        if batch_metrics is not None:
            metrics = batch_metrics
        elif trainer.compute_metrics is not None and all_preds is not None and all_labels is not None:
            metrics = dict(call_compute_metrics(trainer.compute_metrics, all_preds, all_labels, all_inputs,
                                                all_losses))
        metrics = {k if k.startswith(f"{metric_key_prefix}_") else f"{metric_key_prefix}_{k}": _plain(v)
                   for k, v in metrics.items()}
        if losses:  # NaN when every batch's loss was NaN/Inf (left out by logging_nan_inf_filter)
            metrics[f"{metric_key_prefix}_loss"] = sum(losses) / loss_weight if loss_weight else float("nan")
        runtime = time.time() - start
        steps = math.ceil(num_samples / (args.per_device_eval_batch_size * ctx.world_size))
        metrics[f"{metric_key_prefix}_runtime"] = round(runtime, 4)
        metrics[f"{metric_key_prefix}_samples_per_second"] = round(num_samples / max(runtime, 1e-9), 3)
        metrics[f"{metric_key_prefix}_steps_per_second"] = round(steps / max(runtime, 1e-9), 3)
    metrics = ctx.broadcast_object(metrics)
    return PredictionOutput(predictions=all_preds, label_ids=all_labels, metrics=metrics)


def call_compute_metrics(compute_metrics, predictions, label_ids, inputs=None, losses=None):
    """compute_metrics on the gathered predictions. A script written for generated ids (decoding them) fails deep
    inside its tokenizer when it gets logits: its error then names compute_metrics and the cause."""
    try:
        return compute_metrics(EvalPrediction(predictions=predictions, label_ids=label_ids, inputs=inputs,
                                              losses=losses))
    except (TypeError, OverflowError) as exc:  # what a tokenizer's decode raises on floats
        first = predictions[0] if isinstance(predictions, (tuple, list)) and predictions else predictions
        if not (isinstance(first, np.ndarray) and np.issubdtype(first.dtype, np.floating)):
            raise
        raise TypeError(
            f"compute_metrics raised {type(exc).__name__}: {exc}. It was given the model's logits (float, shape "
            f"{first.shape}), not token ids: if it decodes ids, use raytrainer.Seq2SeqTrainer with "
            "Seq2SeqTrainingArguments(predict_with_generate=True) for generated ids, or reduce the logits first "
            "(argmax) in preprocess_logits_for_metrics.") from exc


def _passes_behind(trainer, dataloader) -> int:
    """Under a sharded strategy (FSDP) every forward pass gathers parameters with the other ranks, so every
    rank must run as many as the rank with the most batches: how many this rank is short of that. (Agreed
    before the first pass, or the count's all-reduce would meet another rank's gather.) Replicated
    strategies need nothing."""
    ctx = trainer.ctx
    if not _sharded(trainer):
        return 0
    mine = len(dataloader)
    return int(ctx.all_reduce_max(torch.tensor(mine, device=ctx.device)).item()) - mine


def _sharded(trainer) -> bool:
    return bool(getattr(trainer.strategy, "shards_state", False) and trainer.ctx.distributed)


def _filler_passes(trainer, model, dataloader, last_batch, count: int, prediction_loss_only, ignore_keys):
    """Forward passes whose results are discarded: a batch of this rank's again (or the first sample)."""
    filler = last_batch
    if filler is None and isinstance(dataloader, INTERLEAVED):
        filler = dataloader.filler_batch()
    if filler is None:
        subset = dataloader.dataset
        base = getattr(subset, "dataset", subset)
        filler = dataloader.collate_fn([base[0]])
    for _ in range(count):
        trainer.prediction_step(model, filler, prediction_loss_only, ignore_keys=ignore_keys)


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") and np.ndim(value) == 0 else value
