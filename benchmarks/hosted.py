"""The hosted mode's cost: one TRL SFT script under torchrun and under `raytrainer launch`, 2 processes each.

    python benchmarks/hosted.py                 # ~3 min on 2 cores
    python benchmarks/hosted.py --steps 200 --rounds 2 --json /tmp/hosted.json

The script (benchmarks/hosted_sft.py) stamps, on rank 0, its own start (before its imports), train begin and
every step end. Reported, for each launcher and round:
  steady step    the median step time over the steps after the first 20% (the same code runs in both:
                 HF's loop, DDP over gloo; the difference is what hosting adds per step: the relay callback)
  start-up       torchrun: launch -> script start (processes), script start -> train begin (imports, model,
                 data), train begin -> first step end; launch: Ray's start (first round only), the call ->
                 script start (worker group start and the job's dispatch: a new group the first time, the
                 warm one after), then the script's own phases as for torchrun
Ratio (reported, not asserted): hosted / torchrun steady step, target <= 1.05.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import common

sys.path.insert(0, common.REPO_ROOT)
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hosted_sft.py")


def phases(stamps: dict, called: float) -> dict:
    steps = stamps["steps"]
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    steady = gaps[len(gaps) // 5:]
    return {"to_script_s": stamps["started"] - called, "script_s": stamps["train_begin"] - stamps["started"],
            "first_step_s": steps[0] - stamps["train_begin"], "steady_step_ms": 1000 * statistics.median(steady),
            "steps": len(steps)}


def run_torchrun(steps: int, root: str) -> dict:
    stamps = os.path.join(root, "torchrun.json")
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    called = time.time()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", SCRIPT,
                    "--output_dir", os.path.join(root, "torchrun"), "--max_steps", str(steps), "--stamps", stamps],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(stamps) as f:
        return {**phases(json.load(f), called), "call_s": time.time() - called}


def run_launch(steps: int, root: str, tag: str) -> dict:
    import raytrainer

    stamps = os.path.join(root, f"{tag}.json")
    called = time.time()
    raytrainer.launch(SCRIPT, ["--output_dir", os.path.join(root, tag), "--max_steps", str(steps),
                               "--stamps", stamps], num_workers=2, disable_tqdm=True, resume=False)
    with open(stamps) as f:
        return {**phases(json.load(f), called), "call_s": time.time() - called}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json")
    options = parser.parse_args()
    rows, ratios = [], []
    with tempfile.TemporaryDirectory() as root:
        ray_s = None
        for round_ in range(options.rounds):
            torchrun = run_torchrun(options.steps, root)
            if ray_s is None:
                t0 = time.time()
                from raytrainer.coordinator import cluster

                cluster.connect()
                ray_s = time.time() - t0
            hosted = run_launch(options.steps, root, f"launch-{round_}")
            ratios.append(hosted["steady_step_ms"] / torchrun["steady_step_ms"])
            for name, figures in (("torchrun", torchrun), (f"raytrainer launch ({'new' if round_ == 0 else 'warm'}"
                                                            " group)", hosted)):
                rows.append([round_, name, common.fmt(figures["steady_step_ms"]), common.fmt(figures["to_script_s"]),
                             common.fmt(figures["script_s"]), common.fmt(figures["first_step_s"]),
                             common.fmt(figures["call_s"])])
    common.print_table(f"Hosted SFT, 2 processes, {options.steps} steps (Ray start: {ray_s:.1f} s, once)",
                       ["round", "launcher", "steady_step_ms", "to_script_s", "script_s", "first_step_s", "call_s"],
                       rows, notes=[f"hosted / torchrun steady step, per round: "
                                    f"{', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}"
                                    " (target <= 1.05)"])
    common.write_json(options.json, {"machine": common.machine_info(), "rows": rows, "ratios": ratios,
                                     "ray_start_s": ray_s})


if __name__ == "__main__":
    main()
