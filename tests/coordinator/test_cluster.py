"""Finding the Ray to join: a cluster `ray start` left its address for is joined only if it answers; a
stale address (a cluster killed without `ray stop`) must not make the driver wait for a dead GCS."""

import socket
from types import SimpleNamespace

import pytest
import ray._private.utils

from raytrainer.coordinator.cluster import _running_local_cluster
from tests.support import free_port


def test_a_stale_cluster_address_starts_a_new_local_ray(monkeypatch):
    port = free_port()  # nothing listens there
    monkeypatch.setattr(ray._private.utils, "read_ray_address", lambda *a: f"127.0.0.1:{port}")
    assert _running_local_cluster() == "local"


def test_a_live_cluster_address_is_joined(monkeypatch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        address = "127.0.0.1:%d" % server.getsockname()[1]
        monkeypatch.setattr(ray._private.utils, "read_ray_address", lambda *a: address)
        assert _running_local_cluster() == address


def test_no_address_file_starts_a_new_local_ray(monkeypatch):
    monkeypatch.setattr(ray._private.utils, "read_ray_address", lambda *a: None)
    assert _running_local_cluster() == "local"


@pytest.fixture
def ray_init_seen(monkeypatch):
    """What connect() passes to ray.init (recorded, not called): Ray looks uninitialised."""
    import ray

    from raytrainer.coordinator import cluster

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs) or SimpleNamespace(dashboard_url=None))
    monkeypatch.setattr(cluster, "filter_forwarded_logs", lambda: None)
    monkeypatch.setattr(cluster, "quiet_driver", lambda: None)
    monkeypatch.setenv("PYTHONPATH", "")
    return seen


def test_an_embedded_ray_starts_without_its_dashboard_unless_the_user_asks(monkeypatch, ray_init_seen):
    """Nothing of raytrainer's reads the dashboard (Tune trials' placement-group cleaner asks the GCS:
    cleaner.py): the Ray raytrainer starts leaves it out unless RAYTRAINER_DASHBOARD=1; a joined cluster keeps
    what it has (a driver that joins starts no dashboard either way)."""
    from raytrainer.coordinator import cluster

    seen = ray_init_seen
    monkeypatch.delenv(cluster.DASHBOARD_ENV, raising=False)
    cluster.connect("local")
    assert seen["include_dashboard"] is False
    monkeypatch.setenv(cluster.DASHBOARD_ENV, "1")
    cluster.connect("local")
    assert seen["include_dashboard"] is True
    seen.clear()
    cluster.connect("127.0.0.1:6379")
    assert seen["address"] == "127.0.0.1:6379" and "include_dashboard" not in seen


def test_an_embedded_ray_runs_no_node_drain_watcher_unless_the_user_asks(monkeypatch, ray_init_seen):
    """One node that nothing drains: Ray Train's PreemptionWatcher actor (started with every group) is left out
    of the Ray raytrainer starts; a cluster keeps Ray's default, and a value the user set is kept, and reaches
    a joined cluster's controller too (Ray Train reads it there, not in the driver)."""
    from raytrainer.coordinator import cluster

    seen = ray_init_seen
    monkeypatch.delenv(cluster.PREEMPTION_WATCHER_ENV, raising=False)
    cluster.connect("local")
    assert seen["runtime_env"]["env_vars"][cluster.PREEMPTION_WATCHER_ENV] == "0"
    cluster.connect("127.0.0.1:6379")
    assert cluster.PREEMPTION_WATCHER_ENV not in seen["runtime_env"]["env_vars"]
    monkeypatch.setenv(cluster.PREEMPTION_WATCHER_ENV, "1")
    cluster.connect("local")
    assert seen["runtime_env"]["env_vars"][cluster.PREEMPTION_WATCHER_ENV] == "1"
    monkeypatch.setenv(cluster.PREEMPTION_WATCHER_ENV, "0")
    cluster.connect("127.0.0.1:6379")
    assert seen["runtime_env"]["env_vars"][cluster.PREEMPTION_WATCHER_ENV] == "0"


def test_an_embedded_ray_keeps_idle_worker_processes_and_records_no_ray_metrics_unless_the_user_says(
        monkeypatch, ray_init_seen):
    """Ray Data's next pass reuses the processes of the last one (Ray's default kills them after 1 s idle), and
    no Ray process records Ray's Prometheus metrics: set on the Ray raytrainer starts; a joined cluster keeps
    its own configuration (Ray accepts none from a driver that joins), and a Ray variable the user set for one of
    them is left to Ray."""
    from raytrainer.coordinator import cluster

    seen = ray_init_seen
    for name in cluster.EMBEDDED_SYSTEM_CONFIG:
        monkeypatch.delenv(f"RAY_{name}", raising=False)
    cluster.connect("local")
    assert seen["_system_config"] == {"idle_worker_killing_time_threshold_ms": 30_000,
                                      "enable_metrics_collection": False, "prestart_worker_first_driver": False}
    seen.clear()
    cluster.connect("127.0.0.1:6379")
    assert "_system_config" not in seen
    monkeypatch.setenv("RAY_idle_worker_killing_time_threshold_ms", "5000")
    cluster.connect("local")
    assert seen["_system_config"] == {"enable_metrics_collection": False, "prestart_worker_first_driver": False}


def test_a_submitted_job_keeps_its_own_environment_variables(monkeypatch, ray_init_seen):
    """`ray job submit --runtime-env-json '{"env_vars": {"RAY_TRAIN_V2_ENABLED": "1"}}'` (and the k8s RayJob):
    Ray refuses a ray.init runtime env naming the same variable ("Failed to merge the Job's runtime env"), so
    connect() leaves the job's variables to the job."""
    import json

    from raytrainer.coordinator import cluster

    seen = ray_init_seen
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(
        {"runtime_env": {"env_vars": {"RAY_TRAIN_V2_ENABLED": "1", "HF_HOME": "/tmp/hf"}}}))
    monkeypatch.setenv(cluster.PREEMPTION_WATCHER_ENV, "1")
    cluster.connect("127.0.0.1:6379")
    assert seen["runtime_env"]["env_vars"] == {cluster.PREEMPTION_WATCHER_ENV: "1"}
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")
    cluster.connect("127.0.0.1:6379")
    assert seen["runtime_env"]["env_vars"]["RAY_TRAIN_V2_ENABLED"] == "1"


@pytest.mark.parametrize("argv0, folder_added", [("{tmp}/scripts/train.py", True), ("{pkg}/__main__.py", False),
                                                 ("{tmp}/bin/raytrainer", False)])
def test_the_workers_path_gets_the_scripts_folder_not_raytrainers_own(monkeypatch, ray_init_seen, tmp_path, argv0,
                                                                      folder_added):
    """A user's script's folder reaches the embedded Ray's workers (models defined beside it unpickle there);
    under `python -m raytrainer` the folder of sys.argv[0] is raytrainer's package, which on the workers' path
    would make its modules importable as top-level `data`, `state`, `trainer`; the `raytrainer` command's is a
    folder of executables."""
    import os
    import sys

    import raytrainer
    from raytrainer.coordinator import cluster

    script = argv0.format(tmp=tmp_path, pkg=os.path.dirname(raytrainer.__file__))
    monkeypatch.setattr(sys, "argv", [script, "launch"])
    monkeypatch.chdir(tmp_path)
    cluster.connect("127.0.0.1:6379")
    entries = os.environ["PYTHONPATH"].split(os.pathsep)
    assert entries[0] == str(tmp_path)
    assert (os.path.dirname(script) in entries) == folder_added
    assert os.path.dirname(raytrainer.__file__) not in entries
