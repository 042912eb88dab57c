"""Where a steady-state step goes, section by section, on each rank: raytrainer (a) against the hand-written loop
in a bare Ray Train TorchTrainer (g), the same model, data and steps as `overhead.py`.

    python benchmarks/step_breakdown.py                  # 600 steps each, 2 workers: ~1.5 min on 2 cores
    python benchmarks/step_breakdown.py --steps 300 --json /tmp/breakdown.json

Wall time per optimizer step in each section, over the steps after the first --warmup fraction. (g) times its
own sections inline. For (a) the worker wraps raytrainer's functions with timers as it unpickles the trainer
(nothing in raytrainer is changed for it): the sections nest (`training_step` holds the forward, the backward
and the wait for the step's exchange; `_optimizer_step` holds clipping and the optimizer), so they do not add
up; "rest of the step" is the step minus the top-level sections. A wrapper costs about a microsecond a call.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import overhead  # noqa: E402
from common import print_table  # noqa: E402

# (module, attribute path, label, top-level): what (a)'s step is made of.
SECTIONS = (
    ("raytrainer.worker.loop", "TrainLoop._agree", "take the micro-batches' counts, start the exchange", True),
    ("raytrainer.worker.step_sync", "StepSync.start", "  the exchange: start (all-reduce sent)", False),
    ("raytrainer.worker.step_sync", "StepSync.complete", "  the exchange: wait (in the loss, or a read)", False),
    ("raytrainer.worker.loop", "TrainLoop._label_counts", "  label counting", False),
    ("raytrainer.worker.stopping", "StopSignals.stage", "  stop / preemption polling", False),
    ("raytrainer.worker.loop", "TrainLoop._stop_agreed", "read the last exchange's stop flags", True),
    ("raytrainer.worker.loop_events", "LoopEvents.fire", "events (fire: callbacks, emit to the driver)", False),
    ("raytrainer.worker.hooks", "WorkerHooks.training_step", "training_step (forward, backward, exchange wait)", True),
    ("raytrainer.strategy.base", "Strategy.backward", "  backward (with DDP's gradient all-reduce)", False),
    ("raytrainer.worker.meter", "Meter.add_micro", "meter", True),
    ("raytrainer.worker.nonfinite", "NonFiniteGuard.add", "NaN/Inf guard: add", True),
    ("raytrainer.worker.nonfinite", "NonFiniteGuard.end_step", "NaN/Inf guard: end of step", True),
    ("raytrainer.worker.loop", "TrainLoop._optimizer_step", "clip, optimizer step, schedule, zero_grad", True),
    ("raytrainer.strategy.base", "Strategy.clip_grad_norm", "  clip_grad_norm", False),
    ("raytrainer.strategy.base", "Strategy.optimizer_step", "  optimizer step", False),
    ("raytrainer.worker.loop", "TrainLoop._maybe_log_evaluate_save", "log / evaluate / save when due", True),
    ("raytrainer.worker.watchdog", "Watchdog.phase", "watchdog marks", False),
)
TOTALS: dict = {}


def _wrap(module: str, dotted: str) -> bool:
    owner = importlib.import_module(module)
    *path, name = dotted.split(".")
    for part in path:
        owner = getattr(owner, part, None)
    fn = getattr(owner, name, None) if owner is not None else None
    if fn is None or getattr(fn, "_timed", False):
        return fn is not None

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            entry = TOTALS.setdefault(dotted, [0.0, 0])
            entry[0] += time.perf_counter() - t
            entry[1] += 1

    timed._timed = True
    setattr(owner, name, timed)
    return True


def breakdown_trainer_class():
    """overhead.py's timed Trainer, whose worker copy wraps SECTIONS and writes their totals over the steady steps."""
    base = common.make_timed_trainer_class()

    class Breakdown(base):
        def __setstate__(self, state):
            super().__setstate__(state)
            self._b_missing = [d for m, d, _, _ in SECTIONS if not _wrap(m, d)]

        def training_step(self, model, inputs, num_items_in_batch=None):
            state = self.state
            if state.global_step == self._b_from:
                TOTALS.clear()
                self._b_t0 = time.perf_counter()
            loss = super().training_step(model, inputs, num_items_in_batch=num_items_in_batch)
            if state.global_step == state.max_steps - 1:  # the last step: up to its start
                steps = state.global_step - self._b_from
                with open(os.path.join(self.stamp_dir, f"breakdown-{self.ctx.rank}.json"), "w") as f:
                    json.dump({"steps": steps, "elapsed": time.perf_counter() - self._b_t0,
                               "totals": {k: v[0] for k, v in TOTALS.items()},
                               "calls": {k: v[1] for k, v in TOTALS.items()}, "missing": self._b_missing}, f)
            return loss

    return Breakdown


def run_raytrainer(cfg, workdir: str, warmup: float) -> dict:
    cls = breakdown_trainer_class()
    cls._b_from = int(cfg.steps * warmup)
    common.make_timed_trainer_class, original = (lambda: cls), common.make_timed_trainer_class
    try:
        overhead.run_raytrainer(cfg, workdir, 2)
    finally:
        common.make_timed_trainer_class = original
    out = {}
    for root, _, files in os.walk(workdir):
        for name in files:
            if name.startswith("breakdown-"):
                with open(os.path.join(root, name)) as f:
                    out[int(name[len("breakdown-"):-5])] = json.load(f)
    return out


