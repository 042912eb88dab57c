"""One local multi-node cluster (cluster/local_cluster.py) for the package's tests: a head without CPUs and
two 1-CPU worker nodes on loopback. Starting one costs ~15 s on 2 cores, so the tests share it; a test that
removes a node adds one back. Stopping it must leave none of its processes behind."""

import os
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
