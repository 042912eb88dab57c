"""Iterable datasets (streams) as training and evaluation data: a `datasets.IterableDataset`
(`load_dataset(..., streaming=True)`, `Dataset.to_iterable_dataset()`) or a torch `IterableDataset`.

Training (`StreamTrainData`): every rank iterates the whole stream in the same order, cuts it into global
micro-batches of `per_device_train_batch_size x world_size` rows, and keeps its contiguous slice of each, the
rule of the map-style sampler (data/sampler.py) on the stream's own order. So:

- the global batch does not depend on the world size (2 workers x 4 rows and 1 worker x 8 see the same rows);
- the position is a global sample offset (rows read since the pass began), and a resume skips that many rows
  from the start of the pass: exact at any world size, for any stream that gives the same rows in the same
  order when iterated again (a `datasets` shuffle with its seed, reseeded per pass by `set_epoch`, does);
- every rank sees the same end of the stream at the same micro-step: no collective is needed to agree on it.
  The last, short global micro-batch is split as evenly as possible in rank order; a rank left without a row
  trains on a zero-weight filler (its first row again), so the collectives stay matched.

The price: every rank reads (and decodes) the whole stream, and a resume reads the pass again up to the
position. The alternative, `datasets.distributed.split_dataset_by_node` (each rank reads only its shards) with
`IterableDataset.state_dict()` for resume, reads less, but a resume is exact only at the same world size
(another one splits the shards differently), and its shuffle buffer is not restored (datasets says so): a
resumed run would train on other rows than the uninterrupted one. Exactness wins here (principle 3);
docs/data.md says what this costs.

A new pass starts when the stream ends (with max_steps): the epoch index goes up and `set_epoch(epoch)` is
called on the dataset, as transformers does (datasets' shuffle reseeds with it).

Evaluation (`StreamEvalLoader`): every rank reads the whole stream in batches of `per_device_eval_batch_size`
and keeps every world-size-th batch, as for a Ray Dataset; `ray_batches.interleave` puts the gathered
predictions back in stream order.
"""

from __future__ import annotations

import math
import sys
from itertools import islice
from typing import Any, Callable, Iterator, List, Optional, Tuple

import torch

from .ray_batches import InterleavedEval
from .sampler import epoch_end, rank_share

SKIP_MARK = 10_000  # rows between two progress marks while a resume skips rows


def is_stream(dataset: Any) -> bool:
    """An iterable dataset: torch's `IterableDataset`, or `datasets.IterableDataset` (a torch one once made,
    but asked by its own class too: datasets adds torch's base class to it only at construction)."""
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return True
    datasets = sys.modules.get("datasets")  # imported already if the user made one: asking imports nothing
    return datasets is not None and isinstance(dataset, datasets.IterableDataset)


def stream_length(dataset: Any) -> Optional[int]:
    """len() of a stream that has one (a torch IterableDataset may define __len__), else None."""
    try:
        return len(dataset)
    except (TypeError, NotImplementedError):
        return None


def first_rows(dataset: Any, count: int) -> List[Any]:
    """The stream's first rows (the driver's loss check), without drawing from torch's random stream."""
    with torch.random.fork_rng(devices=[]):
        return list(islice(iter(dataset), count))


