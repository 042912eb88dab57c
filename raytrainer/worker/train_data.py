"""Where the loop's micro-batches come from, behind one interface for every kind of training data.

    micro_batches_per_epoch() -> int, or None when the epoch's length is unknown (max_steps is then set)
    batches(epoch, offset)     -> (batch, is_filler) for each micro-step of the epoch, from `offset`
    offset_after(offset, n)    -> the position after n more micro-steps (what a checkpoint records)
    fraction(offset)           -> how far into the epoch that is (TrainerState.epoch's fractional part)
    exhausted(offset)          -> whether the epoch's data ran out at that position

A filler batch (`is_filler`) is a rank's zero-weight batch: it runs forward/backward so that collective
calls stay matched across ranks and changes nothing (see data/sampler.py).

- `SamplerData`: a map-style dataset through our `DistributedBatchSampler`; the position is a global
  sample offset, so a resume at another world size continues at the same sample.
- `LoaderData`: a user's own dataloader (an overridden `get_train_dataloader`); the position is a count of
  this rank's micro-batches.
- `data/ray_batches.RayTrainData`: a `ray.data.Dataset`.
- `data/streaming.StreamTrainData`: an iterable dataset (a stream); the position is a global sample offset too.
"""

from __future__ import annotations

import math
from itertools import islice
from typing import Iterator, Tuple

import torch

from ..data.ray_batches import RayTrainData
from ..data.sampler import DistributedBatchSampler
from ..data.streaming import StreamTrainData


class SamplerData:
    def __init__(self, dataloader):
        self.dataloader = dataloader
        self.sampler: DistributedBatchSampler = dataloader.batch_sampler

    def micro_batches_per_epoch(self) -> int:
        return self.sampler.micro_batches_per_epoch()

    def batches(self, epoch: int, offset: int) -> Iterator[Tuple[dict, bool]]:
        self.sampler.set_epoch(epoch, offset)
        for i, batch in enumerate(_iterate(self.dataloader, mid_epoch=offset > 0)):
            yield batch, self.sampler.is_padding(i)

    def offset_after(self, offset: int, micro_done: int) -> int:
        return self.sampler.offset_after(micro_done)  # the sampler counts from the epoch's start offset

    def fraction(self, offset: int) -> float:
        # In micro-batches, as transformers counts an epoch (steps / len(dataloader)): 1 of 34 after the first
        # batch of 8 from 270 rows, not 8/270 (its epoch in the logs differed in the 4th digit).
        batches = math.ceil(offset / self.sampler.global_micro_batch)
        return batches / max(self.sampler.micro_batches_per_epoch(), 1)

    def exhausted(self, offset: int) -> bool:
        return offset >= self.sampler.end_offset()


class LoaderData:
    def __init__(self, dataloader):
        self.dataloader = dataloader
        self.length = len(dataloader)

    def micro_batches_per_epoch(self) -> int:
        return self.length

    def batches(self, epoch: int, offset: int) -> Iterator[Tuple[dict, bool]]:
        # Resume: skip the micro-batches seen, without the skipped collations drawing random numbers.
        batches = _iterate(self.dataloader, mid_epoch=offset > 0)
        with torch.random.fork_rng(devices=[]):
            for _ in islice(batches, offset):
                pass
        for batch in batches:
            yield batch, False

    def offset_after(self, offset: int, micro_done: int) -> int:
        return offset + micro_done

    def fraction(self, offset: int) -> float:
        return offset / max(self.length, 1)

    def exhausted(self, offset: int) -> bool:
        return offset >= self.length


def _iterate(dataloader, mid_epoch: bool) -> Iterator[dict]:
    """The dataloader's iterator. A DataLoader draws its workers' base seed from torch's global random stream
    when an iterator is made, at the start of each epoch, as in transformers' loop: that draw is kept, so
    dropout masks after it are transformers' own in one process. An iterator made in the middle of an epoch
    (a resume) is made without touching the stream: the uninterrupted run drew at the epoch's start, before
    the checkpoint's streams were saved, and a second draw shifted every dropout mask after a resume
    (principle 3: the streams a step uses continue where the checkpoint left them)."""
    if not mid_epoch:
        return iter(dataloader)
    with torch.random.fork_rng(devices=[]):
        return iter(dataloader)


def train_data(dataloader):
    """The interface above for what `get_train_dataloader()` returned."""
    if isinstance(dataloader, (RayTrainData, StreamTrainData)):
        return dataloader
    if isinstance(getattr(dataloader, "batch_sampler", None), DistributedBatchSampler):
        return SamplerData(dataloader)
    return LoaderData(dataloader)

