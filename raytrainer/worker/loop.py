"""The training loop that runs on every worker (and in the driver process when num_workers=0).

    build model -> wrap (strategy) -> optimizer, scheduler -> resume from a committed checkpoint
    on_train_begin -> [evaluate if eval_on_start]
    for epoch:
        on_epoch_begin
        for each accumulation group of micro-batches (this rank's shard):
            a preemption or Ctrl-C agreed in the previous step's exchange: every rank saves there and stops
            the step's one all-reduce (worker/step_sync.py), started, not waited for: the preemption / Ctrl-C
                flags raised during the previous step, whether any rank still has data (Ray Data),
                num_items_in_batch = label items of the whole global batch (all micro-steps, all ranks; the
                loss's first use of it waits), the input tokens
            on_step_begin
            forward/backward each micro-batch (no gradient all-reduce but on the last), on_substep_end
            clip -> on_pre_optimizer_step -> optimizer step -> on_optimizer_step -> scheduler step
            on_step_end -> log / evaluate / save when due or when a callback asked
        on_epoch_end -> epoch-interval log / evaluate / save
    wait for the last checkpoint to commit -> preempted: hand over to Ray Train, which restarts the group
    -> log the run's metrics -> on_train_end -> rank 0 returns

Every decision depends only on values that are identical on all ranks (the global step, reduced metrics,
control flags combined over ranks in `worker/loop_events.py`), so every rank takes it at the same step
(principle 1). `callbacks/event_names.py` lists the events in order.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import islice
from typing import Optional

from ..arguments.scaling import accumulation_at
from ..checkpoint.manager import CheckpointManager
from ..data.columns import count_label_items, loss_shifts_labels
from ..data.global_batch import global_batch_size
from ..data.loader_options import main_input_name
from ..data.ray_batches import RayTrainData
from ..optimizers.builtin import optimizer_eval_mode, optimizer_train_mode
from ..protocol import GroupStart, TrainResult
from ..startup import EVENT as STARTUP_EVENT, Timeline
from ..state import TrainerControl, TrainerState, TrainOutput
from ..strategy import make_strategy
from ..strategy.liger import apply_liger_kernel
from .evaluation import eval_sets, evaluation_loop
from .loop_events import LoopEvents
from .meter import Meter
from .neftune import neftune
from .nonfinite import NonFiniteGuard
from .process_options import empty_cache_if_due, input_tokens, setup_process
from .run_link import MicroStep
from .step_sync import StepSync
from .stopping import StopSignals
from .throughput import ModelFlops, peak_flops, run_precision
from .train_data import train_data
from .watchdog import UNWATCHED, watch_events, watching_job


@dataclass
class Plan:
    """How long the run is, derived from the dataloader length (which depends on the world size)."""
    micro_batches_per_epoch: Optional[int]
    steps_per_epoch: Optional[int]
    max_steps: int
    num_epochs: int

    @classmethod
    def make(cls, args, micro_batches_per_epoch: Optional[int]) -> "Plan":
        if micro_batches_per_epoch is None:  # unknown length (a Ray Data pipeline): max_steps ends the run
            return cls(None, None, args.max_steps, sys.maxsize)
        steps_per_epoch = max(math.ceil(micro_batches_per_epoch / args.gradient_accumulation_steps), 1)
        if args.max_steps > 0:
            max_steps = args.max_steps
            num_epochs = math.ceil(max_steps / steps_per_epoch)
        else:
            max_steps = math.ceil(args.num_train_epochs * steps_per_epoch)
            num_epochs = math.ceil(args.num_train_epochs)
        return cls(micro_batches_per_epoch, steps_per_epoch, max_steps, num_epochs)


class TrainLoop:
    watch = UNWATCHED  # this run's watchdog (worker/watchdog.py), while run() runs
    def __init__(self, trainer, ctx, emitter, events: LoopEvents, run_id: str, resume_from: Optional[str],
                 on_ray: bool = False, startup: Optional[Timeline] = None, taken_at: Optional[float] = None,
                 own_hyperparameters: bool = False):
        """`startup`: this rank's side of the start-up timeline, from the job's receipt (startup.py); `taken_at`:
        the sink's stamp of rank 0 taking the job; `own_hyperparameters`: TrainOrder's."""
        self.trainer = trainer
        self.on_ray = on_ray
        self.entered_at = time.time()  # setup_s on on_train_begin: how long building and resuming took
        self.args = trainer.args
        self.ctx = ctx
        self.emitter = emitter
        self.events = events
        self.run_id = run_id
        self.resume_from = resume_from
        self.own_hyperparameters = own_hyperparameters
        self.startup = startup if startup is not None else Timeline()
        self.taken_at = taken_at
        self.micro = MicroStep()  # what training_step reads and tells back (worker/run_link.py)
        self._log_extra, self._log_control = {}, None  # what the next on_log carries; what it decided

    # ------------------------------------------------------------------ set-up
    def _setup(self):
        trainer, args, ctx = self.trainer, self.args, self.ctx
        marks = self.startup  # the start-up timeline's rank side (startup.py)
        setup_process(args, ctx.device)  # seed or full_determinism, tf32
        model = trainer.model_init() if trainer.model_init is not None else trainer.model
        model = apply_liger_kernel(model, args)  # a no-op unless use_liger_kernel
        marks.mark("build")
        trainer.strategy = make_strategy(args, ctx)
        trainer.strategy.same_weights_everywhere = trainer.model_init is None  # one pickle, unpacked on each rank
        trainer.model_wrapped = trainer.strategy.setup(model)
        trainer.model = trainer.strategy.unwrap(trainer.model_wrapped)
        marks.mark("wrap")
        self.checkpoints = CheckpointManager(trainer, ctx, self.emitter, self.run_id)
        url = self.checkpoints.find_resume_url(self.resume_from)
        if url is not None:  # before planning: another world size changes the accumulation (same global batch)
            self.checkpoints.keep_global_batch(url)
        elif args.elastic:  # a fresh elastic start below max: the global batch is max workers' (arguments/scaling.py)
            args.gradient_accumulation_steps = accumulation_at(args.gradient_accumulation_steps, args.max_workers,
                                                               ctx.world_size)
        self.sync = StepSync(ctx)  # the step's one collective: slots registered in the same order on every rank
        self.stops = StopSignals(ctx, self.emitter, self.on_ray, self.sync)
        marks.mark("resume")
        self.dataloader = self.events.train_dataloader = trainer.get_train_dataloader()  # callbacks get it too
        self.data = train_data(self.dataloader)
        self._agreeing = isinstance(self.data, RayTrainData) and self.data.agree_on_steps(
            self.sync, args.gradient_accumulation_steps)  # Ray Data of unknown length: has-data counts
        self._items = self.sync.slot() if args.average_tokens_across_devices and ctx.distributed else None
        self._shift = loss_shifts_labels(trainer.model)  # a causal LM's first label of a row is no target
        self._tokens = self.sync.slot() if args.include_num_input_tokens_seen != "no" else None
        self._step_ended, self._saved_step = False, None  # a step's flags not exchanged yet; the last save's step
        self._flags_unread = False  # the last exchange's stop flags not read yet
        self.plan = Plan.make(args, self.data.micro_batches_per_epoch())
        marks.mark("data")
        trainer.create_optimizer_and_scheduler(num_training_steps=self.plan.max_steps)
        marks.mark("optimizer")

        state = TrainerState(
            max_steps=self.plan.max_steps, num_train_epochs=self.plan.num_epochs,
            logging_steps=args.resolve_interval(args.logging_steps, self.plan.max_steps),
            eval_steps=args.resolve_interval(args.eval_steps, self.plan.max_steps),
            save_steps=args.resolve_interval(args.save_steps, self.plan.max_steps),
            train_batch_size=args.per_device_train_batch_size)
        if url is not None:
            state = self._resume(url, state)
        if trainer._trial is not None:  # a hyperparameter search's trial, recorded as transformers does
            state.is_hyper_param_search, state.trial_params = True, dict(trainer._trial)
            state.trial_name = trainer._trial_name
        state.own.update(run_id=self.run_id, world_size=ctx.world_size,
                         global_batch_size=global_batch_size(args, ctx.world_size))
        self._record_restart(state, url)
        # Per-rank facts: a restored state carries rank 0's.
        state.is_local_process_zero, state.is_world_process_zero = ctx.local_rank == 0, ctx.is_main
        trainer.state = state
        marks.mark("resume")
        if ctx.is_main:  # buffered with on_train_begin: no round trip of its own
            self.emitter.emit(STARTUP_EVENT, phases=marks.phases, taken_at=self.taken_at)

    def _resume(self, url: str, fresh: TrainerState) -> TrainerState:
        restored = self.checkpoints.restore(url, self.own_hyperparameters)
        for name in ("max_steps", "num_train_epochs", "logging_steps", "eval_steps", "save_steps"):
            setattr(restored, name, getattr(fresh, name))
        if self.args.ignore_data_skip:
            restored.samples_seen_in_epoch = 0
        return restored

    def _record_restart(self, state: TrainerState, url: Optional[str]):
        """Rank 0 of a group that replaces another one of this run (after a failure, a preemption or a resize)
        records why, and the resize if the world size changed, in the trainer state and as events."""
        if not self.ctx.is_main:
            return
        started = self.emitter.group_started(GroupStart(
            world_size=self.ctx.world_size, global_step=state.global_step, checkpoint=url,
            gradient_accumulation_steps=self.args.gradient_accumulation_steps))
        if started is None:  # the run's first worker group
            return
        for name in ("restarts", "resizes"):  # the checkpoint's (earlier runs too), then this run's, once each
            kept = getattr(state, name)
            kept.extend(r for r in getattr(started, name) if r not in kept)
        self.emitter.emit("restart", epoch=state.epoch, **started.restart)
        if started.resize is not None:
            self.emitter.emit("resize", epoch=state.epoch, **started.resize)

    # ------------------------------------------------------------------ the loop
    def run(self) -> Optional[TrainResult]:
        """Rank 0's result (None on the other ranks)."""
        # `log` and `evaluate` act inside this run; training_step reads the micro-batch (worker/run_link.py).
        self.trainer.training_run, self.trainer.micro_step = self, self.micro
        # A rank without progress is named, then its worker ends (on Ray only): hang_warning_s, hang_timeout_s.
        # The stall line travels through the event sink to the driver's console (protocol.Stall).
        with watching_job(self.args, self.ctx.rank, self.on_ray, self.emitter) as self.watch:
            watch_events(self.events, self.watch)
            try:
                return self._run()
            finally:
                self.trainer.training_run = self.trainer.micro_step = None

    def _run(self) -> Optional[TrainResult]:
        self._setup()
        trainer, ctx, state = self.trainer, self.ctx, self.trainer.state
        self.meter = Meter(ctx.device, self.args.logging_nan_inf_filter,  # throughput keys: worker/throughput.py
                           ModelFlops.of(trainer.model),
                           peak_flops(ctx.device, self.args.peak_flops_per_device, run_precision(self.args)))
        self.nonfinite = NonFiniteGuard(self.args.on_nonfinite_loss, ctx)  # on_nonfinite_loss (worker/nonfinite.py)
        start_time, start_step = time.time(), state.global_step
        trainer.optimizer.zero_grad(set_to_none=True)
        self._optimizer_mode("train")
        with neftune(trainer.model, self.args.neftune_noise_alpha):
            control = self.events.fire("train_begin", max_steps=state.max_steps,
                                       num_train_epochs=state.num_train_epochs, world_size=ctx.world_size,
                                       best_metric=state.best_metric, best_global_step=state.best_global_step,
                                       setup_s=round(time.time() - self.entered_at, 3))
            if self.args.eval_on_start and state.global_step == 0:
                control = self._evaluate(state)
            while (not control.should_training_stop and state.global_step < state.max_steps
                   and state.epoch_index < self.plan.num_epochs):
                control = self._train_epoch(state)
        self.watch.phase("waiting for the last checkpoint to commit")
        self.checkpoints.wait()
        if self.stops.reason == "preemption" and state.global_step < state.max_steps:
            self.stops.hand_over(state.global_step, self.checkpoints.last_committed)  # does not return
        return self._finish(state, time.time() - start_time, state.global_step - start_step)

    def _train_epoch(self, state: TrainerState) -> TrainerControl:
        trainer, args = self.trainer, self.args
        epoch = state.epoch_index
        offset = state.samples_seen_in_epoch
        batches = self.data.batches(epoch, offset)
        accumulation = args.gradient_accumulation_steps
        micro_done = 0
        control = self.events.fire("epoch_begin")
        while not (control.should_epoch_stop or control.should_training_stop):
            waited = time.perf_counter()
            # A stop agreed in the last step's exchange saves at that step, before this one takes anything.
            if self._stop_agreed():
                control = self._stop_after_step(state, control)
                break
            self.watch.phase("loading the next batch")
            group = list(islice(batches, accumulation))  # this rank's micro-batches: no collective
            started = time.perf_counter()
            group, num_items = self._agree(group)  # starts the step's one collective
            if not group:
                break
            self.events.fire("step_begin")
            self.micro.accumulation_steps = len(group)
            for i, (batch, filler) in enumerate(group):
                self.micro.loss_weight = 0.0 if filler else 1.0
                last = i == len(group) - 1
                self.watch.phase("forward/backward")
                with (nullcontext() if last else trainer.strategy.no_sync(trainer.model_wrapped)):
                    loss = trainer.training_step(trainer.model_wrapped, batch, num_items_in_batch=num_items)
                # Normalised by the global item count, rank losses sum to the step's loss; otherwise each is a
                # per-rank mean (DDP averages the gradients), so average them.
                share = loss if self.micro.loss_is_global else loss / self.ctx.world_size
                self.meter.add_micro(share, batch, self.micro.loss_weight, trainer.floating_point_ops(batch))
                self.nonfinite.add(share)
                if not last:
                    self.events.fire("substep_end")
            micro_done += len(group)
            skip = self.nonfinite.end_step(state.global_step + 1)
            grad_norm, learning_rate = self.nonfinite.skip(trainer) if skip else self._optimizer_step()
            state.global_step += 1
            if self._tokens is not None:  # include_num_input_tokens_seen: the step's tokens over all ranks
                state.num_input_tokens_seen += self._tokens.total
            empty_cache_if_due(args, state.global_step, self.ctx.device)  # torch_empty_cache_steps
            state.samples_seen_in_epoch = self.data.offset_after(offset, micro_done)
            state.epoch = epoch + self.data.fraction(state.samples_seen_in_epoch)
            self.meter.step_done(grad_norm, learning_rate, data_wait=started - waited,
                                 busy=time.perf_counter() - started)
            control = self.events.fire("step_end")
            self._step_ended = True  # the preemption or Ctrl-C flags raised since go with the next exchange
            control = self._maybe_log_evaluate_save(state, control)
            self.events.end_step()  # callback_decisions="next_step": ask the driver now, apply at the next step
            if state.global_step >= state.max_steps:
                control.should_training_stop = True
        deferred = self.events.settle()  # the last step's answer (callback_decisions="next_step")
        if deferred is not None:
            control = self._apply_deferred(state, control, deferred)
        if self._stop_agreed(last=True):  # the loop ends without another step (max_steps, a callback, the end
            control = self._stop_after_step(state, control)  # of the data): the flags not agreed on yet
        self.nonfinite.report()  # a NaN/Inf loss this epoch is named (warn: not checked per step)
        # The epoch's data ran out (also when that was the last step), or a callback ended the epoch.
        exhausted = self.data.exhausted(state.samples_seen_in_epoch) or control.should_epoch_stop
        # A stream (max_steps, unknown length) that gave no row from a pass's start gives none in the next one
        # either (empty, or a one-shot iterator): stop, as transformers does, rather than loop over empty passes.
        empty_pass = exhausted and micro_done == 0 and offset == 0 and not control.should_epoch_stop
        if exhausted:
            state.epoch_index += 1
            state.samples_seen_in_epoch = 0
        control = self.events.fire("epoch_end")
        if exhausted:
            control = self._at_epoch_end(state, control)
        if empty_pass and not control.should_training_stop:
            logging.getLogger("raytrainer").warning(
                "The training data gave no row in epoch %d: stopping at step %d of max_steps=%d. An iterable "
                "dataset must give its rows again each time it is iterated (__iter__ returning a new iterator).",
                epoch, state.global_step, state.max_steps)
            control.should_training_stop = True
        return control

    def _agree(self, group: list) -> tuple:
        """Start the step's one collective (worker/step_sync.py), after this rank took its micro-batches and
        before anything of the step runs. It carries the preemption / Ctrl-C flags raised since the last step,
        how many micro-batches the ranks have (Ray Data of unknown length: waited for here), the label items
        and the input tokens. Returns (the step's micro-batches, num_items_in_batch): the global item count
        arrives with the collective, which completes where the loss first uses it."""
        self._stage_stop_flags()
        counts = self._label_counts(group)
        if self._items is not None:
            self._items.put(sum(c for c, (_, filler) in zip(counts, group) if c is not None and not filler))
        if self._tokens is not None:
            self._tokens.put(self._input_tokens(group))
        if self._agreeing:
            self.data.stage(group)
        self.sync.start()
        self._flags_unread = True
        if self._agreeing:  # completed with fillers to the ranks' agreed number of micro-batches
            taken = len(group)
            group = self.data.agreed(group)
            counts += self._label_counts(group[taken:])
        return group, self._num_items(group, counts)

    def _stage_stop_flags(self):
        if self._step_ended:  # once per step: the flags raised during it
            self.stops.stage()
            self._step_ended = False

    def _stop_agreed(self, last: bool = False) -> bool:
        """Whether the ranks agreed to stop (a preemption or Ctrl-C, `stops.reason`) in the exchange started at
        the last step's start: flags raised during step s are read at the start of step s + 2, before it takes
        its micro-batches, so every rank stops after step s + 1 and saves there. `last`: the loop ends, so the
        flags raised since are exchanged too (waiting for them)."""
        if self._flags_unread:
            self._flags_unread = False
            if self.stops.agreed() is not None:
                return True
        if last and self._step_ended:
            self._stage_stop_flags()
            self.sync.exchange()
            return self.stops.agreed() is not None
        return False

    def _input_tokens(self, group) -> int:
        """include_num_input_tokens_seen: this rank's input tokens of the step (filler batches excluded)."""
        trainer = self.trainer
        main_input = main_input_name(trainer.model, trainer.processing_class)
        pad = getattr(trainer.processing_class, "pad_token_id", None)
        mode = self.args.include_num_input_tokens_seen
        return sum(input_tokens(batch, mode, main_input, pad) for batch, filler in group if not filler)

    def _label_counts(self, group) -> list:
        return [count_label_items(b, self.trainer.label_names, self._shift) for b, _ in group]

    def _num_items(self, group, counts):
        """Label items in the whole global batch: all micro-batches of the group, summed over ranks (in the
        step's exchange, a tensor completed at its first use) when average_tokens_across_devices."""
        if any(c is None for c in counts):
            return None
        if self._items is not None:
            return self.sync.late(self._items, floor=1)
        return max(sum(c for c, (_, filler) in zip(counts, group) if not filler), 1)

    def _stop_after_step(self, state: TrainerState, control: TrainerControl) -> TrainerControl:
        """A preemption or Ctrl-C agreed over the ranks: every rank saves at this step (unless it just did) and
        stops."""
        if self._saved_step != state.global_step:
            self._save(state)
        control.should_training_stop = True
        return control

    def _optimizer_step(self) -> tuple:
        """Clip, step, schedule: (grad_norm, the learning rate this step used), as transformers logs them."""
        trainer, args = self.trainer, self.args
        grad_norm = None
        if args.max_grad_norm > 0:
            grad_norm = trainer.strategy.clip_grad_norm(trainer.model_wrapped, args.max_grad_norm, trainer.optimizer)
        self.events.fire("pre_optimizer_step")
        self.watch.phase("optimizer step")
        trainer.strategy.optimizer_step(trainer.optimizer)
        self.events.fire("optimizer_step")
        learning_rate = trainer.lr_scheduler.get_last_lr()[0]
        trainer.lr_scheduler.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        return grad_norm, learning_rate

    def _optimizer_mode(self, mode: str):
        """Schedule-free optimizers keep train and eval weights: evaluate and save with the eval ones (as HF)."""
        (optimizer_train_mode if mode == "train" else optimizer_eval_mode)(self.trainer.optimizer)

    # ------------------------------------------------------------------ when due: log, evaluate, save
    def _maybe_log_evaluate_save(self, state: TrainerState, control: TrainerControl) -> TrainerControl:
        """HF's order after a step: log, evaluate, save; each when its interval is due or a callback asked.
        The run's last step evaluates (eval_strategy="steps") and saves (save_strategy="steps") whether or not
        it falls on the interval, as transformers 5's DefaultFlowCallback does; a run that stops early (a
        callback's should_training_stop) saves a final checkpoint."""
        args, step = self.args, state.global_step
        if control.should_log or (args.logging_strategy == "steps" and step % state.logging_steps == 0) or (
                args.logging_first_step and step == 1):
            control = self._log(state)
        evaluated = False
        if control.should_evaluate or (args.eval_strategy == "steps" and step >= args.eval_delay and (
                step % state.eval_steps == 0 or step >= state.max_steps)):
            control, evaluated = self._evaluate(state), True
        last = step >= state.max_steps or control.should_training_stop
        if (control.should_save or (args.save_strategy == "steps" and (step % state.save_steps == 0 or last))
                or (args.save_strategy == "best" and evaluated and state.best_global_step == step)
                or (control.should_training_stop and args.save_strategy != "no")):
            self._save(state)
        control.should_log = control.should_evaluate = control.should_save = False
        return control

    def _apply_deferred(self, state: TrainerState, control: TrainerControl,
                        deferred: TrainerControl) -> TrainerControl:
        """The answer to the epoch's last step (callback_decisions="next_step"), applied at that step as the
        next step's on_step_end would have: a stop (with its final checkpoint), log / evaluate / save asked."""
        stop = deferred.should_training_stop and not control.should_training_stop
        control.should_training_stop |= deferred.should_training_stop
        control.should_epoch_stop |= deferred.should_epoch_stop
        control.should_log, control.should_evaluate = deferred.should_log, deferred.should_evaluate
        control.should_save = deferred.should_save or (stop and self.args.save_strategy != "no")
        if control.should_log:
            control = self._log(state)
        if control.should_evaluate:
            control = self._evaluate(state)
        if control.should_save and self._saved_step != state.global_step:
            self._save(state)
        control.should_log = control.should_evaluate = control.should_save = False
        return control

    def _at_epoch_end(self, state: TrainerState, control: TrainerControl) -> TrainerControl:
        args = self.args
        if args.logging_strategy == "epoch" or control.should_log:
            control = self._log(state)
        evaluated = False
        if control.should_evaluate or (args.eval_strategy == "epoch" and state.epoch_index >= args.eval_delay):
            control, evaluated = self._evaluate(state), True
        best = args.save_strategy == "best" and evaluated and state.best_global_step == state.global_step
        if args.save_strategy == "epoch" or best or control.should_save:
            self._save(state)
        control.should_log = control.should_evaluate = control.should_save = False
        return control

    def _save(self, state: TrainerState):
        self._saved_step = state.global_step
        self.nonfinite.report(saving_step=state.global_step)  # never commit after a NaN/Inf loss silently
        self.watch.phase("checkpoint save")
        self._optimizer_mode("eval")
        self.checkpoints.save(state)
        self._optimizer_mode("train")

    def _log(self, state: TrainerState) -> TrainerControl:
        out = self.meter.flush(self.ctx)
        state.total_flos += out.get("flos", 0.0)
        if "logs" not in out:
            return self.events.control
        logs = {**out["logs"], "epoch": state.epoch}
        return self._record(state, logs, rank_stats=out["rank_stats"])

    def _record(self, state: TrainerState, logs: dict, **extra) -> TrainerControl:
        """A record for log_history and on_log, through the trainer's (overridable) `log`."""
        self._log_extra, self._log_control = extra, self.events.control
        self.trainer.log(logs)
        return self._log_control

    def record_log(self, logs: dict):
        """HF's `log` inside the run: rank 0 keeps the history, every rank fires on_log (decisions agree)."""
        logs["epoch"] = self.trainer.state.epoch  # as transformers' log, into the caller's dict (evaluation's too)
        if self.args.include_num_input_tokens_seen != "no":  # transformers' log adds it to every record
            logs = {**logs, "num_input_tokens_seen": self.trainer.state.num_input_tokens_seen}
        logs = {**logs, "step": self.trainer.state.global_step}
        if self.ctx.is_main:
            self.trainer.state.log_history.append(logs)
        self._log_control = self.events.fire("log", logs=logs, **self._log_extra)
        self._log_extra = {}

    def _evaluate(self, state: TrainerState) -> TrainerControl:
        trainer = self.trainer
        self.watch.phase("evaluation")
        self._optimizer_mode("eval")
        # Through the trainer's `evaluate`, as HF: a subclass's override runs for these evaluations too.
        results = [trainer.evaluate(dataset, metric_key_prefix=prefix)
                   for prefix, dataset in eval_sets(trainer.eval_dataset)]
        self._optimizer_mode("train")
        for metrics in results:
            metrics.update(epoch=state.epoch)
        self._update_best(state, {key: value for metrics in results for key, value in metrics.items()})
        # As HF's evaluate of each dataset (a dict of eval datasets is one evaluate per dataset): its metrics
        # logged (a record in log_history, on_log), then its on_evaluate; `eval_datasets_left` tells a callback
        # that needs the whole evaluation (Tune's report, as transformers reports the merged metrics) when it has it.
        control = self.events.control
        for index, metrics in enumerate(results):
            self._record(state, metrics)
            control = self.events.fire("evaluate", metrics=metrics, eval_datasets_left=len(results) - 1 - index)
        return control

    def evaluate_here(self, dataset, ignore_keys=None, metric_key_prefix: str = "eval") -> dict:
        """`Trainer.evaluate` called inside the run (by the loop, or by the user's override): this group's
        evaluation of `dataset`, its metrics returned; the loop logs them."""
        dataset = self.trainer.eval_dataset if dataset is None else dataset
        output = evaluation_loop(self.trainer, self.trainer.get_eval_dataloader(dataset), ignore_keys=ignore_keys,
                                 metric_key_prefix=metric_key_prefix, on_step=self.events.emit)
        return output.metrics

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
    def _finish(self, state: TrainerState, runtime: float, steps_run: int) -> Optional[TrainResult]:
        trainer, args = self.trainer, self.args
        self.watch.phase("the end: final metrics and weights")
        self._optimizer_mode("eval")  # the weights a schedule-free optimizer evaluates with are the result
        if args.load_best_model_at_end and state.best_model_checkpoint:
            self.checkpoints.load_model(state.best_model_checkpoint)
        if self.stops.reason is None:  # a run stopped by Ctrl-C continues from its newest checkpoint: kept
            self.checkpoints.keep_only_best(state.best_model_checkpoint)  # save_total_limit=1, as transformers
        total = self.meter.totals(self.ctx)
        state.total_flos += total["flos"]
        train_loss = total["loss_sum"] / max(total["steps"], 1)
        metrics = {
            "train_runtime": round(runtime, 4),
            "train_samples_per_second": round(total["samples"] / max(runtime, 1e-9), 3),
            "train_steps_per_second": round(steps_run / max(runtime, 1e-9), 3),
            "total_flos": state.total_flos, "train_loss": train_loss, "epoch": state.epoch,
        }
        self._record(state, metrics)
        self.events.fire("train_end")
        # No copy here on the CPU: the driver copies it into its model (in-process), or entry.py puts it into
        # the object store (one copy, into shared memory).
        model_state = trainer.strategy.host_state_dict(trainer.model_wrapped)  # all ranks: FSDP gathers here
        if not self.ctx.is_main:
            return None
        return TrainResult(state=state.to_json_string(), model_state=model_state,
                           train_output=TrainOutput(state.global_step, train_loss, metrics), stopped=self.stops.reason)

