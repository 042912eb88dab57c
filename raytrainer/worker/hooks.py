"""The overridable steps of training, with Hugging Face's names and signatures. They run on every worker.

`Trainer` inherits these; a user's subclass that overrides `compute_loss`, `training_step`, ... is shipped to
each Ray actor, so the override runs there. Before they run, the worker loop sets `self.model` (unwrapped,
on the worker's device), `self.model_wrapped` (DDP...), `self.ctx` (rank, world size) and `self.state`.
"""

from __future__ import annotations

from typing import Optional

import torch
from accelerate.utils import send_to_device
from torch.utils.data import DataLoader

from ..data.collator import DefaultCollator, pad_token_id_of
from ..data.columns import (ColumnFilter, accepts_argument, accepts_loss_kwargs, count_label_items,
                            default_label_names, extract_logits, extract_loss, forward_signature)
from ..data.ray_batches import RayEvalLoader, RayTrainData
from ..data.ray_data import RayDataRef
from ..data.sampler import DistributedBatchSampler, eval_shard
from ..optim import create_optimizer, create_scheduler
from .losses import is_causal_lm, label_smoothed_loss


class WorkerHooks:
    # Hugging Face's class attribute: whether `compute_loss` returns a loss already normalised over the whole
    # accumulated (global) batch, i.e. by `num_items_in_batch`. None: decided on each call, True exactly when the
    # base `compute_loss` normalised it. A subclass that computes its own loss returns a per-micro-batch mean
    # (averaged over micro-steps and ranks) unless it sets this to True.
    loss_is_scaled_for_ga: Optional[bool] = None
    # Set per micro-batch by the loop: 0.0 for a rank's zero-weight filler batch (see data/sampler.py).
    _loss_weight: float = 1.0
    _accumulation_steps_now: int = 1
    # Set by the base compute_loss when it normalised by num_items_in_batch; read by training_step.
    _loss_scaled_by_items: bool = False
    # Set by training_step, read by the loop's loss meter: whether the returned loss is this rank's share of
    # the global batch's loss (summed over ranks) rather than a per-rank value (averaged over ranks).
    _step_loss_is_global: bool = False

    # ------------------------------------------------------------------ data
    @property
    def label_names(self) -> list:
        return self.args.label_names or default_label_names(self._unwrapped_model())

    def _unwrapped_model(self):
        return self.model if self.model is not None else self.model_init()

    def _collator(self):
        collator = self.data_collator or DefaultCollator(pad_token_id=pad_token_id_of(self.processing_class))
        if not self.args.remove_unused_columns:
            return collator
        names, var_kw = forward_signature(self._unwrapped_model())
        return collator if var_kw else ColumnFilter(collator, names + self.label_names)

    def get_train_dataloader(self) -> DataLoader:
        ctx, args = self.ctx, self.args
        if isinstance(self.train_dataset, RayDataRef):  # a ray.data.Dataset: this rank's streaming shard
            return RayTrainData(self.train_dataset, args.per_device_train_batch_size, self._collator(), ctx,
                                drop_last=args.dataloader_drop_last)
        sampler = DistributedBatchSampler(len(self.train_dataset), args.per_device_train_batch_size,
                                          rank=ctx.rank, world_size=ctx.world_size, seed=args.train_data_seed,
                                          shuffle=True, drop_last=args.dataloader_drop_last)
        return DataLoader(self.train_dataset, batch_sampler=sampler, collate_fn=self._collator(),
                          num_workers=args.dataloader_num_workers, pin_memory=ctx.device.type == "cuda")

    def get_eval_dataloader(self, eval_dataset=None) -> DataLoader:
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        return self._ordered_dataloader(dataset)

    def get_test_dataloader(self, test_dataset) -> DataLoader:
        return self._ordered_dataloader(test_dataset)

    def _ordered_dataloader(self, dataset) -> DataLoader:
        if isinstance(dataset, RayDataRef):  # every rank reads the stream, keeps every world-size-th batch
            return RayEvalLoader(dataset, self.args.per_device_eval_batch_size, self._collator(),
                                 self.ctx.rank, self.ctx.world_size)
        # Contiguous shard per rank: gathering in rank order restores the dataset order exactly.
        shard = torch.utils.data.Subset(dataset, eval_shard(len(dataset), self.ctx.rank, self.ctx.world_size))
        return DataLoader(shard, batch_size=self.args.per_device_eval_batch_size, shuffle=False,
                          collate_fn=self._collator(), num_workers=self.args.dataloader_num_workers)

    def _place_auxiliary_modules(self):
        """Modules a subclass keeps besides the model (a frozen reference model for a DPO-style loss, ...) go to
        this worker's device, frozen and in eval mode: they are never wrapped, optimised or saved."""
        for name, value in vars(self).items():
            if isinstance(value, torch.nn.Module) and name not in ("model", "model_wrapped"):
                value.to(self.ctx.device).eval().requires_grad_(False)

    # ------------------------------------------------------------------ optimisation
    def create_optimizer(self):
        if self.optimizer is None:
            self.optimizer = create_optimizer(self.model, self.args)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            self.lr_scheduler = create_scheduler(optimizer or self.optimizer, self.args, num_training_steps)
        return self.lr_scheduler

    def create_optimizer_and_scheduler(self, num_training_steps: int):
        self.create_optimizer()
        self.create_scheduler(num_training_steps=num_training_steps, optimizer=self.optimizer)

    # ------------------------------------------------------------------ steps
    def _prepare_inputs(self, inputs: dict) -> dict:
        # accelerate's send_to_device walks nested dicts/lists/tuples (and anything with .to), non-blocking.
        return send_to_device(inputs, self.ctx.device, non_blocking=True)

    @property
    def model_accepts_loss_kwargs(self) -> bool:
        return accepts_loss_kwargs(self.model)

    def compute_loss(self, model, inputs: dict, return_outputs: bool = False,
                     num_items_in_batch: Optional[int] = None):
        """The loss of one micro-batch. Given `num_items_in_batch`, normalised so that summing over micro-steps
        and ranks gives the mean over every label item of the global batch; otherwise the model's own mean."""
        inputs = dict(inputs)
        smoothing = self.args.label_smoothing_factor if self.compute_loss_func is None else 0.0
        labels = inputs.pop("labels", None) if self.compute_loss_func is not None or smoothing else None
        rescale_items = None
        if num_items_in_batch is not None and self.compute_loss_func is None and not smoothing:
            if self.model_accepts_loss_kwargs:
                inputs["num_items_in_batch"] = num_items_in_batch
            else:  # the model returns a mean over its own label items: turn it into a share of the global sum
                rescale_items = count_label_items(inputs, self.label_names)
        outputs = model(**inputs)
        if self.compute_loss_func is not None:
            loss = self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
        elif labels is not None:  # label smoothing: our loss from the logits, as HF's LabelSmoother
            loss = label_smoothed_loss(extract_logits(outputs), labels, smoothing, num_items_in_batch,
                                       shift_labels=is_causal_lm(self.model))
        else:
            loss = extract_loss(outputs, inputs.keys())
            if rescale_items is not None and rescale_items != num_items_in_batch:
                loss = loss * (rescale_items / num_items_in_batch)
        self._loss_scaled_by_items = num_items_in_batch is not None
        return (loss, outputs) if return_outputs else loss

    def _call_compute_loss(self, model, inputs: dict, return_outputs: bool = False,
                           num_items_in_batch: Optional[int] = None):
        """`compute_loss`, called with only the arguments an override accepts (older HF scripts override
        `compute_loss(self, model, inputs, return_outputs=False)`, without `num_items_in_batch`)."""
        kwargs = {"return_outputs": return_outputs} if return_outputs else {}
        if num_items_in_batch is not None and accepts_argument(type(self).compute_loss, "num_items_in_batch"):
            kwargs["num_items_in_batch"] = num_items_in_batch
        self._loss_scaled_by_items = False
        return self.compute_loss(model, inputs, **kwargs)

    def _loss_is_scaled(self) -> bool:
        """Whether the last compute_loss result is normalised over the whole accumulated batch (HF's rule)."""
        if self.loss_is_scaled_for_ga is not None:
            return bool(self.loss_is_scaled_for_ga)
        return self._loss_scaled_by_items

    def compute_loss_context_manager(self):
        """HF's name: the context of the forward and loss (autocast under bf16/fp16)."""
        return self.strategy.autocast()

    def training_step(self, model, inputs: dict, num_items_in_batch: Optional[int] = None) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns the detached loss (its share of the step's loss)."""
        model.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss = self._call_compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        scaled = self._loss_is_scaled()
        # A per-micro-batch mean is averaged over the accumulated micro-steps; a filler batch weighs zero.
        share = self._loss_weight / (1 if scaled else self._accumulation_steps_now)
        # DDP/FSDP average gradients over ranks: a loss normalised by the global item count must be summed, so
        # it is multiplied by the world size; a per-rank mean is averaged, as DDP does.
        self._step_loss_is_global = (scaled and num_items_in_batch is not None
                                     and self.args.average_tokens_across_devices)
        scale = share * (self.ctx.world_size if self._step_loss_is_global else 1)
        self.strategy.backward(loss * scale if scale != 1 else loss)
        return loss.detach() * share if share != 1 else loss.detach()

    def prediction_step(self, model, inputs: dict, prediction_loss_only: bool, ignore_keys=None):
        """(loss, logits, labels) of one evaluation batch, without gradients."""
        if ignore_keys is None:  # HF models name outputs that are not predictions (e.g. past_key_values)
            ignore_keys = getattr(getattr(self.model, "config", None), "keys_to_ignore_at_inference", [])
        inputs = self._prepare_inputs(inputs)
        label_names = self.label_names
        has_labels = all(inputs.get(n) is not None for n in label_names)
        labels = None
        if has_labels:
            labels = tuple(inputs[n].detach() for n in label_names)
            labels = labels[0] if len(labels) == 1 else labels
        model.eval()
        with torch.no_grad():
            if has_labels:
                loss, outputs = self._call_compute_loss(model, inputs, return_outputs=True)
                loss = loss.mean().detach()
            else:
                loss, outputs = None, model(**inputs)
        if prediction_loss_only:
            return loss, None, None
        return loss, extract_logits(outputs, ignore_keys), labels
