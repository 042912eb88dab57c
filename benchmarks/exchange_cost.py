"""What the step's exchange (raytrainer/worker/step_sync.py) costs a DDP step on gloo, and what folding it into
DDP's gradient all-reduce would cost instead: two processes, overhead.py's MLP and batch, forward + backward only.

    python benchmarks/exchange_cost.py                  # 8 rounds of 60 steps per variant: ~1.5 min on 2 cores
    python benchmarks/exchange_cost.py --rounds 16 --json /tmp/exchange.json

Variants, each a DistributedDataParallel of the same module on the same gloo group (one torch thread a process):
  builtin     DDP as the hand-written loop runs it: forward, backward (C++ all-reduce of the gradient buckets)
  exchange    + raytrainer's exchange: an all-reduce of 12 int64s started before the forward, waited after it
  waited      + the same all-reduce waited for at once, before the forward
  gather      + the same values exchanged by all_gather instead (summed locally)
  pyhook      DDP with torch's default all-reduce registered as a Python comm hook (what any comm hook costs)
  carried     a Python comm hook that appends the 12 values (as float32) to the last bucket: no exchange of its own
  carried0    the same on the first bucket all-reduced (DDP keeps it small, 1 MB: less to copy than the last)

The variants run in blocks of --steps steps (the first --warmup of each block dropped), one block of each per
round, so that the host's drift spreads over all of them alike; each variant's figure is the median step over
its blocks, and its ratio is against builtin's from the same run. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import overhead  # noqa: E402

VALUES = 12  # about what the exchange carries: stop flags, label items, input tokens, has-data counts
VARIANTS = ("builtin", "exchange", "waited", "gather", "pyhook", "carried", "carried0")


class Carry:
    """A comm hook that sends `payload` with one bucket of the backward (the last, or the first all-reduced) and
    keeps the summed values."""

    def __init__(self, first: bool = False):
        self.payload, self.sums, self.first = None, None, first

    def hook(self, process_group, bucket):  # no annotations: DDP checks them against its own, not as strings
        if self.payload is None or not (bucket.index() == 0 if self.first else bucket.is_last()):
            return allreduce_hook(process_group, bucket)
        payload, self.payload = self.payload, None
        gradients = bucket.buffer().div_(dist.get_world_size())
        size = gradients.numel()

        def split(future):
            summed = future.value()[0]
            self.sums = summed[size:]
            return summed[:size]

        return dist.all_reduce(torch.cat([gradients, payload]), async_op=True).get_future().then(split)


def _worker(rank: int, world: int, port: int, opts, out_path: str):
    with overhead.gloo_group(rank, world, port):
        _measure(rank, world, opts, out_path)


def _measure(rank: int, world: int, opts, out_path: str):
    cfg = overhead.Config()
    module = overhead.build_model(cfg)
    models = {name: torch.nn.parallel.DistributedDataParallel(module) for name in VARIANTS}
    models["pyhook"].register_comm_hook(None, allreduce_hook)
    carries = {"carried": Carry(), "carried0": Carry(first=True)}
    for name, carry in carries.items():
        models[name].register_comm_hook(None, carry.hook)
    x = torch.randn(cfg.batch, cfg.dim)
    y = torch.randint(0, cfg.num_classes, (cfg.batch,))
    gathered = torch.zeros(world * VALUES, dtype=torch.int64)

    def step(name: str):
        work = None
        if name == "waited":
            dist.all_reduce(torch.ones(VALUES, dtype=torch.int64))
        elif name == "exchange":
            work = dist.all_reduce(torch.ones(VALUES, dtype=torch.int64), async_op=True)
        elif name == "gather":
            work = dist.all_gather_single(gathered, torch.ones(VALUES, dtype=torch.int64), async_op=True)
        elif name in carries:
            carries[name].payload, carries[name].sums = torch.ones(VALUES), None
        out = models[name](x=x)["logits"]
        if work is not None:  # where the loss would use the label items
            work.wait()
            if name == "gather":
                gathered.view(world, VALUES).sum(0)
        torch.nn.functional.cross_entropy(out, y).backward()
        if name in carries:  # the values came back with the gradients, summed over the ranks
            sums = carries[name].sums
            if sums is None or sums.tolist() != [float(world)] * VALUES:
                raise RuntimeError(f"{name}: the gradient all-reduce brought back {sums}, not {world} x {VALUES}")
        for p in module.parameters():
            p.grad = None

    times = {name: [] for name in VARIANTS}
    for _ in range(opts.rounds):
        for name in VARIANTS:
            for i in range(opts.steps):
                start = time.perf_counter()
                step(name)
                if i >= opts.warmup:
                    times[name].append(time.perf_counter() - start)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(times, f)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60, help="steps per block")
    parser.add_argument("--warmup", type=int, default=10, help="steps dropped at the start of each block")
    parser.add_argument("--json", default=None)
    opts = parser.parse_args(argv)
    out_path = os.path.join(tempfile.mkdtemp(prefix="exchange-"), "times.json")
    load = os.getloadavg()[0]
    mp.spawn(_worker, args=(2, overhead._free_port(), opts, out_path), nprocs=2)
    with open(out_path) as f:
        times = json.load(f)
    medians = {name: 1e3 * statistics.median(values) for name, values in times.items()}
    base = medians["builtin"]
    rows = [[name, f"{medians[name]:.2f}", f"{medians[name] - base:+.2f}", f"{medians[name] / base:.3f}"]
            for name in VARIANTS]
    common.print_table(f"forward + backward, 2 gloo processes, {opts.rounds} rounds x {opts.steps - opts.warmup} "
                       f"steps per variant (load {load:.1f} at the start)",
                       ["variant", "median ms", "vs builtin ms", "ratio"], rows)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"benchmark": "exchange_cost", "load": load, "median_ms": medians,
                       "ratio": {k: v / base for k, v in medians.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
