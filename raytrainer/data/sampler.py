"""Deterministic, resumable sharding of a map-style dataset across ranks.

The global view is one permutation of the dataset per epoch, seeded by (data seed, epoch). Each micro-step
consumes `batch_size * world_size` consecutive samples of that order and rank r takes its contiguous slice.
So the samples of every global batch do not depend on how many workers share it, and the position in the
epoch is a *global sample offset*: a run resumed at another world size continues at the same sample.

The last micro-step of an epoch may hold fewer samples than ranks. A rank left without a sample gets one
real sample marked as padding: it runs forward/backward so that collective calls stay matched across ranks,
and the loop scales its loss by zero, so it changes nothing.
"""

from __future__ import annotations

import math
from typing import Iterator, List

import numpy as np
import torch


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(num_samples)
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(num_samples, generator=generator).numpy()


class DistributedBatchSampler:
    """Yields this rank's micro-batches (lists of dataset indices) for one epoch, from a start offset."""

    def __init__(self, num_samples: int, batch_size: int, rank: int = 0, world_size: int = 1, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = False):
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.start_offset = 0

    @property
    def global_micro_batch(self) -> int:
        return self.batch_size * self.world_size

    def set_epoch(self, epoch: int, start_offset: int = 0):
        self.epoch = epoch
        self.start_offset = start_offset

    def end_offset(self) -> int:
        """Where the epoch ends: the dataset size, or the last full micro-batch with drop_last."""
        if not self.drop_last:
            return self.num_samples
        return (self.num_samples // self.global_micro_batch) * self.global_micro_batch

    def offset_after(self, micro_steps: int) -> int:
        """The global sample offset after `micro_steps` micro-batches from the start offset."""
        return min(self.start_offset + micro_steps * self.global_micro_batch, self.end_offset())

    def __len__(self) -> int:
        remaining = max(self.end_offset() - self.start_offset, 0)
        return math.ceil(remaining / self.global_micro_batch)

    def micro_batches_per_epoch(self) -> int:
        return math.ceil(self.end_offset() / self.global_micro_batch)

    def is_padding(self, micro_step: int) -> bool:
        """Whether this rank's `micro_step`-th batch (from the start offset) is a zero-weight filler."""
        start = self.offset_after(micro_step)
        remaining = self.end_offset() - start
        return 0 < remaining < self.world_size and self.rank >= remaining

    def __iter__(self) -> Iterator[List[int]]:
        order = epoch_order(self.num_samples, self.seed, self.epoch, self.shuffle)
        end = self.end_offset()
        for micro_step in range(len(self)):
            start = self.offset_after(micro_step)
            stop = min(start + self.global_micro_batch, end)
            chunk = order[start:stop]
            if len(chunk) == self.global_micro_batch:
                mine = chunk[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]
            else:  # the short last micro-batch: split as evenly as possible, in rank order
                mine = np.array_split(chunk, self.world_size)[self.rank]
                if len(mine) == 0:
                    mine = chunk[:1]  # padding: see is_padding()
            yield mine.tolist()


def eval_shard(num_samples: int, rank: int, world_size: int) -> range:
    """A contiguous, non-overlapping slice per rank: concatenating the slices in rank order gives the
    dataset in order, with no duplicated or missing sample whatever the world size."""
    bounds = np.linspace(0, num_samples, world_size + 1).round().astype(int)
    return range(int(bounds[rank]), int(bounds[rank + 1]))
