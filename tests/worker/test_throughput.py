"""Throughput in every training log record (worker/meter.py, worker/throughput.py): the keys, their
consistency (tokens/s x step time = tokens per step), the FLOPs estimate, the device peaks and MFU, in the
driver process (num_workers=0). The same keys on 2 Ray workers: tests/integration/test_throughput_on_ray.py."""

import types

import pytest
import torch

from raytrainer import Trainer, TrainerCallback, TrainingArguments
from raytrainer.errors import ConfigError
from raytrainer.worker import throughput
from raytrainer.worker.throughput import ModelFlops, peak_flops, run_precision
from tests.models import TokenData, make_model

THROUGHPUT_KEYS = {"train_step_time_s", "train_samples_per_second", "train_tokens_per_second",
                   "train_tokens_per_step", "train_tokens_per_second_per_device", "train_tflops_per_device",
                   "peak_memory_mb"}


def train_logs(tmp_path, **overrides):
    args = dict(output_dir=str(tmp_path), num_workers=0, per_device_train_batch_size=4, max_steps=4,
                logging_steps=2, save_strategy="no", disable_tqdm=True)
    args.update(overrides)
    trainer = Trainer(model=make_model(), args=TrainingArguments(**args), train_dataset=TokenData(40))
    trainer.train()
    return trainer, [h for h in trainer.state.log_history if "loss" in h]


def check_consistent(record, world_size=1):
    assert THROUGHPUT_KEYS <= record.keys()
    assert record["train_tokens_per_second"] * record["train_step_time_s"] == pytest.approx(
        record["train_tokens_per_step"], rel=1e-3)
    assert record["train_tokens_per_second_per_device"] == pytest.approx(
        record["train_tokens_per_second"] / world_size, rel=1e-3)
    # TinyLM has no transformer config: 6 FLOPs per matmul parameter per token (the embedding is looked up).
    dense = 6 * sum(p.numel() for name, p in make_model().named_parameters() if not name.startswith("emb."))
    assert record["train_tflops_per_device"] * 1e12 * world_size == pytest.approx(
        dense * record["train_tokens_per_second"], rel=1e-3)
    assert record["peak_memory_mb"] > 0


def test_every_log_record_has_consistent_throughput_keys_and_no_mfu_on_cpu(tmp_path):
    trainer, records = train_logs(tmp_path)
    assert [r["step"] for r in records] == [2, 4]
    for record in records:
        check_consistent(record)
        assert "train_mfu_percent" not in record  # a CPU's peak is unknown unless the user gives it
    # tokens per step: the attention-mask ones of the step's batches (4 rows of 3..8 tokens)
    assert all(4 * 3 <= r["train_tokens_per_step"] <= 4 * 8 for r in records)


def test_a_given_peak_gives_mfu_and_the_keys_reach_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tests.callbacks.test_tensorboard import read, scalars

    logdir = str(tmp_path / "tb")
    _, records = train_logs(tmp_path, peak_flops_per_device=1e9, report_to="tensorboard", logging_dir=logdir)
    for record in records:
        check_consistent(record)
        assert record["train_mfu_percent"] == pytest.approx(
            100 * record["train_tflops_per_device"] * 1e12 / 1e9, rel=1e-3)
    acc = read(logdir)  # the reporters take every numeric key of the record (MLflow the same way)
    for key in ("train_tokens_per_second", "train_mfu_percent", "peak_memory_mb"):
        assert scalars(acc, f"train/{key}") == pytest.approx({r["step"]: r[key] for r in records}, rel=1e-6)
    assert sorted(scalars(acc, "rank0/tokens_per_second")) == [2, 4]


def test_rank_stats_carry_each_ranks_throughput(tmp_path):
    seen = []

    class Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, rank_stats=None, **kwargs):
            if rank_stats:
                seen.append(rank_stats)

    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, per_device_train_batch_size=4, max_steps=2,
                             logging_steps=1, save_strategy="no", disable_tqdm=True)
    Trainer(model=make_model(), args=args, train_dataset=TokenData(40), callbacks=[Record()]).train()
    assert len(seen) == 2 and all(len(stats) == 1 for stats in seen)
    assert {"rank", "step_time_s", "data_wait_s", "samples_per_second", "tokens_per_second",
            "memory_mb"} == seen[0][0].keys()
    assert seen[0][0]["tokens_per_second"] > seen[0][0]["samples_per_second"] > 0


