"""FSDP's units (raytrainer/strategy/blocks.py), which need no process group: which modules they are, and wrap
classes that match none refused. The sharded checkpoint format kept with num_workers=0:
tests/checkpoint/test_sharded.py."""


import pytest
from torch import nn

from raytrainer import ConfigError, Trainer
from raytrainer.strategy.blocks import find_blocks
from tests.blocks_model import TinyBlocks, blocks_args
from tests.models import TokenData


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
