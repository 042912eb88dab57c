"""PEFT runs (LoRA; IA3) on 2 workers resume, restart after a killed worker and load the best model (issue 31): their
checkpoints hold the adapter only, and every interrupted run ends with the uninterrupted run's adapter, which has
transformers' numbers in one process.

Every step takes the whole 8-row set (2 workers x 4 rows, or 8 rows in one process), as in
test_transformers_numbers.py, so one process and two see the same batches. The eval rows are not the training rows,
and the eval loss rises after step 3: the best checkpoint is checkpoint-3, not the last, so loading it changes the
weights.
"""

from __future__ import annotations

import math
import os

import pytest
import safetensors.torch
import torch

from raytrainer import Trainer, TrainingArguments
from raytrainer.data.collator import DefaultCollator
from raytrainer.storage import join
from tests.hf_models import tiny_model, tiny_rows
from tests.models import weights
from tests.support import die_once_committed

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("ray_session")

STEPS, SAVE = 6, 3
KILL_AT = 5


def lora_model():
    return peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(r=4, lora_alpha=8,
                                                                    target_modules=["q_proj", "v_proj"]))


def ia3_model():
    return peft.get_peft_model(tiny_model("llama"), peft.IA3Config(target_modules=["k_proj", "v_proj", "down_proj"],
                                                                   feedforward_modules=["down_proj"]))


def schedule(**fields) -> dict:
    return dict(max_steps=STEPS, save_steps=SAVE, eval_strategy="steps", eval_steps=SAVE, learning_rate=1e-2,
                logging_steps=1, load_best_model_at_end=True, metric_for_best_model="eval_loss", report_to="none",
                disable_tqdm=True, seed=0, **fields)


def ours(output_dir: str, trainer_class=Trainer, resume=None, marker=None, model=lora_model, **fields) -> Trainer:
    args = TrainingArguments(output_dir=output_dir, num_workers=2, per_device_train_batch_size=4,
                             per_device_eval_batch_size=4, **schedule(**fields))
    trainer = trainer_class(model=model(), args=args, train_dataset=tiny_rows("llama"),
                            eval_dataset=tiny_rows("llama", seed=1))
    trainer.marker = marker  # DiesOnce's: an instance attribute travels to the workers
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def adapter(checkpoint: str) -> dict:
    with open(os.path.join(checkpoint, "adapter_model.safetensors"), "rb") as f:
        return safetensors.torch.load(f.read())


def adapter_weights(model, prefix: str = "lora_") -> dict:
    """The model's adapter tensors (their names hold the tuner's prefix), from every weight of the model."""
    return {k: v for k, v in weights(model).items() if prefix in k}


def assert_equal(got: dict, expected: dict, atol: float = 1e-6):
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=atol, msg=f"differs at {key}")


def losses(trainer) -> dict:
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}


