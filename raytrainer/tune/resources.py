"""What a trial holds, and how many trials the cluster runs at once.

A trial is two things in Ray: Tune's trial actor (the run's driver: it holds `resources_per_trial`, nothing by
default) and the worker group its `train()` places itself (`num_workers` x `resources_per_worker`, a placement
group of Ray Train's own, not inside Tune's). Tune only sees the first: with a trial actor of 0 CPU it would
start every trial at once, and their worker groups would wait on each other for the CPUs. So the sweep runs at
most as many trials at once as the cluster can place worker groups for, unless `max_concurrent_trials` says
otherwise; and a trial that can never be placed fails here, before any trial starts.
"""

from __future__ import annotations

from typing import Dict, Optional

from ..arguments.scaling import bounds
from ..coordinator import cluster
from ..coordinator.spec import decide_use_gpu
from ..errors import ConfigError
from .options import TRIAL_ACTOR


def trial_actor(args, resources_per_trial: Optional[Dict[str, float]]) -> Dict[str, float]:
    """What Tune places for the trial's actor: `resources_per_trial` as given; by default nothing but 1 MiB of
    memory (options.TRIAL_ACTOR), or one CPU for a trial with num_workers=0, which trains in that actor."""
    if resources_per_trial:
        return dict(resources_per_trial)
    return {"cpu": 1} if args.max_workers == 0 else dict(TRIAL_ACTOR)


def group_needs(args) -> Dict[str, float]:
    """What one trial's worker group reserves to start (an elastic range: its minimum), in Ray's names."""
    use_gpu = decide_use_gpu(args.use_gpu, args.max_workers)
    per_worker = cluster.worker_resources(args, use_gpu)
    workers = bounds(args.num_workers)[0] if args.max_workers else 0
    return {name: amount * workers for name, amount in per_worker.items() if amount > 0}


def ray_names(resources: Dict[str, float]) -> Dict[str, float]:
    """Tune's spelling of `resources_per_trial` ("cpu", "gpu") in Ray's resource names ("CPU", "GPU")."""
    names = {"cpu": "CPU", "gpu": "GPU", "memory": "memory"}
    return {names.get(k, k): float(v) for k, v in resources.items() if not isinstance(v, dict)}


def trial_needs(args, resources_per_trial: Dict[str, float]) -> Dict[str, float]:
    need = dict(group_needs(args))
    for name, amount in ray_names(resources_per_trial).items():
        need[name] = need.get(name, 0.0) + amount
    return need


def check_trial_placeable(args, resources_per_trial: Dict[str, float], totals: Dict[str, float]):
    """A trial (its actor and its worker group) must fit the cluster as it is, or no trial would ever start."""
    if "gpu" in resources_per_trial or "GPU" in resources_per_trial:
        raise ConfigError("resources_per_trial asks for GPUs for the trial's actor, which only drives the run: the "
                          "workers' GPUs come from the arguments (num_workers, use_gpu, resources_per_worker). "
                          "Leave GPUs out of resources_per_trial.")
    for name, amount in trial_needs(args, resources_per_trial).items():
        if totals.get(name, 0.0) + 1e-9 < amount:
            raise ConfigError(f"One trial needs {amount:g} {name} (its worker group {group_needs(args)} and its "
                              f"actor's resources_per_trial={resources_per_trial}), but the cluster has "
                              f"{totals.get(name, 0.0):g}. Lower num_workers or resources_per_trial, or add nodes.")


def default_concurrency(args, resources_per_trial: Dict[str, float], totals: Dict[str, float]) -> int:
    """How many trials the cluster's resources place at once (at least 1)."""
    fits = [int((totals.get(name, 0.0) + 1e-9) // amount)
            for name, amount in trial_needs(args, resources_per_trial).items() if amount > 0]
    return max(1, min(fits)) if fits else 1
