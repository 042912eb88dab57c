"""Where a worker sits in the run (raytrainer/worker_context.py): in the driver process every collective is the
identity; on a real 2-process gloo group (forked here, as Ray Train sets one up on its workers) the sums, maxima,
gathers and broadcasts the loop relies on are computed over both ranks."""

import multiprocessing
import os

import pytest
import torch
import torch.distributed as dist

from raytrainer.worker_context import WorkerContext
from tests.support import free_port


def test_in_the_driver_process_every_collective_is_the_identity():
    ctx = WorkerContext.in_process(use_gpu=False)
    assert (ctx.rank, ctx.world_size, ctx.device, ctx.is_main, ctx.distributed) == (0, 1, torch.device("cpu"),
                                                                                    True, False)
    tensor = torch.tensor([1.0, 2.0])
    assert ctx.all_reduce_sum(tensor) is tensor and tensor.tolist() == [1.0, 2.0]
    assert ctx.all_reduce_max(tensor) is tensor and ctx.start_all_reduce_sum(tensor) is None
    assert ctx.all_gather_object({"a": 1}) == [{"a": 1}] and ctx.broadcast_object("x") == "x"
    ctx.barrier()


def _rank(rank: int, port: int, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        ctx = WorkerContext(rank=rank, world_size=2, local_rank=rank)
        summed = ctx.all_reduce_sum(torch.tensor([rank + 1.0, 10.0]))
        largest = ctx.all_reduce_max(torch.tensor([float(rank), -float(rank)]))
        started = torch.tensor([rank * 5.0])
        handle = ctx.start_all_reduce_sum(started)
        handle.wait()
        gathered = ctx.all_gather_object({"rank": rank})
        told = ctx.broadcast_object(f"from {rank}", src=1)
        ctx.barrier()
        results.put((rank, ctx.distributed, ctx.is_main, summed.tolist(), largest.tolist(), started.tolist(),
                     gathered, told))
    finally:
        dist.destroy_process_group()


def test_on_two_ranks_the_collectives_combine_both():
    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    port = free_port()
    ranks = [fork.Process(target=_rank, args=(rank, port, results)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    try:
        seen = sorted(results.get(timeout=60) for _ in ranks)
    finally:
        for process in ranks:
            process.join(timeout=30)
    if len(seen) != 2:
        pytest.fail(f"ranks reported {seen}")
    for rank, distributed, is_main, summed, largest, started, gathered, told in seen:
        assert distributed and is_main == (rank == 0)
        assert summed == [3.0, 20.0] and largest == [1.0, 0.0] and started == [5.0]
        assert gathered == [{"rank": 0}, {"rank": 1}] and told == "from 1"
    assert [process.exitcode for process in ranks] == [0, 0]
