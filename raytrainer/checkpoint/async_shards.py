"""Sharded (FSDP) checkpoints written in the background: DCP's `async_save` copies this rank's shards to CPU
memory (the only stall), then writes them from a thread of its own while training goes on.

DCP's save is a collective. In the background it runs on gloo groups of its own, never on the training's
group: a collective of the training thread and one of the writer's on the same group could pair up
differently on two ranks. Each `async_save` call has its own thread, and the model and the optimizer are two
calls running at once, so each gets its own group. The groups are made once per job, by every rank at the
same save (principle 1), and gloo also on GPU: `async_save` needs a CPU backend.

`finish` runs in the checkpoint writer's thread on every rank: it waits for both writes, checksums this
rank's shard files and gathers every rank's outcome. Only when every rank wrote its shards does rank 0 get
the files to commit; a failed write on any rank (DCP reports it on every rank) raises on every rank, and the
checkpoint stays uncommitted (principle 2).
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch.distributed as dist
from torch import nn

from ..storage import join
from .manifest import list_files
from .sharded import MODEL_DIR, OPTIMIZER_DIR, dcp_writer, one_process_is_intended, shard_checksums


class ShardGroups:
    """The two gloo groups of one job's background saves; none without a process group (num_workers=0)."""

    def __init__(self):
        self._groups: Optional[tuple] = None

    def get(self) -> tuple:
        if not (dist.is_available() and dist.is_initialized()):
            return None, None
        if self._groups is None:  # a collective: every rank gets here at the same save
            self._groups = (dist.new_group(backend="gloo"), dist.new_group(backend="gloo"))
        return self._groups

    def close(self):
        """After the last write finished: a kept worker group serves many jobs, each would leak two groups."""
        groups, self._groups = self._groups, None
        for group in groups or ():
            dist.destroy_process_group(group)


class PendingShards:
    """Every rank's shards of one checkpoint, being written by DCP in the background."""

    def __init__(self, ckpt_url: str, futures: list, group, rank: int, world_size: int,
                 storage_options: Optional[dict]):
        self.ckpt_url, self.futures, self.group = ckpt_url, futures, group
        self.rank, self.world_size, self.storage_options = rank, world_size, storage_options

    def finish(self) -> Optional[tuple]:
        """Wait for this rank's writes, then gather every rank's outcome. Rank 0 gets (files, checksums) of
        every shard file; the others None. Raises on every rank when any rank's write failed."""
        outcome = None, {}
        try:
            for future in self.futures:
                future.result()
            # DCP's save ends with a collective after every rank's write_data, so every shard file exists now.
            files = list_files(self.ckpt_url, self.storage_options)
            # DCP writes the files itself: each rank reads its own back once (page cache), in parallel.
            outcome = None, shard_checksums(self.ckpt_url, files, self.rank, self.world_size, self.storage_options)
        except Exception as exc:  # noqa: BLE001 (still take part in the gather below, or the others hang)
            outcome = f"{type(exc).__name__}: {exc}", {}
            files = {}
        gathered = [outcome]
        if self.group is not None:
            gathered = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(gathered, outcome, group=self.group)
        failed = [(rank, error) for rank, (error, _) in enumerate(gathered) if error is not None]
        if failed:
            rank, error = failed[0]
            raise RuntimeError(f"rank {rank} could not write its shards of {self.ckpt_url}: {error}")
        if self.rank != 0:
            return None
        return files, {name: value for _, part in gathered for name, value in part.items()}


def save_sharded_async(model: nn.Module, optimizer, ckpt_url: str, storage_options: Optional[dict],
                       groups: tuple, rank: int, world_size: int) -> PendingShards:
    """Every rank: copy its shards of the model (and optimizer) to CPU memory, then write them in the
    background. Returns what `finish` waits on."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model_group, optimizer_group = groups
    parts = [(get_model_state_dict(model), MODEL_DIR, model_group)]
    if optimizer is not None:
        parts.append(({"optimizer": get_optimizer_state_dict(model, optimizer)}, OPTIMIZER_DIR, optimizer_group))
    if model_group is None:  # num_workers=0: DCP warns of a missing process group from its own thread, where
        # the main thread's catch_warnings does not reach; one process is what we mean (as sharded.py).
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
    futures = []
    with one_process_is_intended():
        for state, directory, group in parts:
            # The writer stages (copies to CPU, also from CPU: the next optimizer step changes the tensors in
            # place) before async_save returns; planning and writing happen in DCP's thread.
            futures.append(dcp.async_save(state, storage_writer=dcp_writer(join(ckpt_url, directory), storage_options),
                                          process_group=group, no_dist=group is None))
    return PendingShards(ckpt_url, futures, model_group, rank, world_size, storage_options)