def hand_loop_timed(config: dict, rank: int, world: int, device):
    """overhead.hand_loop with a timer around each section (its own copy: the timers must sit inside the loop)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader
    from torch.utils.data._utils.collate import default_collate

    cfg, warm_from = config["cfg"], int(config["cfg"].steps * config["warmup"])
    torch.set_num_threads(1)
    model = DistributedDataParallel(overhead.build_model(cfg))
    dataset = overhead.build_dataset(cfg)
    sampler = common.ContiguousShardSampler(len(dataset), cfg.batch, rank, world, cfg.seed)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=default_collate)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, common.linear_schedule(cfg.steps))
    totals, step, epoch, t0 = {}, 0, 0, None

    def mark(name, since):
        now = time.perf_counter()
        if step >= warm_from:
            totals[name] = totals.get(name, 0.0) + now - since
        return now

    interval = torch.zeros((), dtype=torch.float64)
    while step < cfg.steps:
        sampler.set_epoch(epoch)
        batches = iter(loader)
        while step < cfg.steps:
            if step == warm_from:
                t0 = time.perf_counter()
            t = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                break
            t = mark("data: batches and collation", t)
            model.train()
            loss = model(**batch)["loss"]
            t = mark("forward", t)
            loss.backward()
            t = mark("backward (with DDP's gradient all-reduce)", t)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            t = mark("clip_grad_norm", t)
            optimizer.step()
            t = mark("optimizer step", t)
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            interval += loss.detach()
            step += 1
            if step % cfg.log_every == 0:
                dist.all_reduce(interval)
                interval.zero_()
            mark("schedule, zero_grad, log", t)
        epoch += 1
    with open(os.path.join(config["dir"], f"hand-{rank}.json"), "w") as f:
        json.dump({"steps": cfg.steps - warm_from, "elapsed": time.perf_counter() - t0, "totals": totals}, f)


def run_hand_in_ray_train(cfg, workdir: str, warmup: float) -> dict:
    out_dir = tempfile.mkdtemp(prefix="hand-", dir=workdir)
    common.run_in_bare_ray_train(hand_loop_timed, {"cfg": cfg, "warmup": warmup, "dir": out_dir}, workdir, 2)
    return {int(n[5:-5]): json.load(open(os.path.join(out_dir, n))) for n in os.listdir(out_dir)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=float, default=0.2)
    parser.add_argument("--json", default=None)
    opts = parser.parse_args(argv)
    cfg = overhead.Config(steps=opts.steps)
    common.ship_by_value()
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cloudpickle.register_pickle_by_value(overhead)
    common.quiet_ray_logs()
    workdir = tempfile.mkdtemp(prefix="raytrainer-bench-breakdown-")
    try:
        common.start_ray()
        print(f"(g) hand loop in a bare TorchTrainer, {cfg.steps} steps ...", flush=True)
        hand = run_hand_in_ray_train(cfg, workdir, opts.warmup)
        print(f"(a) raytrainer, num_workers=2, {cfg.steps} steps ...", flush=True)
        ours = run_raytrainer(cfg, workdir, opts.warmup)
    finally:
        common.stop_ray()
        shutil.rmtree(workdir, ignore_errors=True)
    report(hand, ours, opts)


def _per_step(run: dict, key: str) -> float:
    return 1e3 * run["totals"].get(key, 0.0) / run["steps"]


def report(hand: dict, ours: dict, opts):
    ranks = sorted(ours)
    rows = [["(g) step", *[1e3 * hand[r]["elapsed"] / hand[r]["steps"] for r in ranks], ""]]
    for name in sorted(hand[ranks[0]]["totals"], key=lambda k: -hand[ranks[0]]["totals"][k]):
        rows.append([f"  {name}", *[_per_step(hand[r], name) for r in ranks], ""])
    rows.append(["(a) step", *[1e3 * ours[r]["elapsed"] / ours[r]["steps"] for r in ranks], ""])
    top = 0.0
    for _, dotted, label, top_level in SECTIONS:
        values = [_per_step(ours[r], dotted) for r in ranks]
        calls = ours[ranks[0]]["calls"].get(dotted, 0) / ours[ranks[0]]["steps"]
        rows.append([f"  {label}", *values, f"{calls:.1f}"])
        top += values[0] if top_level else 0.0
    rows.append(["  rest of the step (data, loop)", 1e3 * ours[ranks[0]]["elapsed"] / ours[ranks[0]]["steps"] - top,
                 *[""] * (len(ranks) - 1), ""])
    print_table("ms per optimizer step (steady state)", ["section", *[f"rank {r}" for r in ranks], "calls/step"],
                rows, notes=[f"not found, so not timed: {ours[ranks[0]]['missing']}"] if ours[ranks[0]]["missing"]
                else [])
    common.write_json(opts.json, {"benchmark": "step_breakdown", "hand": hand, "raytrainer": ours,
                                  "machine": common.machine_info()})


if __name__ == "__main__":
    main()
