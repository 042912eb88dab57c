"""Session-wide fixtures: one local Ray for the whole suite (start-up is paid once), a real S3 API on
loopback (moto server), and a guard that fails a test which leaks a torch process group."""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist

from tests.s3server import s3_bucket, s3_server  # noqa: F401  (fixtures)

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


# This Ray is one node: no node of it can be drained, so Ray Train's node-drain watcher (an actor started
# for every run, about 1 s of the ~13 s a worker group takes to start here) has nothing to watch. Preemption by
# SIGTERM does not use it; the multi-node tests (tests/cluster) run their drivers without this setting.
SINGLE_NODE = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray with 4 logical CPUs: two 1-CPU workers plus headroom, on a 2-core machine."""
    import ray

    from raytrainer.coordinator.cluster import connect

    if not ray.is_initialized():
        # address="local": always a new instance, never a cluster another test or script started here.
        ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="WARNING",
                 runtime_env={"env_vars": {"RAY_TRAIN_V2_ENABLED": "1", **SINGLE_NODE}})
    connect()  # reuses the running instance
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def no_leaked_process_group():
    yield
    # Each test's Trainers release their worker groups (a Trainer keeps one between calls): without waiting,
    # so the release overlaps the next test; a group start waits for it if it needs the CPUs.
    from raytrainer.coordinator import holders

    holders.release_all(wait=False)
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
