"""A Trainer's worker group: started by the first call that needs workers, kept for the calls after it.

One Ray Train V2 `fit()` runs in a driver thread for the group's whole life; its worker function serves the
jobs the driver posts on the event sink's job board (`jobs.py`, `worker/entry.py`). Placement, process
groups and restarts stay Ray Train's; what a call saves is placing the actors, starting their processes,
importing torch and setting up the process group again (seconds on a laptop, minutes for a large GPU job;
benchmarks/worker_group.py measures it).

A group is released by `Trainer.close()`, by leaving `with Trainer(...) as trainer:`, when its Trainer is
garbage-collected or the interpreter exits, and after `worker_idle_timeout_s` without a job. A call after
that starts a new group, as the first call did.

`GroupSpec` is what a group is built from (the part of the run's `RunSpec`, spec.py, that Ray Train takes at
its start): when a call needs another one (num_workers or resources changed), the Trainer releases its group
and starts a new one, and says why. Ray Datasets are not part of it: each job
brings its own and splits them itself (data/ray_data.py), so one group serves jobs on any Ray Datasets.
"""

from __future__ import annotations

import functools
import logging
import pickle
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from ..protocol import Job, JobKind
from ..worker.entry import ray_worker_main
from .sink import EventSink
from .spec import RunSpec

logger = logging.getLogger("raytrainer")

# How long close() waits for the workers to return and Ray Train to release them, before aborting.
CLOSE_TIMEOUT_S = 60.0
# How long Ray Train's controller gets to abort (cancel its resource request, remove its placement group)
# before it is killed.
ABORT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class GroupSpec:
    """Everything a Ray Train worker group is built from (Ray Train takes these only at its start)."""
    num_workers: Any  # an int, or (min, max) for an elastic run
    resources_per_worker: Optional[tuple]
    use_gpu: bool
    elastic_resize_monitor_interval_s: Optional[float]
    max_preemptions: int
    worker_idle_timeout_s: float
    ray_train_log_level: str
    ddp_timeout: int = 1800  # seconds: the process group's collective timeout (transformers' ddp_timeout)

    @classmethod
    def of(cls, run: RunSpec) -> "GroupSpec":
        return cls(num_workers=tuple(run.num_workers) if run.elastic else run.max_workers,
                   resources_per_worker=tuple(sorted((run.resources_per_worker or {}).items())),
                   use_gpu=run.use_gpu,
                   elastic_resize_monitor_interval_s=run.elastic_resize_monitor_interval_s if run.elastic else None,
                   max_preemptions=run.max_preemptions, worker_idle_timeout_s=run.worker_idle_timeout_s,
                   ray_train_log_level=run.ray_train_log_level, ddp_timeout=run.ddp_timeout)

    def changes_to(self, other: "GroupSpec") -> list:
        """What differs, as 'field old -> new'."""
        return [f"{name} {getattr(self, name)} -> {getattr(other, name)}" for name in self.__dataclass_fields__
                if getattr(self, name) != getattr(other, name)]


