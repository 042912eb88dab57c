"""Code the driver loaded after Ray started (a folder put on sys.path by the script; a module written into
HF_MODULES_CACHE the way `evaluate.load` writes `evaluate_modules`) is importable on the workers, without
PYTHONPATH; a module no worker can import fails at once with one line naming the fix; and the zip that
carries driver-only modules to other nodes installs in a process that has none of the driver's folders."""

import importlib
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from raytrainer import Trainer, TrainingArguments
from raytrainer.code_paths import capture
from raytrainer.coordinator.pump import TrainingError

MODEL_MODULE = """
import numpy as np
import torch
from torch import nn


class DriverOnlyModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(32, 8)
        self.head = nn.Linear(8, 32)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.emb(input_ids))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return {"loss": loss, "logits": logits}
"""

# The shape of what evaluate.load() writes: HF_MODULES_CACHE/evaluate_modules/metrics/<name>/<hash>/<name>.py
METRIC_MODULE = """
import numpy as np


class Accuracy:
    def compute(self, predictions, references):
        keep = references != -100
        return {"accuracy": float((predictions[keep] == references[keep]).mean())}
"""


class Tokens:
    def __init__(self, n):
        import torch

        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, 32, (n, 6), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": (self.ids[i] + 1) % 32}


def _write(folder, relative, text):
    path = os.path.join(folder, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))


@pytest.fixture
def driver_only_code(tmp_path, monkeypatch):
    """A model module on a folder only the driver's sys.path has, and a metric in HF_MODULES_CACHE."""
    code, cache = str(tmp_path / "driver_code"), str(tmp_path / "hf_modules")
    _write(code, "driver_only_models.py", MODEL_MODULE)
    for package in ("evaluate_modules", "evaluate_modules/metrics", "evaluate_modules/metrics/accuracy",
                    "evaluate_modules/metrics/accuracy/0a1b2c"):
        _write(cache, f"{package}/__init__.py", "")
    _write(cache, "evaluate_modules/metrics/accuracy/0a1b2c/accuracy.py", METRIC_MODULE)
    monkeypatch.setenv("HF_MODULES_CACHE", cache)
    monkeypatch.syspath_prepend(code)
    monkeypatch.setattr(sys, "path", sys.path + [cache])  # as evaluate's init_dynamic_modules() does
    yield code, cache
    for name in [m for m in sys.modules if m.startswith(("driver_only_", "evaluate_modules"))]:
        del sys.modules[name]


@pytest.mark.usefixtures("ray_session")
def test_modules_only_the_driver_can_import_reach_two_workers_and_a_missing_one_fails_at_once(
        tmp_path, driver_only_code):
    code, _ = driver_only_code
    models = importlib.import_module("driver_only_models")
    metric = importlib.import_module("evaluate_modules.metrics.accuracy.0a1b2c.accuracy").Accuracy()

    def compute_metrics(prediction):  # refers to the metric object, whose class lives in evaluate_modules
        return metric.compute(predictions=prediction.predictions.argmax(-1), references=prediction.label_ids)

    args = TrainingArguments(output_dir=str(tmp_path / "run"), num_workers=2, max_steps=4, eval_strategy="steps",
                             eval_steps=2, per_device_train_batch_size=4, save_strategy="no", disable_tqdm=True,
                             learning_rate=1e-2)
    trainer = Trainer(model=models.DriverOnlyModel(), args=args, train_dataset=Tokens(32), eval_dataset=Tokens(8),
                      compute_metrics=compute_metrics)
    trainer.train()
    accuracies = [h["eval_accuracy"] for h in trainer.state.log_history if "eval_accuracy" in h]
    assert len(accuracies) == 2 and all(0.0 <= a <= 1.0 for a in accuracies)

    # A module the workers cannot import at all (gone from disk after the driver imported it): one line that
    # names the module and Ray's runtime_env, at once (no retry can help), and the next call works.
    _write(code, "driver_only_gone.py", "def gone_metrics(prediction):\n    return {'gone': 1.0}\n")
    trainer.compute_metrics = importlib.import_module("driver_only_gone").gone_metrics
    os.remove(os.path.join(code, "driver_only_gone.py"))
    args.max_failures = 3
    started = time.time()
    with pytest.raises(TrainingError) as caught:
        trainer.evaluate()
    message = str(caught.value)
    assert time.time() - started < 30, "a job that no worker can read must not be retried"
    assert message.startswith("evaluate() failed on worker rank ") and "No module named 'driver_only_gone'" in message
    assert "runtime_env" in message and "working_dir" in message and "\n" not in message
    assert "Traceback" in caught.value.worker_traceback

    trainer.compute_metrics = compute_metrics
    assert 0.0 <= trainer.evaluate()["eval_accuracy"] <= 1.0
    trainer.close()


def test_driver_only_modules_ship_to_a_process_that_has_none_of_their_folders(tmp_path, driver_only_code):
    code, cache = driver_only_code
    importlib.import_module("driver_only_models")
    importlib.import_module("evaluate_modules.metrics.accuracy.0a1b2c.accuracy")
    shipped = capture(ship=True)
    assert {"driver_only_models", "evaluate_modules"} <= set(shipped.modules)
    assert "torch" not in shipped.modules and "raytrainer" not in shipped.modules  # installed ones stay
    with open(tmp_path / "code.pkl", "wb") as f:
        pickle.dump(shipped, f)
    shutil.rmtree(code)  # "another node": neither folder exists there
    shutil.rmtree(cache)
    check = (f"import pickle, sys; from raytrainer.code_paths import install; "
             f"install(pickle.load(open({str(tmp_path / 'code.pkl')!r}, 'rb'))); "
             "from driver_only_models import DriverOnlyModel; "
             "from evaluate_modules.metrics.accuracy import __path__ as p; "
             "import importlib; m = importlib.import_module('evaluate_modules.metrics.accuracy.0a1b2c.accuracy'); "
             "print(type(DriverOnlyModel()).__name__, m.Accuracy.__name__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=str(tmp_path),
                          env=env, timeout=120)
    assert done.stdout.split() == ["DriverOnlyModel", "Accuracy"], done.stderr
