"""benchmarks/gpu.py keeps working without a GPU: its CPU smoke run (every part on tiny models, one worker, one
round, in a subprocess that joins the session's Ray) writes the JSON a GPU run writes, with finite positive
figures. The figures mean nothing on a CPU and are compared with nothing: speed is reported by the benchmark,
never asserted."""

import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = ("own_over_hand_ddp", "own_over_hand_fsdp", "hosted_over_torchrun", "mfu_own_1b", "mfu_hand_1b",
           "peak_mem_own_over_hand", "hosted_over_plain", "ray_actor_over_plain")


def test_the_gpu_benchmarks_cpu_smoke_writes_every_figure(tmp_path, join_session_ray):
    out = tmp_path / "gpu.json"
    # The session's Ray, named on purpose (a Ray of its own cost ~10 CPU s to start and stop)
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu.py"), "--device", "cpu", "--smoke",
                          "--ray-address", join_session_ray["RAY_ADDRESS"], "--json", str(out)], cwd=ROOT,
                         env=join_session_ray, capture_output=True, text=True, timeout=420)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert {"device", "torch", "date", "rounds"} <= result.keys() and result["device"] == "cpu"
    for key in FIGURES:
        assert isinstance(result[key], float) and math.isfinite(result[key]) and result[key] > 0, (key, result[key])
    assert result["hosted_over_torchrun_fsdp"] is None  # accelerate's FSDP cannot run on CPU: skipped, and said
    assert "cannot run on CPU" in result["parts"]["hosted"]["fsdp"]["skipped"]
    assert "raytrainer on a GPU against" in run.stdout  # the one table
