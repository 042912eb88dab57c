"""A torch `Sampler` a user's `_get_train_sampler` / `_get_eval_sampler` override returns (a
`WeightedRandomSampler` for class imbalance, a `SequentialSampler`...), turned into this rank's share.

transformers hands such a sampler to accelerate, which shards it over processes. Here every rank draws the
sampler's order for the epoch itself, under torch's random stream seeded by (seed, epoch), so every rank
draws the same order and a resumed run draws the epoch's order again; then the order is sharded exactly as
raytrainer's own (data/sampler.py): consecutive global micro-batches, a resumable global sample offset, a
zero-weight filler for a rank left without samples. A sampler with its own seeded generator draws from that
generator instead, the same on every rank as long as each rank's copy starts from the same state.
"""

from __future__ import annotations

from typing import Iterator, List

import torch

from .sampler import DistributedBatchSampler, eval_shard


def draw(sampler, seed: int, epoch: int) -> List[int]:
    """The sampler's indices for `epoch`, identical on every rank, without moving this rank's random stream."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + epoch)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        return [int(i) for i in sampler]


class SamplerShards(DistributedBatchSampler):
    """raytrainer's sharding over the positions of the order drawn for the epoch; yields dataset indices. (The
    indices are mapped here, in the process that iterates the sampler, so DataLoader worker processes, even
    persistent ones, need no copy of the order.)"""

    def __init__(self, sampler, batch_size: int, rank: int, world_size: int, seed: int, drop_last: bool):
        self.sampler = sampler
        self.indices = draw(sampler, seed, 0)
        super().__init__(len(self.indices), batch_size, rank=rank, world_size=world_size, seed=seed, shuffle=False,
                         drop_last=drop_last)

    def set_epoch(self, epoch: int, start_offset: int = 0):
        super().set_epoch(epoch, start_offset)
        self.indices = draw(self.sampler, self.seed, epoch)
        self.num_samples = len(self.indices)

    def __iter__(self) -> Iterator[List[int]]:
        for positions in super().__iter__():
            yield [self.indices[p] for p in positions]


def evaluation_shard(sampler, dataset, rank: int, world_size: int, seed: int):
    """This rank's contiguous slice of the sampler's order: gathered in rank order, the sampler's order."""
    order = draw(sampler, seed, 0)
    return torch.utils.data.Subset(dataset, [order[i] for i in eval_shard(len(order), rank, world_size)])
