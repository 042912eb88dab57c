"""One local multi-node cluster (cluster/local_cluster.py) for the package's tests: a head without CPUs and
two 1-CPU worker nodes on loopback. Starting one costs ~15 s on 2 cores, so the tests share it; a test that
removes a node adds one back. Stopping it must leave none of its processes behind."""

import json
import os
import subprocess
import sys

import pytest

from tests.support import ROOT

sys.path.insert(0, os.path.join(ROOT, "cluster"))
from local_cluster import LocalCluster, _group_alive  # noqa: E402


@pytest.fixture(scope="package")
def cluster(tmp_path_factory):
    local = LocalCluster(str(tmp_path_factory.mktemp("local-cluster")))
    try:
        local.start(workers=2, head_cpus=0, worker_cpus=1, resources={"spot": 1}, timeout_s=180)
        yield local
    finally:
        groups = local.process_groups()
        local.stop()
        assert groups and not any(_group_alive(g) for g in groups), "a process of the local cluster survived"


# A driver of its own asks Ray's AutoscalingCoordinator (the one Ray Train's elastic policy sizes its groups from)
# for every worker node's CPU at the top priority: what it is granted is what no other request holds.
_PROBE = """
import json, ray
from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
    ResourceRequestPriority, get_or_create_autoscaling_coordinator)
ray.init(logging_level="ERROR")
coordinator = get_or_create_autoscaling_coordinator()
ray.get(coordinator.request_resources.remote(requester_id="probe", resources=[{"CPU": 1}] * %d, expire_after_s=30,
                                             priority=ResourceRequestPriority.HIGH))
granted = ray.get(coordinator.get_reserved_resources.remote("probe", recompute=True))
ray.get(coordinator.cancel_request.remote("probe"))
print(json.dumps(sum(r.get("CPU", 0) for r in granted.values())))
"""


def unreserved_cpus(cluster, cpus: int) -> float:
    """How many of `cpus` worker CPUs Ray's AutoscalingCoordinator grants a new request now (Ray 2.60's
    internal API, as raytrainer's elastic runs use it through Ray Train)."""
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "RAY_AUTH_MODE": "token"}
    out = subprocess.run([sys.executable, "-c", _PROBE % cpus], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
