"""`ray.data.Dataset` input, worker side: batches from this rank's shard, through the collator, to tensors.

Training (`RayTrainData`): this rank's part of the job's split (`RayDataRef.iterator`) is read in numpy batches of
`per_device_train_batch_size`, once per epoch. The ranks agree at every optimizer step on how many
micro-batches it has: each takes up to `gradient_accumulation_steps` of its own, and the step's one all-reduce
(`worker/step_sync.py`) carries how many ranks have at least k of them (not needed when the row count is known
and the split is equal). A rank with fewer, or whose batch held only padding rows, trains on zero-weight
filler batches so that the collectives stay matched; the epoch ends at the first step that no rank has a
micro-batch for, as if the ranks had agreed at every micro-step. The position in the epoch is the number of
rows consumed over all ranks: a resume at the same world size skips exactly the rows each rank had
consumed (the split is deterministic, see `ray_data.py`); at another world size each rank skips its share
of that count, so the count is kept but not which rows (documented in docs/data.md, "Resume").

Evaluation (`RayEvalLoader`): every rank reads the whole (unsplit) stream and keeps batches
rank, rank + world, ...; `interleave` puts the gathered predictions back in dataset order.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator, List, Optional, Tuple

import numpy as np

from .ray_data import PAD_COLUMN, RayDataRef


def _rows(batch: dict) -> Tuple[List[dict], List[dict]]:
    """A numpy batch as (real rows, padding rows), each row a dict as a map-style dataset gives it."""
    pad = batch.get(PAD_COLUMN)
    columns = [k for k in batch if k != PAD_COLUMN]
    size = len(next(iter(batch.values()))) if batch else 0
    real, padding = [], []
    for i in range(size):
        row = {k: batch[k][i] for k in columns}
        (padding if pad is not None and pad[i] else real).append(row)
    return real, padding


class RayTrainData:
    """The training epochs of a Ray Dataset on this rank, with the interface of `worker/train_data.py`."""

    def __init__(self, ref: RayDataRef, batch_size: int, collate: Callable, ctx, drop_last: bool,
                 prefetch_batches: int = 2):
        self.ref, self.batch_size, self.collate, self.ctx = ref, batch_size, collate, ctx
        self.drop_last = drop_last
        self.prefetch_batches = prefetch_batches
        self.shard = ref.iterator(ctx.rank, ctx.world_size, drop_last)  # every rank at once: rank 0 splits
        self.ran_out = False
        self._slot, self._accumulation = None, 1  # see agree_on_steps
        self._last: Optional[List[dict]] = None  # the rows of this rank's last real batch (for fillers)

    # ---- the epoch's length, when the row count is known (see ray_data.py: an equal, padded split)
    def rows_per_rank(self) -> Optional[int]:
        if self.ref.num_rows is None:
            return None
        n, w = self.ref.num_rows, self.ctx.world_size
        return n // w if self.drop_last else math.ceil(n / w)

    def micro_batches_per_epoch(self) -> Optional[int]:
        rows = self.rows_per_rank()
        if rows is None:
            return None
        return rows // self.batch_size if self.drop_last else math.ceil(rows / self.batch_size)

    def end_offset(self) -> Optional[int]:
        rows = self.rows_per_rank()
        return None if rows is None else rows * self.ctx.world_size

    # ---- the loop's interface
    def offset_after(self, offset: int, micro_done: int) -> int:
        return offset + micro_done * self.batch_size * self.ctx.world_size

    def fraction(self, offset: int) -> float:
        end = self.end_offset()
        return min(offset / end, 1.0) if end else 0.0

    def exhausted(self, offset: int) -> bool:
        end = self.end_offset()
        return self.ran_out if end is None else offset >= end

    def batches(self, epoch: int, offset: int) -> Iterator[Tuple[dict, bool]]:
        """(batch, is_filler) for each micro-step of the epoch that this rank has rows for, from `offset` rows
        consumed over all ranks. No collective: with agreement (`agree_on_steps`) the loop completes each
        step's micro-batches with `agreed`."""
        self.ran_out = False
        self._last = None
        for real, padding in self._row_batches(skip=offset // self.ctx.world_size):
            if real:
                self._last = real
                yield self.collate(real), False
            else:  # only padding rows: a zero-weight batch keeps the collectives matched
                yield self.collate(padding), True
        if self._slot is None:  # alone, or an equal split: every rank runs out at the same micro-step
            self.ran_out = True

    def agree_on_steps(self, sync, accumulation: int) -> bool:
        """Ray Data of unknown length on several ranks: register the has-data slot in the step's exchange
        (`worker/step_sync.StepSync`); True if the loop must call `stage` and `agreed` around it. A known row
        count means an equal split: every rank runs out at the same micro-step, no need to ask."""
        if not self.ctx.distributed or self.ref.num_rows is not None:
            return False
        self._slot, self._accumulation = sync.slot(accumulation), accumulation
        return True

    def stage(self, group: list) -> None:
        """Before the exchange: this rank has len(group) micro-batches for the step (one in each of the
        first len(group) counters: the sums are how many ranks have at least k)."""
        self._slot.put(*([1] * len(group)))

    def agreed(self, group: list) -> list:
        """After the exchange: the step's micro-batches, as many as the rank with the most has (none: the
        epoch ran out), this rank's completed with zero-weight fillers. Fewer than a full accumulation also
        means that no rank has more: the epoch's data ran out with this step."""
        steps = sum(1 for ranks in self._slot.totals if ranks > 0)
        self.ran_out = steps < self._accumulation
        return group + [(self.collate((self._last or self.ref.sample)[:1]), True)
                        for _ in range(steps - len(group))]

    def _row_batches(self, skip: int) -> Iterator[Tuple[List[dict], List[dict]]]:
        for batch in self.shard.iter_batches(batch_size=self.batch_size, batch_format="numpy",
                                             drop_last=self.drop_last, prefetch_batches=self.prefetch_batches):
            size = len(next(iter(batch.values())))
            if skip >= size:
                skip -= size
                continue
            if skip:
                batch = {k: v[skip:] for k, v in batch.items()}
                skip = 0
            yield _rows(batch)


class InterleavedEval:
    """Every world-size-th batch of the whole stream, starting at this rank's; see `interleave`. A subclass gives
    the stream's batches as lists of rows (`_batches`) and the rows of a filler pass's batch (`_filler_rows`):
    a Ray Dataset here, an iterable dataset in data/streaming.py."""

    def __init__(self, batch_size: int, collate: Callable, rank: int, world_size: int):
        self.batch_size, self.collate = batch_size, collate
        self.rank, self.world_size = rank, world_size
        self.total_batches = 0
        self.sizes: List[int] = []  # rows of each batch this rank took, in order

    def _batches(self) -> Iterator[List[Any]]:
        raise NotImplementedError

    def _filler_rows(self) -> List[Any]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[dict]:
        self.total_batches, self.sizes = 0, []
        for index, rows in enumerate(self._batches()):
            self.total_batches = index + 1
            if index % self.world_size != self.rank:
                continue
            self.sizes.append(len(rows))
            yield self.collate(rows)

    def passes_behind(self) -> int:
        """After iterating: how many forward passes fewer than rank 0 this rank ran (sharded models need
        every rank to run as many)."""
        return math.ceil(self.total_batches / self.world_size) - len(self.sizes)

    def filler_batch(self) -> dict:
        return self.collate(self._filler_rows())


class RayEvalLoader(InterleavedEval):
    def __init__(self, ref: RayDataRef, batch_size: int, collate: Callable, rank: int, world_size: int):
        super().__init__(batch_size, collate, rank, world_size)
        self.ref = ref

    def _batches(self) -> Iterator[List[Any]]:
        for batch in self.ref.iterator().iter_batches(batch_size=self.batch_size, batch_format="numpy"):
            yield _rows(batch)[0]  # without the padding rows

    def _filler_rows(self) -> List[Any]:
        return self.ref.sample[:1]


def interleave(parts: List[Any], sizes: List[List[int]], concat: Callable[[List[Any]], Any]) -> Any:
    """Per-rank concatenated outputs (rank r holds batches r, r + world, ...) back in batch order."""
    if all(p is None for p in parts):
        return None
    pieces = []  # (batch index, rows) of every rank
    for rank, (part, rank_sizes) in enumerate(zip(parts, sizes)):
        start = 0
        for k, size in enumerate(rank_sizes):
            pieces.append((rank + k * len(parts), _slice(part, start, start + size)))
            start += size
    pieces.sort(key=lambda item: item[0])
    return concat([piece for _, piece in pieces])


def _slice(value: Any, start: int, stop: int) -> Any:
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        return type(value)(_slice(v, start, stop) for v in value)
    return value[start:stop] if isinstance(value, np.ndarray) and value.ndim > 0 else value