class StreamTrainData:
    """This rank's micro-batches of a stream, with the interface of `worker/train_data.py`."""

    def __init__(self, dataset: Any, batch_size: int, collate: Callable, rank: int, world_size: int,
                 drop_last: bool = False, progress: Callable[[str], None] = lambda phase: None,
                 epoch_micro_batches: Optional[int] = None):
        """`progress(phase)`: told while a resume skips rows (the worker's watchdog: a long skip is progress).
        `epoch_micro_batches`: what a pass of unknown length counts as in TrainerState.epoch; transformers
        counts max_steps x gradient_accumulation_steps micro-batches."""
        self.dataset, self.batch_size, self.collate = dataset, batch_size, collate
        self.rank, self.world_size, self.drop_last = rank, world_size, drop_last
        self.progress, self.epoch_micro_batches = progress, epoch_micro_batches
        self.length = stream_length(dataset)  # None: the pass ends when the stream does (max_steps is set)
        self.ran_out = False  # this pass's stream has ended
        self.end: Optional[int] = None  # the pass's last trained offset, once its end was read

    @property
    def global_micro_batch(self) -> int:
        return self.batch_size * self.world_size

    def end_offset(self) -> Optional[int]:
        return None if self.length is None else epoch_end(self.length, self.global_micro_batch, self.drop_last)

    # ---- the loop's interface
    def micro_batches_per_epoch(self) -> Optional[int]:
        end = self.end_offset()
        return None if end is None else math.ceil(end / self.global_micro_batch)

    def offset_after(self, offset: int, micro_done: int) -> int:
        after = offset + micro_done * self.global_micro_batch
        return after if self.end is None else min(after, self.end)

    def fraction(self, offset: int) -> float:
        """In micro-batches, as transformers counts an epoch (the short last one counts as one)."""
        per_epoch = self.micro_batches_per_epoch() or self.epoch_micro_batches
        done = math.ceil(offset / self.global_micro_batch)
        return min(done / per_epoch, 1.0) if per_epoch else 0.0

    def exhausted(self, offset: int) -> bool:
        end = self.end_offset()
        return self.ran_out or (end is not None and offset >= end)

    def batches(self, epoch: int, offset: int) -> Iterator[Tuple[dict, bool]]:
        """(batch, is_filler) for each micro-step of pass `epoch`, from `offset` rows read over all ranks."""
        self.ran_out, self.end = False, None
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        rows = iter(self.dataset)
        skipped = self._skip(rows, offset)
        position = offset
        if skipped < offset:  # the stream is shorter than the position: the pass had ended there
            self.ran_out, self.end = True, skipped
            return
        while True:
            chunk = list(islice(rows, self.global_micro_batch))
            short = len(chunk) < self.global_micro_batch
            if short:  # the stream's end: known to every rank at the same micro-step (each reads all of it)
                self.ran_out = True
                self.end = position if self.drop_last or not chunk else position + len(chunk)
                if self.drop_last or not chunk:
                    return
            start, stop = rank_share(len(chunk), self.batch_size, self.rank, self.world_size)
            mine = chunk[start:stop]
            position += len(chunk)
            yield (self.collate(mine), False) if mine else (self.collate(chunk[:1]), True)
            if short:
                return

    def _skip(self, rows: Iterator, count: int) -> int:
        """Resume: read past the rows trained on; how many there were. A stream that draws from torch's random
        stream as it is read does not draw for them: the checkpoint's random streams hold what they drew."""
        skipped = 0
        with torch.random.fork_rng(devices=[]):
            while skipped < count:
                read = sum(1 for _ in islice(rows, min(SKIP_MARK, count - skipped)))
                skipped += read
                self.progress(f"skipping the stream's rows to the checkpoint's position ({skipped} of {count})")
                if read == 0:
                    break
        return skipped


class StreamEvalLoader(InterleavedEval):
    """Every world-size-th batch of the whole stream, starting at this rank's (`ray_batches.InterleavedEval`)."""

    def __init__(self, dataset: Any, batch_size: int, collate: Callable, rank: int, world_size: int):
        super().__init__(batch_size, collate, rank, world_size)
        self.dataset = dataset
        self._first: List[Any] = []  # the stream's first row: a filler pass's batch

    def _batches(self) -> Iterator[List[Any]]:
        rows = iter(self.dataset)
        while True:
            chunk = list(islice(rows, self.batch_size))
            if not chunk:
                return
            self._first = self._first or chunk[:1]
            yield chunk

    def _filler_rows(self) -> List[Any]:
        return self._first or first_rows(self.dataset, 1)
