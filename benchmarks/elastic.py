"""Elastic resize latency on the local multi-node cluster (cluster/local_cluster.py).

    python benchmarks/elastic.py [--monitor-s 2] [--start-timeout-s 10] [--json PATH]

A head without CPUs and two 1-CPU worker nodes; a `num_workers=(1, 2)` run (tiny model, ~0.1 s steps,
a checkpoint every 10 steps). Once it trains with 2 workers, one worker node is killed (SIGKILL to its
process group); once it trains with 1, a node is added back; once it trains with 2 again, the driver gets
Ctrl-C (it saves and stops). Reported, per transition:

- loss -> first step of the smaller group, and node registered -> first step of the larger group;
- split: Ray Train's part (until our worker function starts on the new group: node-loss detection,
  failure handling, the elastic monitor, placement, worker processes and the process group) and ours
  (worker function start -> first step: rebuild the trainer, model, optimizer, load the checkpoint,
  the first step itself).

Times come from one clock (every process is on this machine): the orchestrator's, and the events the
workers send (a driver callback that listens to on_step_end makes rank 0 send each step at once).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "cluster"))


def driver(work: str, monitor_s: float):
    """The training run: writes every train_begin and step_end it sees to WORK/events.jsonl."""
    from raytrainer import Trainer, TrainerCallback, TrainingArguments
    from tests.models import TokenData, make_model

    log = open(os.path.join(work, "events.jsonl"), "a", buffering=1)

    class Timeline(TrainerCallback):  # steers nothing, but listening to step ends makes each one urgent
        def on_train_begin(self, args, state, control, world_size=None, setup_s=None, **kw):
            log.write(json.dumps({"event": "train_begin", "time": time.time(), "world": world_size,
                                  "setup_s": setup_s, "step": state.global_step}) + "\n")

        def on_step_end(self, args, state, control, **kw):
            log.write(json.dumps({"event": "step", "time": time.time(), "step": state.global_step}) + "\n")

    class Slow(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            time.sleep(0.1)
            return super().training_step(model, inputs, num_items_in_batch)

    args = TrainingArguments(output_dir=os.path.join(work, "run"), num_workers=(1, 2), per_device_train_batch_size=4,
                             max_steps=2000, save_steps=10, logging_steps=50, disable_tqdm=True, max_failures=-1,
                             elastic_resize_monitor_interval_s=monitor_s, allow_local_output_dir_on_multinode=True)
    trainer = Slow(model=make_model(), args=args, train_dataset=TokenData(4000), callbacks=[Timeline()])
    try:
        trainer.train()
    except KeyboardInterrupt:
        pass


def _events(work):
    path = os.path.join(work, "events.jsonl")
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def _wait_world(work, world, steps, proc, since=0.0, timeout_s=300):
    """Block until `steps` steps ran on a group of `world` workers that began after `since`."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the driver exited early")
        current, count = None, 0
        for e in _events(work):
            if e["event"] == "train_begin":
                current, count = (e if e["world"] == world and e["time"] > since else None), 0
            elif current is not None:
                count += 1
        if current is not None and count >= steps:
            return
        time.sleep(0.2)
    raise TimeoutError(f"no group of {world} workers trained {steps} steps in {timeout_s} s")


def _transition(work, world, since):
    """From `since` to the first step of the next group of `world` workers, and its split."""
    events = _events(work)
    for i, e in enumerate(events):
        if e["event"] == "train_begin" and e["world"] == world and e["time"] > since:
            first = next(x for x in events[i + 1:] if x["event"] == "step")
            entered = e["time"] - e["setup_s"]
            return {"total_s": first["time"] - since, "ray_train_s": entered - since,
                    "ours_s": first["time"] - entered, "setup_s": e["setup_s"], "resumed_at_step": e["step"]}
    raise RuntimeError(f"no group of {world} workers after {since}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--monitor-s", type=float, default=2.0, help="elastic_resize_monitor_interval_s")
    parser.add_argument("--start-timeout-s", type=float, default=None,
                        help="RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S for the run (Ray Train's default: 60)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--driver", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.driver:
        return driver(opts.driver, opts.monitor_s)

    from local_cluster import LocalCluster

    work = tempfile.mkdtemp(prefix="rt-elastic-bench-")
    cluster = LocalCluster(os.path.join(work, "cluster"))
    proc = None
    try:
        cluster.start(workers=2, head_cpus=0, worker_cpus=1, timeout_s=180)
        env = {**os.environ, "RAY_ADDRESS": cluster.address, "RAY_AUTH_MODE": "token", "PYTHONPATH": ROOT}
        if opts.start_timeout_s is not None:  # Ray Train propagates it from the driver to its controller
            env["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(opts.start_timeout_s)
        proc = subprocess.Popen([sys.executable, __file__, "--driver", work, "--monitor-s", str(opts.monitor_s)],
                                cwd=ROOT, env=env, stdout=open(os.path.join(work, "driver.log"), "w"),
                                stderr=subprocess.STDOUT)
        _wait_world(work, 2, 15, proc)
        lost = time.time()
        cluster.remove(1)
        _wait_world(work, 1, 15, proc, since=lost)
        cluster.add(cpus=1)  # returns once the head lists the node as alive
        back = time.time()
        _wait_world(work, 2, 5, proc, since=back)
        figures = {"node_lost": _transition(work, 1, lost), "node_back": _transition(work, 2, back),
                   "monitor_interval_s": opts.monitor_s, "start_timeout_s": opts.start_timeout_s}
        proc.send_signal(signal.SIGINT)  # the run saves and stops
        proc.wait(timeout=120)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        cluster.stop()
    print(f"{'transition':<12} {'total s':>8} {'Ray Train s':>12} {'ours s':>8} {'(setup s)':>10}")
    for name in ("node_lost", "node_back"):
        f = figures[name]
        print(f"{name:<12} {f['total_s']:8.1f} {f['ray_train_s']:12.1f} {f['ours_s']:8.2f} {f['setup_s']:10.2f}")
    print(f"driver log and events: {work}")
    if opts.json:
        with open(opts.json, "w") as out:
            json.dump(figures, out, indent=2)


if __name__ == "__main__":
    main()
