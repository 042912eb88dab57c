"""A transformers example script, changed only in its import, runs on 2 workers: parsed by transformers'
HfArgumentParser, trained, evaluated with an `evaluate` metric loaded from a local folder (a module only the
driver has), resumed by the script's own `get_last_checkpoint`, with its results and model card written.
(`tests/integration/example_scripts/run_clm_shaped.py`; the tokenizer and data are made here, nothing is downloaded.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import ROOT

SCRIPT = os.path.join(ROOT, "tests", "integration", "example_scripts", "run_clm_shaped.py")
WORDS = [f"w{i}" for i in range(40)]

METRIC = '''
import datasets
import evaluate


class TokenAccuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(description="token accuracy", citation="", inputs_description="",
                                   features=datasets.Features({"predictions": datasets.Value("int64"),
                                                               "references": datasets.Value("int64")}))

    def _compute(self, predictions, references):
        pairs = [(p, r) for p, r in zip(predictions, references) if r != -100]
        return {"accuracy": sum(p == r for p, r in pairs) / max(len(pairs), 1)}
'''


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    pytest.importorskip("evaluate")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("clm")
    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                            pad_token="</s>").save_pretrained(str(root / "tokenizer"))
    for name, lines, seed in (("train.txt", 60, 0), ("validation.txt", 12, 1)):
        with open(root / name, "w") as f:  # a next-word pattern a tiny model can start to learn
            for i in range(lines):
                start = (i * 7 + seed) % len(WORDS)
                f.write(" ".join(WORDS[(start + k) % len(WORDS)] for k in range(9 + i % 5)) + "\n")
    metric = root / "token_accuracy"
    metric.mkdir()
    (metric / "token_accuracy.py").write_text(METRIC)
    return root


def run(inputs, output_dir, max_steps: int, ray_env=None) -> subprocess.CompletedProcess:
    """`ray_env`: the environment of a running Ray to join; without it the script starts a Ray of its own, as
    a user's script gets."""
    env = {**(ray_env or os.environ), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(inputs / "hf-home")}
    if ray_env is None:
        env["RAY_ADDRESS"] = "local"
    env.pop("PYTHONPATH", None)  # the script's folder and the metric's module reach the workers by themselves
    cmd = [sys.executable, SCRIPT, "--tokenizer_name", str(inputs / "tokenizer"),
           "--train_file", str(inputs / "train.txt"), "--validation_file", str(inputs / "validation.txt"),
           "--metric_dir", str(inputs / "token_accuracy"), "--config_overrides", "n_embd=32,n_layer=2,n_head=2",
           "--output_dir", str(output_dir), "--do_train", "--do_eval", "--num_workers", "2",
           "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4", "--learning_rate", "3e-3",
           "--max_steps", str(max_steps), "--save_steps", "3", "--logging_steps", "1", "--seed", "1",
           "--disable_tqdm", "true", "--report_to", "none"]
    return subprocess.run(cmd, cwd=str(inputs), env=env, capture_output=True, text=True, timeout=400)


def test_a_run_clm_shaped_script_trains_evaluates_resumes_and_writes_its_results(inputs, tmp_path,
                                                                                 join_session_ray):
    """The first run starts a Ray of its own; the second joins a running one (the test session's), as a
    script on a cluster does: the driver-only modules then travel through Ray, not the inherited PYTHONPATH."""
    output_dir = tmp_path / "out"
    first = run(inputs, output_dir, max_steps=3)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    # The driver is no worker: local_rank -1 (as transformers in one process); the rest describes the workers.
    assert "Process rank: -1, device: cpu, n_gpu: 0, distributed training: True" in first.stdout + first.stderr
    assert os.path.isdir(output_dir / "checkpoint-3")

    second = run(inputs, output_dir, max_steps=6, ray_env=join_session_ray)  # get_last_checkpoint: checkpoint-3
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    assert "Checkpoint detected, resuming training at" in out and "checkpoint-3" in out
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    losses = [h["loss"] for h in state["log_history"] if "loss" in h]
    assert [h["step"] for h in state["log_history"] if "loss" in h] == [1, 2, 3, 4, 5, 6]  # 1-3 from the checkpoint
    assert all(0 < loss < 10 for loss in losses)
    results = json.loads((output_dir / "all_results.json").read_text())
    assert {"train_loss", "eval_loss", "eval_accuracy", "perplexity", "train_samples", "eval_samples"} <= set(results)
    assert 0.0 <= results["eval_accuracy"] <= 1.0
    for name in ("train_results.json", "eval_results.json", "README.md", "model.safetensors", "config.json",
                 "tokenizer.json"):
        assert (output_dir / name).exists(), name
    assert "text-generation" in (output_dir / "README.md").read_text()
