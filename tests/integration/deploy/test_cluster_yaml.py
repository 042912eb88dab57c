"""`cluster/gpu-cluster.yaml` (Ray cluster launcher): valid against the schema Ray ships, a GPU worker type with
a min/max range, the project installed on every node, and token authentication on every node."""

from __future__ import annotations

import json
import os

import pytest

from tests.integration.deploy.manifests import documents, schema_errors

CONFIG = "cluster/gpu-cluster.yaml"


@pytest.fixture(scope="module")
def ray_schema_validator():
    import jsonschema
    import ray.autoscaler

    path = os.path.join(os.path.dirname(ray.autoscaler.__file__), "ray-schema.json")
    with open(path, encoding="utf-8") as f:
        return jsonschema.Draft7Validator(json.load(f))


@pytest.fixture
def config() -> dict:
    (doc,) = documents(CONFIG)
    return doc


def test_validates_against_rays_cluster_schema(ray_schema_validator, config):
    assert schema_errors(ray_schema_validator, config) == []
    config["max_worker"] = 3  # the schema refuses unknown keys: the check can fail
    assert any("'max_worker' was unexpected" in e for e in schema_errors(ray_schema_validator, config))


def test_head_plus_an_elastic_gpu_worker_type(config):
    types = config["available_node_types"]
    assert config["head_node_type"] in types
    (gpu,) = [t for name, t in types.items() if t["resources"].get("GPU", 0) >= 1]
    assert 0 < gpu["min_workers"] < gpu["max_workers"] <= config["max_workers"]


def test_every_node_installs_the_project(config):
    commands = " && ".join(config["setup_commands"])
    assert "pip install" in commands and "raytrainer" in commands
    assert "~/raytrainer" in config["file_mounts"]  # what the setup commands install


def test_token_authentication_on_every_node(config):
    starts = config["head_start_ray_commands"] + config["worker_start_ray_commands"]
    ray_starts = [c for c in starts if "ray start" in c]
    assert len(ray_starts) == 2 and all("RAY_AUTH_MODE=token" in c for c in ray_starts)
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"  # one token for all nodes
    assert "RAY_AUTH_MODE=disabled" not in json.dumps(config)
