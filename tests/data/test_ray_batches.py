"""A Ray Data shard as this rank's batches (raytrainer/data/ray_batches.py): with an unknown row count the ranks
agree on each step's micro-batches in the step's one exchange. No Ray: a fake shard and the fake context of
tests/worker/test_step_sync.py."""

from __future__ import annotations

import numpy as np

from raytrainer.data.ray_batches import RayTrainData
from raytrainer.worker.step_sync import StepSync
from tests.worker.test_step_sync import FakeCtx


class FakeShard:
    def __init__(self, rows):
        self.rows = rows

    def iter_batches(self, batch_size, batch_format, drop_last, prefetch_batches):
        for i in range(0, len(self.rows), batch_size):
            yield {"x": np.array(self.rows[i:i + batch_size])}


class FakeRef:
    num_rows = None  # unknown: the ranks agree on each step's micro-batches
    sample = [{"x": -1}]

    def __init__(self, rows):
        self.rows = rows

    def iterator(self, rank=0, world_size=1, drop_last=False):
        return FakeShard(self.rows)


def test_ray_data_ranks_agree_on_each_steps_micro_batches_in_the_exchange():
    """This rank has 3 micro-batches, the other 6: with accumulation 4, steps of 4 and 2 (this rank's
    completed with fillers of its last rows), then the epoch ends; one all-reduce per step."""
    ctx = FakeCtx()
    sync = StepSync(ctx)
    data = RayTrainData(FakeRef([1, 2, 3]), batch_size=1, collate=lambda rows: [int(r["x"]) for r in rows],
                        ctx=ctx, drop_last=False)
    assert data.agree_on_steps(sync, 4)
    batches = data.batches(0, 0)
    steps = []
    for other in ([1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]):
        ctx.others = [other]
        group = [next(batches, None) for _ in range(4)]
        group = [g for g in group if g is not None]
        data.stage(group)
        sync.exchange()
        steps.append((data.agreed(group), data.ran_out))
    assert steps == [([([1], False), ([2], False), ([3], False), ([3], True)], False),
                     ([([3], True), ([3], True)], True), ([], True)]
    assert ctx.calls == 3
