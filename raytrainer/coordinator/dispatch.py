"""Where a job runs: in this process (num_workers=0), or on a worker group of the process's pool.

`Trainer._dispatch` packs the trainer and its work order (`transfer.pack_job`), the hosted mode its order and
target (hosting/run_order.py), and both hand them here with the run's `RunSpec` (spec.py). The policy:
- take an idle group of the pool that can run it (the caller's last one first, else any Trainer's:
  `holders.take_idle`), else start a new one, after releasing the caller's last group and saying why
  (a warning, unless a group per call was asked for with worker_idle_timeout_s=0);
- mark it busy while the job runs, so no other call takes or releases it (`holders.py`);
- post the job and pump its events (`pump.run_job_on_group`); if the group's board closed (idle timeout) just
  as the job was posted, take or start another group, once;
- for train(): complete the start-up timeline that train() began (`startup.py`), log it at the first step and
  write it into the result's trainer state.

What it knows of the caller is what it is given: the `RunSpec`, the job's handlers (`handlers.JobHandlers`),
and the caller's `holders.PoolUser` (its last group, and the name its groups carry).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Dict, Optional

from .. import transfer
from ..protocol import JobKind, TrainResult
from ..startup import Startup, Timeline, add_to_state_json
from . import cluster, holders, pump
from .group import GroupSpec, WorkerGroup
from .handlers import JobHandlers, StartupWatch
from .pump import TrainingError
from .spec import RunSpec

logger = logging.getLogger("raytrainer")


def dispatch_job(packed: transfer.Packed, kind: JobKind, *, spec: RunSpec, handlers: JobHandlers,
                 user: holders.PoolUser, datasets: Dict[str, Any], receive: Optional[Callable[[Any], Any]] = None,
                 startup: Optional[Startup] = None) -> Any:
    """Run the packed job (its trainer and work order) on `spec`, its messages handed to `handlers`, for the pool
    `user` given; returns rank 0's result (`protocol.TrainResult`, ...) as `receive(result)` returns it,
    which runs while the result's objects (the trained weights, owned by rank 0) still exist. `datasets`: the
    Ray Datasets the job reads (they travel in the job; a new group for it leaves CPUs for Ray Data's tasks).
    `startup`: train()'s start-up timeline, logged at the first step and kept in the result's state."""
    kind, receive = JobKind(kind), receive or (lambda result: result)
    if startup is not None:
        handlers = JobHandlers(handlers.callbacks, handlers.claims, StartupWatch(startup))
        receive = _recording_startup(receive, handlers)
    if spec.in_process:
        # Work on a copy, as a worker would: the driver's model changes only from the result.
        marks = Timeline()
        copy, order = transfer.unpack(packed.payload, packed.data)
        marks.mark("unpack")
        return receive(pump.run_job_in_process(copy, order, handlers, spec.use_gpu, startup=marks))
    for _ in range(2):  # a second time only when the group closed (idle timeout) as the job was posted
        group = take_or_start_group(spec, user, kind, datasets, startup)
        if startup is not None:
            startup.driver.mark("group")
        group.busy = True  # no other call takes or releases it meanwhile (holders.py)
        try:
            result = pump.run_job_on_group(group, packed, handlers, spec.max_failures, receive, kind=kind,
                                           startup=startup)
        finally:
            group.busy = False
        if result is not pump.NOT_POSTED:
            return result
    raise TrainingError("The worker group closed twice as a job was posted to it.")


def _recording_startup(receive: Callable[[Any], Any], handlers: JobHandlers) -> Callable[[Any], Any]:
    """`receive`, after the start-up timeline is logged (if the first step never came) and written into the
    result's trainer state (`trainer.state.startup`)."""
    watch = handlers.startup

    def recorded(result):
        watch.log(handlers.callbacks)
        if isinstance(result, TrainResult):
            result = dataclasses.replace(result, state=add_to_state_json(result.state, watch.startup.record()))
        return receive(result)

    return recorded


def take_or_start_group(spec: RunSpec, user: holders.PoolUser, kind: JobKind, datasets: Dict[str, Any],
                        startup: Optional[Startup] = None) -> WorkerGroup:
    """An idle group of the process's pool that can run the job (`user`'s last one first, else any Trainer's),
    else a new one: the idle groups that hold what it needs are released first. `startup`: told whether the
    group is new or reused."""
    shape = GroupSpec.of(spec)
    group = holders.take_idle(shape, prefer=user.group)
    if group is None:
        if user.group is not None:
            old = user.group
            expected = not old.alive and old.spec.worker_idle_timeout_s == 0  # asked for: a group per call
            logger.log(logging.INFO if expected else logging.WARNING, "Starting a new worker group for %s(): "
                       "%s.", kind, old.why_not_reused(shape))
            user.release()
        need = {k: v * spec.min_workers for k, v in spec.per_worker().items()}
        if datasets:  # Ray Data's tasks need CPUs besides the workers': an idle group must not hold them
            data_cpus = cluster.data_cpu_asks(datasets.values())[0]  # what their steps ask (map_batches, reads)
            need["CPU"] = need.get("CPU", 0) + max(cluster.DATA_CPU_HEADROOM, data_cpus)
        holders.check_room(need, f"{kind}() with {spec.num_workers} workers")
        group = WorkerGroup(spec, owner=user.owner)
        holders.hold(group)
        if startup is not None:
            startup.group = "new"
    else:
        if startup is not None:
            startup.group = "reused"
        if group is not user.group:
            logger.info("%s() runs on an idle worker group of this process (%s).", kind, group.owner)
            group.owner = user.owner
    user.use(group)
    return group
