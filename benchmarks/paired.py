"""raytrainer's loop against the hand-written loop on the same warm worker group, in short alternating blocks.

    python benchmarks/paired.py                          # 24 pairs of 300 steps: ~9 min on 2 cores
    python benchmarks/paired.py --pairs 8 --json /tmp/paired.json

Why: on a 2-vCPU virtual machine the host's speed drifts by 10-30 % within a minute (the same hand loop took
26.8 and 34.3 ms a step 20 s apart), which is more than the few percent `overhead.py --variants ga` wants to
resolve from 3 rounds a few minutes apart. Here both loops run on one worker group (the pool's, so no group
starts between blocks), one block of each per pair, in alternating order (h a, a h, h a, ...), and each pair's
ratio compares blocks about 10 s apart; the figure is the median over many pairs.

  a  raytrainer: `Trainer(...).train()` with 2 workers (overhead.py's variant a)
  h  overhead.py's hand loop (DDP over gloo, the same model, data and optimizer), run on the same workers by
     `raytrainer.launch("hand_loop_script.py")`: the processes, Ray Train's worker group and the process group
     are the same ones, so what differs is raytrainer's loop alone. (A hand loop run this way measured 0-4 %
     slower than in a bare TorchTrainer, overhead.py's (g), on 2026-11-26: a/h may read that much below a/g.)

Step time is the median of rank 0's step durations after the warm-up fraction, as in overhead.py. Ratios are
reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import overhead  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hand_loop_script.py")


def run_hand_on_group(cfg: overhead.Config, workdir: str, block: int) -> float:
    import raytrainer

    path = os.path.join(workdir, f"hand-{block}.json")
    raytrainer.launch(SCRIPT, [path, str(cfg.steps)], num_workers=2, disable_tqdm=True)
    return common.step_stats(common.read_stamps(path)["perf"], cfg.warmup)["median_ms"]


def run_ours_on_group(cfg: overhead.Config, workdir: str) -> float:
    return overhead.run_raytrainer(cfg, workdir, 2, keep_group=True)["median_ms"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="steps per block (default 300: ~10 s here)")
    parser.add_argument("--pairs", type=int, default=24, help="pairs of blocks (default 24)")
    parser.add_argument("--json", help="write the per-block figures here")
    opts = parser.parse_args(argv)
    cfg = overhead.Config(steps=opts.steps)
    common.quiet_ray_logs()
    common.start_ray()
    workdir = tempfile.mkdtemp(prefix="raytrainer-bench-paired-")
    blocks = {"a": [], "h": []}
    try:
        for pair in range(opts.pairs):
            for kind in ("h", "a") if pair % 2 == 0 else ("a", "h"):
                started = time.time()
                ms = run_hand_on_group(cfg, workdir, pair) if kind == "h" else run_ours_on_group(cfg, workdir)
                blocks[kind].append(ms)
                print(f"[pair {pair + 1}/{opts.pairs}] ({kind}) {ms:.2f} ms/step ({time.time() - started:.0f} s, "
                      f"load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        common.stop_ray()
        shutil.rmtree(workdir, ignore_errors=True)
    ratios = [a / h for a, h in zip(blocks["a"], blocks["h"])]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    mean, spread = statistics.mean(ratios), statistics.stdev(ratios) if len(ratios) > 1 else 0.0
    print(f"\n(a) / (h) over {len(ratios)} pairs of {opts.steps} steps: median {statistics.median(ratios):.3f}, "
          f"quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}, mean {mean:.3f} +- {spread / len(ratios) ** 0.5:.3f} "
          f"(standard error); (h) ranged {min(blocks['h']):.1f}-{max(blocks['h']):.1f} ms/step")
    print("per pair: " + " ".join(f"{r:.3f}" for r in ratios))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"config": vars(opts), "blocks_ms": blocks, "ratios": ratios,
                       "machine": common.machine_info()}, f, indent=1)


if __name__ == "__main__":
    main()
