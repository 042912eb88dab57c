"""The one collective of an optimizer step: every value the ranks must agree on before the step's first
forward travels in a single all-reduce (SUM) of a few int64s.

Each component registers its slot once, in the same order on every rank, stages its local value before the
exchange and reads the sum after it:

    stop / preempt flags   worker/stopping.py       one bit per rank (preempting ranks, interrupting ranks):
                                                    distinct bits sum to their OR, so every rank learns who asked
    has-data counts        data/ray_batches.py      Ray Data of unknown length only: how many ranks have at
                                                    least k micro-batches for the step, k = 1..accumulation
    label items            worker/loop.py           num_items_in_batch of the global batch (and whether any
                                                    rank's labels cannot be counted)
    input tokens           worker/loop.py           include_num_input_tokens_seen

The loop calls `exchange()` once per optimizer step, after taking the step's micro-batches and before
on_step_begin (worker/loop.py). Flags raised at the end of step s are read there, at the start of step s+1,
before anything of s+1 runs, so every rank acts at step s, as if they had been read at its end. Without a
process group the exchange is the identity and no collective runs.
"""

from __future__ import annotations

from typing import List

import torch


class Slot:
    """`size` int64s of the exchange: `put` this rank's values before it, read `totals` (over ranks) after."""

    def __init__(self, sync: "StepSync", start: int, size: int):
        self.sync, self.start, self.size = sync, start, size

    def put(self, *values: int) -> None:
        """This rank's values for the next exchange (a slot left unset sends zeros)."""
        if len(values) > self.size:
            raise ValueError(f"{len(values)} values for a slot of {self.size}")
        self.sync._local[self.start:self.start + len(values)] = [int(v) for v in values]

    @property
    def totals(self) -> List[int]:
        return self.sync._totals[self.start:self.start + self.size]

    @property
    def total(self) -> int:
        return self.totals[0]


class StepSync:
    def __init__(self, ctx):
        self.ctx = ctx
        self._local: List[int] = []
        self._totals: List[int] = []
        self.exchanges = 0  # how many have run: tests count one per optimizer step

    def slot(self, size: int = 1) -> Slot:
        """Register `size` int64s; every rank registers the same slots in the same order."""
        slot = Slot(self, len(self._local), size)
        self._local.extend([0] * size)
        self._totals.extend([0] * size)
        return slot

    def exchange(self) -> None:
        """Collective (every rank, same point of the loop): sum the staged values over ranks, then reset them."""
        if self.ctx.distributed and self._local:
            summed = torch.tensor(self._local, dtype=torch.int64, device=self.ctx.device)
            self._totals = self.ctx.all_reduce_sum(summed).tolist()
        else:
            self._totals = list(self._local)
        self._local = [0] * len(self._local)
        self.exchanges += 1


def rank_bits(world_size: int) -> int:
    """int64 words for one bit per rank (62 bits a word: a sum of distinct bits never reaches the sign)."""
    return max(1, -(-world_size // BITS))


BITS = 62


def set_rank_bit(words: List[int], rank: int) -> None:
    words[rank // BITS] |= 1 << (rank % BITS)


def ranks_in(words: List[int]) -> List[int]:
    return [w * BITS + b for w, word in enumerate(words) for b in range(BITS) if word >> b & 1]
