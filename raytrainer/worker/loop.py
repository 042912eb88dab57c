"""The training loop that runs on every worker (and in the driver process when num_workers=0).

    build model -> wrap (strategy) -> optimizer, scheduler -> resume from a committed checkpoint
    for epoch:
        for each accumulation group of micro-batches (this rank's shard):
            num_items_in_batch = label items of the whole global batch (all micro-steps, all ranks)
            forward/backward each micro-batch (no gradient all-reduce but on the last)
            clip -> optimizer step -> scheduler step
            log / evaluate / save when due: decided from the step counter, so every rank agrees
    wait for the last checkpoint to commit -> rank 0 returns the result

Every decision depends only on values that are identical on all ranks (the global step, reduced metrics),
so every rank takes it at the same step (principle 1).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from itertools import islice
from typing import Optional

import numpy as np
import torch

from ..checkpoint.manager import CheckpointManager
from ..data.columns import count_label_items
from ..data.global_batch import global_batch_size
from ..data.sampler import DistributedBatchSampler
from ..state import TrainerState, TrainOutput
from ..strategy import make_strategy
from .evaluation import evaluation_loop


def set_seed(seed: int):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Plan:
    """How long the run is, derived from the dataloader length (which depends on the world size)."""
    micro_batches_per_epoch: int
    steps_per_epoch: int
    max_steps: int
    num_epochs: int

    @classmethod
    def make(cls, args, micro_batches_per_epoch: int) -> "Plan":
        steps_per_epoch = max(math.ceil(micro_batches_per_epoch / args.gradient_accumulation_steps), 1)
        if args.max_steps > 0:
            max_steps = args.max_steps
            num_epochs = math.ceil(max_steps / steps_per_epoch)
        else:
            max_steps = math.ceil(args.num_train_epochs * steps_per_epoch)
            num_epochs = math.ceil(args.num_train_epochs)
        return cls(micro_batches_per_epoch, steps_per_epoch, max_steps, num_epochs)


class TrainLoop:
    def __init__(self, trainer, ctx, emitter, run_id: str, resume_from: Optional[str]):
        self.trainer = trainer
        self.args = trainer.args
        self.ctx = ctx
        self.emitter = emitter
        self.run_id = run_id
        self.resume_from = resume_from

    # ------------------------------------------------------------------ set-up
    def _setup(self):
        trainer, args, ctx = self.trainer, self.args, self.ctx
        set_seed(args.seed)
        model = trainer.model_init() if trainer.model_init is not None else trainer.model
        trainer.strategy = make_strategy(args, ctx)
        trainer.model_wrapped = trainer.strategy.setup(model)
        trainer.model = trainer.strategy.unwrap(trainer.model_wrapped)
        self.checkpoints = CheckpointManager(trainer, ctx, self.emitter, self.run_id)
        url = self.checkpoints.find_resume_url(self.resume_from)
        if url is not None:  # before planning: another world size changes the accumulation (same global batch)
            self.checkpoints.keep_global_batch(url)
        self.dataloader = trainer.get_train_dataloader()
        sampler = self.dataloader.batch_sampler
        self.sampler = sampler if isinstance(sampler, DistributedBatchSampler) else None
        micro = self.sampler.micro_batches_per_epoch() if self.sampler else len(self.dataloader)
        self.plan = Plan.make(args, micro)
        trainer.create_optimizer_and_scheduler(num_training_steps=self.plan.max_steps)

        state = TrainerState(
            max_steps=self.plan.max_steps, num_train_epochs=self.plan.num_epochs,
            logging_steps=args.resolve_interval(args.logging_steps, self.plan.max_steps),
            eval_steps=args.resolve_interval(args.eval_steps, self.plan.max_steps),
            save_steps=args.resolve_interval(args.save_steps, self.plan.max_steps),
            train_batch_size=args.per_device_train_batch_size)
        if url is not None:
            state = self._resume(url, state)
        state.own.update(run_id=self.run_id, world_size=ctx.world_size,
                         global_batch_size=global_batch_size(args, ctx.world_size))
        # Per-rank facts: a restored state carries rank 0's.
        state.is_local_process_zero, state.is_world_process_zero = ctx.local_rank == 0, ctx.is_main
        trainer.state = state

    def _resume(self, url: str, fresh: TrainerState) -> TrainerState:
        restored = self.checkpoints.restore(url)
        restart = restored.own.get("run_id") == self.run_id
        for name in ("max_steps", "num_train_epochs", "logging_steps", "eval_steps", "save_steps"):
            setattr(restored, name, getattr(fresh, name))
        if restart and self.ctx.is_main:
            cause = self.emitter.last_failure() or "worker group restarted"
            restored.restarts.append({"global_step": restored.global_step, "cause": cause, "time": time.time(),
                                      "checkpoint": url})
            self.emitter.emit("restart", global_step=restored.global_step, cause=cause, checkpoint=url)
        if self.args.ignore_data_skip:
            restored.samples_seen_in_epoch = 0
        return restored

    # ------------------------------------------------------------------ the loop
    def run(self) -> Optional[dict]:
        self._setup()
        trainer, ctx, state = self.trainer, self.ctx, self.trainer.state
        self.emitter.emit("train_begin", global_step=state.global_step, epoch=state.epoch,
                          max_steps=state.max_steps, num_train_epochs=state.num_train_epochs,
                          world_size=ctx.world_size)
        self.meter = Meter(ctx.device)
        start_time, start_step = time.time(), state.global_step
        trainer.optimizer.zero_grad(set_to_none=True)

        while state.global_step < state.max_steps and state.epoch_index < self.plan.num_epochs:
            self._train_epoch(state)
            if not self._epoch_exhausted(state):
                break  # max_steps reached mid-epoch
            # The epoch's data ran out (also when that was the last step): epoch-end hooks run.
            state.epoch_index += 1
            state.samples_seen_in_epoch = 0
            self._on_epoch_end(state)

        self.checkpoints.wait()
        return self._finish(state, time.time() - start_time, state.global_step - start_step)

    def _train_epoch(self, state: TrainerState):
        trainer, args = self.trainer, self.args
        epoch = state.epoch_index
        offset = state.samples_seen_in_epoch
        if self.sampler is not None:
            self.sampler.set_epoch(epoch, offset)
            batches = iter(self.dataloader)
        else:  # a user dataloader: resume by skipping the micro-batches already seen
            batches = islice(iter(self.dataloader), offset, None)
        accumulation = args.gradient_accumulation_steps
        micro_done = 0
        while True:
            group = list(islice(batches, accumulation))
            if not group:
                break
            num_items = self._num_items(group, first_micro=micro_done)
            trainer._accumulation_steps_now = len(group)
            for i, batch in enumerate(group):
                trainer._loss_weight = 0.0 if self._is_padding(micro_done + i) else 1.0
                last = i == len(group) - 1
                with (_null() if last else trainer.strategy.no_sync(trainer.model_wrapped)):
                    loss = trainer.training_step(trainer.model_wrapped, batch, num_items_in_batch=num_items)
                # Normalised by the global item count, rank losses sum to the step's loss; otherwise each is a
                # per-rank mean (DDP averages the gradients), so average them.
                share = loss if trainer._normalised_globally(num_items) else loss / self.ctx.world_size
                self.meter.add_micro(share, batch, trainer._loss_weight)
            micro_done += len(group)
            grad_norm = self._optimizer_step()
            state.global_step += 1
            if self.sampler is not None:
                state.samples_seen_in_epoch = self.sampler.offset_after(micro_done)
                state.epoch = epoch + state.samples_seen_in_epoch / max(self.sampler.end_offset(), 1)
            else:
                state.samples_seen_in_epoch = offset + micro_done
                state.epoch = epoch + state.samples_seen_in_epoch / max(self.plan.micro_batches_per_epoch, 1)
            self.meter.step_done(grad_norm)
            self.emitter.emit("step", global_step=state.global_step, epoch=state.epoch)
            self._on_step_end(state)
            if state.global_step >= state.max_steps:
                break

    def _epoch_exhausted(self, state: TrainerState) -> bool:
        if self.sampler is not None:
            return state.samples_seen_in_epoch >= self.sampler.end_offset()
        return state.samples_seen_in_epoch >= self.plan.micro_batches_per_epoch

    def _is_padding(self, micro_step: int) -> bool:
        return self.sampler is not None and self.sampler.is_padding(micro_step)

    def _num_items(self, group, first_micro: int) -> Optional[int]:
        """Label items in the whole global batch: all micro-batches of the group, summed over ranks."""
        counts = [count_label_items(b, self.trainer.label_names) for b in group]
        if any(c is None for c in counts):
            return None
        weights = [0 if self._is_padding(first_micro + i) else 1 for i in range(len(counts))]
        total = sum(c * w for c, w in zip(counts, weights))
        if self.args.average_tokens_across_devices and self.ctx.distributed:
            total = int(self.ctx.all_reduce_sum(torch.tensor(float(total), device=self.ctx.device)).item())
        return max(total, 1)

    def _optimizer_step(self) -> Optional[float]:
        trainer, args = self.trainer, self.args
        grad_norm = None
        if args.max_grad_norm > 0:
            grad_norm = trainer.strategy.clip_grad_norm(trainer.model_wrapped, args.max_grad_norm, trainer.optimizer)
        trainer.strategy.optimizer_step(trainer.optimizer)
        trainer.lr_scheduler.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    # ------------------------------------------------------------------ when due: log, evaluate, save
    def _on_step_end(self, state: TrainerState):
        args, step = self.args, state.global_step
        last = step >= state.max_steps
        if (args.logging_strategy == "steps" and step % state.logging_steps == 0) or (
                args.logging_first_step and step == 1):
            self._log(state)
        metrics = None
        if args.eval_strategy == "steps" and step % state.eval_steps == 0:
            metrics = self._evaluate(state)
        if (args.save_strategy == "steps" and (step % state.save_steps == 0 or last)) or (
                args.save_strategy == "best" and metrics is not None and state.best_global_step == step):
            self.checkpoints.save(state)

    def _on_epoch_end(self, state: TrainerState):
        args = self.args
        if args.logging_strategy == "epoch":
            self._log(state)
        if args.eval_strategy == "epoch":
            self._evaluate(state)
            if args.save_strategy == "best" and state.best_global_step == state.global_step:
                self.checkpoints.save(state)
        if args.save_strategy == "epoch":
            self.checkpoints.save(state)

    def _log(self, state: TrainerState):
        logs = self.meter.flush(self.ctx, self.trainer.lr_scheduler.get_last_lr()[0])
        if not logs:
            return
        logs.update(epoch=round(state.epoch, 4), step=state.global_step)
        if self.ctx.is_main:
            state.log_history.append(logs)
            self.emitter.emit("log", global_step=state.global_step, epoch=state.epoch, logs=logs)

    def _evaluate(self, state: TrainerState) -> dict:
        trainer = self.trainer
        datasets = trainer.eval_dataset if isinstance(trainer.eval_dataset, dict) else {None: trainer.eval_dataset}
        metrics = {}
        for name, dataset in datasets.items():
            prefix = "eval" if name is None else f"eval_{name}"
            output = evaluation_loop(trainer, trainer.get_eval_dataloader(dataset),
                                     metric_key_prefix=prefix)
            metrics.update(output.metrics)
        metrics.update(epoch=round(state.epoch, 4), step=state.global_step)
        self._update_best(state, metrics)
        if self.ctx.is_main:
            state.log_history.append(metrics)
            self.emitter.emit("evaluate", global_step=state.global_step, epoch=state.epoch, metrics=metrics)
        return metrics

    def _update_best(self, state: TrainerState, metrics: dict):
        name = self.args.metric_for_best_model
        if name is None:
            return
        key = name if name.startswith("eval_") else f"eval_{name}"
        if key not in metrics:
            raise KeyError(f"metric_for_best_model={name!r} is not among the evaluation metrics "
                           f"{sorted(metrics)}: pick one of them.")
        value = float(metrics[key])
        better = (lambda a, b: a > b) if self.args.greater_is_better else (lambda a, b: a < b)
        if state.best_metric is None or better(value, state.best_metric):
            state.best_metric, state.best_global_step = value, state.global_step

    # ------------------------------------------------------------------ the end
    def _finish(self, state: TrainerState, runtime: float, steps_run: int) -> Optional[dict]:
        trainer, args = self.trainer, self.args
        if args.load_best_model_at_end and state.best_model_checkpoint:
            self.checkpoints.load_model(state.best_model_checkpoint)
        total = self.meter.totals(self.ctx)
        train_loss = total["loss_sum"] / max(total["steps"], 1)
        metrics = {
            "train_runtime": round(runtime, 4),
            "train_samples_per_second": round(total["samples"] / max(runtime, 1e-9), 3),
            "train_steps_per_second": round(steps_run / max(runtime, 1e-9), 3),
            "train_loss": train_loss, "epoch": round(state.epoch, 4),
        }
        model_state = trainer.strategy.host_state_dict(trainer.model_wrapped)  # all ranks: FSDP gathers here
        if not self.ctx.is_main:
            return None
        state.log_history.append({**metrics, "step": state.global_step})
        self.emitter.emit("train_end", global_step=state.global_step, epoch=state.epoch, metrics=metrics)
        return {"state": state.to_json_string(), "model_state": model_state,
                "train_output": TrainOutput(state.global_step, train_loss, metrics)}


class Meter:
    """Loss, samples and tokens since the last log. The loss stays on the device (no sync per step); the
    counts come from the CPU batch, so they are plain numbers. Reduced over ranks only when logging."""

    def __init__(self, device):
        self.device = device
        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        self.samples = self.tokens = self.steps = 0
        self.total = [0.0, 0.0, 0.0]  # loss, samples, steps: all ranks, whole run
        self.last_grad_norm = None
        self.last_time = time.time()

    def add_micro(self, loss, batch: dict, weight: float):
        self.loss.add_(loss)
        if weight:
            samples, tokens = _batch_counts(batch)
            self.samples += samples
            self.tokens += tokens

    def step_done(self, grad_norm):
        self.steps += 1
        self.last_grad_norm = grad_norm

    def flush(self, ctx, learning_rate: float) -> dict:
        packed = torch.stack([self.loss, *(torch.tensor(float(v), dtype=torch.float64, device=self.device)
                                           for v in (self.samples, self.tokens, self.steps))])
        loss_sum, samples, tokens, steps = ctx.all_reduce_sum(packed).tolist()
        steps /= ctx.world_size
        self.total = [self.total[0] + loss_sum, self.total[1] + samples, self.total[2] + steps]
        self.loss.zero_()
        self.samples = self.tokens = self.steps = 0
        now = time.time()
        elapsed, self.last_time = now - self.last_time, now
        if steps == 0:
            return {}
        logs = {"loss": loss_sum / steps}
        if self.last_grad_norm is not None:
            logs["grad_norm"] = float(self.last_grad_norm)
        logs["learning_rate"] = learning_rate
        logs["train_samples_per_second"] = round(samples / max(elapsed, 1e-9), 3)
        if tokens:
            logs["train_tokens_per_second"] = round(tokens / max(elapsed, 1e-9), 3)
        return logs

    def totals(self, ctx) -> dict:
        self.flush(ctx, 0.0)  # fold in what was not logged yet
        loss_sum, samples, steps = self.total
        return {"loss_sum": loss_sum, "samples": samples, "steps": steps}


def _batch_counts(batch: dict):
    """(samples, tokens) of a micro-batch; tokens are attention-mask ones, else input_ids elements."""
    samples = 0
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            samples = value.shape[0]
            break
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        return samples, int(mask.sum())
    ids = batch.get("input_ids")
    return samples, ids.numel() if isinstance(ids, torch.Tensor) else 0


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
