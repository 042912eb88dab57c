"""The hosted mode's step taken apart, one launcher at a time (`benchmarks/gpu.py --parts hosted:ladder`).

On one GPU the hosted mode's step was 1.25-1.48x torchrun's (2026-11-27, two H200 runs) with the same kernels
and no extra host waits: the script's loop is host-bound there, so whatever slows the host's Python slows the
step. The same plain `transformers.Trainer` script (gpu_hosted_script.py) runs here, on one worker:

    plain    `python gpu_hosted_script.py`: what a one-GPU user runs (the main thread, this machine's niceness,
             Python's 5 ms switch interval, no process group)
    actor    a bare Ray actor running the script in a thread of its own, as Ray Train's worker runs a train
             function: Ray's worker process (its threads, its niceness, its environment) without Ray Train and
             without raytrainer
    launch   `raytrainer.launch` on the warm worker group (gpu.py's hosted part)

each one's steady step over plain's, per round. Slow under launch only: the time is Ray Train's or raytrainer's
(the hosted relay, the job's switch interval); slow under the actor too: it is Ray's process. On CPU this runs
in gpu.py's smoke (its figures mean nothing there); on CPU with a 2-layer model, 300 steps (2026-11-28, idle
2-core machine): launch / plain 1.033-1.156, median 1.067 (the loop thread's CPU +0.4-0.9 ms a step).
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import threading
import time
from typing import List

LAUNCHERS = ("plain", "actor", "launch")


def plain_env(device: str) -> dict:
    """The environment a user's own process has, with one torch thread as the hosted job and torchrun get."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if device != "cuda":
        env["ACCELERATE_USE_CPU"] = "true"
    return env


def job_env(device: str) -> dict:
    """What plain_env sets, for a script run in a Ray actor (which has Ray's environment otherwise)."""
    return {key: value for key, value in plain_env(device).items() if key in ("OMP_NUM_THREADS", "ACCELERATE_USE_CPU")}


def run_plain(script: str, script_args: List[str], device: str) -> None:
    subprocess.run([sys.executable, script, *script_args], check=True, env=plain_env(device),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_as_main(script: str, argv: List[str]) -> None:
    """The script as `python script ARGS` runs it, in this process (a Ray actor's or Ray Train worker's thread)."""
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


class ScriptHost:
    """A bare Ray actor that runs a script as `python script ARGS` would, in a thread of its own (Ray Train's
    worker runs the train function in its "TrainingThread"), on the device the driver sees: the GPU stays with
    the warm worker group beside it, idle, as it does under torchrun."""

    def run(self, script: str, argv: List[str], env: dict) -> float:
        os.environ.update(env)  # before the script's torch starts CUDA: the device the driver sees
        failure: List[BaseException] = []

        def target():
            try:
                run_as_main(script, argv)
            except BaseException as exc:  # noqa: BLE001 (raised on the caller's side below)
                failure.append(exc)

        started = time.time()
        thread = threading.Thread(target=target, name="ScriptThread")
        thread.start()
        thread.join()
        if failure:
            raise failure[0]
        return time.time() - started


_host = None


def run_in_actor(script: str, script_args: List[str], device: str) -> None:
    """One actor for every round (started by the first, as the worker group is): each run is a warm start."""
    import ray

    global _host
    if _host is None:
        _host = ray.remote(num_cpus=0)(ScriptHost).remote()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0") if device == "cuda" else ""
    env = job_env(device)
    ray.get(_host.run.remote(script, script_args, {**env, "CUDA_VISIBLE_DEVICES": visible}))


def stop_actor() -> None:
    import ray

    global _host
    if _host is not None:
        ray.kill(_host)
        _host = None
