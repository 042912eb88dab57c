"""`raytrainer launch script.py`: an unmodified training script on N Ray workers, as torchrun would run it.

Every rank runs the script (RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR set, the process group up, as under
torchrun); every `transformers.Trainer` it builds is hosted (worker/hosted/host.py): committed checkpoints on
any fsspec URL, automatic resume (a restart after a lost worker, or the same command run again), and one event
stream to this process, the driver, which shows progress and runs the reporters. The script is read and
compiled here first, so a missing file or a syntax error fails before any worker starts; its text travels with
the job (a worker on another node need not have the file).
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Optional, Sequence

from ..coordinator import holders
from ..errors import ConfigError
from ..protocol import HostedOrder, HostedResult, HostedScript, LogLevels
from ..storage.urls import absolute_if_local
from ..verbosity import notice, quiet_driver, worker_level
from .callbacks import driver_callbacks
from .dispatch_order import dispatch_order
from .hosted_handler import HostedHandler
from .interrupted import stop_if_interrupted
from .options import HostedOptions, hosted_options


def launch(script: str, script_args: Sequence[str] = (), **options: Any) -> HostedResult:
    """Run `script` with `script_args` on the workers `options` ask for (raytrainer's options: num_workers,
    max_failures, storage_options, report_to, resume, ...); rank 0's `HostedResult` (one record per Trainer
    that trained)."""
    return launch_script(script, script_args, hosted_options(options, "raytrainer launch"),
                         reporters_named="report_to" in options)


def launch_script(script: str, script_args: Sequence[str], options: HostedOptions,
                  reporters_named: bool = False) -> HostedResult:
    """`launch` with its options checked (`raytrainer launch` builds them from its command line).
    `reporters_named`: report_to was given (else the reporters the script's arguments name run)."""
    path = os.path.abspath(script)
    text = read_script(path)
    quiet_driver(options)
    callbacks = driver_callbacks(options)
    run_id = uuid.uuid4().hex[:12]
    order = HostedOrder(run_id=run_id, method=None, resume=options.resume, storage_options=options.storage_options,
                        callback_decisions=options.callback_decisions, control_points=callbacks.control_points(),
                        hang_warning_s=options.hang_warning_s, hang_timeout_s=options.hang_timeout_s,
                        heard=callbacks.heard(),
                        log_levels=LogLevels(rank0=worker_level(options, 0, driver_ran_model=True),
                                             replica=worker_level(options, 1, driver_ran_model=True)))
    claims = HostedHandler(callbacks, run_id, options.resume, options.storage_options, reporters_named)
    # The group stays in the process's pool for the next launch() or hosted() call (released at exit).
    user = holders.PoolUser(owner=f"raytrainer launch {script}")
    try:
        named = named_output_dir(script_args)
        if named is not None:
            # HF's scripts take `--output_dir`: its storage is probed and its lease taken here, before Ray and
            # the workers start and the script's top runs (a second driver, bad credentials, an unreachable
            # endpoint: one line at once). A Trainer's claim of that output_dir finds it taken by this job.
            claims.take(named)
        result = dispatch_order(HostedScript(path, text, tuple(script_args), os.getcwd()), order, options,
                                callbacks, claims, user)
    finally:
        claims.close()
    stop_if_interrupted(result, "run the same command to continue", callbacks)
    for record in result.runs:
        saved = (f"last checkpoint {record['checkpoint']}" if record["checkpoint"] else
                 f"no checkpoint saved (output_dir {record['output_dir']})")
        notice(f"{record['trainer'].rsplit('.', 1)[-1]} trained {record['global_step']} steps; {saved}")
    return result


def named_output_dir(script_args: Sequence[str]) -> Optional[str]:
    """The script's `--output_dir` (HfArgumentParser's spelling, `--output_dir X` or `--output_dir=X`), as the
    workers will name it (they run the script in this directory), or None."""
    args = list(script_args)
    for i, arg in enumerate(args):
        value = args[i + 1] if arg == "--output_dir" and i + 1 < len(args) else (
            arg.split("=", 1)[1] if arg.startswith("--output_dir=") else None)
        if value:
            return absolute_if_local(value)
    return None


def read_script(path: str) -> str:
    """The script's text, compiled once here: a missing file or a syntax error fails before any worker."""
    if not os.path.isfile(path):
        raise ConfigError(f"raytrainer launch: {path} is not a file (relative paths start at {os.getcwd()}).")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        compile(text, path, "exec")
    except SyntaxError as exc:
        raise ConfigError(f"raytrainer launch: {path}:{exc.lineno}: {exc.msg}. The script does not parse.") from None
    return text
