"""`RunSpec`: everything the coordinator reads of a run, decided once on the driver before any actor starts.

`Trainer` builds one from its `TrainingArguments` (`RunSpec.of_arguments`), the hosted mode from its options
(hosting/options.py, `HostedOptions.run_spec`); dispatch, the pool, a worker group and the pump read this and
nothing else of the caller's configuration. Whether the workers get GPUs is decided here, once, for both
(`decide_use_gpu`). A new option the coordinator reads is a field here, set by those two builders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from ..arguments.scaling import WorkerRange, Workers
from ..verbosity import ray_train_log_level
from . import cluster


@dataclass(frozen=True)
class RunSpec(WorkerRange):
    """`num_workers`: an int, or (min, max) for an elastic run (0: in the driver process, without a group);
    `resources_per_worker`: Ray's resources of one worker (None: 1 CPU, plus a GPU with `use_gpu`);
    `max_failures` / `max_preemptions`: restarts of a job before it fails (-1: no limit);
    `elastic_resize_monitor_interval_s`: how often Ray Train looks for room to resize an elastic group;
    `worker_idle_timeout_s`: an idle group's life; `ddp_timeout`: the process group's collective timeout (s);
    `ray_address`: the cluster to join; `run_name`: names the groups; `storage_options`: fsspec's, for the run's
    URLs; `ray_train_log_level`: Ray Train's logging (DEBUG when verbose). The defaults are
    `TrainingArguments`' (tests/coordinator/test_spec.py)."""
    num_workers: Workers
    use_gpu: bool
    resources_per_worker: Optional[Dict[str, float]] = None
    max_failures: int = 0
    max_preemptions: int = -1
    elastic_resize_monitor_interval_s: float = 60.0
    worker_idle_timeout_s: float = 300.0
    ddp_timeout: int = 1800
    ray_address: Optional[str] = None
    run_name: Optional[str] = None
    storage_options: Optional[Dict[str, Any]] = None
    ray_train_log_level: str = "WARNING"

    @classmethod
    def of_arguments(cls, args, use_gpu: bool, **overrides: Any) -> "RunSpec":
        """From raytrainer's `TrainingArguments` (or an object with the same fields: hosting/options.py)."""
        fields = dict(num_workers=args.num_workers, use_gpu=use_gpu,
                      resources_per_worker=dict(args.resources_per_worker) if args.resources_per_worker else None,
                      max_failures=args.max_failures, max_preemptions=args.max_preemptions,
                      elastic_resize_monitor_interval_s=args.elastic_resize_monitor_interval_s,
                      worker_idle_timeout_s=args.worker_idle_timeout_s, ddp_timeout=args.ddp_timeout,
                      ray_address=args.ray_address, run_name=args.run_name, storage_options=args.storage_options,
                      ray_train_log_level=ray_train_log_level(args))
        return cls(**{**fields, **overrides})

    @property
    def in_process(self) -> bool:
        """num_workers=0: the job runs in the driver process, without a worker group."""
        return self.max_workers == 0

    def per_worker(self) -> Dict[str, float]:
        """What one worker reserves (`cluster.worker_resources`)."""
        return cluster.worker_resources(self, self.use_gpu)


def decide_use_gpu(use_gpu: Optional[bool], max_workers: int, in_process_default: bool = False) -> bool:
    """Whether the workers get GPUs, from the `use_gpu` option: as it says when set (in this process only where
    CUDA is there); None: the cluster's GPUs (Ray connected), or for num_workers=0 `in_process_default` and
    CUDA here. raytrainer's Trainer trains here on CUDA only when asked (`TrainingArguments.device`, docs/
    arguments.md); a hosted script does where it would by itself (HF picks CUDA when it is there)."""
    if max_workers == 0:
        import torch

        wanted = in_process_default if use_gpu is None else bool(use_gpu)
        return wanted and torch.cuda.is_available()
    return cluster.cluster_has_gpus() if use_gpu is None else bool(use_gpu)
