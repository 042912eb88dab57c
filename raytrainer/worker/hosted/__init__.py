"""The hosted mode on a worker: a `transformers.Trainer` subclass (TRL's, Seq2SeqTrainer, a team's own) runs
as its user wrote it, on every rank of the worker group, inside raytrainer's guarantees.

`run_hosted` serves one `HostedOrder` (`protocol.py`): a script (`raytrainer launch`: every rank runs it, as
under torchrun) or a call (the Python API: the trainer is built here from its class and constructor
arguments, then train / evaluate / predict / save_model runs). While it runs, `host.py` wraps
transformers.Trainer's methods (checkpoints committed, resume, events), and `sandbox.py` keeps what the job
changes in this long-lived process from reaching the next job.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from typing import Any, Optional

from ...checkpoint.model_io import load_into
from ...errors import ConfigError
from ...protocol import HostedCall, HostedOrder, HostedResult, HostedScript
from ..watchdog import watching_job
from .host import Host, installed
from .sandbox import sandbox
from .stops import HostedStop, JobStops

ONE_PROCESS_UNSET = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK")
# Python's thread switch interval while a job runs. HF's loop runs in Ray Train's training thread, and Ray's main
# thread of this process asks for the GIL about every 10 ms (its signal check); at Python's default 5 ms each
# ask takes the GIL from the loop, a switch torchrun's single-threaded ranks never pay. At 50 ms the hosted step
# on 2 CPU cores went from 1.113 to 1.071 x torchrun's (medians of 6 pairs, benchmarks/README.md, hosted.py).
# Ray's own calls into this process (health checks) wait up to this long for the GIL; nothing of ours polls here.
# RAYTRAINER_JOB_SWITCH_INTERVAL_S (in the workers' environment) sets another, to measure it (benchmarks/gpu.py).
JOB_SWITCH_INTERVAL_S = float(os.environ.get("RAYTRAINER_JOB_SWITCH_INTERVAL_S", "0.05"))


class ScriptExit(RuntimeError):
    """The script called sys.exit() with a failure status."""


def run_hosted(target: Any, order: HostedOrder, ctx, emitter, on_ray: bool = False) -> Optional[HostedResult]:
    """Run the order on this rank; rank 0's `HostedResult` (None on the other ranks). `on_ray`: a stalled rank
    past hang_timeout_s ends its worker (Ray Train restarts the group); in the driver process it only warns."""
    stops = JobStops(ctx, emitter, on_ray)  # preemption and Ctrl-C: save at one step first (stops.py)
    host = Host(order, ctx, emitter, stops)
    value = model_state = stopped = None
    # The hang watchdog (worker/watchdog.py) is marked by the relay: each step's begin, each event, the loop
    # between steps; a rank stalled in HF's all_gather is named as waiting for a peer.
    with sandbox(), installed(host), switch_interval(JOB_SWITCH_INTERVAL_S), one_process(ctx.world_size), \
            watching_job(order, ctx.rank, on_ray, emitter), stops:
        if ctx.device.type == "cpu":
            # accelerate treats a CPU process as distributed only when told (`accelerate launch --cpu`, or
            # use_cpu=True): without it every rank of a CPU group would train alone, as under torchrun.
            os.environ.setdefault("ACCELERATE_USE_CPU", "true")
        try:
            if isinstance(target, HostedScript):
                run_script(target)
            else:
                trainer = build_trainer(target)
                value = getattr(trainer, order.method)(*target.call_args, **target.call_kwargs)
                if order.method == "train" and ctx.is_main:
                    model_state = trained_state(trainer)
        except HostedStop as stop:  # every rank, its checkpoint committed; the job's code after it does not run
            stopped = stop
    if stopped is not None and stopped.reason == "preemption":  # Ray Train restarts the group from it
        stopped.signals.hand_over(stopped.global_step, stopped.checkpoint)  # does not return
    if not ctx.is_main:
        return None
    return HostedResult(runs=tuple(host.runs), value=value, model_state=model_state)


@contextlib.contextmanager
def one_process(world_size: int):
    """One worker runs the job as one plain process would: no DDP wrapper around a group of one, and what HF
    refuses under DDP (the layer-wise optimizers) runs. accelerate reads RANK, LOCAL_RANK, WORLD_SIZE to go
    distributed, so they are unset for the job; except for arguments that ask for FSDP, which HF runs only
    distributed ("Using fsdp only works in distributed training"): those are built as under `torchrun
    --nproc_per_node 1`, with the variables back (accelerate reads them in `TrainingArguments.__post_init__`
    and again in the Trainer). sandbox() puts the environment back after the job."""
    if world_size != 1:
        yield
        return
    import transformers

    saved = {name: os.environ.pop(name) for name in ONE_PROCESS_UNSET if name in os.environ}
    cls = transformers.TrainingArguments
    post_init = cls.__dict__["__post_init__"]

    def hosted_post_init(self, *args, **kwargs):
        if self.fsdp:  # as given ("full_shard", a list, True): HF parses it in __post_init__
            os.environ.update(saved)
        return post_init(self, *args, **kwargs)

    cls.__post_init__ = hosted_post_init
    try:
        yield
    finally:
        cls.__post_init__ = post_init


@contextlib.contextmanager
def switch_interval(seconds: float):
    """sys.setswitchinterval(seconds) for the job; the process's own value again after it."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def run_script(script: HostedScript):
    """Run the script as `python script.py ARGS` would: `__name__ == "__main__"`, its `__file__`, sys.argv, its
    folder first on sys.path, in the driver's working directory where this node has it."""
    module = types.ModuleType("__main__")
    module.__file__ = script.path
    module.__builtins__ = __builtins__
    sys.modules["__main__"] = module
    sys.argv[:] = [script.path, *script.argv]
    folder = os.path.dirname(os.path.abspath(script.path))
    sys.path.insert(0, folder)
    if os.path.isdir(script.cwd):
        os.chdir(script.cwd)
    code = compile(script.text, script.path, "exec")
    try:
        exec(code, module.__dict__)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise ScriptExit(f"the script exited with status {exc.code!r}") from None


def build_trainer(call: HostedCall):
    """The trainer, built on this rank from what the driver gave: its arguments object rebuilt here first."""
    import transformers

    kwargs = dict(call.kwargs)
    if call.args_class is not None:
        kwargs["args"] = call.args_class(**call.args_fields)
    trainer = call.factory(*call.args, **kwargs)
    if not isinstance(trainer, transformers.Trainer):
        raise ConfigError(f"{getattr(call.factory, '__name__', call.factory)!r} returned "
                          f"{type(trainer).__name__}, not a transformers.Trainer (or a subclass of it).")
    if call.trained_state is not None:  # this trainer's last hosted train(): its weights
        load_into(trainer.model, call.trained_state)
    return trainer


def trained_state(trainer) -> dict:
    """Rank 0's trained weights, for the driver's model (a state dict of CPU tensors)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {name: value.detach().cpu() for name, value in model.state_dict().items()}
