"""Precision, activation checkpointing and torch.compile, in the driver process (num_workers=0), and the
bad combinations refused on the driver before anything runs, each naming its field."""

import pytest

from raytrainer import ConfigError, Trainer
from tests.blocks_model import blocks_args, make_blocks, train_blocks
from tests.models import TokenData, assert_same_weights, weights


def in_process(tmp_path, name, **kw):
    return train_blocks(str(tmp_path / name), num_workers=0, **kw)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return weights(in_process(tmp_path_factory.mktemp("ref"), "fp32").model)


def test_bf16_trains_on_cpu_and_the_loss_goes_down(tmp_path):
    trainer = in_process(tmp_path, "bf16", bf16=True, max_steps=12, n=48, learning_rate=3e-2)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3


@pytest.mark.parametrize("extra", [
    dict(gradient_checkpointing=True),
    dict(gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": True}),
    dict(torch_compile=True, torch_compile_backend="aot_eager"),
], ids=["checkpointing", "reentrant", "compile"])
def test_checkpointing_and_compile_change_nothing_but_speed_and_memory(tmp_path, reference, extra):
    trainer = in_process(tmp_path, "x", **extra)
    assert_same_weights(weights(trainer.model), reference)


def _train(tmp_path, **kw):
    Trainer(model=make_blocks(), args=blocks_args(str(tmp_path / "bad"), num_workers=0, **kw),
            train_dataset=TokenData(8)).train()


@pytest.mark.parametrize("kw,message", [
    (dict(fp16=True), r"fp16=True needs GPUs.*bf16=True"),
    (dict(bf16=True, fp16=True), r"bf16=True and fp16=True"),
    (dict(torch_compile_backend="no_such_backend"), r"torch_compile_backend='no_such_backend'.*aot_eager"),
    (dict(fsdp="full_shard auto_wrap", fsdp_config={"transformer_layer_cls_to_wrap": ["GPT2Block"]}),
     r"transformer_layer_cls_to_wrap.*\['GPT2Block'\].*TinyBlocks.*TransformerEncoderLayer"),
    (dict(fsdp="hybrid_shard auto_wrap"), r"fsdp='hybrid_shard auto_wrap': 'hybrid_shard' is not supported"),
    (dict(fsdp="full_shard shard_grad_op"), r"choose one of full_shard and shard_grad_op"),
    (dict(strategy="fsdp", fsdp_config={"min_num_params": 1000}), r"min_num_params.*size-based"),
    (dict(strategy="fsdp", fsdp_config={"version": 1}), r"only FSDP2"),
    (dict(fsdp_config={"reshard_after_forward": True}), r"fsdp_config is set but FSDP is off"),
    (dict(gradient_checkpointing_kwargs="{nope"), r"gradient_checkpointing_kwargs=.*not valid JSON"),
])
def test_bad_precision_and_fsdp_settings_are_refused_naming_the_field(tmp_path, kw, message):
    with pytest.raises(ConfigError, match=message):
        _train(tmp_path, **kw)
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())


def test_hf_fsdp_strings_map_onto_the_fsdp_strategy(tmp_path):
    for fsdp, reshard, offload in (("full_shard auto_wrap", True, False), ("shard_grad_op auto_wrap", False, False),
                                   ("full_shard offload auto_wrap", True, True), (True, True, False)):
        args = blocks_args(str(tmp_path), fsdp=fsdp, fsdp_config={"fsdp_transformer_layer_cls_to_wrap": "A,B"})
        assert args.strategy == "fsdp"
        assert args.fsdp_config == {"transformer_layer_cls_to_wrap": ["A", "B"], "reshard_after_forward": reshard,
                                    "cpu_offload": offload, "activation_checkpointing": False}
