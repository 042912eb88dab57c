"""Connecting to Ray and checking, before any actor starts, that the requested workers can be placed."""

from __future__ import annotations

import logging
import math
import os
import sys
from typing import Dict, Tuple

from ..arguments.scaling import Workers, bounds
from ..data import ray_data
from ..errors import ConfigError
from ..verbosity import filter_forwarded_logs, quiet_driver


def connect(address: str | None = None):
    """Use RAY_ADDRESS / `address`, else a running local cluster, else start an embedded one.

    An already initialised Ray (a notebook, a test session, `ray job submit`) is reused as it is.
    """
    import ray

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    if ray.is_initialized():
        filter_forwarded_logs()
        return
    # Workers of an embedded Ray inherit this environment: let them import what the driver imports
    # (the script's folder and the current directory), so models defined in user modules unpickle there.
    paths = [os.getcwd()] + _script_folder()
    existing = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths + ([existing] if existing else [])))
    address = address or os.environ.get("RAY_ADDRESS") or _running_local_cluster()
    quiet_driver()
    env_vars, started = {"RAY_TRAIN_V2_ENABLED": "1"}, {}
    if address == "local":  # a new Ray
        started = {"_system_config": embedded_system_config(), "include_dashboard": dashboard_wanted()}
        # One node, which nothing drains: Ray Train's node-drain watcher (an actor per group start) has nothing
        # to watch. Preemption by SIGTERM does not use it. A value the user set is kept.
        env_vars[PREEMPTION_WATCHER_ENV] = os.environ.get(PREEMPTION_WATCHER_ENV, "0")
    elif os.environ.get(PREEMPTION_WATCHER_ENV):  # a cluster joined: Ray Train reads the watcher's switch in
        env_vars[PREEMPTION_WATCHER_ENV] = os.environ[PREEMPTION_WATCHER_ENV]  # the controller, not here
    # Under `ray job submit` (and KubeRay's RayJob) Ray merges the job's runtime env with ours and refuses the
    # same variable named in both: the job's value is kept, ours left out.
    job_env = _job_env_vars()
    env_vars = {key: value for key, value in env_vars.items() if key not in job_env}
    context = ray.init(address=address, logging_level=logging.WARNING, runtime_env={"env_vars": env_vars},
                       **started)
    if started.get("include_dashboard") and context.dashboard_url:
        logging.getLogger("raytrainer").warning("Ray's dashboard: http://%s", context.dashboard_url)
    filter_forwarded_logs()


def _script_folder() -> list:
    """The folder of the script this process runs, for the workers' PYTHONPATH; none under `python -m
    raytrainer` (sys.argv[0] is raytrainer's own __main__.py: its folder on the path would make raytrainer's
    modules importable as top-level `data`, `state`, `trainer`, ... in every worker) or the `raytrainer`
    command (a folder of executables). `raytrainer launch` ships the launched script's own folder itself."""
    script = os.path.abspath(sys.argv[0] or ".")
    folder = os.path.dirname(script)
    own_package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if folder == own_package or os.path.basename(script) == "raytrainer":
        return []
    return [folder]


# What the Ray raytrainer starts changes of Ray's defaults (`ray.init(_system_config=...)`), each unless the user
# set Ray's own variable for it (RAY_<name>, which Ray then reads itself):
# - idle_worker_killing_time_threshold_ms: Ray kills a worker process idle this long once more are idle than it
#   keeps (its soft limit, about one per free CPU): 1 s by default. Ray Data's tasks (every pass over a dataset:
#   each epoch, the driver's two-row sample) run in such processes, and each new one imports Ray Data, pyarrow
#   and pandas (about 2 CPU seconds) before its first block. On a machine of few CPUs, where the training workers
#   hold most of them, the next epoch's pass found its processes gone and started them again: its first step
#   took 7.1 s against 3.2 s with them kept 30 s (a 2-CPU Ray, 2 workers; tests/integration/ray_data_two_cpus.py).
#   An idle one costs about 0.01 core.
# - enable_metrics_collection: every Ray process records and exports Ray's own metrics (for Prometheus) to the
#   node's agent. Nothing of raytrainer reads them (its metrics go through its own event sink), and an idle Ray
#   with a 2-worker group used 0.153-0.157 core with them against 0.123-0.137 without, on a machine where each
#   core is the training's.
# - prestart_worker_first_driver: Ray starts one idle worker process per CPU for the first driver. raytrainer's
#   actors (the worker group's, Ray Train's, the event sink) carry a runtime env of their own and start their own
#   processes, so the prestarted ones idled until killed, 30 s later (above): 2 CPU s more per Ray start and group
#   (30 against 32 s of the whole machine's CPU for a start, a 2-worker launch and its end, 3 runs each), and two
#   processes waking 150 times a second beside the training's first 30 s, which cost a 2-rank step on 2 cores
#   about 1.6 % (benchmarks/ray_share.py). The group's first call takes ~0.4 s longer without them.
EMBEDDED_SYSTEM_CONFIG = {"idle_worker_killing_time_threshold_ms": 30_000, "enable_metrics_collection": False,
                          "prestart_worker_first_driver": False}


