"""The sharded (DCP) checkpoint format (raytrainer/checkpoint/sharded.py) that strategy="fsdp" keeps with
num_workers=0 (the model stays whole there): load_best_model_at_end loads the best one, and consolidate()
exports it to the trained weights. On 2 Ray workers: tests/integration/test_fsdp.py."""

import os

import safetensors.torch

from raytrainer import Trainer
from raytrainer.checkpoint.consolidate import consolidate
from tests.blocks_model import TinyBlocks, blocks_args
from tests.models import TokenData, assert_same_weights, weights


def test_load_best_model_at_end_loads_the_best_sharded_checkpoint(tmp_path):
    out = str(tmp_path / "run")
    trainer = Trainer(model=TinyBlocks(), args=blocks_args(
        out, num_workers=0, strategy="fsdp", eval_strategy="steps", eval_steps=2, save_strategy="steps",
        save_steps=2, load_best_model_at_end=True, metric_for_best_model="eval_loss",
        greater_is_better=True), train_dataset=TokenData(24),  # "best": the highest loss, an early checkpoint
        eval_dataset=TokenData(8, seed=1))
    trainer.train()
    best = trainer.state.best_model_checkpoint
    evals = {h["step"]: h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h}
    assert best.endswith(f"checkpoint-{max(evals, key=evals.get)}") and not best.endswith("checkpoint-6")
    assert os.path.isdir(os.path.join(best, "pytorch_model_fsdp_0"))
    exported = safetensors.torch.load_file(consolidate(best, str(tmp_path / "best")))
    assert_same_weights(exported, weights(trainer.model), atol=0)
