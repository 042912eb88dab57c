"""The worker loop's view of checkpoints: save when due, resume at start, track the best one.

Ownership under DDP: every rank holds the same model, so rank 0 writes the model, optimizer, scheduler and
trainer state; each rank's RNG state is gathered to rank 0 (a few KB) and written as rng_state_{rank}.pth.
One writer means the commit needs no cross-rank coordination in the background.

Under FSDP (a strategy whose `shards_state` is set) each rank holds a shard: every rank writes its shards
with DCP, synchronously (DCP's save is a collective, and collectives cannot run in the writer thread), then
a barrier; only then does rank 0 write the small files and the commit marker, in the background as above.
"""

from __future__ import annotations

import logging
from typing import Optional

from ..data.global_batch import accumulation_to_keep
from ..worker.context import WorkerContext
from . import manifest
from .listing import TRAINER_STATE_NAME, list_checkpoints, remove_partial
from .model_io import load_into, load_model_state
from .snapshot import (OPTIMIZER_FILE, SCHEDULER_FILE, Snapshot, get_rng_state, rng_file, set_rng_state,
                       to_host, torch_from_bytes)
from .sharded import MODEL_DIR, OPTIMIZER_DIR, is_sharded, load_sharded, save_sharded
from .storage import exists, join, read_bytes, read_text
from .writer import CheckpointWriter
from ..state import OWN_STATE_KEY, TrainerState

logger = logging.getLogger("raytrainer")


