"""The callback every hosted Trainer gets on every rank: its events reach the driver, the driver's control
decisions reach every rank at the same step, and each checkpoint HF writes is committed.

HF's `CallbackHandler` calls it on every rank, in the same order (HF's own flow is the same on all ranks),
so `LoopEvents` can do here what it does in raytrainer's own loop (worker/loop_events.py): rank 0 reports the
event (buffered; observing costs no round trip), and only where a driver callback can change control does
rank 0 wait for the driver's decision, which one small all-reduce then gives every rank. The flags decided
on the driver are added to HF's own (`should_save` from save_steps stays set; a driver's stop is added).

`on_save` runs after HF wrote `checkpoint-N` on every rank: after a barrier each node's files are uploaded (a
remote output_dir) or read once for their checksums (a local one), and rank 0 writes the manifest last
(checkpoint/hf_dirs.py), under the run's lease; only then does the driver hear of the save.

Preemption and Ctrl-C (stops.py): at an exchange step (about every 0.2 s of steps, on a schedule every rank
agrees on) `on_step_begin` starts one small all-reduce of the ranks' stop flags, read at the step's
`on_step_end`; once agreed, every rank asks HF to save at that step, and the relay's `on_save` ends the loop
after the commit.
"""

from __future__ import annotations

import functools
import os
import shutil

from transformers import TrainerCallback

from ...callbacks.base import CONTROL_FLAGS
from ...checkpoint import hf_dirs, lease
from ...checkpoint.listing import checkpoint_name
from ...checkpoint.retention import end_keeping_only_best, rotate
from ...state import OWN_STATE_KEY
from ...storage import is_local, join
from ..loop_events import LoopEvents
from ..watchdog import current as current_watchdog

# The HF events a hosted Trainer reports whatever the driver's callbacks listen to: progress, logs and the
# run's records need them. Others (step_begin, substep_end, ...) only when a driver callback listens.
ALWAYS_RELAYED = frozenset({"train_begin", "epoch_begin", "step_end", "log", "evaluate", "save", "epoch_end",
                            "train_end", "predict"})


# Where a stalled rank is, by the last HF event it passed: what HF does until its next event (the watchdog adds
# the line the rank is stuck on; one inside torch.distributed is named as waiting for another rank).
NEXT_PHASE = {"train_begin": "HF's loop before its first step (the first batch)",
              "step_begin": "HF's training step (forward, backward)",
              "substep_end": "HF's training step (the next micro-batch)",
              "pre_optimizer_step": "HF's optimizer step",
              "optimizer_step": "HF's loop after the optimizer step (the callbacks' on_step_end)",
              "step_end": "HF's loop after a step (log, evaluate, save, the next batch)"}


@functools.lru_cache(maxsize=None)  # the names are built once per event, not at every step
def _phases(event: str) -> tuple:
    """The watchdog's phase while the relay handles `event`, and the one after it, until HF's next event."""
    return f"on_{event} (the driver's callbacks, control)", NEXT_PHASE.get(event) or f"HF's loop after on_{event}"