@functools.lru_cache(maxsize=None)
def _group_trainer_class(keeps_cleaner: bool):
    """Ray Train's TorchTrainer without its DatasetsCallback and, unless `keeps_cleaner`, its
    PlacementGroupCleanerCallback: two actor processes less per group start (each imports Ray, pandas and Ray
    Train: about 1.7 CPU seconds, which the workers starting beside it need; benchmarks/worker_group.py). It is
    Ray Train's DataParallelTrainer given torch_backend.py's configuration, which its controller unpickles
    without importing torch (TorchTrainer only fills in TorchConfig's backend, which WorkerGroup names).

    - The DatasetsCallback starts a DatasetManager actor for every worker group, datasets or not, to split the
      datasets given to TorchTrainer; ours are not given to it (each job splits its own, data/ray_data.py).
    - The cleaner is a detached actor that asks each second whether the controller lives, and removes the
      group's placement group once it does not: a placement group made by an actor is the Ray job's, and
      outlives a controller that dies without removing it. A driver process does that itself
      (`WorkerGroup._remove_orphaned_placement_group`), and when the driver process dies its Ray job ends,
      the placement groups with it. A Trainer inside a Ray actor or task (a Tune trial, which Tune kills at the
      end of a sweep) can die with its controller and leave the job running: there a cleaner stays, ours,
      which asks Ray's GCS instead of the dashboard's state API (cleaner.py).
    """
    import ray
    from ray.train.v2._internal.callbacks import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from .cleaner import GcsCleanerCallback

    dropped = (DatasetsCallback,) if keeps_cleaner else (DatasetsCallback, GcsCleanerCallback)

    class GroupTrainer(DataParallelTrainer):
        def _create_default_callbacks(self):
            callbacks = [GcsCleanerCallback() if isinstance(cb, PlacementGroupCleanerCallback) else cb
                         for cb in super()._create_default_callbacks()]
            return [cb for cb in callbacks if not isinstance(cb, dropped)]

        def _initialize_and_run_controller(self, **controller_init_kwargs):
            """Ray Train's own (data_parallel_trainer.py), but the controller is killed once its result is read,
            while this handle still holds it. Left to Ray Train, the controller exits when its last handle goes:
            Ray's graceful actor exit, whose core-worker teardown can deadlock on its own publisher (Ray 2.60:
            `~CoreWorkerProcessImpl` -> `Publisher::~Publisher` posting to the io_context it is shutting down),
            leaving a 200 MB `ray::TrainController` process behind for as long as the machine runs. `ray.kill`
            is a forced exit without that teardown. The group's fit() runs in a thread of its own, so Ray Train's
            Ctrl-C handler (main thread only) is not registered here either."""
            from ray._common.constants import RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_ENV_VAR
            from ray.train.v2._internal.constants import (
                DEFAULT_RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_VALUE,
                get_env_vars_to_propagate,
            )
            from ray.train.v2._internal.execution.controller import TrainController

            env_vars = get_env_vars_to_propagate()
            env_vars.setdefault(RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_ENV_VAR,
                                DEFAULT_RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_VALUE)
            here = {ray._raylet.RAY_NODE_ID_KEY: ray.get_runtime_context().get_node_id()}  # the driver's node
            controller = ray.remote(num_cpus=0, label_selector=here, runtime_env={"env_vars": env_vars})(
                TrainController).remote(**controller_init_kwargs)
            try:
                ray.get(controller.run.remote())
                return ray.get(controller.get_result.remote())
            finally:
                kill_and_wait(controller)

    return GroupTrainer


def kill_and_wait(actor, timeout_s: float = 10.0) -> None:
    """`ray.kill`, then hold the handle until the actor is seen dead. `ray.kill` only sends the request: had
    the handle gone at once, the owner's report that no reference is left could reach Ray first, and the actor
    would take the graceful exit that `ray.kill` is there to avoid. A call to the actor fails once Ray has it
    dead (one that the actor still answers was ahead of the kill: ask again); bounded, since a Ray shutting
    down under us answers nothing."""
    import time

    import ray

    try:
        ray.kill(actor)
    except Exception:  # noqa: BLE001 (Ray shut down under the group: nothing left to kill)
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=max(deadline - time.monotonic(), 0.01))
        except Exception:  # noqa: BLE001 (RayActorError: dead as asked; a timeout or a Ray gone: nothing to wait on)
            return
        time.sleep(0.05)


def driver_is_a_ray_worker() -> bool:
    """Whether this process's Trainer runs inside a Ray actor (a Tune trial) or task rather than in a driver
    process: a process that can be killed while its Ray job goes on."""
    import ray

    return ray.get_runtime_context().worker.mode == ray.WORKER_MODE