class DiesOnce(Trainer):
    """Rank 1 kills its process during step KILL_AT once checkpoint-3 is committed, once (as test_recovery.py)."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.ctx.rank == 1 and self.state.global_step + 1 == KILL_AT and not os.path.exists(self.marker):
            die_once_committed(join(self.args.output_dir, "checkpoint-3"), self.marker, self.args.storage_options)
        return super().training_step(model, inputs, num_items_in_batch)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("peft") / "ref")
    return out, ours(out)


def test_an_uninterrupted_lora_run_has_transformers_numbers_and_ends_on_its_best_adapter(uninterrupted, tmp_path):
    out, trainer = uninterrupted
    hf = transformers.Trainer(
        model=lora_model(), train_dataset=tiny_rows("llama"), eval_dataset=tiny_rows("llama", seed=1),
        data_collator=DefaultCollator(),
        args=transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), per_device_train_batch_size=8,
                                            per_device_eval_batch_size=8, use_cpu=True, **schedule()))
    hf.train()
    for step, loss in losses(hf).items():
        assert math.isclose(losses(trainer)[step], loss, rel_tol=1e-4), step
    assert_equal(adapter_weights(trainer.model), adapter_weights(hf.model), atol=1e-5)
    # Both loaded checkpoint-3 at the end; ours holds the adapter only, as transformers writes it, and the manifest.
    assert os.path.basename(trainer.state.best_model_checkpoint) == os.path.basename(hf.state.best_model_checkpoint)
    assert os.path.basename(trainer.state.best_model_checkpoint) == "checkpoint-3"
    best, last = adapter(os.path.join(out, "checkpoint-3")), adapter(os.path.join(out, "checkpoint-6"))
    assert_equal(adapter(os.path.join(tmp_path / "hf", "checkpoint-6")), last, atol=1e-5)
    assert not torch.equal(best["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"],
                           last["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"])
    assert_equal({k.replace(".default", ""): v for k, v in adapter_weights(trainer.model).items()}, best)
    files = set(os.listdir(os.path.join(out, "checkpoint-3")))
    assert {"adapter_model.safetensors", "adapter_config.json", "COMMITTED"} <= files
    assert not any(name.startswith("model") for name in files)


def test_a_lora_run_resumed_at_step_3_ends_as_the_uninterrupted_one(uninterrupted, tmp_path):
    out, reference = uninterrupted
    resumed = ours(str(tmp_path / "resumed"), resume=os.path.join(out, "checkpoint-3"))
    assert {s: losses(resumed)[s] for s in (4, 5, 6)} == {s: losses(reference)[s] for s in (4, 5, 6)}
    assert_equal(adapter(str(tmp_path / "resumed" / "checkpoint-6")), adapter(os.path.join(out, "checkpoint-6")))
    assert_equal(adapter_weights(resumed.model), adapter_weights(reference.model))  # the best, loaded at the end


def test_a_lora_run_restarted_after_a_killed_worker_ends_as_the_uninterrupted_one(uninterrupted, tmp_path):
    out, reference = uninterrupted
    trainer = ours(str(tmp_path / "killed-run"), DiesOnce, marker=str(tmp_path / "killed"), max_failures=1)
    assert os.path.exists(str(tmp_path / "killed")), "the injected failure never happened"
    assert len(trainer.state.restarts) == 1 and trainer.state.restarts[0]["checkpoint"].endswith("checkpoint-3")
    assert_equal(adapter(str(tmp_path / "killed-run" / "checkpoint-6")), adapter(os.path.join(out, "checkpoint-6")))
    assert_equal(adapter_weights(trainer.model), adapter_weights(reference.model))


def test_an_ia3_run_resumed_at_step_3_ends_as_the_uninterrupted_one(tmp_path):
    """A second adapter type: IA3's scaling vectors (ia3_l) instead of LoRA's matrices."""
    reference = ours(str(tmp_path / "ref"), model=ia3_model)
    resumed = ours(str(tmp_path / "resumed"), model=ia3_model, resume=str(tmp_path / "ref" / "checkpoint-3"))
    assert_equal(adapter(str(tmp_path / "resumed" / "checkpoint-6")), adapter(str(tmp_path / "ref" / "checkpoint-6")))
    assert adapter_weights(reference.model, "ia3_l")
    assert_equal(adapter_weights(resumed.model, "ia3_l"), adapter_weights(reference.model, "ia3_l"))


def test_a_lora_run_under_fsdp_resumes_and_loads_its_best_adapter_as_under_ddp(uninterrupted, tmp_path):
    """FSDP2 shards the PEFT model as any other: its checkpoints are DCP shards of the whole model (base weights
    too), and a run resumed from one ends, after loading its best checkpoint, where the DDP run does."""
    _, reference = uninterrupted
    fsdp = dict(fsdp="full_shard auto_wrap", fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]})
    first = ours(str(tmp_path / "fsdp"), **fsdp)
    assert "pytorch_model_fsdp_0" in os.listdir(tmp_path / "fsdp" / "checkpoint-3")
    resumed = ours(str(tmp_path / "fsdp-resumed"), resume=str(tmp_path / "fsdp" / "checkpoint-3"), **fsdp)
    assert resumed.state.best_model_checkpoint.endswith("checkpoint-3")
    for trainer in (first, resumed):
        assert_equal(adapter_weights(trainer.model), adapter_weights(reference.model))
