"""Finding the Ray to join: a cluster `ray start` left its address for is joined only if it answers; a
stale address (a cluster killed without `ray stop`) must not make the driver wait for a dead GCS."""

import socket

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
