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
from raytrainer.worker.hosted.sandbox import sandbox
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
    """HF refuses layer-wise optimizers under DDP; one worker runs the script as one plain process would, at the
    worker's thread count (one, for a 1-CPU worker; tests/conftest.py runs this process at one thread too, and the
    results record each side's count, which compare_case checks)."""
    args = ["--cases", "galore_layerwise"]
    with sandbox():  # the plain process: this one (what the script changes in it is put back)
        cases.main(["--output_root", str(tmp_path / "plain"), "--results_dir", str(tmp_path / "plain-results"),
                    *args])
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


def test_grpo_resumes_from_its_checkpoint(launched_results, capfd, ray_session):
    """GRPO (generation, a reward function, evaluation) trained 6 steps above; the same script with
    --max_steps 8 resumes from its checkpoint-6 and goes on, evaluating at step 6's boundary as before."""
    root = os.path.dirname(launched_results)
    result = raytrainer.launch(SCRIPT, ["--output_root", os.path.join(root, "out"), "--results_dir",
                                        os.path.join(root, "grpo-again"), "--cases", "grpo", "--max_steps", "8"],
                               num_workers=2, disable_tqdm=True)
    assert "GRPOTrainer resumes from checkpoint-6 (step 6)" in capfd.readouterr().err
    history = result.runs[-1]["log_history"]
    assert result.runs[-1]["global_step"] == 8
    assert [h["step"] for h in history if "loss" in h] == list(range(1, 9))
    assert any("eval_loss" in h for h in history)


def test_a_lora_run_commits_adapter_checkpoints_and_resumes_exactly(tmp_path, capfd, ray_session):
    """SFTTrainer(peft_config=LoraConfig(...)) on 2 workers: adapter-only checkpoints, committed; 4 steps then a
    resumed run to 6 end with the adapter weights and losses of 6 steps in one go (a constant learning rate)."""
    from peft import LoraConfig

    tokenizer = cases.build_tokenizer()

    def run(output_dir: str, steps: int):
        opts = argparse.Namespace(output_root=output_dir, max_steps=steps)
        args = SFTConfig(**{**cases.common_args(opts, "lora"), "save_steps": 2, "lr_scheduler_type": "constant",
                            "learning_rate": 1e-2}, max_length=32)
        trainer = raytrainer.hosted(SFTTrainer, num_workers=2, disable_tqdm=True)(
            model=cases.tiny_causal_lm(tokenizer), args=args, train_dataset=cases.text_dataset(),
            processing_class=tokenizer, peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        trainer.train()
        return trainer

    once = run(str(tmp_path / "once"), 6)
    run(str(tmp_path / "twice"), 4)
    checkpoint = tmp_path / "twice" / "lora" / "checkpoint-4"
    assert {"adapter_model.safetensors", "COMMITTED"} <= set(os.listdir(checkpoint))
    assert "model.safetensors" not in os.listdir(checkpoint)
    twice = run(str(tmp_path / "twice"), 6)
    assert "SFTTrainer resumes from checkpoint-4 (step 4)" in capfd.readouterr().err
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (once, twice)]
    assert len(losses[0]) == 6 and losses[1] == pytest.approx(losses[0], rel=1e-5)
    # The workers wrapped the model in a PEFT model: the trained weights stay on the driver for the next call.
    adapters = [{k: v for k, v in t._trained.items() if "lora_" in k} for t in (once, twice)]
    assert adapters[0] and adapters[0].keys() == adapters[1].keys()
    for name, value in adapters[0].items():
        assert (adapters[1][name] - value).abs().max() <= 1e-6, name
