"""The worker loop's view of checkpoints: save when due, resume at start, track the best one.

Ownership under DDP: every rank holds the same model, so rank 0 writes the model, optimizer, scheduler and
trainer state; each rank's RNG state is gathered to rank 0 (a few KB) and written as rng_state_{rank}.pth.
One writer means the commit needs no cross-rank coordination in the background.

Under FSDP (a strategy whose `shards_state` is set) each rank holds a shard and writes it with DCP. With
save_async every rank copies its shards to CPU memory and DCP writes them in the background on
gloo groups of their own (async_shards.py); each rank's writer thread waits for them and gathers every rank's
outcome, and only then does rank 0 write the small files and the commit marker. save_async=False: every rank
writes its shards now, a barrier, then rank 0 commits inline. Either way the next save, the end of training
and a resume wait for the save in flight, on every rank.
"""

from __future__ import annotations

import logging
import warnings
from typing import Optional

import torch

from ..data.global_batch import accumulation_to_keep
from ..state import OWN_STATE_KEY, TrainerState
from ..storage import basename, exists, join, read_bytes
from ..storage.retry import DEFAULT_TIMEOUT_S, Retry
from ..verbosity import notice
from ..worker_context import WorkerContext
from . import hyperparameters, lease, manifest, retention
from .async_shards import ShardGroups, save_sharded_async
from .choice import choose
from .damage import CheckpointDamagedError, check_bytes, parsing
from .listing import TRAINER_STATE_NAME, checkpoint_name
from .model_io import load_checkpoint_weights
from .sharded import (
    OPTIMIZER_DIR,
    is_sharded,
    load_sharded,
    save_sharded,
    shard_checksums,
    shard_damage,
    strategy_mismatch,
)
from .snapshot import (
    OPTIMIZER_FILE,
    SCHEDULER_FILE,
    Snapshot,
    get_rng_state,
    rng_file,
    set_rng_state,
    to_host,
    torch_from_bytes,
)
from .writer import CheckpointWriter, clear_leftover

logger = logging.getLogger("raytrainer")


