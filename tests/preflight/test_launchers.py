"""A script started by a multi-process launcher refuses at once, in every process, naming the command to run
instead (it hung 300 s in Ray's GetTimeoutError before). Real launches: `torchrun --nproc_per_node 2`, and
the environment `accelerate launch` gives its processes."""

import os
import subprocess
import sys
import time

import pytest

from raytrainer.errors import ConfigError
from raytrainer.preflight.launchers import check_not_launched
from tests.support import ROOT

SCRIPT = """
import time
from raytrainer import Trainer, TrainingArguments
from tests.models import TokenData, make_model

started = time.time()
args = TrainingArguments(output_dir={out!r}, num_workers=0, max_steps=2, disable_tqdm=True, save_strategy="no")
try:
    Trainer(model=make_model(), args=args, train_dataset=TokenData(8)).train()
    print("TRAINED", flush=True)
except Exception as exc:
    print(f"REFUSED {{type(exc).__name__}} after {{time.time() - started:.2f}} s: {{exc}}", flush=True)
    raise SystemExit(3)
"""

# Whole launches, interpreter start-up and imports included, on a loaded 2-core machine; a hang was 300 s.
BOUND_S = 90


def _script(tmp_path) -> str:
    path = tmp_path / "train_script.py"
    path.write_text(SCRIPT.format(out=str(tmp_path / "out")))
    return str(path)


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "RAY_ADDRESS")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)  # for tests.models
    return {**env, **extra}


def _refusals(output: str) -> list:
    return [line for line in output.splitlines() if line.startswith("REFUSED")]


def test_torchrun_with_two_processes_refuses_in_seconds_before_ray_starts(tmp_path):
    """As a user's script meets it, with nothing catching the error: the message alone, no traceback."""
    script = tmp_path / "train_script.py"
    head = SCRIPT.format(out=str(tmp_path / "out")).split("try:")[0]
    script.write_text(head + "Trainer(model=make_model(), args=args, train_dataset=TokenData(8))\n")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    started = time.time()
    done = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", str(script), "--seed", "3"],
                          env=_env(), capture_output=True, text=True, timeout=BOUND_S + 60)
    elapsed = time.time() - started
    assert elapsed < BOUND_S, f"took {elapsed:.0f} s"
    assert done.returncode != 0
    # Each rank refuses by itself (a rank-1 process alone: the test below). Both usually print it; on a busy
    # machine the second may still be importing when torchrun, seeing the first exit, stops it with SIGTERM.
    refused = done.stderr.count("started by torchrun as 2 processes")
    stopped = refused == 1 and "Signal 15 (SIGTERM) received" in done.stderr
    assert refused == 2 or stopped, done.stdout + done.stderr
    ranks_said = done.stderr.split("failed (exitcode")[0]  # torchrun's own block (its traceback) follows
    assert "Traceback" not in ranks_said, done.stderr
    assert "python " in done.stderr and "train_script.py --seed 3 --num_workers 2" in done.stderr
    assert not os.path.exists(tmp_path / "out" / "checkpoint-2")


def test_the_environment_accelerate_launch_gives_refuses_but_one_process_trains(tmp_path):
    script = _script(tmp_path)
    # What `accelerate launch --num_processes 2` sets in each process (it runs torchrun's elastic agent).
    accelerate = dict(ACCELERATE_MIXED_PRECISION="no", ACCELERATE_USE_CPU="True", ACCELERATE_DYNAMO_BACKEND="NO",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT="29511", WORLD_SIZE="2", RANK="1", LOCAL_RANK="1",
                      LOCAL_WORLD_SIZE="2", GROUP_RANK="0", TORCHELASTIC_RUN_ID="none")
    started = time.time()
    done = subprocess.run([sys.executable, script], env=_env(**accelerate), capture_output=True, text=True,
                          timeout=BOUND_S + 60)
    assert time.time() - started < BOUND_S
    assert done.returncode == 3, done.stdout + done.stderr
    assert "accelerate launch as 2 processes" in done.stdout and "--num_workers 2" in done.stdout

    # One process under the same launcher is one driver: it trains (in process here, num_workers=0).
    single = {**accelerate, "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    done = subprocess.run([sys.executable, script], env=_env(**single), capture_output=True, text=True,
                          timeout=BOUND_S + 60)
    assert "TRAINED" in done.stdout, done.stdout + done.stderr


def test_the_suggested_command_replaces_num_workers_and_names_the_machines():
    env = {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "x"}
    with pytest.raises(ConfigError) as caught:
        check_not_launched(env, ["run_clm.py", "--num_workers", "1", "--output_dir", "out dir"])
    message = str(caught.value)
    assert "python run_clm.py --output_dir 'out dir' --num_workers 8" in message
    assert "2 machines" in message and "ray start --head" in message
    check_not_launched({"WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "x"}, ["s.py"])  # one process: runs
    with pytest.raises(ConfigError, match="mpirun as 4 processes"):
        check_not_launched({"OMPI_COMM_WORLD_SIZE": "4"}, ["s.py"])
