"""KubeRay manifests (`k8s/`): valid against the published v1 CRD schemas, and holding what a raytrainer run
needs -- an elastic GPU worker group with autoscaling, S3 credentials from a Secret, token authentication on,
pod requests equal to the entrypoint's `resources_per_worker`, and an entrypoint the example itself parses."""

from __future__ import annotations

import json
import os
import re
import shlex

import pytest
import yaml

from tests.integration.deploy.manifests import (
    ROOT,
    documents,
    entrypoint_script_and_args,
    load_script,
    schema_errors,
    strict,
)

CRD_DIR = os.path.normpath(os.path.join(ROOT, "..", "shared", "kuberay-crds"))
CRD_FILES = {"RayJob": "ray.io_rayjobs.yaml", "RayCluster": "ray.io_rayclusters.yaml"}
MANIFESTS = ["k8s/rayjob.yaml", "k8s/raycluster.yaml", "k8s/secret.example.yaml"]
S3_SECRET = "raytrainer-s3"


@pytest.fixture(scope="session")
def crd_validators():
    """{kind: validator} from the v1 schemas, loaded once (about 1 MB of YAML each)."""
    import jsonschema

    missing = [name for name in CRD_FILES.values() if not os.path.isfile(os.path.join(CRD_DIR, name))]
    if missing:
        pytest.skip(f"KubeRay CRD schemas not found: {', '.join(os.path.join(CRD_DIR, m) for m in missing)} "
                    "(the CustomResourceDefinitions of ray-project/kuberay, ray-operator/config/crd/bases/, "
                    "expected in ../shared/kuberay-crds/ next to the repository)")
    validators = {}
    for kind, name in CRD_FILES.items():
        with open(os.path.join(CRD_DIR, name), encoding="utf-8") as f:
            crd = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        assert crd["spec"]["names"]["kind"] == kind
        validators[kind] = jsonschema.Draft7Validator(strict(v1["schema"]["openAPIV3Schema"]))
    return validators


def _objects(kind: str) -> list[dict]:
    return [doc for path in MANIFESTS for doc in documents(path) if doc["kind"] == kind]


def _rayjob() -> dict:
    (job,) = _objects("RayJob")
    return job


def _cluster_specs() -> list[tuple[str, dict]]:
    return [("RayJob", _rayjob()["spec"]["rayClusterSpec"])] + [("RayCluster", c["spec"]) for c in
                                                                 _objects("RayCluster")]


