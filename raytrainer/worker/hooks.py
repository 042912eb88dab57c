"""The overridable steps of training, with Hugging Face's names and signatures. They run on every worker.

`Trainer` inherits these; a user's subclass that overrides `compute_loss`, `training_step`, ... is shipped to
each Ray actor, so the override runs there. Before they run, the worker loop sets `self.model` (unwrapped,
on the worker's device), `self.model_wrapped` (DDP...), `self.ctx` (rank, world size) and `self.state`; in a
training run also `self.micro_step` and `self.training_run` (worker/run_link.py).
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from accelerate.utils import send_to_device
from torch.utils.data import DataLoader

from ..data.collator import DefaultCollator, pad_token_id_of
from ..data.columns import (
    ColumnFilter,
    accepts_argument,
    accepts_loss_kwargs,
    default_ignore_keys,
    default_label_names,
    extract_logits,
    extract_loss,
    forward_signature,
    label_items,
    loss_shifts_labels,
)
from ..data.loader_options import loader_options, main_input_name
from ..data.ray_batches import RayEvalLoader, RayTrainData
from ..data.ray_data import RayDataRef
from ..data.sampler import DistributedBatchSampler, eval_shard, order_options
from ..data.streaming import StreamEvalLoader, StreamTrainData, is_stream
from ..data.user_sampler import SamplerShards, evaluation_shard
from ..errors import ConfigError
from ..optimizers import create_optimizer, create_scheduler, fused_backward, is_fused_backward
from ..optimizers.builtin import get_decay_parameter_names
from ..optimizers.registry import get_optimizer_cls_and_kwargs
from .losses import label_smoothed_loss
from .run_link import MicroStep, TrainingRun
from .watchdog import current as current_watchdog


class WorkerHooks:
    # Hugging Face's class attribute: whether `compute_loss` returns a loss already normalised over the whole
    # accumulated (global) batch, i.e. by `num_items_in_batch`. None: decided on each call, True exactly when the
    # base `compute_loss` normalised it. A subclass that computes its own loss returns a per-micro-batch mean
    # (averaged over micro-steps and ranks) unless it sets this to True.
    loss_is_scaled_for_ga: Optional[bool] = None
    # While a training run runs in this process, the loop sets these (worker/run_link.py): the micro-batch
    # training_step is called on, and the run that `log` and `evaluate` act inside. None outside a run.
    micro_step: Optional[MicroStep] = None
    training_run: Optional[TrainingRun] = None
    # Set by the base compute_loss when it normalised by num_items_in_batch; read by training_step.
    _loss_scaled_by_items: bool = False

    # Read by subclasses written before run_link.py: whether a run is on, and the micro-batch's loss weight.
    @property
    def _loop(self) -> Optional[TrainingRun]:
        return self.training_run

    @property
    def _loss_weight(self) -> float:
        return self.micro_step.loss_weight if self.micro_step is not None else 1.0

    # ------------------------------------------------------------------ data
    @property
    def label_names(self) -> list:
        return self.args.label_names or default_label_names(self._unwrapped_model())

    def _unwrapped_model(self):
        return self.model if self.model is not None else self.model_init()

    # transformers' data hooks, with its signatures: the subclassing guide's recipes call them as they are,
    # e.g. `self._get_dataloader(dataset=self.train_dataset, description="Training",
    # batch_size=self._train_batch_size, sampler_fn=self._get_train_sampler, is_training=True)`.
    @property
    def _train_batch_size(self) -> int:
        """The per-process (here: per-worker) training batch size; auto_find_batch_size may set another."""
        return self.__dict__.get("_train_batch_size_set") or self.args.per_device_train_batch_size

    @_train_batch_size.setter
    def _train_batch_size(self, value: int):
        self.__dict__["_train_batch_size_set"] = value

    def get_train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        return self._get_dataloader(dataset=self.train_dataset, description="Training",
                                    batch_size=self._train_batch_size, sampler_fn=self._get_train_sampler,
                                    is_training=True)

    def get_eval_dataloader(self, eval_dataset=None) -> DataLoader:
        """transformers' semantics: None is `self.eval_dataset`, a str names one of a dict of eval datasets."""
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        dataset = (self.eval_dataset[eval_dataset] if isinstance(eval_dataset, str)
                   else self.eval_dataset if eval_dataset is None else eval_dataset)
        return self._get_dataloader(dataset=dataset, description="Evaluation",
                                    batch_size=self.args.per_device_eval_batch_size, sampler_fn=self._get_eval_sampler,
                                    dataloader_key=eval_dataset if isinstance(eval_dataset, str) else "eval")

    def get_test_dataloader(self, test_dataset) -> DataLoader:
        return self._get_dataloader(dataset=test_dataset, description="test",
                                    batch_size=self.args.per_device_eval_batch_size, sampler_fn=self._get_eval_sampler)

    def _get_train_sampler(self, train_dataset=None):
        """This rank's batches of one seeded order over all ranks, by train_sampling_strategy (data/sampler.py):
        resumable at a global sample offset, at any world size. An override may return any torch Sampler
        (a WeightedRandomSampler...): every rank then draws its order alike and takes its share
        (data/user_sampler.py)."""
        dataset = self.train_dataset if train_dataset is None else train_dataset
        ctx, args = self.ctx, self.args
        order = order_options(args, dataset, main_input_name(self.model, self.processing_class),
                              ctx.world_size)  # train_sampling_strategy: random, sequential, group_by_length
        # Without data_seed the order's seed is torch's initial seed when the sampler is made, as accelerate's
        # SeedableRandomSampler under transformers' Trainer: args.seed, unless a model_init reseeded (then its seed).
        seed = args.data_seed if args.data_seed is not None else torch.initial_seed()
        return DistributedBatchSampler(len(dataset), self._train_batch_size, rank=ctx.rank,
                                       world_size=ctx.world_size, seed=seed, drop_last=args.dataloader_drop_last,
                                       **order)

    def _get_eval_sampler(self, eval_dataset):
        """None: each rank takes a contiguous slice, so gathering in rank order gives the dataset's order. An
        override's Sampler sets that order instead."""
        return None

    def _get_dataloader(self, dataset, description: str, batch_size: int, sampler_fn=None, is_training: bool = False,
                        dataloader_key: Optional[str] = None) -> DataLoader:
        """transformers' helper: a DataLoader of this rank's share of `dataset` (`description` and
        `dataloader_key` are accepted for its signature)."""
        ctx, args, collate = self.ctx, self.args, batch_collator(self)
        if isinstance(dataset, RayDataRef):  # a ray.data.Dataset: this rank's streaming shard
            if is_training:
                return RayTrainData(dataset, batch_size, collate, ctx, drop_last=args.dataloader_drop_last)
            return RayEvalLoader(dataset, batch_size, collate, ctx.rank, ctx.world_size)  # every world-size-th batch
        if is_stream(dataset):  # an iterable dataset: every rank reads the stream and keeps its share (streaming.py)
            if is_training:
                return StreamTrainData(dataset, batch_size, collate, ctx.rank, ctx.world_size,
                                       drop_last=args.dataloader_drop_last, progress=current_watchdog().phase,
                                       epoch_micro_batches=max(args.max_steps, 0) * args.gradient_accumulation_steps)
            return StreamEvalLoader(dataset, batch_size, collate, ctx.rank, ctx.world_size)
        options = loader_options(args, ctx.device)
        sampler = sampler_fn(dataset) if sampler_fn is not None else None
        if isinstance(sampler, DistributedBatchSampler):  # ours: already this rank's batches
            sampler.batch_size = batch_size
            return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, **options)
        seed = args.train_data_seed if is_training else args.seed
        if is_training:  # a user's Sampler, or none (the dataset's order): sharded as ours is
            sampler = sampler if sampler is not None else torch.utils.data.SequentialSampler(dataset)
            batches = SamplerShards(sampler, batch_size, ctx.rank, ctx.world_size, seed, args.dataloader_drop_last)
            return DataLoader(dataset, batch_sampler=batches, collate_fn=collate, **options)
        shard = (torch.utils.data.Subset(dataset, eval_shard(len(dataset), ctx.rank, ctx.world_size))
                 if sampler is None else evaluation_shard(sampler, dataset, ctx.rank, ctx.world_size, seed))
        return DataLoader(shard, batch_size=batch_size, shuffle=False, collate_fn=collate, **options)

    # ------------------------------------------------------------------ records
    def log(self, logs: dict, start_time: Optional[float] = None):
        """HF's `log`: the record joins log_history and goes to on_log. The loop logs every record through it
        (training logs, evaluation metrics, the final metrics), on every rank, so an override that adds keys
        and calls `super().log(logs)` sees them all. Called on the driver, outside a run, the record goes to
        the driver's callbacks and log_history."""
        if self.training_run is not None:
            self.training_run.record_log(logs)
        else:
            if self.state.epoch is not None:  # as transformers, into the caller's dict (so evaluate() returns it
                logs["epoch"] = self.state.epoch  # too), 0 before any training
            self.callback_handler.handle({"kind": "log", "logs": {**logs, "step": self.state.global_step}})

    # ------------------------------------------------------------------ optimisation
    def create_optimizer(self):
        if self.optimizer is None:  # optimizer_cls_and_kwargs, when given, overrides optim (as transformers)
            self.optimizer = create_optimizer(self.model, self.args, getattr(self, "optimizer_cls_and_kwargs", None))
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            self.lr_scheduler = create_scheduler(optimizer or self.optimizer, self.args, num_training_steps)
        return self.lr_scheduler

    def create_optimizer_and_scheduler(self, num_training_steps: int):
        self.create_optimizer()
        self.create_scheduler(num_training_steps=num_training_steps, optimizer=self.optimizer)

    # transformers' helpers around the optimizer, for subclasses (a create_optimizer override) and scripts.
    @staticmethod
    def get_optimizer_cls_and_kwargs(args, model=None) -> tuple:
        """The class and kwargs of the optimizer args.optim names (built-in names; optimizers/registry.py)."""
        return get_optimizer_cls_and_kwargs(args, model)

    def get_decay_parameter_names(self, model) -> list:
        """The names of the parameters weight decay applies to (not biases, not normalisation weights)."""
        return get_decay_parameter_names(model)

    def get_num_trainable_parameters(self) -> int:
        if self.model is None:
            raise ConfigError("get_num_trainable_parameters() needs a model: this Trainer has model_init, which "
                              "builds the model on the workers; call it in a hook there, or pass model=.")
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def get_learning_rates(self) -> list:
        return [group["lr"] for group in self._built_optimizer("get_learning_rates").param_groups]

    def get_optimizer_group(self, param=None):
        """The parameter group holding `param`, or every group's parameters (as transformers')."""
        optimizer = self._built_optimizer("get_optimizer_group")
        if param is not None:
            for group in optimizer.param_groups:
                if any(p is param for p in group["params"]):
                    return group
        return [group["params"] for group in optimizer.param_groups]

    def _built_optimizer(self, method: str):
        if self.optimizer is None:
            raise ValueError(f"{method}(): the optimizer is not built yet. It is built on each worker when training "
                             "starts: call it from a hook that runs there (a Trainer subclass's training_step, say); "
                             "the driver's log_history holds each logged step's learning_rate.")
        return self.optimizer

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
        own_items = None
        if num_items_in_batch is not None and self.compute_loss_func is None and not smoothing:
            if self.model_accepts_loss_kwargs:
                # A torch.compile'd model gets the count settled: the late tensor's wait is no code to trace.
                compiled = type(self.model).__name__ == "OptimizedModule" and torch.is_tensor(num_items_in_batch)
                inputs["num_items_in_batch"] = num_items_in_batch.clone() if compiled else num_items_in_batch
            else:  # the model returns a mean over its own label items: turn it into a share of the global sum
                own_items = label_items(inputs, self.label_names, shift=loss_shifts_labels(self.model))
        outputs = model(**inputs)
        if self.compute_loss_func is not None:
            loss = self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
        elif labels is not None:  # label smoothing: our loss from the logits, as HF's LabelSmoother
            loss = label_smoothed_loss(extract_logits(outputs), labels, smoothing, num_items_in_batch,
                                       shift_labels=loss_shifts_labels(self.model))
        else:
            loss = extract_loss(outputs, inputs.keys())
            if own_items is not None:  # a tensor on the device: no host sync per micro-batch
                loss = loss * (own_items.to(loss.device, loss.dtype) / num_items_in_batch)
        self._loss_scaled_by_items = num_items_in_batch is not None
        return (loss, outputs) if return_outputs else loss

    def _loss_is_scaled(self) -> bool:
        """Whether the last compute_loss result is normalised over the whole accumulated batch (HF's rule)."""
        if self.loss_is_scaled_for_ga is not None:
            return bool(self.loss_is_scaled_for_ga)
        return self._loss_scaled_by_items

    def floating_point_ops(self, inputs: dict) -> int:
        """transformers' estimate of one micro-batch's forward and backward FLOPs: 6 x input elements x
        non-embedding parameters, for models that count their parameters (0 otherwise). Overridable."""
        model = self.model
        main_input = getattr(model, "main_input_name", "input_ids")
        if main_input not in inputs or not hasattr(model, "num_parameters"):
            return 0
        cached = getattr(self, "_flops_params", None)
        if cached is None or cached[0] != id(model):  # counted once per model (an id: no reference to ship)
            cached = self._flops_params = (id(model), model.num_parameters(exclude_embeddings=True))
        return 6 * inputs[main_input].numel() * cached[1]

    def compute_loss_context_manager(self):
        """HF's name: the context of the forward and loss (autocast under bf16/fp16)."""
        return self.strategy.autocast()

    def training_step(self, model, inputs: dict, num_items_in_batch: Optional[int] = None) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns the detached loss (its share of the step's loss)."""
        model.train()
        inputs = self._prepare_inputs(inputs)
        # LOMO/AdaLomo update each parameter inside backward and average its gradient over ranks themselves:
        # DDP must not all-reduce (it would write averaged gradients back, applied a second time).
        fused = is_fused_backward(self.optimizer)
        with self.strategy.no_sync(model) if fused else contextlib.nullcontext():
            with self.compute_loss_context_manager():
                loss = call_compute_loss(self, model, inputs, num_items_in_batch=num_items_in_batch)
            scaled = self._loss_is_scaled()
            # A per-micro-batch mean is averaged over the accumulated micro-steps; a filler batch weighs zero.
            micro = self.micro_step if self.micro_step is not None else MicroStep()  # outside a run: 1 of 1
            share = micro.loss_weight / (1 if scaled else micro.accumulation_steps)
            # DDP/FSDP average gradients over ranks: a loss normalised by the global item count must be summed,
            # so it is multiplied by the world size; a per-rank mean is averaged, as DDP does.
            micro.loss_is_global = (scaled and num_items_in_batch is not None
                                    and self.args.average_tokens_across_devices)
            scale = share * (self.ctx.world_size if micro.loss_is_global else 1)
            scaled_loss = loss * scale if scale != 1 else loss
            if fused:
                fused_backward(self.optimizer, scaled_loss)
            else:
                self.strategy.backward(scaled_loss)
        return loss.detach() * share if share != 1 else loss.detach()

    def prediction_step(self, model, inputs: dict, prediction_loss_only: bool, ignore_keys=None):
        """(loss, logits, labels) of one evaluation batch, without gradients."""
        if ignore_keys is None:  # outputs that are not predictions: a generation cache
            ignore_keys = default_ignore_keys(self.model)
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
                loss, outputs = call_compute_loss(self, model, inputs, return_outputs=True)
                loss = loss.mean().detach()
            else:
                loss, outputs = None, model(**inputs)
        if prediction_loss_only:
            return loss, None, None
        return loss, extract_logits(outputs, ignore_keys), labels


# ---------------------------------------------------------------------------------------------------- helpers
# Used by the hooks above and by the driver's 2-sample loss check (preflight/loss.py), which must batch and call
# compute_loss exactly as training does.
def batch_collator(trainer):
    """The trainer's data_collator (the default one without), keeping only the columns its model's forward takes
    (and the labels) with remove_unused_columns."""
    collator = trainer.data_collator or DefaultCollator(pad_token_id=pad_token_id_of(trainer.processing_class))
    if not trainer.args.remove_unused_columns:
        return collator
    names, var_kw = forward_signature(trainer._unwrapped_model())
    return collator if var_kw else ColumnFilter(collator, names + trainer.label_names,
                                                reads_only=isinstance(collator, DefaultCollator))


def call_compute_loss(trainer, model, inputs: dict, return_outputs: bool = False,
                      num_items_in_batch: Optional[int] = None):
    """`trainer.compute_loss`, called with only the arguments an override accepts (older HF scripts override
    `compute_loss(self, model, inputs, return_outputs=False)`, without `num_items_in_batch`)."""
    kwargs = {"return_outputs": return_outputs} if return_outputs else {}
    if num_items_in_batch is not None and accepts_argument(type(trainer).compute_loss, "num_items_in_batch"):
        kwargs["num_items_in_batch"] = num_items_in_batch
    trainer._loss_scaled_by_items = False
    return trainer.compute_loss(model, inputs, **kwargs)
