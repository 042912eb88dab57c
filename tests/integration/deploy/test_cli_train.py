"""`raytrainer train CONFIG.yaml [--key value ...]`: trains and checkpoints what the config references; bad
references are a ConfigError (exit 2, no traceback) that names the reference and why, before anything is built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid

import pytest

from raytrainer.checkpoint.listing import list_checkpoints
from raytrainer.checkpoint.manifest import is_committed
from raytrainer.cli.commands import main
from tests.support import ROOT

TINY_LM = os.path.join(ROOT, "examples", "configs", "tiny_lm.yaml")
FAST = ["--max_steps", "6", "--save_steps", "3", "--eval_steps", "6", "--logging_steps", "3", "--disable_tqdm"]


@pytest.fixture
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # references resolve from the current directory, as on a cluster's working dir


def test_train_from_the_example_config_in_process(tmp_path, at_root):
    out = str(tmp_path / "run")
    assert main(["train", TINY_LM, "--num_workers", "0", "--output_dir", out, *FAST]) == 0
    infos = list_checkpoints(out)
    assert [(i.step, i.committed) for i in infos] == [(3, True), (6, True)]
    state = json.loads((tmp_path / "run" / "checkpoint-6" / "trainer_state.json").read_text())
    assert any("eval_accuracy" in e for e in state["log_history"])  # compute_metrics came from the config
    results = json.loads((tmp_path / "run" / "train_results.json").read_text())
    assert results["train_loss"] > 0 and (tmp_path / "run" / "model.safetensors").exists()


def test_train_with_two_ray_workers(tmp_path, at_root, ray_session):
    out = str(tmp_path / "run")
    assert main(["train", TINY_LM, "--num_workers", "2", "--output_dir", out, "--max_steps", "4",
                 "--save_steps", "4", "--eval_strategy", "no", "--disable_tqdm"]) == 0
    assert is_committed(os.path.join(out, "checkpoint-4"))


# --------------------------------------------------------------------------- bad input
@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """An importable module in the current directory whose model factory leaves a mark when it is called."""
    name = f"user_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""
        import torch
        BUILT = {str(tmp_path / 'built')!r}
        def model(width=4):
            open(BUILT, "w").close()
            return torch.nn.Linear(width, 1)
        def data():
            return [{{"x": torch.zeros(4), "labels": torch.zeros(1)}}] * 8
        NOT_CALLABLE = 3
    """))
    monkeypatch.chdir(tmp_path)
    yield name
    sys.modules.pop(name, None)


def _config(tmp_path, **refs) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"output_dir": str(tmp_path / "out"), "num_workers": 0, **refs}))
    return str(path.with_suffix(".yaml"))


@pytest.mark.parametrize("refs, expected", [
    ({"compute_metrics": "no_such_module_xyz:f"},
     "compute_metrics: cannot import module 'no_such_module_xyz' of 'no_such_module_xyz:f': ModuleNotFoundError"),
    ({"compute_metrics": "{mod}:missing"}, "compute_metrics: '{mod}:missing': '{mod}' has no attribute 'missing'"),
    ({"data_collator": "{mod}:NOT_CALLABLE"}, "data_collator: '{mod}:NOT_CALLABLE' is a int, not a function"),
    ({"compute_metrics": "{mod}.model"}, "compute_metrics='{mod}.model' is not a reference: write "
                                         "'package.module:function'"),
    ({"model": {"ref": "{mod}:model", "kwargs": {"depth": 2}}}, "model: kwargs {'depth': 2} do not fit "
                                                                "{mod}:model(width=4)"),
    ({"model": {"function": "{mod}:model"}}, "model: a mapping reference takes the keys 'ref' (required)"),
    ({"trainer_class": "{mod}:model"}, "trainer_class: '{mod}:model' must be a subclass of raytrainer.Trainer"),
    ({"model": None}, "The config names no model"),
    ({"train_dataset": None}, "no train_dataset"),
])
def test_bad_reference_is_named_before_anything_is_built(tmp_path, user_module, capsys, refs, expected):
    base = {"model": "{mod}:model", "train_dataset": "{mod}:data"}
    config = {k: v for k, v in {**base, **refs}.items() if v is not None}
    config = json.loads(json.dumps(config).replace("{mod}", user_module))
    assert main(["train", _config(tmp_path, **config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raytrainer: error: ") and expected.replace("{mod}", user_module) in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "built").exists()  # nothing was built, no Ray worker started


def test_command_line_overrides_the_config(tmp_path, user_module, capsys):
    config = _config(tmp_path, model=f"{user_module}:model", train_dataset=f"{user_module}:data")
    assert main(["train", config, "--compute_metrics", f"{user_module}:missing"]) == 2
    assert f"'{user_module}' has no attribute 'missing'" in capsys.readouterr().err


def test_missing_config_file_and_wrong_suffix(tmp_path, capsys):
    assert main(["train", str(tmp_path / "absent.yaml")]) == 2
    assert "absent.yaml': no such file" in capsys.readouterr().err
    assert main(["train", str(tmp_path / "config.txt")]) == 2
    assert "expected a .yaml/.yml/.json file" in capsys.readouterr().err


def test_the_command_exits_2_without_a_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: not_a_module_abc:model\ntrain_dataset: not_a_module_abc:data\n")
    run = subprocess.run([sys.executable, "-m", "raytrainer", "train", str(bad)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT}, cwd=tmp_path, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "model: cannot import module 'not_a_module_abc'" in run.stderr


def _help(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_help_of_each_command_is_useful(capsys):
    top = _help(capsys)
    assert "train" in top and "checkpoints" in top
    train = _help(capsys, "train")
    assert _help(capsys, "train", "config.yaml") == train  # also after CONFIG
    assert "train_dataset:" in train and "ray job submit" in train  # the config format, with an example
    assert "--learning_rate" in train and "--compute_metrics" in train  # every override
    assert "committed, damaged" in _help(capsys, "checkpoints")