def _containers(cluster_spec: dict) -> list[dict]:
    groups = [cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def _gpu_group(cluster_spec: dict) -> dict:
    groups = [g for g in cluster_spec["workerGroupSpecs"]
              if any("nvidia.com/gpu" in c["resources"].get("limits", {}) for c in g["template"]["spec"]["containers"])]
    assert len(groups) == 1, "expected one GPU worker group"
    return groups[0]


def _entrypoint_args():
    script, argv = entrypoint_script_and_args(_rayjob()["spec"]["entrypoint"])
    model_args, args = load_script(script).build_parser().parse_args_into_dataclasses(argv)
    return script, args


# --------------------------------------------------------------------------- schema
def test_every_ray_object_validates_against_the_kuberay_v1_schema(crd_validators):
    objects = [doc for path in MANIFESTS for doc in documents(path)]
    assert {doc["kind"] for doc in objects} == {"RayJob", "RayCluster", "Secret"}
    for doc in objects:
        if doc["kind"] in crd_validators:
            assert doc["apiVersion"] == "ray.io/v1"
            assert schema_errors(crd_validators[doc["kind"]], doc) == [], doc["metadata"]["name"]


def test_the_schema_check_rejects_a_misspelt_field_and_a_wrong_type(crd_validators):
    job = _rayjob()
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["maxReplica"] = 4   # misspelt
    job["spec"]["shutdownAfterJobFinishes"] = "yes"                           # not a boolean
    errors = "\n".join(schema_errors(crd_validators["RayJob"], job))
    assert "'maxReplica' was unexpected" in errors and "'yes' is not of type 'boolean'" in errors


# --------------------------------------------------------------------------- what a run needs
def test_rayjob_runs_an_example_whose_own_parser_accepts_the_arguments():
    spec = _rayjob()["spec"]
    script, args = _entrypoint_args()
    assert os.path.isfile(os.path.join(ROOT, script)), script
    assert args.num_workers == 2 and args.output_dir.startswith("s3://")  # several pods: shared storage only
    assert spec["shutdownAfterJobFinishes"] is True
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert isinstance(runtime_env, dict) and runtime_env["env_vars"]["RAY_TRAIN_V2_ENABLED"] == "1"
    assert not any(k.startswith("AWS_") for k in runtime_env.get("env_vars", {}))  # credentials: Secret only


@pytest.mark.parametrize("kind, spec", _cluster_specs(), ids=lambda v: v if isinstance(v, str) else "")
def test_gpu_worker_group_is_elastic_and_autoscaled(kind, spec):
    group = _gpu_group(spec)
    assert spec["enableInTreeAutoscaling"] is True
    assert group["minReplicas"] < group["maxReplicas"]
    assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    if kind == "RayJob":
        assert _entrypoint_args()[1].num_workers <= group["maxReplicas"]  # one training worker per pod


@pytest.mark.parametrize("kind, spec", _cluster_specs(), ids=lambda v: v if isinstance(v, str) else "")
def test_pod_requests_match_resources_per_worker(kind, spec):
    per_worker = _entrypoint_args()[1].resources_per_worker
    assert per_worker and per_worker.get("GPU") == 1
    for container in _gpu_group(spec)["template"]["spec"]["containers"]:
        for which in ("requests", "limits"):
            res = container["resources"][which]
            assert float(res["cpu"]) == per_worker["CPU"], (kind, which)
            assert int(res["nvidia.com/gpu"]) == per_worker["GPU"], (kind, which)
    if kind == "RayJob":
        head = spec["headGroupSpec"]["rayStartParams"]
        assert head.get("num-cpus") == "0"  # no training worker may land on the CPU-only head


@pytest.mark.parametrize("kind, spec", _cluster_specs(), ids=lambda v: v if isinstance(v, str) else "")
def test_token_authentication_is_on(kind, spec):
    assert spec["authOptions"]["mode"] == "token"
    assert tuple(int(x) for x in spec["rayVersion"].split(".")[:2]) >= (2, 52)  # KubeRay needs it for authOptions
    for container in _containers(spec):
        env = {e["name"]: e for e in container.get("env", [])}
        assert env.get("RAY_AUTH_MODE", {}).get("value", "token") == "token"


@pytest.mark.parametrize("kind, spec", _cluster_specs(), ids=lambda v: v if isinstance(v, str) else "")
def test_s3_credentials_come_from_a_secret_never_inline(kind, spec):
    for container in _containers(spec):
        refs = [e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e]
        refs += [e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", [])
                 if "secretKeyRef" in e.get("valueFrom", {})]
        assert S3_SECRET in refs, container["name"]
        inline = [e["name"] for e in container.get("env", []) if e["name"].startswith("AWS_") and "value" in e]
        assert inline == [], container["name"]


def test_no_credential_is_written_in_any_manifest():
    text = "\n".join(open(os.path.join(ROOT, path), encoding="utf-8").read() for path in MANIFESTS)
    assert not re.search(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b", text)  # an AWS access key id
    (secret,) = _objects("Secret")
    assert secret["metadata"]["name"] == S3_SECRET
    values = {**secret.get("stringData", {}), **secret.get("data", {})}
    assert values["AWS_ACCESS_KEY_ID"] == values["AWS_SECRET_ACCESS_KEY"] == "REPLACE_ME"
    assert "auth_token" not in json.dumps(values)


# --------------------------------------------------------------------------- the hosted mode's RayJob
HOSTED = "k8s/rayjob-hosted.yaml"


def test_the_hosted_rayjob_validates_and_launches_a_script_whose_parser_accepts_its_arguments(crd_validators):
    """`raytrainer launch ... examples/hosted_sft.py ...`: the launcher's parser takes the options, the script's
    own parser its arguments, checkpoints go to S3 (several pods), and TRL reaches the workers."""
    from raytrainer.cli.commands import build_parser

    (job,) = [doc for doc in documents(HOSTED) if doc["kind"] == "RayJob"]
    assert schema_errors(crd_validators["RayJob"], job) == []
    words = shlex.split(job["spec"]["entrypoint"])
    assert words[0] == "raytrainer", words
    launched = build_parser().parse_args(words[1:])
    assert launched.command == "launch" and launched.num_workers == 2 and launched.max_failures >= 1
    assert os.path.isfile(os.path.join(ROOT, launched.script)), launched.script
    script_args, config = load_script(launched.script).build_parser().parse_args_into_dataclasses(
        launched.script_args)
    assert config.output_dir.startswith("s3://")
    runtime_env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])
    assert any(str(p).startswith("trl") for p in runtime_env.get("pip", []))
    gpu = _gpu_group(job["spec"]["rayClusterSpec"])
    limits = gpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert float(limits["nvidia.com/gpu"]) == launched.resources_per_worker["GPU"]
