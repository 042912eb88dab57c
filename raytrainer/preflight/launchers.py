"""Refuse at once when a multi-process launcher (torchrun, `accelerate launch`, mpirun, deepspeed) started
this script.

Under such a launcher every process runs the script, and each would start (or join) Ray and ask for its own
worker group: N copies of the run competing for the same CPUs/GPUs and the same output_dir. Before this
check that waited for a placement and ended in Ray's GetTimeoutError. raytrainer starts the workers
itself, so the fix is to run the script once, with the launcher's process count as `num_workers`; the error
says exactly which command. A launcher with one process (`torchrun --nproc_per_node 1`) is one driver: it runs.

Checked when a Trainer is built: before Ray starts, with nothing spent.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Mapping, Optional

from ..errors import ConfigError

# Where the process count comes from: torchrun / torch.distributed.launch / accelerate / deepspeed set
# WORLD_SIZE; Open MPI, MPICH/Intel MPI and MVAPICH (mpirun, `accelerate launch --mpirun_hostfile`) their own.
WORLD_SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")


def launcher_name(env: Mapping[str, str]) -> str:
    if any(k.startswith("ACCELERATE_") for k in env):
        return "accelerate launch"
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    if "OMPI_COMM_WORLD_SIZE" in env or "PMI_SIZE" in env or "MV2_COMM_WORLD_SIZE" in env:
        return "mpirun"
    return "a distributed launcher"


def launched_world_size(env: Mapping[str, str]) -> int:
    for name in WORLD_SIZE_VARS:
        value = env.get(name, "")
        if value.strip().isdigit():
            return int(value)
    return 1


def _in_ray_worker() -> bool:
    """Ray Train sets WORLD_SIZE in its own workers: a Trainer built there is no launcher's doing."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        return ray.is_initialized() and ray._private.worker.global_worker.mode == ray.WORKER_MODE
    except AttributeError:  # a Ray without these internals: assume a driver
        return False


def check_not_launched(env: Optional[Mapping[str, str]] = None, argv: Optional[list] = None):
    """Raise ConfigError, naming the command to run instead, in every process of a multi-process launch."""
    env = os.environ if env is None else env
    world_size = launched_world_size(env)
    if world_size <= 1 or _in_ray_worker():
        return
    name = launcher_name(env)
    local = env.get("LOCAL_WORLD_SIZE", "")
    nodes = world_size // int(local) if local.isdigit() and int(local) > 0 else 1
    command = suggested_command(world_size, sys.argv if argv is None else argv)
    multi_node = ("" if nodes <= 1 else
                  f" Your launch spans {nodes} machines: start a Ray cluster on them first (`ray start --head` on "
                  "one, `ray start --address=HEAD_IP:6379` on the others) and run the command on the head node.")
    raise LaunchRefused(
        f"This script was started by {name} as {world_size} processes, but raytrainer starts its own workers "
        f"(one Ray actor per GPU or CPU slot): run it once, as a single process, and ask for {world_size} "
        f"workers:\n    {command}\n(or set TrainingArguments(num_workers={world_size}) in the script)."
        f"{multi_node} Every process of this launch stops here, before Ray starts.")


class LaunchRefused(ConfigError, SystemExit):
    """The launcher's refusal, read in a terminal where every process of the launch prints what reaches the top:
    as a SystemExit it ends the process with the message alone, no traceback, and status 1 (a str code: Python
    prints it to stderr), and the launcher's own summary follows. Every rank prints it: the launcher stops the
    others when the first exits, so the rank that gets there first must say it. Code that catches ConfigError
    (or ValueError) still catches it."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = message


def suggested_command(world_size: int, argv: list) -> str:
    """`python SCRIPT ARGS --num_workers N`, without any --num_workers the arguments already had."""
    args, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        if arg in ("--num_workers", "--num-workers"):
            skip = True
            continue
        if arg.startswith(("--num_workers=", "--num-workers=")):
            continue
        args.append(arg)
    script = argv[0] if argv else "script.py"
    return shlex.join(["python", script, *args, "--num_workers", str(world_size)])