def background_saves(save_async: Optional[bool], sharded: bool, device: torch.device) -> bool:
    """save_async, or where it is None what measured faster (benchmarks/README.md, checkpoint.py's stall): in the
    background, where the step stalls only for the copy to host memory, except sharded (FSDP) checkpoints on CPU
    workers. There the training processes hold every core, and DCP's background write took as long as an inline
    one (1.05x on the idle 2-core machine, 2.4x under load) where DDP's took half."""
    if save_async is not None:
        return save_async
    return not (sharded and device.type == "cpu")


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
        self._resume_states: dict = {}  # url -> its trainer_state.json, while resuming (_state_bytes)
        # A transient storage error is waited out for this long before it counts as a failure (storage/retry.py).
        self.retry = Retry(getattr(args, "storage_retry_timeout_s", DEFAULT_TIMEOUT_S), args.storage_options)
        self.save_async = background_saves(args.save_async, trainer.strategy.shards_state, ctx.device)
        self.writer = CheckpointWriter(args.output_dir, args.storage_options, self.save_async,
                                       args.save_total_limit, on_commit=self._committed, retry=self.retry,
                                       guard=self._check_lease)
        self.shard_groups = ShardGroups()  # FSDP's background saves: made at the first one (async_shards.py)

    def _check_lease(self):
        """The run's lease (taken by the driver) is still ours: else the storage lost it, or another run took
        output_dir over; either way this run must not commit (lease.py)."""
        lease.check_held(self.output_dir, self.run_id, self.storage_options, self.retry)

    # ------------------------------------------------------------------ saving
    def save(self, state: TrainerState):
        """Capture now (all ranks), write and commit in the background (rank 0)."""
        trainer, args = self.trainer, self.trainer.args
        if trainer.strategy.shards_state:
            return self._save_sharded(state)
        rng_states = self.ctx.all_gather_object(get_rng_state())
        ckpt_url = join(self.output_dir, checkpoint_name(state.global_step))
        _mark_best(state, ckpt_url)
        if not self.ctx.is_main:
            return
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
        ckpt_url = join(self.output_dir, checkpoint_name(state.global_step))
        _mark_best(state, ckpt_url)
        optimizer = None if args.save_only_model else trainer.optimizer
        # Every rank: the previous save's background writes, their collectives and its commit are done before
        # this one starts (one save in flight; its groups are free again; retention ran before this directory).
        self.writer.wait()
        rng_states = ctx.all_gather_object(get_rng_state())
        if ctx.is_main:
            self._check_lease()  # before DCP writes anything (its fsspec writer would create a missing bucket)
            clear_leftover(ckpt_url, opts, self.retry)  # a leftover of the same step (a damaged one is set aside)
        ctx.barrier()
        written = checksums = shards = None
        if self.save_async:  # stall: the copy to CPU; the shards are written and gathered in the background
            pending = save_sharded_async(trainer.model_wrapped, optimizer, ckpt_url, opts, self.shard_groups.get(),
                                         ctx.rank, ctx.world_size)
            shards = pending.finish
            if not ctx.is_main:
                self.writer.run(shards)  # takes part in the background gather that lets rank 0 commit
                return
        else:
            written, checksums = self._write_shards_now(optimizer, ckpt_url)
            if not ctx.is_main:
                return
        model = trainer.strategy.unwrap(trainer.model_wrapped)
        snapshot = Snapshot(
            step=state.global_step, model_state={}, model=model, optimizer_state=None,
            scheduler_state=None if args.save_only_model else trainer.lr_scheduler.state_dict(),
            rng_states=[] if args.save_only_model else rng_states,
            trainer_state_json=state.to_json_string(), args_json=args.to_json_string())
        save_config = lambda directory, _: _save_config(directory, model)  # noqa: E731
        self.writer.submit(snapshot, save_config, state.best_model_checkpoint, written=written, checksums=checksums,
                           shards=shards)

    def _write_shards_now(self, optimizer, ckpt_url: str):
        """save_async=False: every rank writes its shards now; rank 0 gets (files, checksums) of them all."""
        ctx, opts = self.ctx, self.storage_options
        save_sharded(self.trainer.model_wrapped, optimizer, ckpt_url, opts)
        # Every rank's shards are durable once every rank is past its write: only then may the commit follow.
        ctx.barrier()
        written = ctx.broadcast_object(manifest.list_files(ckpt_url, opts) if ctx.is_main else None)
        # Each rank checksums the shard files it wrote (a read back: DCP writes them itself), in parallel.
        gathered = ctx.all_gather_object(shard_checksums(ckpt_url, written, ctx.rank, ctx.world_size, opts))
        return written, {name: value for part in gathered for name, value in part.items()}

    def _committed(self, step: int, url: str):
        self.last_committed = url
        self.emitter.emit("save", global_step=step, checkpoint=url,
                          best_model_checkpoint=self.trainer.state.best_model_checkpoint,
                          best_metric=self.trainer.state.best_metric)

    def wait(self):
        """The end of training: the last write is committed (or its error raised), its gloo groups released."""
        try:
            self.writer.wait()
        finally:
            self.shard_groups.close()

    def keep_only_best(self, best_url: Optional[str]):
        """transformers' end of training with save_total_limit=1 and a best checkpoint: only the best stays, the
        newest is deleted too (rank 0, after `wait`: the last write is committed; under the run's lease)."""
        if not (self.ctx.is_main and self.trainer.args.save_total_limit == 1 and best_url):
            return
        retention.end_keeping_only_best(
            self.output_dir, best_url, self.storage_options, self._check_lease,
            lambda fn: self.retry.call(fn, self.output_dir, "keeping only the best checkpoint (save_total_limit=1)"))

    # ------------------------------------------------------------------ resuming
    def find_resume_url(self, requested: Optional[str]) -> Optional[str]:
        """This run's newest committed, intact checkpoint (we are a restarted worker group), else `requested`.

        Decided on rank 0 and broadcast, so every rank loads the same checkpoint."""
        url = None
        self.writer.wait()  # a save of this manager still in flight is committed (or failed) before we look
        if self.ctx.is_main:
            self._check_lease()  # missing: the storage lost this run's data; do not start again from step 0
            # A restarted group: this run's own checkpoints only, never an earlier run's (choice.py says which).
            url = choose(self.output_dir, self.storage_options, run_id=self.run_id, remove_unfinished=True,
                         retry=self.retry, doing="restarting this run").url
            if url is None and requested is not None:
                url = requested
                notice(f"resuming from {basename(url)} under {self.output_dir}")
        return self.ctx.broadcast_object(url)

    def _state_bytes(self, url: str) -> bytes:
        """Checkpoint `url`'s trainer_state.json, read once for a resume (its global batch, the restore);
        `restore` forgets it, so a later checkpoint of the same name is read afresh."""
        if url not in self._resume_states:
            self._resume_states[url] = self.retry.call(
                lambda: read_bytes(join(url, TRAINER_STATE_NAME), self.storage_options), url,
                "reading trainer_state.json")
        return self._resume_states[url]

    def _read_state(self, url: str, committed: Optional[dict] = None) -> TrainerState:
        data = self._state_bytes(url)
        if committed is not None:
            check_bytes(url, TRAINER_STATE_NAME, data, committed)
        with parsing(url, TRAINER_STATE_NAME):
            return TrainerState.from_json_string(data.decode("utf-8"))

    def keep_global_batch(self, url: str):
        """Resuming at another world size: set gradient_accumulation_steps so the global batch the run started
        with stays the same (the driver checked this already when it could)."""
        own = None
        if self.ctx.is_main:
            own = self._read_state(url).stateful_callbacks.get(OWN_STATE_KEY, {})
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
        self.writer.wait()  # `url` may be the save still in flight
        self.ctx.barrier()  # every rank loads it: the others wait until rank 0's writer committed it
        if trainer.strategy.shards_state:
            self._check_shards(url, self._manifest(url))
            load_sharded(trainer.model_wrapped, None, url, self.storage_options)
        else:
            load_checkpoint_weights(trainer.strategy.unwrap(trainer.model_wrapped), url, self.storage_options,
                                    self._manifest(url))

    def _check_shards(self, url: str, committed: Optional[dict]):
        """Collective: every rank checks its share of the DCP files, and all raise if any is damaged (DCP's load
        is a collective too: one rank must not enter it while another gives up)."""
        ctx = self.ctx
        mine = shard_damage(url, committed, ctx.rank, ctx.world_size, self.storage_options)
        found = [d for d in ctx.all_gather_object(mine) if d is not None]
        if found:
            raise CheckpointDamagedError(url, *found[0])

    def _manifest(self, url: str) -> Optional[dict]:
        return self.retry.call(lambda: manifest.read_manifest(url, self.storage_options), url, "reading COMMITTED")

    def _read(self, url: str, name: str, committed: Optional[dict]) -> bytes:
        """A file of checkpoint `url`, checked against the manifest (size, checksum) as it is loaded."""
        data = self.retry.call(lambda: read_bytes(join(url, name), self.storage_options), url, f"reading {name}")
        check_bytes(url, name, data, committed)
        return data

    def _load_object(self, url: str, name: str, committed: Optional[dict]):
        data = self._read(url, name, committed)
        with parsing(url, name):
            return torch_from_bytes(data)

    def restore(self, url: str, own_hyperparameters: bool = False) -> TrainerState:
        """Load weights, optimizer, scheduler, this rank's RNG streams and the trainer state from `url`.
        `own_hyperparameters`: the optimizer keeps this run's learning rate, weight decay, betas and eps
        (a PBT trial continuing another trial's checkpoint: hyperparameters.py)."""
        trainer, opts = self.trainer, self.storage_options
        own = hyperparameters.own_hyperparameters(trainer.optimizer, trainer.lr_scheduler) if own_hyperparameters \
            else None
        sharded = trainer.strategy.shards_state
        if sharded != is_sharded(url, opts):  # the driver refuses this first; a restart can still meet it
            raise RuntimeError(strategy_mismatch(url, sharded))
        # save_only_model=True wrote no optimizer, scheduler or RNG state: as transformers, resume from the weights
        # with a fresh optimizer (restart_from_weights says so and moves the schedule to the saved step).
        model_only = not exists(join(url, OPTIMIZER_DIR if sharded else OPTIMIZER_FILE), opts)
        committed = self._manifest(url)
        if sharded:
            self._check_shards(url, committed)
            load_sharded(trainer.model_wrapped, None if model_only else trainer.optimizer, url, opts)
        else:
            load_checkpoint_weights(trainer.strategy.unwrap(trainer.model_wrapped), url, opts, committed)
            if not model_only:
                trainer.optimizer.load_state_dict(self._load_object(url, OPTIMIZER_FILE, committed))
        state = self._read_state(url, committed)
        self._resume_states.clear()
        if model_only:
            restart_from_weights(trainer, url, state.global_step, warn=self.ctx.is_main)
            return state
        trainer.lr_scheduler.load_state_dict(self._load_object(url, SCHEDULER_FILE, committed))
        if own is not None:
            hyperparameters.put_back(trainer.optimizer, trainer.lr_scheduler, own)
        # After a resize, ranks beyond the old world size continue rank 0's streams.
        own_rng = rng_file(self.ctx.rank)
        set_rng_state(self._load_object(url, own_rng if exists(join(url, own_rng), opts) else rng_file(0), committed))
        return state


