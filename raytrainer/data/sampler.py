"""Deterministic, resumable sharding of a map-style dataset across ranks.

The global view is one permutation of the dataset per epoch, seeded by (data seed, epoch). Each micro-step
consumes `batch_size * world_size` consecutive samples of that order and rank r takes its contiguous slice.
So the samples of every global batch do not depend on how many workers share it, and the position in the
epoch is a *global sample offset*: a run resumed at another world size continues at the same sample.
The order is random (transformers' default), sequential, or grouped by length (`train_sampling_strategy`).

The last micro-step of an epoch may hold fewer samples than ranks. A rank left without a sample gets one
real sample marked as padding: it runs forward/backward so that collective calls stay matched across ranks,
and the loop scales its loss by zero, so it changes nothing.
"""

from __future__ import annotations

import math
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool, lengths: Optional[Sequence[int]] = None,
                group_size: int = 1) -> np.ndarray:
    if not shuffle:
        return np.arange(num_samples)
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    order = torch.randperm(num_samples, generator=generator).numpy()
    return order if lengths is None else length_grouped(order, lengths, group_size)


def length_grouped(order: np.ndarray, lengths: Sequence[int], group_size: int) -> np.ndarray:
    """transformers' LengthGroupedSampler on a random order: mega-batches of up to 50 groups, each sorted by
    length (longest first), the mega-batch holding the longest sample first, so a too-large batch fails at once.

    `group_size` is the global batch (per-device batch x accumulation x workers): it does not change when an
    elastic run resizes, so the order, and a checkpoint's position in it, does not depend on the world size.
    transformers' unit is the per-process batch x accumulation; on one process the two are the same."""
    mult = min(len(order) // (group_size * 4), 50) or 1
    size = mult * group_size
    megas = [sorted(order[i:i + size].tolist(), key=lambda j: lengths[j], reverse=True)
             for i in range(0, len(order), size)]
    longest = int(np.argmax([lengths[m[0]] for m in megas]))
    megas[0][0], megas[longest][0] = megas[longest][0], megas[0][0]
    return np.array([i for m in megas for i in m], dtype=np.int64)


def sample_lengths(dataset, length_column: str, main_input: str) -> List[int]:
    """Each sample's length, for group_by_length: the dataset's `length_column` when it has one (a
    datasets.Dataset column, read at once), else the length of each sample's main input, as transformers."""
    names = getattr(dataset, "column_names", None)
    if names is not None and length_column in names:
        return [int(n) for n in dataset[length_column]]
    lengths = []
    for i in range(len(dataset)):
        sample = dataset[i]
        if not isinstance(sample, dict) or main_input not in sample:
            raise ValueError(f"train_sampling_strategy='group_by_length' needs each sample's length: sample {i} "
                             f"has no {main_input!r}, and the dataset no {length_column!r} column. Add a "
                             "length column and name it with length_column_name.")
        lengths.append(len(sample[main_input]))
    return lengths


def order_options(args, dataset, main_input: str, world_size: int) -> dict:
    """The DistributedBatchSampler arguments that set the training order (args.train_sampling_strategy)."""
    strategy = args.train_sampling_strategy
    if strategy == "sequential":
        return {"shuffle": False}
    if strategy == "group_by_length":
        group = args.per_device_train_batch_size * args.gradient_accumulation_steps * world_size
        return {"shuffle": True, "lengths": sample_lengths(dataset, args.length_column_name, main_input),
                "group_size": group}
    return {"shuffle": True}


def epoch_end(num_samples: int, global_micro_batch: int, drop_last: bool) -> int:
    """Where an epoch of `num_samples` ends: all of it, or the last full global micro-batch with drop_last."""
    return num_samples // global_micro_batch * global_micro_batch if drop_last else num_samples


def rank_share(rows: int, batch_size: int, rank: int, world_size: int) -> Tuple[int, int]:
    """[start, stop) of rank's rows in a global micro-batch of `rows` rows: its contiguous slice of a full one;
    of the short last one, the slice of an even split in rank order (np.array_split's), which may be empty.
    The one rule of map-style data and of streams (data/streaming.py)."""
    if rows >= batch_size * world_size:
        return rank * batch_size, (rank + 1) * batch_size
    base, extra = divmod(rows, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class DistributedBatchSampler:
    """Yields this rank's micro-batches (lists of dataset indices) for one epoch, from a start offset."""

    def __init__(self, num_samples: int, batch_size: int, rank: int = 0, world_size: int = 1, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = False, lengths: Optional[Sequence[int]] = None,
                 group_size: int = 1):
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.lengths = lengths  # group_by_length: each sample's length (see length_grouped)
        self.group_size = group_size
        self.epoch = 0
        self.start_offset = 0

    @property
    def global_micro_batch(self) -> int:
        return self.batch_size * self.world_size

    def set_epoch(self, epoch: int, start_offset: int = 0):
        self.epoch = epoch
        self.start_offset = start_offset

    def end_offset(self) -> int:
        return epoch_end(self.num_samples, self.global_micro_batch, self.drop_last)

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
        order = epoch_order(self.num_samples, self.seed, self.epoch, self.shuffle, self.lengths, self.group_size)
        end = self.end_offset()
        for micro_step in range(len(self)):
            start = self.offset_after(micro_step)
            stop = min(start + self.global_micro_batch, end)
            chunk = order[start:stop]
            first, last = rank_share(len(chunk), self.batch_size, self.rank, self.world_size)
            mine = chunk[first:last] if last > first else chunk[:1]  # padding: see is_padding()
            yield mine.tolist()


def eval_shard(num_samples: int, rank: int, world_size: int) -> range:
    """A contiguous, non-overlapping slice per rank: concatenating the slices in rank order gives the
    dataset in order, with no duplicated or missing sample whatever the world size."""
    bounds = np.linspace(0, num_samples, world_size + 1).round().astype(int)
    return range(int(bounds[rank]), int(bounds[rank + 1]))