class Relay(TrainerCallback):
    def __init__(self, host, trainer):
        self.host, self.trainer = host, trainer
        order = host.order
        self.events = LoopEvents(trainer, host.ctx, host.emitter, order.control_points, heard=order.heard,
                                 next_step=order.callback_decisions == "next_step")
        self.relayed = ALWAYS_RELAYED | order.heard
        self.checkpoint = None  # the URL of the last committed checkpoint
        self.watch = current_watchdog()  # the job's hang watchdog (a no-op when off): this relay marks it
        self.stops = None  # this train()'s stop requests (stops.py LoopStops), from on_train_begin

    def _fire(self, event: str, control, **payload):
        during, after = _phases(event)
        self.watch.phase(during)
        if event in self.relayed:
            decided = self.events.fire(event, **payload)
            for name in CONTROL_FLAGS:
                if getattr(decided, name):
                    setattr(control, name, True)
            if event == "step_end":
                self.events.end_step()
        if event == "train_end":
            self.watch.idle()  # what the script does after train() is not a step: never a stall
        else:  # the relay is HF's last callback: what HF does until the next event is named
            self.watch.phase(after)
        return control

    def on_train_begin(self, args, state, control, **kwargs):
        self.stops = self.host.stops.for_loop()
        control = self._fire("train_begin", control, max_steps=state.max_steps,
                             num_train_epochs=state.num_train_epochs, world_size=self.host.ctx.world_size,
                             trainer=type(self.trainer).__name__, output_dir=self.host.url_of(self.trainer))
        if self.host.ctx.is_main:
            self._record_restarts(state)
        return control

    def _record_restarts(self, state):
        """In a worker group that replaced another (a lost worker, a hang, a preemption), the job's restarts and
        resizes go into this Trainer's state, so its next trainer_state.json has them (under
        `stateful_callbacks["raytrainer"]`, as the own loop writes them); the group's first Trainer reports the
        restart to the driver."""
        history, first = self.host.restart_history(self.trainer)
        if history is None:
            return
        own = state.stateful_callbacks.setdefault(OWN_STATE_KEY, {})
        for name in ("restarts", "resizes"):
            kept = own.setdefault(name, [])
            kept.extend(r for r in getattr(history, name) if r not in kept)
        if first:
            self.host.emitter.emit("restart", epoch=state.epoch, **history.restart)
            if history.resize is not None:
                self.host.emitter.emit("resize", epoch=state.epoch, **history.resize)

    def on_epoch_begin(self, args, state, control, **kwargs):
        return self._fire("epoch_begin", control)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.stops is not None:
            self.stops.at_step_begin()  # at an exchange step: this rank's stop requests, beside the step
        return self._fire("step_begin", control)

    def on_substep_end(self, args, state, control, **kwargs):
        return self._fire("substep_end", control)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        return self._fire("pre_optimizer_step", control)

    def on_optimizer_step(self, args, state, control, **kwargs):
        return self._fire("optimizer_step", control)

    def on_step_end(self, args, state, control, **kwargs):
        control = self._fire("step_end", control)
        if self.stops is not None:
            self.stops.at_step_end(state, control)  # a stop agreed: every rank saves at this step and stops
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        return self._fire("log", control, logs=dict(logs or {}))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        return self._fire("evaluate", control, metrics=dict(metrics or {}))

    def on_predict(self, args, state, control, metrics=None, **kwargs):
        return self._fire("predict", control, metrics=dict(metrics or {}))

    def on_epoch_end(self, args, state, control, **kwargs):
        return self._fire("epoch_end", control)

    def on_train_end(self, args, state, control, **kwargs):
        if self.stops is not None:
            self.stops.at_train_end(state.global_step, self.checkpoint)
        if args.save_total_limit == 1 and state.best_model_checkpoint and self.checkpoint:
            self._keep_only_best(state.best_model_checkpoint)
        return self._fire("train_end", control)

    def _keep_only_best(self, best: str):
        """HF's end of training with save_total_limit=1 deleted every local checkpoint but the best: the remote
        copies go the same way (rank 0, under the run's lease), and the best is the checkpoint the run ends on."""
        host = self.host
        run_url, best = host.url_of(self.trainer), host.url_for(best)
        if not is_local(run_url) and host.ctx.is_main:
            options = host.order.storage_options
            end_keeping_only_best(run_url, best, options, lambda: lease.check_held(run_url, host.order.run_id, options))
        self.checkpoint = best

    def on_save(self, args, state, control, **kwargs):
        url = self._commit(args, state)
        best = state.best_model_checkpoint
        best = self.host.url_for(best) if best else best  # a staging path: named by the output_dir's URL
        control = self._fire("save", control, checkpoint=url, best_model_checkpoint=best,
                             best_metric=state.best_metric)
        if self.stops is not None:
            self.stops.saved(state.global_step, url)  # the stop's checkpoint: the loop ends here (HostedStop)
        return control

    def _commit(self, args, state) -> str:
        host, ctx = self.host, self.host.ctx
        run_url = host.url_of(self.trainer)
        name = checkpoint_name(state.global_step)
        local, url = os.path.join(args.output_dir, name), join(run_url, name)
        remote = not is_local(run_url)
        ctx.barrier()  # every rank's files (rng states, sharded optimizer parts) are written
        options = host.order.storage_options
        writes = ctx.local_rank == 0 if remote else ctx.is_main  # a remote run: one uploader per node
        held = hf_dirs.node_files(local, url if remote else None, options) if writes else ({}, {})
        held = ctx.all_gather_object(held)
        if ctx.is_main:
            lease.check_held(run_url, host.order.run_id, options)
            hf_dirs.commit(url, state.global_step, held, options, written_by=host.written_by(self.trainer))
            if remote:
                rotate(run_url, args.save_total_limit, state.best_model_checkpoint, options)
        if remote and ctx.local_rank == 0:
            _drop_staged(args.output_dir, keep={name, os.path.basename(state.best_model_checkpoint or "")})
        ctx.barrier()  # no rank goes on (or reports the save) before the checkpoint is committed
        self.checkpoint = url
        return url


def _drop_staged(staging: str, keep: set):
    """A remote run's staging keeps only what HF may still read: the newest checkpoint and the best."""
    for entry in os.listdir(staging):
        if entry.startswith("checkpoint-") and entry not in keep and os.path.isdir(os.path.join(staging, entry)):
            shutil.rmtree(os.path.join(staging, entry), ignore_errors=True)
