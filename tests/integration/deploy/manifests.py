"""Helpers shared by the deployment tests: the repository root, YAML documents, strict JSON schemas."""

from __future__ import annotations

import copy
import importlib.util
import os
import shlex

import yaml

from tests.support import ROOT


def documents(relpath: str) -> list[dict]:
    with open(os.path.join(ROOT, relpath), encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def strict(schema: dict) -> dict:
    """The schema with unknown fields rejected, as `kubectl apply` (strict field validation) does.

    CRD schemas leave `additionalProperties` unset, so plain JSON-schema validation would accept a misspelt
    field that Kubernetes refuses (or silently drops). Objects that declare `properties` and do not opt into
    unknown fields get `additionalProperties: false`.
    """
    schema = copy.deepcopy(schema)
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return schema


def schema_errors(validator, obj) -> list[str]:
    return sorted(f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(obj))


def entrypoint_script_and_args(entrypoint: str) -> tuple[str, list[str]]:
    """`python examples/X.py --a b ...` -> (examples/X.py, ['--a', 'b', ...])."""
    words = shlex.split(entrypoint)
    assert words[0] in ("python", "python3") and words[1].endswith(".py"), f"not `python SCRIPT ...`: {entrypoint}"
    return words[1], words[2:]


def load_script(relpath: str):
    """Import an example by its path, as `python examples/X.py` would find it."""
    path = os.path.join(ROOT, relpath)
    spec = importlib.util.spec_from_file_location(f"_entrypoint_{os.path.basename(path)[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