def ray_instance() -> Optional[str]:
    """The Ray this process is connected to now, as the id of the driver's node (a new `ray.init()` after
    `ray.shutdown()` is another one), or None when it is not connected."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


class WorkerGroup:
    def __init__(self, run: RunSpec, owner: str):
        import ray
        from ray.train import FailureConfig, LoggingConfig, RunConfig, ScalingConfig
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from .failures import ControllerRecorder, FailureRecorder, FreshClusterView, ResizeRecorder, UnhurriedWait
        from .torch_backend import GroupTorchConfig

        self.spec = spec = GroupSpec.of(run)
        self.ray_instance = ray_instance()  # after ray.shutdown() and a new ray.init(), the group is gone
        self.owner = owner  # named in the error a second Trainer gets when this group holds what it needs
        self.closing = False
        self.busy = False  # a call's job is running on it: no other call takes or releases it (holders.py)
        self.user = None  # a weak reference to the holders.PoolUser whose call used it last: it releases it
        # What its workers reserve at most (its controller and sink take no CPU): a release gives this back.
        self.holds = {k: v * run.max_workers for k, v in run.per_worker().items()}
        # On the driver's node: a sink on a worker node would die with it (a lost node must only cost workers).
        # Each rank keeps a next_job call (and rank 0 a stop watch) in flight, so the concurrency grows with it.
        here = NodeAffinitySchedulingStrategy(self.ray_instance, soft=False)
        most = run.max_workers
        self.sink = ray.remote(num_cpus=0, max_concurrency=64 + 2 * most)(EventSink).options(
            scheduling_strategy=here).remote(run.worker_idle_timeout_s)
        # An elastic range goes to Ray Train as it is: it places between min and max workers at each start
        # and restart, and resizes a healthy group every elastic_resize_monitor_interval_s (docs/fault-tolerance.md).
        scaling = dict(num_workers=tuple(run.num_workers), elastic_resize_monitor_interval_s=
                       run.elastic_resize_monitor_interval_s) if run.elastic else dict(num_workers=most)
        torch_trainer = _group_trainer_class(driver_is_a_ray_worker())(
            ray_worker_main,
            train_loop_config={"sink": self.sink},
            scaling_config=ScalingConfig(**scaling, use_gpu=spec.use_gpu,
                                         resources_per_worker=run.resources_per_worker),
            # Failures are counted per job by the job board (jobs.py): Ray Train restarts without limit.
            run_config=RunConfig(name=f"{run.run_name or 'raytrainer'}-group-{uuid.uuid4().hex[:8]}",
                                 failure_config=FailureConfig(
                                     max_failures=-1, max_preemption_failures=run.max_preemptions),
                                 callbacks=[FailureRecorder(self.sink), ResizeRecorder(self.sink),
                                            ControllerRecorder(self.sink)] + (
                                     [FreshClusterView(run.elastic_resize_monitor_interval_s), UnhurriedWait()]
                                     if run.elastic else []),
                                 logging_config=LoggingConfig(log_level=run.ray_train_log_level)),
            backend_config=GroupTorchConfig(backend="nccl" if spec.use_gpu else "gloo", timeout_s=spec.ddp_timeout),
        )
        self.error: Optional[BaseException] = None
        self._controller = None  # Ray Train's controller actor, once asked for
        self._thread = threading.Thread(target=self._fit, args=(torch_trainer,), name="raytrainer-group",
                                        daemon=True)
        self._thread.start()

    def _fit(self, torch_trainer):
        try:
            torch_trainer.fit()
        except BaseException as exc:  # the job in flight raises it (pump._pump_job)
            self.error = exc
            self._remove_orphaned_placement_group()
            if not self.closing:
                return  # the driver may still read the job's last events from the sink
        # The board closed (close(), idle timeout): every worker has returned, and the controller was killed as
        # fit() returned or raised (GroupTrainer): the sink is the group's last actor.
        self.closing = True
        self._kill_sink()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self.closing and self.of_this_ray()

    def thread_alive(self) -> bool:
        return self._thread.is_alive()

    def of_this_ray(self) -> bool:
        """Whether the Ray this group started in is the one this process is connected to now. A script (or a
        benchmark, a notebook) that calls ray.shutdown() and then ray.init() again has lost the group's actors
        with the old Ray, while its fit() thread may still wait inside it."""
        return ray_instance() == self.ray_instance

    def reuses(self, spec: GroupSpec) -> bool:
        """Whether a job on `spec` can run here."""
        return spec == self.spec

    def why_not_reused(self, spec: GroupSpec) -> str:
        """Why a call starts a new group instead of this one (for the log)."""
        if self.error is not None and not self.closing:
            from .pump import describe

            return f"the previous one ended: {describe(self.error)}"
        if not self.alive:
            return "the previous one was released (close(), or worker_idle_timeout_s without a call)"
        return "; ".join(self.spec.changes_to(spec))

    def post(self, payload: bytes, data_ref, max_failures: int, code=None, kind: JobKind = JobKind.TRAIN
             ) -> Optional[str]:
        """Post a job; returns its id, or None if the group closed meanwhile (its idle timeout ended). `code`:
        the driver's import path and shipped modules (`code_paths.DriverCode`), installed by each worker
        before it reads the job; `kind` names the job in a worker's error."""
        import ray

        job = Job(id=uuid.uuid4().hex[:12], job_kind=JobKind(kind), payload=payload, data=data_ref, code=code)
        posted = ray.get(self.sink.post_job.remote(job, max_failures))
        if not posted.posted:
            self.closing = True  # the board closed by itself: this group is on its way out
            return None
        for cause in posted.idle_failures:
            logger.warning("A worker of the group was lost since the last call (%s); Ray Train replaced it.",
                           cause)
        return job.id

    def close(self, wait: bool = True):
        """Release the workers: the board closes, each rank's worker function returns, Ray Train releases the
        group and the fit thread removes the sink. `wait`: until all of that is done. A group still running
        a job (abandoned by the driver) is aborted."""
        import ray

        if not self.of_this_ray():  # its Ray is gone, and its actors with it: nothing to release or wait for
            self.closing = True
            return
        if not self._thread.is_alive() or not ray.is_initialized():
            self.closing = True
            self._kill_sink()
            return
        self.closing = True
        try:
            running = ray.get(self.sink.close_board.remote(), timeout=10)
        except Exception:  # noqa: BLE001 (a dead sink: the group is going anyway)
            running = True
        if running:
            self._abort()
        if wait:
            self.join(CLOSE_TIMEOUT_S)

    def stop_now(self, graceful: bool = True):
        """Kill the controller and the sink without waiting (the driver exits; a running job is lost).
        `graceful=False`: without Ray Train's abort first (`_abort_gracefully`), when the whole Ray goes next."""
        self.closing = True
        self._abort(graceful)
        self._kill_sink()

    def join(self, timeout_s: float):
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._abort()
            self._thread.join(10)
        self._kill_sink()

    def _abort(self, graceful: bool = True):
        import ray

        if not ray.is_initialized():
            return
        try:
            if self._controller is None:
                self._controller = self.controller()
            if self._controller is not None:
                if graceful:
                    self._abort_gracefully()
                kill_and_wait(self._controller)  # its workers go with it; its placement group: _fit's error path
        except Exception:  # noqa: BLE001 (a dead sink or controller: nothing left to stop)
            pass

    def _abort_gracefully(self):
        """Ray Train's own abort (what its fit() does on Ctrl-C), before the kill: the group's request to Ray's
        AutoscalingCoordinator is cancelled and its placement group removed. Killed without it, the request
        outlives the group and holds its resources against the next elastic run (whose controller waits,
        spinning, ~3 minutes measured on the local cluster) or Ray Data pipeline until it expires (180 s). A
        controller that already finished returns at once; one that does not answer is killed anyway."""
        import ray

        try:
            ray.get(self._controller.abort.remote(), timeout=ABORT_TIMEOUT_S)
        except Exception:  # noqa: BLE001 (abort ends the actor: its answer may be the actor's death)
            pass

    def _remove_orphaned_placement_group(self):
        """After fit() raised: a controller that died (killed after an abort that did not answer, lost to an
        out-of-memory kill) left its worker group's placement group reserving the workers' CPUs for as long as
        this driver's Ray job runs. Removed here, as Ray Train's cleaner would (see `_group_trainer_class`); one
        that Ray Train removed itself is left alone."""
        import ray
        from ray._raylet import PlacementGroupID
        from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

        if not ray.is_initialized():  # after ray.shutdown(): its placement groups went with it (and a call would
            return  # start a new Ray)
        try:
            hex_id = ray.get(self.sink.placement_group.remote(), timeout=10)
            if hex_id is None:
                return  # no worker group was placed
            group = PlacementGroup(PlacementGroupID(bytes.fromhex(hex_id)))
            if placement_group_table(group).get("state") not in (None, "REMOVED"):
                remove_placement_group(group)
        except Exception:  # noqa: BLE001 (a dead sink, a Ray shut down: nothing this driver can still remove)
            logger.debug("Could not remove the placement group of a dead controller", exc_info=True)

    def controller(self):
        """Ray Train's controller actor of this group, once it has started (None before)."""
        import ray

        pickled = ray.get(self.sink.controller.remote(), timeout=10)
        return pickle.loads(pickled) if pickled is not None else None

    def _kill_sink(self):
        import ray

        if not ray.is_initialized():  # after ray.shutdown(): a Ray call here would start a new Ray
            return
        kill_and_wait(self.sink)
