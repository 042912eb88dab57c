"""Session-wide fixtures: one local Ray for the whole suite (start-up is paid once), a real S3 API on
loopback (moto server), and a guard that fails a test which leaks a torch process group."""

from __future__ import annotations

import os
import sys

# Python's bytecode cache, on for this run and every process it starts (Ray's workers inherit the environment of
# the Ray started here, subprocess drivers this one's). A machine may set PYTHONDONTWRITEBYTECODE (these do):
# then every worker, sink and driver compiled raytrainer's and the tests' sources again, 0.3-0.9 CPU s for a
# process that imports the trainer and the worker's loop (2.9-3.4 CPU s against 2.5-2.6 with the cache). Set
# before the imports below compile raytrainer's modules.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from raytrainer.coordinator.cluster import EMBEDDED_SYSTEM_CONFIG  # noqa: E402
from tests.s3server import s3_bucket, s3_server  # noqa: E402, F401  (fixtures)
from tests.support import SESSION_CPUS  # noqa: E402

pytest_plugins = ("tests.group_starts",)  # the worker groups each test starts, summed at the end of the run

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Every Ray started here (the session's, embedded ones in drivers, `ray start` clusters) keeps idle worker
# processes, prestarts none for its first driver and records no Ray metrics, as raytrainer's embedded Ray does
# (coordinator/cluster.py, EMBEDDED_SYSTEM_CONFIG): Ray Data's passes reuse the processes instead of starting new ones
# (test_ray_data_two_cpus.py: 112 and 100 CPU s without, 74 with). And no process reports task events (the
# dashboard's task views, which no test reads): with the metrics, an idle Ray and 2-worker group used 0.153-0.157
# core with both, 0.106 without; the suite keeps about a dozen Ray processes alive at any time.
for _name, _value in EMBEDDED_SYSTEM_CONFIG.items():  # as Ray reads its variables: numbers, 0 for False
    os.environ.setdefault(f"RAY_{_name}", str(int(_value)))
os.environ.setdefault("RAY_task_events_report_interval_ms", "0")

# Torch in this process on one thread, as in every worker it is compared with: Ray gives a 1-CPU worker
# OMP_NUM_THREADS=1, torchrun gives each of its processes the same. The references computed here (transformers in
# one process, a script run in this process) are then computed at the worker's thread count: on some CPUs two
# threads round a reduction differently from one (GaLore's projection differed by 4.7e-05 on an AMD EPYC host).
# Set before any test imports torch's kernels; subprocess drivers inherit it through the environment.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)


# This Ray is one node: no node of it can be drained, so Ray Train's node-drain watcher (an actor started
# for every run, about 1 s of the ~13 s a worker group takes to start here) has nothing to watch. Preemption by
# SIGTERM does not use it; the multi-node tests (tests/integration/cluster) run their drivers without this setting.
SINGLE_NODE = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


SUBPROCESS_WORKERS = 2  # what a driver that joins the session's Ray asks for


# Tests that close the pool's groups (to check what close() leaves, or to give a later test of theirs fresh
# workers) run last, in this order: earlier, each close cost the next 2-worker test a group start. The
# several-Trainers test goes first: it takes the pool's idle 2- and 1-worker groups, which it leaves open.
CLOSING_POOL_LAST = ("tests/integration/test_worker_group.py::test_trainers_one_after_another",
                     "tests/integration/test_dynamic_modules.py", "tests/integration/test_worker_group.py")


# Two lanes. The README's test command (`python -m pytest`, no paths, no -m) runs the main lane; `python -m pytest
# -m e2e` the end-to-end lane, which .ci/run runs after it: every test that loses a process and checks the restart
# (a killed worker, a hung or preempted rank, a failed background write) or starts processes of its own (subprocess
# drivers, killed and rerun; a local multi-node cluster; a `ray job submit` head; a sweep whose trials start groups;
# benchmarks/gpu.py's smoke). Most of their time is worker-group starts (~17 CPU s each, ~40 of a run's ~45): both
# lanes together took 14-20 minutes on 2 cores (tests/README.md). The main lane keeps one killed worker's exact
# recovery, locally and on S3 (test_recovery.py), and a killed worker between calls (test_worker_group.py).
# Naming a file or a folder runs what it holds, of either lane. Listed by their cost, the largest first: each lane
# runs in two processes (pyproject's addopts: `-n 2`), a file at a time to whichever is free.
E2E = ("tests/integration/cluster/", "tests/tune/test_search.py", "tests/integration/test_ray_data_two_cpus.py",
       "tests/integration/test_ray_data.py::test_every_row_once_per_epoch_and_exact_after_a_kill",
       "tests/integration/test_resume.py", "tests/hosted/test_launch_on_ray.py",
       "tests/integration/test_reliability_storage.py", "tests/test_gpu_benchmark_smoke.py",
       "tests/integration/deploy/test_job_submit.py", "tests/integration/test_example_script.py",
       "tests/checkpoint/test_async_shards.py::test_a_failed_or_killed_background_write",
       "tests/integration/test_console.py::test_quick_start",
       "tests/integration/test_peft_resume.py::test_a_lora_run_restarted_after_a_killed_worker",
       "tests/integration/test_streaming.py::test_every_row_once_per_pass_exact_after_a_kill",
       "tests/integration/test_hang_watchdog.py::test_a_rank_stalled_in_a_callback_is_named_then_its_group_restarts",
       "tests/hosted/test_hang_on_ray.py::test_a_hung_rank_is_named_then_its_group_restarts",
       "tests/hosted/test_stops_on_ray.py::test_a_sigterm_to_a_worker_saves_at_the_next_exchange_step",
       "tests/integration/test_recovery.py::test_a_restart_removes_a_partial_checkpoint")
# Folders whose tests share a package-scoped fixture: one unit for the scheduler, or each process would start its
# own (the local multi-node cluster: a second one started beside the other process's work timed out, 2026-12-06).
ONE_UNIT = ("tests/integration/cluster/",)


def main_lane_only(config) -> bool:
    """The README's test command: no file, folder or -m named."""
    return config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.markexpr


# What makes a test slow (the `slow` marker, for `pytest -m "not slow"`): a Ray, a subprocess driver or a torchrun
# (everything in tests/integration/ and tests/hosted/ but its unit files, and any test that asks for the session's
# Ray), or a run of seconds in process (SLOW_IN_PROCESS, the unit files measured at 3 s or more a test).
SLOW_FIXTURES = ("ray_session", "join_session_ray")
SLOW_PATHS = ("tests/integration/", "tests/hosted/test_equivalence.py", "tests/hosted/test_launch_on_ray.py",
              "tests/hosted/test_api_on_ray.py", "tests/test_gpu_benchmark_smoke.py")
SLOW_IN_PROCESS = ("tests/preflight/test_launchers.py", "tests/seq2seq/test_summarization_script.py",
                   "tests/checkpoint/test_async_shards.py", "tests/strategy/test_precision.py",
                   "tests/test_seq2seq_trainer.py", "tests/storage/test_probe.py",
                   "tests/checkpoint/test_storage_faults.py", "tests/worker/test_memory.py",
                   "tests/arguments/test_transformers_behaviour.py", "tests/arguments/test_scaling.py",
                   "tests/checkpoint/test_listing.py", "tests/test_lint.py", "tests/checkpoint/test_lease.py")


def is_slow(item) -> bool:
    return (item.nodeid.startswith(SLOW_PATHS + SLOW_IN_PROCESS)
            or any(name in SLOW_FIXTURES for name in getattr(item, "fixturenames", ())))


def e2e_index(item) -> int:
    """The item's place in E2E, -1 for the main lane's."""
    return next((i for i, prefix in enumerate(E2E) if item.nodeid.startswith(prefix)), -1)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_slow(item):
            item.add_marker(pytest.mark.slow)
        if e2e_index(item) >= 0:
            item.add_marker(pytest.mark.e2e)
    if main_lane_only(config):
        e2e = [item for item in items if e2e_index(item) >= 0]
        if e2e:
            config.hook.pytest_deselected(items=e2e)
            items[:] = [item for item in items if e2e_index(item) < 0]

    def place(item) -> tuple:
        e2e = e2e_index(item)
        if e2e >= 0:  # the largest first, so that the two processes end together
            return (0, e2e)
        last = [i for i, prefix in enumerate(CLOSING_POOL_LAST) if item.nodeid.startswith(prefix)]
        return (2, last[0]) if last else (1, 0)

    items.sort(key=place)  # a stable sort: within each place the tests keep their order


def pytest_report_collectionfinish(config, items):
    if main_lane_only(config):
        return "the main lane; the end-to-end lane: python -m pytest -m e2e (tests/conftest.py, E2E)"


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: without it (or with -n 0) one process runs all
def pytest_xdist_make_scheduler(config, log):
    """Each test file (or ONE_UNIT folder) goes whole to whichever of the two processes is free (its tests share
    its fixtures and that process's pool), in the order above. (xdist's own `--dist loadfile` orders files its own
    way, and its `loadgroup` marks do not reach its scheduler under pytest 9.2, which renamed the node attribute it
    uses.)"""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # xdist would put the files with most tests first

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return next((folder for folder in ONE_UNIT if nodeid.startswith(folder)), nodeid.split("::")[0])

    return ByFile(config, log)


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray with SESSION_CPUS logical CPUs, for the whole suite."""
    import ray

    from raytrainer.coordinator.cluster import connect

    if not ray.is_initialized():
        # address="local": always a new instance, never a cluster another test or script started here. Without
        # a dashboard, as the Ray raytrainer starts (coordinator/cluster.py).
        ray.init(address="local", num_cpus=SESSION_CPUS, include_dashboard=False, logging_level="WARNING",
                 runtime_env={"env_vars": {"RAY_TRAIN_V2_ENABLED": "1", **SINGLE_NODE}})
    connect()  # reuses the running instance
    yield ray
    from raytrainer.coordinator import holders

    holders.release_all(wait=True)  # before Ray goes: a group's fit() thread must not outlive it
    ray.shutdown()


@pytest.fixture
def join_session_ray(ray_session):
    """The environment for a driver in a subprocess that joins the session's Ray (as a script does a running
    cluster) instead of starting one of its own: ~5 s of start and a few of exit saved per driver. Only for
    tests that are not about the embedded start (test_console and the first run_clm-shaped run keep theirs)."""
    holders = sys.modules.get("raytrainer.coordinator.holders")
    if holders is not None and ray_session.available_resources().get("CPU", 0) < SUBPROCESS_WORKERS:
        for group in holders.idle_groups():  # the driver's 2 workers would wait for them forever
            holders.release(group, wait=True)
    env = {k: v for k, v in os.environ.items() if k != "RAYTRAINER_VERBOSE"}
    # The session's Ray is one node: its drivers' groups need no node-drain watcher (connect() passes the switch on
    # to Ray Train's controller, as for a cluster a user joins).
    env.update(RAY_ADDRESS=ray_session.get_runtime_context().gcs_address, **SINGLE_NODE)
    return env


@pytest.fixture(autouse=True)
def worker_groups():
    """Worker groups are shared between tests as a script's Trainers share them (coordinator/holders.py): a
    test that needs "2 workers" takes the idle group an earlier test left, instead of paying a group start
    (~10 s here). A test that kills workers or closes groups names the actors of its own groups
    (test_worker_group.ActorsOf) rather than asking for an empty pool. After any test, groups that no later
    test can take are released: one that failed, or that a call still holds."""
    yield
    holders = sys.modules.get("raytrainer.coordinator.holders")  # not imported yet: no group exists
    for group in list(holders.live_groups() if holders is not None else []):
        if group.closing:
            continue  # on its way out already
        if group.busy or not group.alive or group.error is not None:
            holders.release(group, wait=False)  # without waiting: the release overlaps the next test


@pytest.fixture(autouse=True)
def no_leaked_process_group():
    yield
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        pytest.fail("the test left a torch.distributed process group initialised")


@pytest.fixture(params=["local", "s3"])
def output_url(request, tmp_path):
    """(output_dir, storage_options) on a local directory and on S3 (moto on loopback)."""
    if request.param == "local":
        return str(tmp_path / "run"), None
    bucket = request.getfixturevalue("s3_bucket")
    return bucket + "/run", dict(request.getfixturevalue("s3_server").storage_options)