def embedded_system_config() -> Dict[str, object]:
    """The `_system_config` of a Ray started here: EMBEDDED_SYSTEM_CONFIG less what the user set."""
    return {name: value for name, value in EMBEDDED_SYSTEM_CONFIG.items() if not os.environ.get(f"RAY_{name}")}


def _job_env_vars() -> dict:
    """The environment variables the submitted job's runtime env sets (none outside `ray job submit`)."""
    import json

    text = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not text:
        return {}
    try:
        runtime_env = json.loads(text).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return {}
    return dict(runtime_env.get("env_vars") or {}) if isinstance(runtime_env, dict) else {}


PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
# Ray's dashboard for a Ray started here: off unless RAYTRAINER_DASHBOARD=1. Nothing of raytrainer's or Ray
# Train's reads it (the placement-group cleaner of a Tune trial asks the GCS: cleaner.py), and it is 10 of an
# idle embedded Ray's 19 processes: 1.5 CPU s at each start (4.7-4.8 against 3.3 s over a start and its first
# 15 s, 2 runs each), 0.02-0.025 core while idle, and 1.6 % of a 2-rank hosted step on 2 cores by its
# wake-ups (benchmarks/ray_share.py). A cluster started with `ray start --head` keeps its own.
DASHBOARD_ENV = "RAYTRAINER_DASHBOARD"


