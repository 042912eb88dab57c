"""Dispatching one hosted order (a script, or a call on a trainer) to the process's pool of worker groups.

The same path as raytrainer's own Trainer from here on (coordinator/dispatch.py): an idle group of the pool
that fits is taken (consecutive runs, SFT then DPO, pay one group start), the order and its target are
packed once (their tensors and Arrow buffers through the object store: transfer.py), and the driver pumps
the job's events into its callbacks until rank 0's result comes back.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from .. import transfer
from ..callbacks.base import CallbackHandler
from ..coordinator import cluster, dispatch, holders
from ..coordinator.handlers import JobHandlers
from ..errors import ConfigError
from ..protocol import HostedOrder, HostedResult
from ..startup import Startup
from ..startup_line import StartupLine
from .hosted_handler import HostedHandler
from .options import HostedOptions


def dispatch_order(target: Any, order: HostedOrder, options: HostedOptions, callbacks: CallbackHandler,
                   claims: HostedHandler, user: holders.PoolUser,
                   receive: Optional[Callable[[HostedResult], Any]] = None) -> Any:
    """Run `order` on its `target` (`protocol.HostedScript` or `HostedCall`), its events to `callbacks` and its
    claims to `claims` (whose leases are released at the end); rank 0's `HostedResult` as `receive(result)`
    returns it (called while the result's weights still exist). While Ray and a new group start (20 s and more),
    the start-up line says what for (startup_line.py), as raytrainer.Trainer's train() does."""
    startup = Startup(words_only=True)
    quiet = getattr(callbacks.args, "disable_tqdm", options.disable_tqdm)  # as the driver's progress has it
    since = "the launch" if order.method is None else f"{order.method}()"
    remote = options.max_workers > 0  # else in this process, without Ray (a debugger works), as raytrainer.Trainer's
    # in process, the script's own set-up is what the wait is, and no worker group starts: no line
    with StartupLine(startup, enabled=remote and not quiet, since=since):
        if remote:
            startup.doing = "connecting to Ray"
            cluster.connect(options.ray_address)
        spec = options.run_spec()  # the GPUs: the cluster's, once connected
        if not spec.in_process:
            startup.doing = "checking placement"
            cluster.check_placeable(spec.num_workers, spec.per_worker())
            if cluster.workers_may_be_elsewhere():
                check_datasets_travel(target)
        startup.driver.mark("preflight")
        packed = pack(target, order)
        startup.driver.mark("pack")
        try:
            return dispatch.dispatch_job(packed, order.job_kind, spec=spec, handlers=JobHandlers(callbacks, claims),
                                         user=user, datasets={}, receive=receive, startup=startup)
        except Exception:
            if claims.refused is not None:  # every rank raised it from the claim's reply: the driver's message alone
                raise ConfigError(claims.refused) from None
            raise
        finally:
            claims.close()


def check_datasets_travel(target: Any):
    """Workers may run on other nodes: a `datasets.Dataset` memory-mapped from this node's disk travels as its
    files' paths (transfer.py), which another node cannot open. Refused before any worker starts, naming the
    argument and the fix."""
    for name, value in _named_arguments(target).items():
        for dataset in (value.values() if isinstance(value, dict) else [value]):
            files = [f.get("filename") for f in getattr(dataset, "cache_files", None) or [] if isinstance(f, dict)]
            if files and type(dataset).__module__.startswith("datasets"):
                raise ConfigError(
                    f"{name} is a datasets.Dataset read from this node's disk ({files[0]}), and the workers may run "
                    "on other nodes, which cannot open that file. Load it into memory (load_from_disk(..., "
                    "keep_in_memory=True), or Dataset.from_dict / from_list), or build it inside a factory "
                    "function given to hosted() from storage every node reads.")


def pack(target: Any, order: HostedOrder) -> transfer.Packed:
    """The target and its order as the workers receive them; an argument that cannot travel is named."""
    try:
        return transfer.pack((target, order))
    except Exception as exc:
        import cloudpickle

        for name, value in _named_arguments(target).items():
            try:
                cloudpickle.dumps(value)
            except Exception as culprit:  # noqa: BLE001 (whatever the pickler raises)
                raise ConfigError(
                    f"The trainer's {name}={type(value).__name__} cannot be sent to the workers "
                    f"({type(culprit).__name__}: {culprit}). Pass something that can be pickled (a function "
                    "defined at module level, a datasets.Dataset, a model), or build it inside a factory "
                    "function given to hosted() instead of the trainer class.") from exc
        raise ConfigError(f"The hosted run cannot be sent to the workers ({type(exc).__name__}: {exc}).") from exc


def _named_arguments(target: Any) -> dict:
    """The trainer's constructor arguments and the call's, by name (positional ones as "argument N")."""
    return {**{f"argument {i}": v for i, v in enumerate(getattr(target, "args", ()))},
            **getattr(target, "kwargs", {}),
            **{f"call argument {i}": v for i, v in enumerate(getattr(target, "call_args", ()))},
            **getattr(target, "call_kwargs", {})}
