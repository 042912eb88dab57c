"""FSDP's parts that need no process group: which modules are the units, and the sharded checkpoint format
that strategy="fsdp" keeps with num_workers=0 (the model stays whole there)."""

import os

import pytest
import safetensors.torch
from torch import nn

from raytrainer import ConfigError, Trainer
from raytrainer.checkpoint.consolidate import consolidate
from raytrainer.strategy.blocks import find_blocks
from tests.blocks_model import TinyBlocks, blocks_args
from tests.models import TokenData, assert_same_weights, weights


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.small = nn.ModuleList([nn.Linear(2, 2)])
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(2, 2), nn.ReLU()) for _ in range(3)])


class WithNoSplit(Stack):
    _no_split_modules = ["Sequential"]


def test_blocks_by_name_by_no_split_modules_by_transformer_layer_else_the_largest_module_list():
    model = TinyBlocks()
    assert find_blocks(model) == list(reversed(model.blocks))  # TransformerEncoderLayer instances
    assert find_blocks(model, ["Embedding"]) == [model.emb]
    stack = Stack()
    assert find_blocks(stack) == list(reversed(stack.layers))
    with_no_split = WithNoSplit()
    assert find_blocks(with_no_split) == list(reversed(with_no_split.layers))


def test_unmatched_wrap_classes_are_refused_on_the_worker_too_with_model_init(tmp_path):
    """With model_init the driver has no model to check: the worker refuses before the first step."""
    args = blocks_args(str(tmp_path / "out"), num_workers=0, strategy="fsdp",
                       fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]})
    trainer = Trainer(model_init=TinyBlocks, args=args, train_dataset=TokenData(8))
    with pytest.raises(ConfigError, match=r"\['LlamaDecoderLayer'\], which match no module of TinyBlocks"):
        trainer.train()


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
