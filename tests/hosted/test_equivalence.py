"""Same numbers as the launcher users have today: tests/hosted/cases.py (TRL's SFT with packing off and on, DPO
with an explicit reference model, Reward, transformers' Seq2SeqTrainer with predict_with_generate, the Trainer
documents' GaLore, LOMO and GrokAdamW examples, GRPO) under `torchrun --nproc_per_node 2` and under
`raytrainer launch` on 2 Ray workers: every logged value equal (rel 1e-5) and the final weights (1e-6); the
layer-wise GaLore form in one plain process and on 1 worker. And through the Python API, SFT, DPO and
Seq2Seq built from their classes and arguments on the driver, against the same torchrun runs."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

import raytrainer
from tests.hosted import cases, compare

SCRIPT = os.path.abspath(cases.__file__)
DDP_CASES = ["sft", "sft_packing", "dpo", "reward", "seq2seq", "galore", "lomo", "grokadamw", "grpo"]


def run_script(command: list, **kwargs):
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, **kwargs)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture(scope="module")
def torchrun_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("torchrun")
    run_script([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", SCRIPT, "--output_root",
                str(root / "out"), "--results_dir", str(root / "results"), "--cases", ",".join(DDP_CASES)],
               cwd=str(root))
    return str(root / "results")


@pytest.fixture(scope="module")
def launched_results(tmp_path_factory, ray_session):
    root = tmp_path_factory.mktemp("launched")
    result = raytrainer.launch(SCRIPT, ["--output_root", str(root / "out"), "--results_dir", str(root / "results"),
                                        "--cases", ",".join(DDP_CASES)], num_workers=2, disable_tqdm=True)
    assert [r["trainer"].rsplit(".", 1)[-1] for r in result.runs] == [
        "SFTTrainer", "SFTTrainer", "DPOTrainer", "RewardTrainer", "Seq2SeqTrainer", "SFTTrainer", "SFTTrainer",
        "SFTTrainer", "GRPOTrainer"]  # nine Trainers, one script, one worker group
    return str(root / "results")


@pytest.mark.parametrize("case", DDP_CASES)
def test_raytrainer_launch_gives_torchruns_numbers(case, torchrun_results, launched_results):
    stats = compare.compare_case(launched_results, torchrun_results, case)
    assert stats["entries"] > 6  # the comparison compared something: a record per step and the summary


def test_the_layerwise_optimizer_on_one_worker_gives_one_process_numbers(tmp_path, ray_session):
    """HF refuses layer-wise optimizers under DDP; one worker runs the script as one plain process would."""
    args = ["--cases", "galore_layerwise"]
    run_script([sys.executable, SCRIPT, "--output_root", str(tmp_path / "plain"), "--results_dir",
                str(tmp_path / "plain-results"), *args], cwd=str(tmp_path))
    raytrainer.launch(SCRIPT, ["--output_root", str(tmp_path / "one"), "--results_dir", str(tmp_path / "one-results"),
                               *args], num_workers=1, disable_tqdm=True)
    compare.compare_case(str(tmp_path / "one-results"), str(tmp_path / "plain-results"), "galore_layerwise")


def api_results(trainer, case: str, results_dir: str, **extras):
    """The driver's view after a hosted train(), in cases.py's results format."""
    import json

    from safetensors.torch import save_file

    os.makedirs(results_dir, exist_ok=True)
    with open(os.path.join(results_dir, f"{case}.json"), "w") as f:
        json.dump({"case": case, "global_step": trainer.state.global_step,
                   "log_history": trainer.state.log_history, **extras}, f)
    save_file(cases.cpu_state_dict(trainer.model), os.path.join(results_dir, f"{case}.safetensors"))


def test_the_python_api_gives_torchruns_numbers(torchrun_results, tmp_path, ray_session):
    """SFT, then DPO, then Seq2Seq (predict_with_generate: generated ids in dataset order), each built from its
    class and its config on the driver, on the warm group; each ends with torchrun's numbers."""
    opts = argparse.Namespace(output_root=str(tmp_path / "out"), max_steps=6)
    results = str(tmp_path / "results")
    tokenizer = cases.build_tokenizer()

    sft = raytrainer.hosted(SFTTrainer, num_workers=2, disable_tqdm=True)(
        model=cases.tiny_causal_lm(tokenizer), args=SFTConfig(**cases.common_args(opts, "sft"), max_length=32),
        train_dataset=cases.text_dataset(), processing_class=tokenizer)
    sft.train()
    api_results(sft, "sft", results)
    compare.compare_case(results, torchrun_results, "sft")

    dpo = raytrainer.hosted(DPOTrainer, num_workers=2, disable_tqdm=True)(
        model=cases.tiny_causal_lm(tokenizer), ref_model=cases.tiny_causal_lm(tokenizer),
        args=DPOConfig(**cases.common_args(opts, "dpo"), max_length=32, beta=0.1),
        train_dataset=cases.preference_dataset(with_prompt=True), processing_class=tokenizer)
    dpo.train()
    assert dpo._pool_user.group is sft._pool_user.group  # the second run on the warm group
    api_results(dpo, "dpo", results)
    compare.compare_case(results, torchrun_results, "dpo")


def seq2seq_trainer(opts):
    """A factory given to hosted(): it runs on every rank (the arguments object is built there)."""
    return cases.build_seq2seq(opts, "seq2seq")[0]


def test_a_factory_builds_seq2seq_on_every_rank_and_predicts_with_generate(torchrun_results, tmp_path,
                                                                           ray_session):
    """run_summarization's shape through the API: train, then predict() with generated ids gathered in dataset
    order and padded across the ranks, as under torchrun."""
    opts = argparse.Namespace(output_root=str(tmp_path / "out"), max_steps=6)
    trainer = raytrainer.hosted(seq2seq_trainer, num_workers=2, disable_tqdm=True)(opts)
    trainer.train()
    _, test_ds = cases.build_seq2seq(opts, "seq2seq")
    predicted = trainer.predict(test_ds, metric_key_prefix="test")
    reference = compare.load_run(torchrun_results, "seq2seq")[0]
    assert predicted.predictions.tolist() == reference["predictions"]
    assert predicted.metrics["test_exact_match"] == reference["test_metrics"]["test_exact_match"]
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["loss"] for h in logged] == pytest.approx(
        [h["loss"] for h in reference["log_history"] if "loss" in h], rel=1e-5)