def dashboard_wanted() -> bool:
    return os.environ.get(DASHBOARD_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def _running_local_cluster() -> str:
    """The cluster `ray start` left its address for on this machine, if it answers; else "local" (a new
    embedded Ray). Ray itself would try a stale address for a minute and fail: a cluster stopped without
    `ray stop` leaves its file behind."""
    import socket

    from ray._private.utils import read_ray_address

    found = read_ray_address()
    if found:
        host, _, port = found.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return found
        except (OSError, ValueError):
            pass
    return "local"


def worker_resources(options, use_gpu: bool) -> Dict[str, float]:
    """What one worker reserves, as Ray Train computes it (1 CPU, plus 1 GPU with use_gpu, by default), from
    the `resources_per_worker` of `options` (a `RunSpec`; preflight's checks pass `TrainingArguments`)."""
    resources = dict(options.resources_per_worker or {})
    if not resources:
        resources["CPU"] = 1
    if use_gpu:
        resources.setdefault("GPU", 1)
    return resources


def cluster_has_gpus() -> bool:
    import ray

    return ray.cluster_resources().get("GPU", 0) > 0


def check_placeable(num_workers: Workers, per_worker: Dict[str, float]):
    """Fail now, naming the missing resource, if `num_workers` (an elastic range: its minimum) can never be
    placed on this cluster as it is now. An elastic maximum above today's capacity is fine: the run grows
    when nodes join."""
    import ray

    needed = bounds(num_workers)[0]
    asked = f"num_workers={num_workers}" if isinstance(num_workers, int) else \
        f"num_workers={tuple(num_workers)} (at least {needed} to start)"

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    total = ray.cluster_resources()
    for name, amount in per_worker.items():
        if amount <= 0:
            continue
        biggest = max((n["Resources"].get(name, 0) for n in nodes), default=0)
        if biggest < amount:
            raise ConfigError(
                f"Each worker asks for {amount:g} {name} but no node of the cluster has that much (largest: "
                f"{biggest:g}). Lower resources_per_worker[{name!r}] or add a node with more {name}.")
        per_node = sum(int(n["Resources"].get(name, 0) // amount) for n in nodes)
        if per_node < needed:
            raise ConfigError(
                f"{asked} needs {needed * amount:g} {name} ({amount:g} per worker), but the cluster can place at "
                f"most {per_node} such workers ({total.get(name, 0):g} {name} in total). Lower num_workers, lower "
                f"resources_per_worker, or add nodes with {name}.")


# CPUs a run that reads a Ray Dataset leaves free of its workers at least (the pool's room check in dispatch.py):
# more than raytrainer's own Ray Data step asks (data/ray_data.py, OWN_TASK_CPUS).
DATA_CPU_HEADROOM = 0.5


def started_here() -> bool:
    """Whether this process started the Ray it is connected to (raytrainer's embedded Ray, or the one Ray Data
    or `ray.init()` started in this script), rather than a cluster the user brought (RAY_ADDRESS, `ray start`,
    `ray job submit`)."""
    try:
        from ray._private import worker  # Ray 2.60: the driver's node object; `head` only where it started one
    except ImportError:
        return False
    return bool(getattr(worker._global_node, "head", False))


def data_cpu_asks(datasets) -> Tuple[float, str]:
    """What the Ray Datasets' own steps need free besides the workers (the largest of them: one is read at a
    time), and the words that name it (`ray_data.cpu_asks`)."""
    return max((ray_data.cpu_asks(dataset) for dataset in datasets), default=(0.0, ""), key=lambda ask: ask[0])


def leave_cpus_for_data(args, use_gpu: bool, data_cpus: float = 0.0):
    """On a Ray this process started, a Ray Data run whose workers would not leave Ray Data a whole CPU (2 workers
    on a 2-core laptop: 0.75 CPU each left 0.5, and a map_batches at its default of 1 CPU waited forever) reserves
    less than a CPU per worker, so that Ray Data's tasks at their default, and `data_cpus` (what the dataset's
    steps ask: `data_cpu_asks`), get the rest. These are logical CPUs: every worker still computes on its core,
    and Ray Data's tasks share the cores with them. A cluster the user brought, or resources_per_worker set by
    the user, is left as it is (check_cpus_left_for_data then names the fix)."""
    import ray

    if args.resources_per_worker or not started_here():
        return
    total, workers = ray.cluster_resources().get("CPU", 0), args.max_workers
    keep = max(ray_data.DEFAULT_STEP_CPUS, data_cpus)  # a user's map_batches at its defaults runs too
    if total - workers >= keep:
        return
    share = _share(total, workers, keep)
    if share <= 0:
        return
    args.resources_per_worker = {"CPU": share, **({"GPU": 1} if use_gpu else {})}
    logging.getLogger("raytrainer").info(
        "A ray.data.Dataset on the %g CPUs of this process's Ray: each of the %d workers reserves %g CPU, which "
        "leaves %g for Ray Data's tasks.", total, workers, share, total - share * workers)


def _share(total: float, workers: int, keep: float) -> float:
    """The CPU per worker that leaves `keep` of `total` free, rounded down to a hundredth."""
    return math.floor((total - keep) / workers * 100) / 100


def check_cpus_left_for_data(num_workers: int, per_worker: Dict[str, float], data_cpus: float = 0.0,
                             asks: str = ""):
    """A Ray Dataset's map_batches/read tasks run on CPUs the training workers do not hold: with fewer left than
    its steps ask (`data_cpus`, named in `asks`) they would wait forever. Fail now, naming the fix."""
    import ray

    total = ray.cluster_resources().get("CPU", 0)
    taken = num_workers * per_worker.get("CPU", 0)
    need = max(data_cpus, ray_data.OWN_TASK_CPUS)
    if total - taken >= need:
        return
    share = _share(total, num_workers, need)
    fewer = f"resources_per_worker={{'CPU': {share:g}}}" if share > 0 else "resources_per_worker={'CPU': 0.5}"
    raise ConfigError(
        f"A ray.data.Dataset is read by {num_workers} workers holding {taken:g} of the cluster's {total:g} CPUs, "
        f"which leaves {max(total - taken, 0):g} for Ray Data's own tasks (map_batches, reads); they ask {need:g} "
        f"({asks or 'raytrainer padding the rows'}): the run would wait forever. Give the workers fewer CPUs "
        f"({fewer}), ask less in the dataset's steps (map_batches(..., num_cpus=0.5)), use fewer workers, or "
        "give Ray more CPUs (ray.init(num_cpus=...) before building the dataset, or add a node).")


def alive_node_count() -> int:
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive"))


def workers_may_be_elsewhere() -> bool:
    """Whether a worker may run on a machine that does not see the driver's files: the cluster has several
    nodes, or this driver is a Ray Client (ray://) outside it."""
    import ray

    try:
        client = ray.util.client.ray.is_connected()
    except AttributeError:
        client = False
    return client or alive_node_count() > 1