def test_flops_per_token_of_a_transformer_follow_torchtitan():
    pytest.importorskip("transformers")
    from tests.hf_models import tiny_model

    model = tiny_model("gpt2")  # n_layer=2, n_head=4, n_embd=32; lm_head tied to wte
    flops = ModelFlops.of(model)
    wpe = model.transformer.wpe.weight.numel()  # position table: looked up only
    assert flops.dense == 6 * (sum(p.numel() for p in model.parameters()) - wpe)  # wte counted: lm_head uses it
    assert flops.attention == 12 * 2 * 4 * 8
    assert flops.batch(samples=2, tokens=10, seq_len=6) == 10 * (flops.dense + flops.attention * 6)


def test_a_model_without_tokens_counts_per_sample():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    flops = ModelFlops.of(model)
    assert flops.attention == 0 and flops.batch(samples=3, tokens=0, seq_len=0) == 3 * 6 * (40 + 18)


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA A10G", 70e12), ("NVIDIA A10", 125e12), ("NVIDIA L4", 121e12),
    ("NVIDIA L40S", 362e12), ("Tesla V100-SXM2-16GB", 125e12), ("NVIDIA H200", 989e12),
    ("Some Future GPU", None)])
def test_peak_of_known_gpus(monkeypatch, name, peak):
    monkeypatch.setattr(throughput.torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda", 0)) == peak
    assert peak_flops(torch.device("cuda", 0), override=1e12) == 1e12  # the user's figure wins


@pytest.mark.parametrize("name, precision, peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989e12), ("NVIDIA H100 80GB HBM3", "fp16", 989e12),
    ("NVIDIA H100 80GB HBM3", "tf32", 494.7e12), ("NVIDIA H100 80GB HBM3", "fp32", 66.9e12),
    ("NVIDIA A100-SXM4-80GB", "tf32", 156e12), ("NVIDIA A100-SXM4-80GB", "fp32", 19.5e12),
    ("Tesla V100-SXM2-16GB", "tf32", 15.7e12), ("Some Future GPU", "fp32", None)])
def test_the_peak_is_the_precisions_the_run_computes_in(monkeypatch, name, precision, peak):
    monkeypatch.setattr(throughput.torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda", 0), precision=precision) == peak
    assert peak_flops(torch.device("cuda", 0), override=1e12, precision=precision) == 1e12


def test_a_runs_precision_comes_from_its_arguments_then_torchs_tf32_setting():
    args = lambda **kw: types.SimpleNamespace(**{"bf16": False, "fp16": False, **kw})  # noqa: E731
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")  # torch's default
        assert run_precision(args(bf16=True)) == "bf16" and run_precision(args(fp16=True)) == "fp16"
        assert run_precision(args()) == "fp32"  # an fp32 run is measured against the fp32 peak
        torch.set_float32_matmul_precision("high")  # TF32 matmuls allowed (what tf32=True sets on a worker)
        assert run_precision(args()) == "tf32" and run_precision(args(bf16=True)) == "bf16"
    finally:
        torch.set_float32_matmul_precision(before)
    with pytest.raises(ValueError, match="precision"):
        peak_flops(torch.device("cuda", 0), precision="fp8")


def test_peak_on_cpu_only_when_given():
    assert peak_flops(torch.device("cpu")) is None
    assert peak_flops(torch.device("cpu"), override=2e11) == 2e11


@pytest.mark.parametrize("value", [0, -1.0, "fast", True])
def test_a_bad_peak_names_the_fix(tmp_path, value):
    with pytest.raises(ConfigError, match="peak_flops_per_device=.*989e12"):
        TrainingArguments(output_dir=str(tmp_path), peak_flops_per_device=value)