class CheckpointManager:
    def __init__(self, trainer, ctx: WorkerContext, emitter, run_id: str):
        self.trainer = trainer
        self.ctx = ctx
        self.emitter = emitter
        self.run_id = run_id
        args = trainer.args
        self.output_dir = args.output_dir
        self.storage_options = args.storage_options
        self.last_committed: Optional[str] = None  # rank 0: the newest checkpoint this group committed
        self.writer = CheckpointWriter(args.output_dir, args.storage_options, args.save_async,
                                       args.save_total_limit, on_commit=self._committed)

    # ------------------------------------------------------------------ saving
    def save(self, state: TrainerState):
        """Capture now (all ranks), write and commit in the background (rank 0)."""
        trainer, args = self.trainer, self.trainer.args
        if trainer.strategy.shards_state:
            return self._save_sharded(state)
        rng_states = self.ctx.all_gather_object(get_rng_state())
        if not self.ctx.is_main:
            return
        ckpt_url = join(self.output_dir, f"checkpoint-{state.global_step}")
        if state.best_global_step == state.global_step:
            state.best_model_checkpoint = ckpt_url
        model = trainer.strategy.unwrap(trainer.model_wrapped)
        snapshot = Snapshot(
            step=state.global_step,
            model_state=to_host(trainer.strategy.model_state_dict(trainer.model_wrapped)),
            model=model,
            optimizer_state=None if args.save_only_model else to_host(trainer.optimizer.state_dict()),
            scheduler_state=None if args.save_only_model else trainer.lr_scheduler.state_dict(),
            rng_states=[] if args.save_only_model else rng_states,
            trainer_state_json=state.to_json_string(),
            args_json=args.to_json_string(),
        )
        save_model = lambda directory, sd: trainer._save(directory, state_dict=sd, model=model)  # noqa: E731
        self.writer.submit(snapshot, save_model, state.best_model_checkpoint)

    def _save_sharded(self, state: TrainerState):
        trainer, args, ctx, opts = self.trainer, self.trainer.args, self.ctx, self.storage_options
        ckpt_url = join(self.output_dir, f"checkpoint-{state.global_step}")
        rng_states = ctx.all_gather_object(get_rng_state())
        if ctx.is_main:
            self.writer.wait()  # the previous commit (and its retention) is done before this directory is used
            if exists(ckpt_url, opts):  # a leftover of the same step: un-commit it before rewriting
                manifest.delete(ckpt_url, opts)
        ctx.barrier()
        save_sharded(trainer.model_wrapped, None if args.save_only_model else trainer.optimizer, ckpt_url, opts)
        # Every rank's shards are durable once every rank is past its write: only then may the commit follow.
        ctx.barrier()
        if not ctx.is_main:
            return
        if state.best_global_step == state.global_step:
            state.best_model_checkpoint = ckpt_url
        model = trainer.strategy.unwrap(trainer.model_wrapped)
        snapshot = Snapshot(
            step=state.global_step, model_state={}, model=model, optimizer_state=None,
            scheduler_state=None if args.save_only_model else trainer.lr_scheduler.state_dict(),
            rng_states=[] if args.save_only_model else rng_states,
            trainer_state_json=state.to_json_string(), args_json=args.to_json_string())
        written = manifest.list_files(ckpt_url, opts)  # every rank's shard files, listed for the manifest
        save_config = lambda directory, _: _save_config(directory, model)  # noqa: E731
        self.writer.submit(snapshot, save_config, state.best_model_checkpoint, written=written)

    def _committed(self, step: int, url: str):
        self.last_committed = url
        self.emitter.emit("save", global_step=step, checkpoint=url,
                          best_model_checkpoint=self.trainer.state.best_model_checkpoint,
                          best_metric=self.trainer.state.best_metric)

    def wait(self):
        self.writer.wait()

    # ------------------------------------------------------------------ resuming
    def find_resume_url(self, requested: Optional[str]) -> Optional[str]:
        """This run's newest committed checkpoint (we are a restarted worker group), else `requested`.

        Decided on rank 0 and broadcast, so every rank loads the same checkpoint."""
        url = None
        if self.ctx.is_main:
            remove_partial(self.output_dir, self.storage_options)
            for info in reversed(list_checkpoints(self.output_dir, self.storage_options)):
                if not info.committed:
                    continue
                state = TrainerState.from_json_string(read_text(join(info.url, TRAINER_STATE_NAME),
                                                                self.storage_options))
                if state.own.get("run_id") == self.run_id:
                    url = info.url
                    break
            url = url or requested
        return self.ctx.broadcast_object(url)

    def keep_global_batch(self, url: str):
        """Resuming at another world size: set gradient_accumulation_steps so the global batch the run started
        with stays the same (the driver checked this already when it could)."""
        own = None
        if self.ctx.is_main:
            state = TrainerState.from_json_string(read_text(join(url, TRAINER_STATE_NAME), self.storage_options))
            own = state.stateful_callbacks.get(OWN_STATE_KEY, {})
        own = self.ctx.broadcast_object(own)
        args = self.trainer.args
        accumulation = accumulation_to_keep(own, args, self.ctx.world_size)
        if accumulation is None:
            return
        if self.ctx.is_main:
            logger.warning("Resuming %s at world size %d (saved at world size %d): gradient_accumulation_steps "
                           "%d -> %d, keeping the global batch of %d samples.", url, self.ctx.world_size,
                           own["world_size"], args.gradient_accumulation_steps, accumulation,
                           own["global_batch_size"])
        args.gradient_accumulation_steps = accumulation

    def load_model(self, url: str):
        """Load only the weights of checkpoint `url` (load_best_model_at_end)."""
        trainer = self.trainer
        if trainer.strategy.shards_state:
            load_sharded(trainer.model_wrapped, None, url, self.storage_options)
        else:
            load_into(trainer.strategy.unwrap(trainer.model_wrapped), load_model_state(url, self.storage_options))

    def restore(self, url: str) -> TrainerState:
        """Load weights, optimizer, scheduler, this rank's RNG streams and the trainer state from `url`."""
        trainer, opts = self.trainer, self.storage_options
        sharded = trainer.strategy.shards_state
        if sharded != is_sharded(url, opts):  # the driver refuses this first; a restart can still meet it
            raise RuntimeError(_format_mismatch(url, sharded))
        if not exists(join(url, OPTIMIZER_DIR if sharded else OPTIMIZER_FILE), opts):
            raise RuntimeError(f"{url} was saved with save_only_model=True and cannot be resumed from: it has "
                               "no optimizer, scheduler or RNG state. Start a new run from its weights instead.")
        if sharded:
            load_sharded(trainer.model_wrapped, trainer.optimizer, url, opts)
        else:
            load_into(trainer.strategy.unwrap(trainer.model_wrapped), load_model_state(url, opts))
            trainer.optimizer.load_state_dict(torch_from_bytes(read_bytes(join(url, OPTIMIZER_FILE), opts)))
        trainer.lr_scheduler.load_state_dict(torch_from_bytes(read_bytes(join(url, SCHEDULER_FILE), opts)))
        # After a resize, ranks beyond the old world size continue rank 0's streams.
        rng_url = join(url, rng_file(self.ctx.rank))
        set_rng_state(torch_from_bytes(read_bytes(rng_url if exists(rng_url, opts) else join(url, rng_file(0)),
                                                  opts)))
        return TrainerState.from_json_string(read_text(join(url, TRAINER_STATE_NAME), opts))


def _save_config(directory: str, model):
    """The model files rank 0 adds to a sharded checkpoint: a transformers model's config.json, so that
    `raytrainer consolidate` produces a directory `from_pretrained` can load."""
    config = getattr(model, "config", None)
    if hasattr(config, "save_pretrained"):
        config.save_pretrained(directory)


def _format_mismatch(url: str, sharded_strategy: bool) -> str:
    if sharded_strategy:
        return (f"{url} is a full (DDP) checkpoint, but strategy='fsdp' resumes from sharded ones: resume it with "
                "strategy='ddp', or start the FSDP run from its weights.")
    return (f"{url} is a sharded FSDP checkpoint ({MODEL_DIR}/): resume it with strategy='fsdp', or turn it into "
            "model.safetensors with `raytrainer consolidate` and start a new run from those weights.")
