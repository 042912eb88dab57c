"""`module:function` references of a `raytrainer train` config (raytrainer/cli/config_refs.py), resolved on the
driver: built objects called with their kwargs, the rest bound with functools.partial, a Trainer subclass used,
the current directory on the import path; every reference that cannot be had is refused naming the config key,
the reference and why, before the model is built. The whole command: tests/integration/deploy/test_cli_train.py."""

from __future__ import annotations

import functools
import hashlib
import sys

import pytest

from raytrainer import Trainer
from raytrainer.cli.config_refs import TrainReferences, resolve
from raytrainer.errors import ConfigError

PROJECT = '''
import torch

from raytrainer import Trainer

BUILT = []


def build_model(width=4):
    BUILT.append(width)
    return torch.nn.Linear(width, 2)


def rows(n):
    return [{"x": [float(i)] * 4} for i in range(n)]


def collate(samples, scale=1.0):
    return samples


class MyTrainer(Trainer):
    pass


NOT_CALLABLE = 3
'''


@pytest.fixture
def project(tmp_path, monkeypatch, request):
    """A project folder, the current directory, with its own module (a name of its own per test)."""
    name = f"refs_project_{hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]}"
    (tmp_path / f"{name}.py").write_text(PROJECT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # resolve() puts the current directory first
    yield name
    sys.modules.pop(name, None)


def test_built_objects_are_called_the_rest_bound_and_a_trainer_subclass_used(project):
    refs = TrainReferences(model={"ref": f"{project}:build_model", "kwargs": {"width": 8}},
                           train_dataset={"ref": f"{project}:rows", "kwargs": {"n": 3}},
                           data_collator={"ref": f"{project}:collate", "kwargs": {"scale": 2.0}},
                           trainer_class=f"{project}:MyTrainer")
    trainer_class, kwargs = resolve(refs)
    module = sys.modules[project]
    assert trainer_class is module.MyTrainer and issubclass(trainer_class, Trainer)
    assert kwargs["model"].in_features == 8 and module.BUILT == [8]
    assert kwargs["train_dataset"] == module.rows(3)
    collator = kwargs["data_collator"]
    assert isinstance(collator, functools.partial) and collator.func is module.collate
    assert collator.keywords == {"scale": 2.0}
    assert resolve(TrainReferences(model_init=f"{project}:build_model"))[1] == {"model_init": module.build_model}


@pytest.mark.parametrize("given, message", [
    (dict(model="build_model"), r"model='build_model' is not a reference: write 'package.module:function'"),
    (dict(model={"reff": "m:f"}), r"model: a mapping reference takes the keys 'ref' \(required\) and 'kwargs'"),
    (dict(model={"ref": "{p}:build_model", "kwargs": [8]}), r"model: kwargs must be a mapping"),
    (dict(model="no_such_module_of_refs:f"), r"model: cannot import module 'no_such_module_of_refs'.*"
                                              r"Run from the folder that holds 'no_such_module_of_refs'"),
    (dict(model="{p}:missing"), r"model: '{p}:missing': '{p}' has no attribute 'missing'"),
    (dict(model="{p}:NOT_CALLABLE"), r"model: '{p}:NOT_CALLABLE' is a int, not a function or class"),
    (dict(model={"ref": "{p}:build_model", "kwargs": {"depth": 2}}), r"model: kwargs \{'depth': 2\} do not fit"),
    (dict(model="{p}:build_model", trainer_class="{p}:build_model"), r"trainer_class: .* must be a subclass"),
    (dict(data_collator="{p}:collate"), r"The config names no model"),
])
def test_a_reference_that_cannot_be_had_is_refused_naming_key_reference_and_why(project, given, message):
    def filled(value):
        if isinstance(value, dict):
            return {k: filled(v) for k, v in value.items()}
        return value.replace("{p}", project) if isinstance(value, str) else value

    with pytest.raises(ConfigError, match=message.replace("{p}", project)):
        resolve(TrainReferences(**{k: filled(v) for k, v in given.items()}))
    assert sys.modules.get(project) is None or sys.modules[project].BUILT == []  # refused before any build


def test_every_reference_is_checked_before_the_model_is_built(project):
    with pytest.raises(ConfigError, match="compute_metrics"):
        resolve(TrainReferences(model=f"{project}:build_model", compute_metrics=f"{project}:missing"))
    assert sys.modules[project].BUILT == []
