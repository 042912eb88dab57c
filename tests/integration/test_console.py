"""The quick start's console, counted as a new user would see it: the progress bar, the logs and the
results; no line from Ray's internals, no warning repeated once per worker."""

import os
import subprocess
import sys

from tests.support import ROOT

RAY_INTERNALS = ("TrainController", "RayTrainWorker", "core_worker.cc", "PlacementGroupCleaner",
                 "Requesting resources", "Setting up process group", "Token authentication is enabled")


def run_quickstart(tmp_path, **env):
    environment = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYTRAINER_VERBOSE")}
    environment.update(PYTHONPATH=ROOT, **env)
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "quickstart.py"), "--max_steps", "10", "--eval_steps", "5",
         "--save_steps", "5", "--logging_steps", "5", "--output_dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = (result.stdout + result.stderr).replace("\r", "\n").splitlines()
    return [line for line in lines if line.strip()]


def test_quick_start_console_has_no_ray_internals_and_no_per_worker_repeats(tmp_path):
    lines = run_quickstart(tmp_path)
    internal = [line for line in lines if any(marker in line for marker in RAY_INTERNALS)]
    assert internal == []
    assert sum("loss_type=None" in line for line in lines) <= 1  # shown once (by the driver's loss check)
    assert any(line.startswith("{loss=") for line in lines)  # the logs are there
    assert any("eval loss" in line for line in lines)  # and the results


def test_the_forwarded_line_filter_drops_internal_notices_and_their_tracebacks_only():
    from raytrainer.verbosity import _without_internal

    lines = ["{loss=1.0}", "Failed to stop PlacementGroupCleaner gracefully.", "Traceback (most recent call last):",
             '  File "x.py", line 1, in f', "ray.exceptions.GetTimeoutError: Get timed out", "user print",
             "[2026 E 1 2] core_worker.cc:2465: Actor with class name: 'PreemptionWatcher' has ...",
             "Failed to send resource request for train-a8ede38c. If this only happens transiently during network "
             "partition or CPU being overloaded, it's safe to ignore this error.", "Traceback (most recent call last):",
             '  File "y.py", line 2, in g', "ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready.",
             "Traceback (most recent call last):", "ValueError: the user's own error"]
    assert _without_internal(lines) == ["{loss=1.0}", "user print", "Traceback (most recent call last):",
                                        "ValueError: the user's own error"]