def _mark_best(state: TrainerState, ckpt_url: str):
    """On every rank, not only the writer: load_best_model_at_end loads on every rank, and FSDP's load is a
    collective (rank 0 alone in it waited forever for the others)."""
    if state.best_global_step == state.global_step:
        state.best_model_checkpoint = ckpt_url


def restart_from_weights(trainer, url: str, global_step: int, warn: bool):
    """Resuming a save_only_model checkpoint: the optimizer starts fresh (transformers does the same), the
    learning-rate schedule continues at the saved step (transformers restarts it at 0, rerunning the warm-up)."""
    if warn:
        logger.warning("%s was saved with save_only_model=True: it holds no optimizer, scheduler or RNG state. "
                       "Resuming from its weights at step %d with a fresh optimizer (the learning-rate schedule "
                       "continues at that step); the run will not match an uninterrupted one.", url, global_step)
    with warnings.catch_warnings():  # torch warns of a scheduler step before any optimizer step: intended here
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(global_step):
            trainer.lr_scheduler.step()


def _save_config(directory: str, model):
    """The model files rank 0 adds to a sharded checkpoint: a transformers model's config.json, so that
    `raytrainer consolidate` produces a directory `from_pretrained` can load."""
    config = getattr(model, "config", None)
    if hasattr(config, "save_pretrained"):
        config.save_pretrained(directory)

